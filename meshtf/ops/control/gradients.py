"""custom_gradient and recompute_grad: a function's operations with a
gradient of the caller's choosing, and the recomputation of a function's
operations inside its gradient (meshtf/models/remat.py's mechanism).

Example:
  >>> y = gradients.recompute_grad(lambda x: [mtf.relu(x * w)], [x])[0]
"""
# The ops here own sub-graphs and reach into each other's parts.
# pylint: disable=protected-access
import copy

from meshtf import autodiff
from meshtf import graph as graph_lib
from meshtf.op_kinds import CostKind
from meshtf.ops.control.loops import WhileLoopOperation
from meshtf.ops.control.subgraphs import _capture
from meshtf.ops.control.subgraphs import _is_source
from meshtf.ops.control.subgraphs import _external_inputs
from meshtf.ops.control.subgraphs import _check_tensors
from meshtf.ops.passthrough import depend


# --- custom_gradient and recompute_grad --------------------------------------
class CustomGradientOperation(graph_lib.Operation):
  """Passes fn's outputs through; its gradient is grad_fn's (Mesh
  TensorFlow's CustomGradientOperation). The forward operations stay in the
  graph and are lowered as usual; this op only aliases their outputs.

  grad_fn is called with keyword arguments explicit_inputs, all_inputs,
  forward_operations, outputs and output_grads, and returns one gradient
  (or None) per tensor of all_inputs. An output no gradient reaches gets
  None in output_grads, as in Mesh TF (revnets pass activations back that
  way).
  """

  takes_missing_output_grads = True
  # Priced as a kernel of no flops and no bytes (op_cost: every output is
  # an alias).
  cost_kind = CostKind.KERNEL

  def __init__(self, explicit_inputs, all_inputs, fn_outputs, grad_fn,
               forward_operations, name=None, check_internals=True):
    super().__init__(list(all_inputs) + list(fn_outputs),
                     name=name or "custom_gradient")
    self._check_internals = check_internals
    self._n_explicit = len(explicit_inputs)
    self._n_all = len(all_inputs)
    self._grad_fn = grad_fn
    self._forward_operations = list(forward_operations)
    self._created_inputs = list(self._inputs)
    self._grad_made = set()  # ops grad_fn made (they may read internals)
    self._outputs = [graph_lib.Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(fn_outputs)]

  # Read from _inputs, so a clone (recompute_grad) sees its own tensors.
  all_inputs = property(lambda self: self._inputs[:self._n_all])
  # Output i is fn's output i (the same lowered value): the plan counts its
  # memory once.
  output_aliases = property(lambda self: {
      i: self._n_all + i for i in range(len(self._outputs))})
  explicit_inputs = property(lambda self: self._inputs[:self._n_explicit])

  def keeps_pending(self, pending_axes, layout):
    """Its outputs are its function's values, pending sums or not."""
    return True
  fn_outputs = property(lambda self: self._inputs[self._n_all:])

  def lower(self, lowering):
    for fo, out in zip(self.fn_outputs, self._outputs):
      lowering.set_tensor_lowering(out, lowering.pending_or_laid_out(fo))

  def _check_internals_unused(self):
    internal = set()
    for op in self._forward_operations:
      if not _is_source(op):
        internal.update(op.outputs)
    internal -= set(self._created_inputs)
    inside = set(self._forward_operations) | {self}
    for op in self.graph.operations:
      if op in inside or op in self._grad_made:
        continue
      for t in op.inputs:
        if t in internal:
          raise ValueError(
              "custom_gradient %r: %s, an intermediate tensor of its "
              "function, is read by %r outside the function; its gradient "
              "would bypass grad_fn. Return it from the function instead"
              % (self.name, t.name, op.name))

  def _adopt_copies(self, copies):
    """Makes this op (a copy clone_operations just made) own the copies
    of its forward operations that the same cloning made, {original op:
    copy}, when every one was copied: its gradient then reads those
    copies' outputs instead of re-creating the forward ops a second time
    (recompute_grad of an enclosing function would otherwise run a norm's
    or a softmax's forward twice in the backward pass: once for the
    recomputed block's values, once more for this op's gradient)."""
    computed = [op for op in self._forward_operations if not _is_source(op)]
    if not all(op in copies for op in computed):
      return
    self._forward_operations = [copies.get(op, op)
                                for op in self._forward_operations]
    self._created_inputs = list(self._inputs)
    self._grad_made = set()

  def gradient(self, grad_ys):
    if self._check_internals:
      self._check_internals_unused()
    forward_operations, outputs = self._forward_operations, self.fn_outputs
    if self._inputs != self._created_inputs:
      # A copy whose forward ops were not copied with it: grad_fn gets the
      # forward ops re-created on this copy's inputs.
      forward_operations, mapping = clone_operations(
          forward_operations,
          dict(zip(self._created_inputs[:self._n_all], self.all_inputs)))
      outputs = [mapping.get(t, t)
                 for t in self._created_inputs[self._n_all:]]
    graph = self.graph
    n_vars, first = len(graph.all_variables), len(graph.operations)
    grads = self._grad_fn(explicit_inputs=self.explicit_inputs,
                          all_inputs=self.all_inputs,
                          forward_operations=forward_operations,
                          outputs=outputs, output_grads=list(grad_ys))
    self._grad_made.update(graph.operations[first:])
    if len(graph.all_variables) != n_vars:
      raise ValueError("custom_gradient %r: grad_fn created variables %s; "
                       "create them in the forward function" % (
                           self.name, [v.name for v in
                                       graph.all_variables[n_vars:]]))
    grads = list(grads)
    if len(grads) != self._n_all:
      raise ValueError(
          "custom_gradient %r: grad_fn returned %d gradients for %d inputs "
          "(all_inputs: %s); return one (or None) per tensor of all_inputs"
          % (self.name, len(grads), self._n_all,
             [t.name for t in self.all_inputs]))
    for g, t in zip(grads, self.all_inputs):
      if g is not None and (not isinstance(g, graph_lib.Tensor) or
                            g.shape != t.shape):
        raise ValueError(
            "custom_gradient %r: the gradient for %s %s is %r; it must be a "
            "meshtf Tensor of the same shape" % (self.name, t.name, t.shape, g))
    return grads + [None] * len(self.fn_outputs)


class _KeptMixin(object):
  """A copy of an operation whose outputs were kept from the forward pass
  (recompute_grad's keep=): it computes nothing -- its outputs are the
  kept values, its last inputs -- but differentiates as the original on
  the recomputed operands, its first inputs."""

  # It computes nothing, whatever the original does: priced as a kernel of
  # no flops and no bytes (op_cost: every output is an alias), none of the
  # original's plan facts.
  cost_kind = CostKind.KERNEL
  sums_partials = False
  elementwise = False
  matrix_unit = False
  reshapes = False

  def keeps_pending(self, pending_axes, layout):
    """Its outputs are the kept values, pending sums or not."""
    return True

  def lower(self, lowering):
    for out, kept in zip(self._outputs, self._inputs[self._n_operands:]):
      lowering.set_tensor_lowering(out, lowering.pending_or_laid_out(kept))

  @property
  def output_aliases(self):
    return {i: self._n_operands + i for i in range(len(self._outputs))}

  def gradient(self, grad_ys):
    original = copy.copy(self)
    original.__class__ = self._original_class
    original._inputs = self._inputs[:self._n_operands]
    grads = list(self._original_class.gradient(original, grad_ys))
    return grads + [None] * (len(self._inputs) - self._n_operands)


_KEPT_CLASSES = {}


def _kept_copy(op, operands, kept_values):
  """A copy of op on `operands` whose outputs are kept_values (_KeptMixin)."""
  cls = type(op)
  if cls not in _KEPT_CLASSES:
    _KEPT_CLASSES[cls] = type("Kept" + cls.__name__, (_KeptMixin, cls), {})
  new = copy.copy(op)
  new.__class__ = _KEPT_CLASSES[cls]
  new._original_class = cls
  new._n_operands = len(operands)
  new._inputs = list(operands) + list(kept_values)
  return new


def clone_operations(ops, input_mapping, kept_values=None):
  """Copies ops onto other inputs (Mesh TensorFlow's
  Graph.clone_operations): input_mapping maps original tensors to
  replacements; returns (the new operations, input_mapping extended with
  original output -> copy). Variables and host imports are not copied.
  Copies keep their names, so a random op draws the same numbers.
  kept_values: {original output: value} for ops whose outputs are not
  recomputed: their copies give those values and differentiate as the
  originals (recompute_grad's keep=).

  Example:
    >>> new_ops, mapping = control.clone_operations(ops, {x: x2})
  """
  mapping = dict(input_mapping)
  kept_values = kept_values or {}
  graph, new_ops = None, []
  copies = {}   # original op -> its copy
  for op in ops:
    if _is_source(op):
      continue
    graph = op.graph
    operands = [mapping.get(t, t) for t in op.inputs]
    if op.outputs and all(t in kept_values for t in op.outputs):
      new = _kept_copy(op, operands, [kept_values[t] for t in op.outputs])
    else:
      new = copy.copy(op)
      new._inputs = operands
    if isinstance(new, WhileLoopOperation):
      new._grad_ops = []
    elif isinstance(new, CustomGradientOperation) and not isinstance(
        new, _KeptMixin):
      # A custom gradient copied with its function's ops (they come
      # before it): its gradient reads those copies.
      new._adopt_copies(copies)
    copies[op] = new
    new._outputs = [graph_lib.Tensor(new, t.shape, t.dtype, index=i)
                    for i, t in enumerate(op.outputs)]
    for t, c in zip(op.outputs, new.outputs):
      if t in input_mapping:
        raise ValueError("clone_operations: input_mapping maps %s, an output "
                         "of the cloned op %r" % (t.name, op.name))
      mapping[t] = c
    graph.operations.append(new)
    new_ops.append(new)
  return new_ops, mapping


def custom_gradient(fn, grad_fn, explicit_inputs, check_internals=True):
  """fn(*explicit_inputs), whose gradient is given by grad_fn (Mesh
  TensorFlow's custom_gradient).

  all_inputs are explicit_inputs followed by the float tensors fn reads from
  outside (e.g. variables). grad_fn(explicit_inputs=..., all_inputs=...,
  forward_operations=..., outputs=..., output_grads=...) returns one
  gradient (or None) per tensor of all_inputs. output_grads holds None for
  an output no gradient reaches (Mesh TF's convention). fn's intermediate tensors
  must not be used outside fn; mtf.gradients checks that (a walk of the
  whole graph per custom gradient), unless check_internals=False says the
  caller guarantees it (a library function that returns everything it
  makes visible).

  Example:
    >>> def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
    ...             output_grads):
    ...   return [output_grads[0] * 2.0]          # twice the true gradient
    >>> y = control.custom_gradient(lambda x: x * 1.0, grad_fn, [x])
  """
  explicit_inputs = _check_tensors("custom_gradient", "explicit_inputs",
                                   explicit_inputs)
  graph = explicit_inputs[0].graph
  outputs, forward_operations = _capture(graph,
                                         lambda: fn(*explicit_inputs))
  graph.operations.extend(forward_operations)  # lowered as usual
  returns_tuple = isinstance(outputs, (tuple, list))
  outputs = list(outputs) if returns_tuple else [outputs]
  for o in outputs:
    if not isinstance(o, graph_lib.Tensor):
      raise TypeError("custom_gradient: fn returned %r, not meshtf Tensors"
                      % (o,))
  made = set()
  for op in forward_operations:
    if not _is_source(op):
      made.update(op.outputs)
  external = [t for t in _external_inputs(
      [op for op in forward_operations if not _is_source(op)])
              if t not in made and t not in explicit_inputs
              and t.dtype.is_floating]
  op = CustomGradientOperation(explicit_inputs, explicit_inputs + external,
                               outputs, grad_fn, forward_operations,
                               check_internals=check_internals)
  return tuple(op.outputs) if returns_tuple else op.outputs[0]


def _recompute_grad_grad(explicit_inputs, all_inputs, forward_operations,
                         outputs, output_grads, control_dependencies=True,
                         keep=None):
  """recompute_grad's grad_fn: copies the forward ops (but those `keep`
  selects, whose outputs the forward pass keeps) and differentiates the
  copies, so the other forward activations need not be kept."""
  computed = [op for op in forward_operations if not _is_source(op)]
  kept = [op for op in computed if keep is not None and keep(op)]
  grads_in = [g for g in output_grads if g is not None]

  def gated(t):
    # The copies wait for the output gradients: they run in the backward
    # pass (TF's executor would otherwise start those that depend only on
    # weights or kept tensors in the forward pass and hold their results),
    # and TensorFlow cannot merge them with the originals.
    return depend(t, grads_in) if control_dependencies else t
  mapping = {t: gated(t) for t in _external_inputs(computed)}
  kept_values = {t: gated(t) for op in kept for t in op.outputs}
  ops, mapping = clone_operations(forward_operations, mapping, kept_values)
  reached = [(mapping.get(t, t), g) for t, g in zip(outputs, output_grads)
             if g is not None]
  # Integer inputs (ids, positions) have no gradient: mtf.gradients refuses
  # them as xs, so they are left out and get None.
  xs = [mapping.get(t, t) for t in all_inputs]
  floating = [i for i, t in enumerate(xs)
              if t.dtype.is_floating or t.dtype.is_complex]
  grads = [None] * len(xs)
  if not floating:
    return grads
  for i, g in zip(floating, autodiff.gradients(
      [t for t, _ in reached], [xs[i] for i in floating],
      grad_ys=[g for _, g in reached], operations=ops)):
    grads[i] = g
  return grads


def recompute_grad(fn, explicit_inputs, control_dependencies=True,
                   keep=None):
  """fn(*explicit_inputs), recomputed in the backward pass: its gradient
  re-runs fn's operations instead of keeping their activations (Mesh
  TensorFlow's recompute_grad). Values and gradients are those of fn.

  keep: None (recompute every op from the inputs) or a predicate on fn's
  operations: the outputs of those it selects are kept from the forward
  pass and the rest recomputed from them (e.g. keep the einsums' outputs,
  recompute the elementwise ops and softmaxes between them: JAX's
  dots-saveable policy). With control_dependencies (the default) the
  recomputation waits for the output gradients, so it runs in the
  backward pass.

  Example:
    >>> y = control.recompute_grad(lambda x: mtf.relu(mtf.einsum([x, w],
    ...                            output_shape=[batch, hidden])), [x])
  """
  def grad_fn(**kwargs):
    return _recompute_grad_grad(control_dependencies=control_dependencies,
                                keep=keep, **kwargs)
  return custom_gradient(fn, grad_fn, explicit_inputs)
