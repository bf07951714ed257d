"""Optimizers, learning-rate schedules, gradient clipping and a global step.

Mesh TensorFlow's optimizers built from meshtf ops. Every state ("slot")
variable has its parameter's shape, so it gets the parameter's layout and the
update is computed slice by slice: SGD, momentum and Adam add no
communication to what the gradient itself needs. Adafactor's parameter scale
and update clipping need scalar RMS values and its factored accumulators
need row/column means: reductions that the lowering allreduces over the mesh
axes of the reduced dims (small: one scalar, or one row/column per slice).

Updates are computed in float32 (float64 for float64 variables) whatever the
variable's stored or activation dtype, and applied with assign / assign_sub,
which cast back to the variable's dtype.

Steps. Hyperparameters may be numbers, scalar meshtf Tensors, or functions of
the step (a float32 scalar Tensor counting the updates applied before this
one). `apply_grads(..., step=s)` uses your step (e.g. from get_global_step);
otherwise an optimizer that needs a step makes its own counter variable
"optimizer_step" and increments it (a second optimizer in the same graph
gets "optimizer_step_1": pass one step to both to share it). The
schedules live in meshtf/models/schedules.py; optimize re-exports them.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import optimize
  >>> def build(mesh, x_tf):
  ...   w = mtf.get_variable(mesh, "w", "io:4;hidden:8")
  ...   x = mtf.import_tf_tensor(mesh, x_tf, "batch:2;io:4")
  ...   loss = mtf.reduce_mean(mtf.square(
  ...       mtf.einsum([x, w], output_shape="batch:2;hidden:8")))
  ...   grads = mtf.gradients([loss], [w])
  ...   optimize.AdamWeightDecayOptimizer(1e-3).apply_grads(grads, [w])
  ...   return loss
  >>> step = mtf.MeshFunction(build, impl)   # slot variables "w/slot_m", ...
"""
import re
import weakref

from absl import logging
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.ops import annotations
from meshtf.ops import elementwise
from meshtf.ops import initializers
from meshtf.ops import io
from meshtf.ops import reductions
from meshtf.ops import variables as variables_lib
# The schedules are optimize's names too (Mesh TF's optimize.py held
# product_learning_rate and compute_lr_for_step).
from meshtf.models.schedules import _maximum
from meshtf.models.schedules import compute_lr_for_step
from meshtf.models.schedules import constant
from meshtf.models.schedules import linear_decay
from meshtf.models.schedules import linear_warmup
from meshtf.models.schedules import product_learning_rate
from meshtf.models.schedules import product_schedule
from meshtf.models.schedules import rsqrt_decay
from meshtf.models.schedules import step_num
from meshtf.models.schedules import warmup_then_decay


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


class SgdOptimizer(Optimizer):
  """Plain SGD: var -= lr * grad.

  Example:
    >>> ops = SgdOptimizer(0.1).apply_grads(grads, [w, b])
  """

  def __init__(self, lr):
    self._lr = lr

  lr = property(lambda self: self._lr)

  def _update(self, grad, var, value):
    lr = self._lr_for(var, self._lr, grad.dtype)
    # assign_sub rather than assign(var - ...): a low-precision variable
    # rounds only the increment, as in Mesh TensorFlow.
    return [variables_lib.assign_sub(var, grad * lr)]


class MomentumOptimizer(Optimizer):
  """SGD with momentum, in Mesh TensorFlow's form:
  velocity = momentum * velocity - lr * grad;  var += velocity.
  State: '<var>/slot_velocity'. (With a constant lr this is TensorFlow's
  momentum; with a schedule, lr scales each gradient when it enters.)

  Example:
    >>> ops = MomentumOptimizer(0.1, 0.9).apply_grads(grads, [w, b])
  """

  def __init__(self, learning_rate, momentum):
    self._lr = learning_rate
    self._momentum = momentum

  lr = property(lambda self: self._lr)
  momentum = property(lambda self: self._momentum)

  def _update(self, grad, var, value):
    lr = self._lr_for(var, self._lr, grad.dtype)
    momentum = self._hparam(var.mesh, "momentum", self._momentum, grad.dtype)
    velocity = _slot(var, "velocity", dtype=grad.dtype)
    new_velocity = velocity * momentum - grad * lr
    return [variables_lib.assign(velocity, new_velocity),
            variables_lib.assign_add(var, new_velocity)]


class AdamWeightDecayOptimizer(Optimizer):
  """Adam with decoupled weight decay (AdamW), as Mesh TensorFlow / BERT,
  plus meshtf's optional bias correction (off by default, as Mesh TF).

    m = beta_1 m + (1 - beta_1) g;   v = beta_2 v + (1 - beta_2) g^2
    by default m_hat = m, v_hat = v (Mesh TensorFlow's update); with
    bias_correction=True (t = step + 1):
      m_hat = m / (1 - beta_1^t),  v_hat = v / (1 - beta_2^t)
    var -= learning_rate * (m_hat / (sqrt(v_hat) + epsilon)
                            + weight_decay_rate * var)

  Weight decay is skipped for variables whose name matches a regex in
  exclude_from_weight_decay. State: '<var>/slot_m', '<var>/slot_v', and the
  step counter when bias_correction is on and no step is given.

  Example:
    >>> opt = AdamWeightDecayOptimizer(1e-3, weight_decay_rate=0.01,
    ...                                exclude_from_weight_decay=["bias"],
    ...                                bias_correction=True)
    >>> ops = opt.apply_grads(grads, [w, b])
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               bias_correction=False):
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay
    self.bias_correction = bias_correction

  def _do_use_weight_decay(self, param_name):
    if not self.weight_decay_rate:
      return False
    for r in self.exclude_from_weight_decay or ():
      if re.search(r, param_name) is not None:
        return False
    return True

  def _bias_corrections(self, mesh, dtype):
    """(1 - beta_1^t, 1 - beta_2^t), t = step + 1: scalars made once per
    graph and shared by all variables."""
    cache = self._state(mesh.graph).hparams
    key = ("bias_corrections", dtype)
    if key not in cache:
      t = _cast(self.step(mesh), dtype) + 1.0
      cache[key] = tuple(1.0 - _pow(beta, t)
                         for beta in (self.beta_1, self.beta_2))
    return cache[key]

  def _update(self, grad, var, value):
    mesh, dtype = var.mesh, grad.dtype
    lr = self._lr_for(var, self.learning_rate, dtype)
    m = _slot(var, "m", dtype=dtype)
    v = _slot(var, "v", dtype=dtype)
    next_m = m * self.beta_1 + grad * (1.0 - self.beta_1)
    next_v = v * self.beta_2 + elementwise.square(grad) * (1.0 - self.beta_2)
    m_hat, v_hat = next_m, next_v
    if self.bias_correction:
      c1, c2 = self._bias_corrections(mesh, dtype)
      m_hat, v_hat = next_m / c1, next_v / c2
    update = m_hat / (elementwise.sqrt(v_hat) + self.epsilon)
    # Decoupled decay: adding |w|^2 to the loss would be rescaled by Adam's
    # second moment, which is not weight decay.
    if self._do_use_weight_decay(var.name):
      update += value * self.weight_decay_rate
    return [variables_lib.assign_sub(var, update * lr),
            variables_lib.assign(m, next_m),
            variables_lib.assign(v, next_v)]


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


class AdamWithMultiLRSchedule(_MultiLRSchedule, AdamWeightDecayOptimizer):
  """AdamWeightDecayOptimizer with other learning-rate schedules for some
  variables (see AdafactorWithMultiLRSchedule); learning_rate and the other
  Adam options are keyword arguments.

  Example:
    >>> opt = AdamWithMultiLRSchedule(
    ...     variable_search=["bias"], alt_lr_schedules=[[0.1]],
    ...     learning_rate=1e-3)
    >>> ops = opt.apply_grads(grads, variables)
  """

  def __init__(self, variable_search=None, alt_lr_schedules=None,
               train_steps=524288, **kwargs):
    super().__init__(**kwargs)
    self._init_schedules(variable_search, alt_lr_schedules, train_steps)


def make_optimizer(name, learning_rate, **kwargs):
  """An optimizer by name: 'sgd', 'momentum', 'adam' or 'adafactor'; or,
  as Mesh TF's make_optimizer(hparams, lr), by hparams.optimizer: "SGD",
  or "Adafactor" (adafactor_optimizer_from_hparams).

  Example:
    >>> opt = make_optimizer("adam", 1e-3, weight_decay_rate=0.01)
  """
  if not isinstance(name, str):
    hparams = name
    if hparams.optimizer == "SGD":
      return SgdOptimizer(learning_rate)
    if hparams.optimizer == "Adafactor":
      return adafactor_optimizer_from_hparams(hparams, learning_rate)
    raise ValueError("make_optimizer: unknown hparams.optimizer %r (Mesh "
                     "TF's hparams form takes 'SGD' or 'Adafactor')"
                     % (hparams.optimizer,))
  classes = {"sgd": SgdOptimizer, "momentum": MomentumOptimizer,
             "adam": AdamWeightDecayOptimizer,
             "adafactor": AdafactorOptimizer}
  key = name.lower()
  if key not in classes:
    raise ValueError("Unknown optimizer %r; use one of %s" %
                     (name, sorted(classes)))
  if key == "adafactor":
    return AdafactorOptimizer(learning_rate=learning_rate, **kwargs)
  return classes[key](learning_rate, **kwargs)


# Adafactor lives in its own module; optimize keeps its names.
from meshtf.models.adafactor import AdafactorOptimizer  # noqa: E402
from meshtf.models.adafactor import AdafactorWithMultiLRSchedule  # noqa: E402,E501
from meshtf.models.adafactor import adafactor_decay_rate_adam  # noqa: E402
from meshtf.models.adafactor import adafactor_decay_rate_pow  # noqa: E402
from meshtf.models.adafactor import adafactor_optimizer_from_hparams  # noqa: E402,E501


__all__ = [
    "Optimizer", "SgdOptimizer", "MomentumOptimizer",
    "AdamWeightDecayOptimizer", "AdafactorOptimizer",
    "AdafactorWithMultiLRSchedule", "AdamWithMultiLRSchedule",
    "adafactor_decay_rate_pow", "adafactor_decay_rate_adam",
    "adafactor_optimizer_from_hparams", "make_optimizer",
    "clip_by_global_norm", "in_variable_layouts", "reduce_rms",
    "get_global_step", "step_num", "constant", "linear_warmup",
    "rsqrt_decay", "linear_decay", "product_schedule", "warmup_then_decay",
    "product_learning_rate", "compute_lr_for_step",
]
