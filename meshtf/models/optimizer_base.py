"""The optimizers' shared kit: the Optimizer base class, slot variables, the
global step, gradients in their variables' layouts, clipping by global norm,
and several learning-rate schedules in one optimizer.

optimize.py (SGD, momentum, Adam, make_optimizer) and adafactor.py both
build on this module; neither reaches into the other for it.

Example:
  >>> from meshtf.models import optimizer_base
  >>> class Sign(optimizer_base.Optimizer):   # var -= lr * sign(grad)
  ...   def _update(self, grad, var, value):
  ...     lr = self._lr_for(var, value, grad.dtype)
  ...     return [mtf.assign_sub(var, mtf.sign(grad) * lr)]
  >>> ops = Sign(0.01).apply_grads(grads, variables)
"""
import re
import weakref

from absl import logging
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.models.schedules import _maximum
from meshtf.models.schedules import compute_lr_for_step
from meshtf.models.schedules import step_num
from meshtf.ops import annotations
from meshtf.ops import elementwise
from meshtf.ops import initializers
from meshtf.ops import io
from meshtf.ops import reductions
from meshtf.ops import variables as variables_lib


# --- helpers ------------------------------------------------------------------
def _is_tensor(x):
  return isinstance(x, graph_lib.Tensor)


def _as_variable(var):
  """The Variable operation behind var: a Variable, the Tensor get_variable
  returned (possibly a cast to an activation dtype), or its master value."""
  if isinstance(var, variables_lib.Variable):
    return var
  t = var
  # get_variable(activation_dtype=...) returns cast(variable): look through.
  while _is_tensor(t) and isinstance(t.operation, elementwise.CastOperation):
    t = t.operation.inputs[0]
  if _is_tensor(t) and isinstance(t.operation, variables_lib.Variable):
    return t.operation
  raise TypeError("optimizer: %r is not a variable; pass the Tensors that "
                  "get_variable returned or graph.trainable_variables" % (var,))


def _compute_dtype(var):
  # float32 at least: bfloat16 updates would round small steps away.
  return tf.float64 if var.dtype == tf.float64 else tf.float32


def _cast(x, dtype):
  return elementwise.cast(x, dtype) if _is_tensor(x) else x


def _pow(base, exponent):
  if _is_tensor(base) or _is_tensor(exponent):
    return elementwise.pow(base, exponent)
  return base ** exponent


def reduce_rms(x, **kwargs):
  """Root mean square of x's elements: a scalar Tensor, or, with
  reduce_mean's output_shape= / reduced_dim=, one per remaining position.

  Example:
    >>> scale = reduce_rms(w)     # allreduced over w's split mesh axes
    >>> per_expert = reduce_rms(w, output_shape="experts:8")
  """
  return elementwise.sqrt(reductions.reduce_mean(elementwise.square(x),
                                                 **kwargs))


# --- global step --------------------------------------------------------------
def get_global_step(mesh, name="global_step", dtype=tf.int64):
  """A scalar step-counter variable and the op that adds 1 to it.

  The returned value is the count before this graph's increment (the read
  happens first), i.e. the number of steps already taken.

  Example:
    >>> step, increment = get_global_step(mesh)
    >>> lr = warmup_then_decay(0.01, 100)(step_num(step))
    >>> optimizer.apply_grads(grads, variables, step=step)
  """
  step = variables_lib.get_variable(
      mesh, name, [], dtype=dtype,
      initializer=initializers.zeros_initializer(), trainable=False)
  one = io.constant(mesh, 1, [], dtype=dtype)
  return step, variables_lib.assign_add(step, one, name=name + "/increment")


# --- gradients in their variables' layouts -----------------------------------
def in_variable_layouts(grads, variables):
  """Each gradient laid out like its variable (None stays None). Where a
  variable is stored split over the data axis (weight-update sharding:
  MeshLayout variable_rules or get_variable(layout=...)), its gradient --
  a partial sum over that axis -- is then reduce-scattered once, and the
  clipping norm and the optimizer work on 1/N of it. Elsewhere nothing
  changes.

  Example:
    >>> grads = in_variable_layouts(mtf.gradients([loss], vs), vs)
  """
  out = []
  for g, v in zip(grads, variables):
    value = _as_variable(v).outputs[0]
    if g is None or (isinstance(g.operation, annotations.LayoutLikeOperation)
                     and g.operation.layout_source is value):
      out.append(g)
    else:
      out.append(annotations.LayoutLikeOperation(g, value).outputs[0])
  return out


# --- gradient clipping --------------------------------------------------------
def clip_by_global_norm(grads, clip_norm):
  """Scales grads so their joint L2 norm is at most clip_norm.

  Returns (clipped grads, global norm) like tf.clip_by_global_norm; None
  grads stay None. The norm sums squares over every grad: reductions over
  split dims, allreduced by the lowering.

  Example:
    >>> grads, norm = clip_by_global_norm(mtf.gradients([loss], vs), 1.0)
  """
  grads = list(grads)
  present = [g for g in grads if g is not None]
  if not present:
    raise ValueError("clip_by_global_norm: every gradient is None")
  squares = [reductions.reduce_sum(elementwise.square(
      elementwise.cast(g, tf.float32))) for g in present]
  # One fused allreduce per mesh axes, not one per gradient split another
  # way (sums over the same axes would add up pending anyway).
  graph_lib.reduce_together(squares)
  norm = elementwise.sqrt(elementwise.add_n(squares))
  clip_norm = _cast(clip_norm, tf.float32)
  scale = clip_norm / _maximum(norm, clip_norm)
  clipped = [None if g is None else g * elementwise.cast(scale, g.dtype)
             for g in grads]
  return clipped, norm


# --- optimizers ---------------------------------------------------------------
class _GraphState(object):
  """An optimizer's state for one graph: the step, the step counter's
  increment (until an apply_grad returns it) and resolved hyperparameters."""

  def __init__(self):
    self.step = None          # scalar Tensor or number, as given or made
    self.float_step = None    # step_num(step), made once
    self.new_ops = []
    self.hparams = {}


class Optimizer(object):
  """Base optimizer: apply_grads(grads, variables) -> list of assign ops.

  Subclasses implement `_update(grad, var, value)` with grad and value (the
  variable's value before the update) in the compute dtype, returning the
  assign Operations. `apply_grad` (Mesh TensorFlow's per-variable hook)
  checks and casts its arguments, then calls `_update`.

  Example:
    >>> class HalfSgd(Optimizer):
    ...   def _update(self, grad, var, value):
    ...     return [mtf.assign_sub(var, grad * 0.5)]
    >>> ops = HalfSgd().apply_grads(grads, [w, b])
  """

  def apply_grads(self, grads, variables, step=None):
    """Applies grads[i] to variables[i]; returns the assign Operations.

    Args:
      grads: Tensors (or None: that variable is skipped with a warning).
      variables: the Tensors get_variable returned, or Variable operations.
      step: optional scalar Tensor, the updates already applied (e.g. from
        get_global_step); otherwise the optimizer counts its own steps if it
        needs them.
    Returns:
      a list of Operations.
    """
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
      raise ValueError("apply_grads: %d grads for %d variables" %
                       (len(grads), len(variables)))
    if not variables:
      return []
    if step is not None:
      self._use_step(_as_variable(variables[0]).graph, step)
    if type(self).apply_grad is not Optimizer.apply_grad:
      # A port's own per-variable hook (Mesh TF's API) is called as there.
      return [op for grad, var in zip(grads, variables)
              for op in self.apply_grad(grad, var)]
    return self._apply(zip(grads, variables))

  def apply_grad(self, grad, var):
    """Updates one variable and its slots; returns a list of Operations.

    Example:
      >>> ops = SgdOptimizer(0.1).apply_grad(grad_w, w)
    """
    return self._apply([(grad, var)])

  def _apply(self, pairs):
    """The update of every (grad, var) of pairs (one _update_all over the
    present gradients), then the step counter's increment if it was made."""
    pairs = list(pairs)
    items = [self._prepare(grad, var) for grad, var in pairs]
    items = [item for item in items if item is not None]
    ops = list(self._update_all(items)) if items else []
    return ops + self._take_new_ops(_as_variable(pairs[0][1]).graph)

  def _prepare(self, grad, var):
    """(grad, Variable, value) in the compute dtype, grad laid out like
    the variable; None (with a warning) where grad is None."""
    var = _as_variable(var)
    if grad is None:
      logging.warning("Gradient is None for variable %s", var.name)
      return None
    if grad.shape != var.shape:
      raise ValueError("apply_grad: gradient %s has shape %s but variable %r "
                       "has shape %s" % (grad.name, grad.shape, var.name,
                                         var.shape))
    dtype = _compute_dtype(var)
    grad = elementwise.cast(in_variable_layouts([grad], [var])[0], dtype)
    return grad, var, elementwise.cast(var.outputs[0], dtype)

  def _take_new_ops(self, graph):
    """The step counter's increment, the first time it is made in a graph
    (then never again)."""
    state = self._state(graph)
    ops, state.new_ops = state.new_ops, []
    return ops

  def _update_all(self, items):
    """The assign Operations for every (grad, var, value) of items: by
    default each variable's _update in turn. An optimizer whose updates
    reduce over split dims overrides this to build all variables' updates
    phase by phase, so that each phase's reductions go out fused
    (AdafactorOptimizer)."""
    return [op for item in items for op in self._update(*item)]

  def _update(self, grad, var, value):
    raise NotImplementedError("%s must implement _update(grad, var, value)"
                              % type(self).__name__)

  # Per-graph state: a MeshFunction builds a new graph per trace, so one
  # optimizer object can serve many graphs.
  def _state(self, graph):
    table = self.__dict__.setdefault("_graph_states",
                                     weakref.WeakKeyDictionary())
    if graph not in table:
      table[graph] = _GraphState()
    return table[graph]

  def _use_step(self, graph, step):
    state = self._state(graph)
    if state.step is not None and state.step is not step:
      raise ValueError("apply_grads(step=...): this optimizer already uses "
                       "another step in this graph (one step per graph)")
    state.step = step

  def step(self, mesh):
    """float32 scalar: the updates applied before this one (the step given
    to apply_grads, or this optimizer's own counter, made on first use).

    Example:
      >>> t = optimizer.step(mesh) + 1.0
    """
    state = self._state(mesh.graph)
    if state.float_step is None:
      if state.step is None:
        state.step, increment = get_global_step(mesh, "optimizer_step")
        state.new_ops.append(increment)
      state.float_step = step_num(state.step)
    return state.float_step

  def _lr_for(self, var, value, dtype):
    """The learning rate for var (value: the optimizer's own), resolved
    once per graph; the multi-schedule optimizers pick one per variable."""
    return self._hparam(var.mesh, "lr", value, dtype)

  def _hparam(self, mesh, key, value, dtype):
    """value (number, scalar Tensor or fn(step)) resolved once per graph."""
    cache = self._state(mesh.graph).hparams
    if (key, dtype) not in cache:
      if callable(value) and not _is_tensor(value):
        value = value(self.step(mesh))
      if _is_tensor(value) and value.shape.ndims != 0:
        raise ValueError("optimizer hyperparameter %s must be a scalar, got "
                         "shape %s" % (key, value.shape))
      cache[(key, dtype)] = _cast(value, dtype)
    return cache[(key, dtype)]


def _slot(var, suffix, shape=None, dtype=tf.float32):
  """A zero-initialised state variable '<var>/slot_<suffix>' (the
  parameter's shape by default), laid out like the parameter: by the same
  rules, or by the parameter's own layout restricted to the slot's dims
  (Adafactor's factored slots)."""
  shape = var.shape if shape is None else shapes.convert_to_shape(shape)
  layout = None
  if var.layout_spec is not None:
    layout = [(d, a) for d, a in var.layout_spec.pairs
              if shape.has_dim_name(d)]
  return variables_lib.get_variable(
      var.mesh, "%s/slot_%s" % (var.name, suffix), shape, dtype=dtype,
      initializer=initializers.zeros_initializer(), trainable=False,
      layout=layout)


# --- several learning-rate schedules in one optimizer -------------------------
class _MultiLRSchedule(object):
  """Variables whose name matches variable_search[i] (re.search) learn at
  alt_lr_schedules[i] (a product_learning_rate factor list over
  train_steps; None: the optimizer's rate); the others at the optimizer's
  learning rate. A name matching several patterns takes the last one's
  schedule."""

  def _init_schedules(self, variable_search, alt_lr_schedules, train_steps):
    if (variable_search is not None and alt_lr_schedules is not None
        and len(alt_lr_schedules) < len(variable_search)):
      raise ValueError(
          "%s: %d variable_search patterns but %d alt_lr_schedules; give "
          "one schedule per pattern" % (type(self).__name__,
                                        len(variable_search),
                                        len(alt_lr_schedules)))
    self.variable_search = variable_search
    self.alt_lr_schedules = alt_lr_schedules
    self.train_steps = train_steps

  def _lr_for(self, var, value, dtype):
    if self.alt_lr_schedules is None or self.variable_search is None:
      return super()._lr_for(var, value, dtype)
    matched = [i for i, pattern in enumerate(self.variable_search)
               if re.search(pattern, var.name) is not None]
    if not matched:
      return super()._lr_for(var, value, dtype)
    i = matched[-1]
    rate = compute_lr_for_step(self.alt_lr_schedules, value,
                               self.train_steps)[i]
    return self._hparam(var.mesh, "lr/alt_%d" % i, rate, dtype)


__all__ = ["Optimizer", "reduce_rms", "get_global_step", "in_variable_layouts",
           "clip_by_global_norm"]
