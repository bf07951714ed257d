"""Control ops: while_loop (differentiable), custom_gradient and
recompute_grad (depend and Print are in passthrough.py,
serialize_training_step in microbatch.py).

A while loop's cond and body are meshtf sub-graphs: they are built once, kept
out of graph.operations, and lowered by the loop itself inside a
tf.while_loop. On the SPMD backend that loop sits inside the per-device
program, so a body may hold collectives (an einsum over a split dim is an
allreduce in every iteration).

Gradients of a while loop: the forward loop records each iteration's loop
state (one TensorArray per slice); a backward tf.while_loop walks the
iterations in reverse, re-runs the body's forward ops from the recorded state
and then the body's meshtf gradient, carrying the loop variables'
cotangents and summing the gradients of the tensors the body reads from
outside (weights). Only the loop state is kept per iteration, not the body's
activations.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> from meshtf.ops import control
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4")
  >>> i, y = control.while_loop(lambda i, x: mtf.less(i, 3),
  ...                           lambda i, x: [i + 1, x * 2.0],
  ...                           [mtf.constant(mesh, 0, dtype=tf.int32), x])
  >>> y.shape
  Shape([batch:4])
"""
# The ops here own sub-graphs and reach into each other's parts.
# pylint: disable=protected-access
import copy

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from meshtf import autodiff
from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import pending as pending_lib
# depend and Print live in passthrough.py; control.depend etc. still work.
from meshtf.ops.passthrough import DependOperation  # noqa: F401
from meshtf.ops.passthrough import Print  # noqa: F401
from meshtf.ops.passthrough import PrintOperation  # noqa: F401
from meshtf.ops.passthrough import depend  # noqa: F401


# --- sub-graph helpers -------------------------------------------------------
class _Parameters(graph_lib.Operation):
  """Placeholders for values a sub-graph receives when it is lowered (a
  loop's state, a cotangent). Not in graph.operations: the op owning the
  sub-graph binds lowering.tensors[t] before lowering the sub-graph."""

  def __init__(self, like, mesh, name):
    super().__init__([], mesh=mesh, name=name)
    mesh.graph.operations.pop()  # just appended by Operation.__init__
    self._outputs = [graph_lib.Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(like)]

  def lower(self, lowering):
    raise ValueError("%s stands for values bound by the op that owns it; it "
                     "is never lowered on its own" % self.name)


def _capture(graph, fn):
  """(fn(), the operations fn added), the latter removed from the graph."""
  n = len(graph.operations)
  out = fn()
  ops = graph.operations[n:]
  del graph.operations[n:]
  return out, ops


def _is_source(op):
  # Variables and host-side imports: a backend sets them up before lowering
  # (the SPMD program takes them as arguments), so they live at top level.
  return op.creates_variable_slices or op.imports_host_slices


def _hoist_sources(graph, ops):
  """Moves the sources among ops to the end of graph.operations (before the
  op about to own the rest); returns the rest."""
  rest = []
  for op in ops:
    if _is_source(op):
      graph.operations.append(op)
    else:
      rest.append(op)
  return rest


def _external_inputs(ops, bound=()):
  """Tensors that ops read and none of them makes (nor `bound` holds), in
  order of first use."""
  made = set(bound)
  for op in ops:
    made.update(op.outputs)
  out, seen = [], set()
  for op in ops:
    for t in op.inputs:
      if t not in made and t not in seen:
        seen.add(t)
        out.append(t)
  return out


def _live_ops(ops, needed):
  """The ops among `ops` (in order) that `needed` tensors depend on."""
  live, keep = set(needed), []
  for op in reversed(ops):
    if any(t in live for t in op.outputs):
      keep.append(op)
      live.update(op.inputs)
  keep.reverse()
  return keep


def _check_tensors(op_name, arg, xs):
  xs = list(xs)
  if not xs:
    raise ValueError("%s: %s must be a non-empty list of meshtf Tensors"
                     % (op_name, arg))
  for x in xs:
    if not isinstance(x, graph_lib.Tensor):
      raise TypeError("%s: %s holds %r, which is not a meshtf Tensor"
                      % (op_name, arg, x))
  return xs


def _bind(lowering, impl, params, slice_lists):
  for p, slices in zip(params, slice_lists):
    lowering.set_tensor_lowering(p, impl.LaidOutTensor(list(slices)))


def _zeros(impl, tensor):
  shape, dtype = impl.slice_shape(tensor.shape), tensor.dtype
  return impl.slicewise(lambda: tf.zeros(shape, dtype))


def _accumulate(lowering, impl, tensor, acc_slices, pending_axes, key):
  """acc + the value of `tensor`. A sum still pending is added unreduced
  (its mesh axes noted under `key`): the partial sums add up across
  iterations and are reduced once, after the loop."""
  raw = lowering.tensors.raw(tensor)
  if isinstance(raw, pending_lib.PendingSum) and not raw.materialized:
    pending_axes[key] = raw.mesh_axes
    part = raw.laid_out
  else:
    pending_axes.pop(key, None)
    part = lowering.tensors[tensor]
  return impl.slicewise(tf.add, part, impl.LaidOutTensor(list(acc_slices))
                        ).tensor_list


def _finish_sum(impl, slices, pending_axes, key):
  value = impl.LaidOutTensor(list(slices))
  if key in pending_axes:
    value = pending_lib.PendingSum(impl, value, pending_axes[key])
  return value


def _tf_while_loop(impl, cond, body, loop_vars, **kwargs):
  """tf.while_loop that stays a functional While op in an SPMD program.

  Lowered to Switch/Merge frames, a loop's collectives would never meet:
  TensorFlow keys them by frame id, which differs between the devices'
  copies of the program (measured: allreduce in a lowered loop times out;
  kept functional, every iteration's collectives complete, reusing the
  traced instance keys in order on the ordering token).
  """
  graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  before = len(graph.get_operations()) if graph is not None else 0
  out = tf.while_loop(cond, body, loop_vars, **kwargs)
  if graph is not None and impl.is_spmd:
    for op in graph.get_operations()[before:]:
      if op.type in ("While", "StatelessWhile"):
        op._set_attr("_lower_using_switch_merge",
                     attr_value_pb2.AttrValue(b=False))
  return out


# --- while_loop --------------------------------------------------------------
_TF_WHILE_KWARGS = ("maximum_iterations", "parallel_iterations", "swap_memory")


class _LoopRecord(object):
  """What a lowered forward loop leaves for its gradient: the trip count
  and {loop variable index: its states stacked [steps, slice...]} for the
  loop variables the gradient reads."""

  def __init__(self, steps, history):
    self.steps = steps
    self.history = history


class WhileLoopOperation(graph_lib.Operation):
  """A while loop over meshtf tensors, lowered to one tf.while_loop.

  The op's inputs are the loop variables' initial values followed by the
  tensors cond_fn/body_fn read from outside (so gradients reach them). With
  has_accumulators, body_fn may return more tensors than there are loop
  variables: each extra one is summed over the iterations (starting from
  zero) and becomes an extra output; a sum still pending (e.g. an einsum
  over a split dim) is reduced once after the loop, not per iteration.
  """

  def __init__(self, cond_fn, body_fn, inputs, tf_kwargs=None,
               has_accumulators=False, name=None):
    inputs = _check_tensors("while_loop", "inputs", inputs)
    mesh, graph = inputs[0].mesh, inputs[0].graph
    base = name or "while_loop"
    tf_kwargs = dict(tf_kwargs or {})
    self._back_prop = bool(tf_kwargs.pop("back_prop", True))
    unknown = sorted(set(tf_kwargs) - set(_TF_WHILE_KWARGS))
    if unknown:
      raise ValueError("while_loop %r: unsupported tf.while_loop arguments %s;"
                       " use only %s" % (base, unknown, list(_TF_WHILE_KWARGS)))
    n = len(inputs)
    cond_in = _Parameters(inputs, mesh, base + "/cond_input")
    cond_out, cond_ops = _capture(graph, lambda: cond_fn(*cond_in.outputs))
    if (not isinstance(cond_out, graph_lib.Tensor) or cond_out.dtype != tf.bool
        or cond_out.shape.ndims):
      raise ValueError(
          "while_loop %r: cond_fn must return a scalar bool meshtf Tensor (a "
          "shape [] tensor, the same on every processor, so all of them run "
          "the same number of iterations); it returned %r" % (base, cond_out))
    body_in = _Parameters(inputs, mesh, base + "/body_input")

    def build_body():
      outs = body_fn(*body_in.outputs)
      if isinstance(outs, graph_lib.Tensor):
        outs = [outs]
      outs = list(outs)
      for i, t in enumerate(outs):
        if not isinstance(t, graph_lib.Tensor):
          raise TypeError("while_loop %r: body_fn output %d is %r, not a "
                          "meshtf Tensor" % (base, i, t))
      return outs
    (body_out, body_ops) = _capture(graph, build_body)
    if len(body_out) < n or (len(body_out) > n and not has_accumulators):
      raise ValueError(
          "while_loop %r: body_fn returned %d tensors for %d loop variables; "
          "it must return one per loop variable%s" % (
              base, len(body_out), n, "" if has_accumulators else
              " (extra outputs are accumulators: pass has_accumulators=True)"))
    for i, (x, y) in enumerate(zip(inputs, body_out)):
      if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            "while_loop %r: loop variable %d enters as %s %s but body_fn "
            "returns %s %s; shape and dtype must stay the same" % (
                base, i, x.shape, x.dtype.name, y.shape, y.dtype.name))
    # Each body output must be made inside the body (lowered per iteration):
    # a loop variable passed through or an outside tensor gets an identity.
    made = set(t for op in body_ops for t in op.outputs)
    from meshtf.ops import elementwise
    fixed, extra = _capture(graph, lambda: [
        t if t in made else elementwise.identity(t) for t in body_out])
    body_ops += extra
    cond_ops = _hoist_sources(graph, cond_ops)
    body_ops = _hoist_sources(graph, body_ops)
    captured = _external_inputs(cond_ops + body_ops,
                                cond_in.outputs + body_in.outputs)
    super().__init__(inputs + captured, mesh=mesh, name=base)
    self._n = n
    self._tf_kwargs = tf_kwargs
    self._cond_in, self._cond_out, self._cond_ops = cond_in, cond_out, cond_ops
    self._body_in, self._body_out, self._body_ops = body_in, fixed, body_ops
    self._captured = captured
    self._grad_ops = []
    self._outputs = [graph_lib.Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(fixed)]

  num_loop_vars = property(lambda self: self._n)

  @property
  def inner_operations(self):
    return self._cond_ops + self._body_ops

  def gradient(self, grad_ys):
    if not self._back_prop:
      raise ValueError(
          "while_loop %r was built with back_prop=False, so it has no "
          "gradient; build it without back_prop to differentiate it"
          % self.name)
    grad_op = WhileLoopGradOperation(self, grad_ys)
    self._grad_ops.append(grad_op)
    return grad_op.input_gradients()

  def _recorded_state(self, lowering):
    """Indices of the loop variables whose every state the gradients in
    the graph read (mtf.gradients may have dropped a gradient as unneeded).
    Only those are recorded."""
    if not self._grad_ops:
      return []
    ops = set(graph_lib.all_operations(lowering.graph.operations))
    return sorted(set(i for g in self._grad_ops if g in ops
                      for i in g.state_used))

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    n = self._n
    init = [lowering.tensors[t].tensor_list for t in self._inputs[:n]]
    for t in self._captured:
      # Read (and reduce, if pending) outside the tf.while_loop, once.
      lowering.tensors[t]  # pylint: disable=pointless-statement
    accs = [_zeros(impl, t).tensor_list for t in self._body_out[n:]]
    recorded = self._recorded_state(lowering)
    history = [impl.slicewise(
        lambda s: tf.TensorArray(s.dtype, size=0, dynamic_size=True,
                                 element_shape=s.shape),
        impl.LaidOutTensor(init[i])).tensor_list for i in recorded]
    pending_axes = {}

    def cond(step, state, acc, hist):
      del step, acc, hist
      _bind(lowering, impl, self._cond_in.outputs, state)
      for op in self._cond_ops:
        lowering.lower_operation(op)
      return lowering.tensors[self._cond_out].tensor_list[0]

    def body(step, state, acc, hist):
      hist = [impl.slicewise(lambda ta, s: ta.write(step, s),
                             impl.LaidOutTensor(tas),
                             impl.LaidOutTensor(state[i])).tensor_list
              for i, tas in zip(recorded, hist)]
      _bind(lowering, impl, self._body_in.outputs, state)
      for op in self._body_ops:
        lowering.lower_operation(op)
      new_state = [lowering.tensors[t].tensor_list for t in self._body_out[:n]]
      new_acc = [_accumulate(lowering, impl, t, a, pending_axes, j)
                 for j, (t, a) in enumerate(zip(self._body_out[n:], acc))]
      return step + 1, new_state, new_acc, hist

    steps, state, acc, hist = _tf_while_loop(
        impl, cond, body, (tf.constant(0), init, accs, history),
        **self._tf_kwargs)
    for t, slices in zip(self._outputs[:n], state):
      lowering.set_tensor_lowering(t, impl.LaidOutTensor(list(slices)))
    for j, (t, slices) in enumerate(zip(self._outputs[n:], acc)):
      lowering.set_tensor_lowering(t, _finish_sum(impl, slices, pending_axes,
                                                  j))
    if self._grad_ops:
      lowering.operations[self] = _LoopRecord(steps, {
          i: impl.slicewise(lambda ta: ta.stack(),
                            impl.LaidOutTensor(list(tas)))
          for i, tas in zip(recorded, hist)})


class WhileLoopGradOperation(graph_lib.Operation):
  """The gradient of a WhileLoopOperation: a backward tf.while_loop over the
  forward loop's recorded iterations, last to first. Each iteration binds
  the recorded state, re-runs the body ops the backward ops need, then the
  body's meshtf gradient (a vector-Jacobian product); it carries the loop
  variables' cotangents and sums the gradients of the outside tensors
  (pending sums stay unreduced until after the loop)."""

  def __init__(self, forward, grad_ys):
    graph, mesh = forward.graph, forward.mesh
    n = forward.num_loop_vars
    outs = forward.outputs
    floats = [i for i in range(n) if outs[i].dtype.is_floating]
    accs = [j for j in range(n, len(outs)) if outs[j].dtype.is_floating]
    # Accumulators' cotangents are the same in every iteration.
    grad_ys = [grad_ys[i] for i in floats + accs]
    cotangents = _Parameters([outs[i] for i in floats + accs], mesh,
                             forward.name + "/cotangent")
    captured = [t for t in forward._captured if t.dtype.is_floating]
    body_in = forward._body_in.outputs
    body_out = forward._body_out
    xs = [body_in[i] for i in floats] + captured

    def vjp():
      try:
        return autodiff.gradients(
            [body_out[i] for i in floats + accs], xs,
            grad_ys=cotangents.outputs,
            operations=forward._body_ops)
      except (NotImplementedError, ValueError, TypeError) as e:
        raise ValueError("while_loop %r: its body cannot be differentiated: "
                         "%s" % (forward.name, e)) from e
    grads, bwd_ops = _capture(graph, vjp)
    bwd_ops = _hoist_sources(graph, bwd_ops)
    needed = _live_ops(
        forward._body_ops,
        [t for op in bwd_ops for t in op.inputs] +
        [g for g in grads if g is not None])
    _check_recomputable(forward, needed)
    ext = _external_inputs(needed + bwd_ops, body_in + cotangents.outputs)
    reads = set(t for op in needed + bwd_ops for t in op.inputs)
    reads.update(g for g in grads if g is not None)
    # The loop variables whose states the backward loop binds.
    self.state_used = [i for i in range(n) if body_in[i] in reads]
    super().__init__(outs + grad_ys + ext, mesh=mesh,
                     name=forward.name + "/gradient")
    self._forward = forward
    self._floats = floats
    self._n_grad_ys = len(grad_ys)
    self._cotangents = cotangents
    self._needed, self._bwd_ops = needed, bwd_ops
    self._ext = ext
    self._loop_grads = grads[:len(floats)]
    # Positions among the forward op's inputs (by position, not tensor: a
    # copy made by recompute_grad has other input tensors).
    positions = [n + j for j, t in enumerate(forward._captured)
                 if t.dtype.is_floating]
    kept = [(p, g) for p, g in zip(positions, grads[len(floats):])
            if g is not None]
    self._captured_grads = [g for _, g in kept]
    self._outputs = [graph_lib.Tensor(self, outs[i].shape, outs[i].dtype,
                                      index=k)
                     for k, i in enumerate(floats)]
    fwd_inputs = forward.inputs
    self._outputs += [graph_lib.Tensor(self, fwd_inputs[p].shape,
                                       fwd_inputs[p].dtype,
                                       index=len(floats) + k)
                      for k, (p, _) in enumerate(kept)]
    self._grad_at = dict(zip(floats + [p for p, _ in kept], self._outputs))

  @property
  def inner_operations(self):
    return self._bwd_ops

  @property
  def has_gradient(self):
    return False

  def input_gradients(self):
    """One gradient (or None) per input of the forward loop."""
    return [self._grad_at.get(k) for k in range(len(self._forward.inputs))]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    fwd = self._forward
    rec = lowering.operations.get(fwd)
    if not isinstance(rec, _LoopRecord):
      raise ValueError("the gradient of while_loop %r is lowered before the "
                       "loop recorded its iterations" % fwd.name)
    n_f = len(self._floats)
    grad_ys = [lowering.tensors[t].tensor_list
               for t in self._inputs[len(fwd.outputs):
                                     len(fwd.outputs) + self._n_grad_ys]]
    for t in self._ext:
      lowering.tensors[t]  # pylint: disable=pointless-statement
    acc_cotangents = grad_ys[n_f:]
    sums = [_zeros(impl, t).tensor_list for t in self._outputs[n_f:]]
    body_in = fwd._body_in.outputs
    missing = [i for i in self.state_used if i not in rec.history]
    if missing:
      raise ValueError("while_loop %r did not record loop variables %s for "
                       "its gradient" % (fwd.name, missing))
    pending_axes = {}

    def cond(k, g, c):
      del g, c
      return k >= 0

    def body(k, g, c):
      _bind(lowering, impl, [body_in[i] for i in self.state_used],
            [impl.slicewise(lambda s: tf.gather(s, k), rec.history[i]
                            ).tensor_list for i in self.state_used])
      _bind(lowering, impl, self._cotangents.outputs, list(g) + acc_cotangents)
      for op in self._needed + self._bwd_ops:
        lowering.lower_operation(op)
      new_g = []
      for i, grad in zip(self._floats, self._loop_grads):
        new_g.append(lowering.tensors[grad].tensor_list if grad is not None
                     else _zeros(impl, fwd.outputs[i]).tensor_list)
      new_c = [_accumulate(lowering, impl, grad, s, pending_axes, j)
               for j, (grad, s) in enumerate(zip(self._captured_grads, c))]
      return k - 1, new_g, new_c

    kwargs = {k: v for k, v in fwd._tf_kwargs.items()
              if k != "maximum_iterations"}
    _, g, c = _tf_while_loop(impl, cond, body,
                             (rec.steps - 1, grad_ys[:n_f], sums), **kwargs)
    for t, slices in zip(self._outputs[:n_f], g):
      lowering.set_tensor_lowering(t, impl.LaidOutTensor(list(slices)))
    for j, (t, slices) in enumerate(zip(self._outputs[n_f:], c)):
      lowering.set_tensor_lowering(t, _finish_sum(impl, slices, pending_axes,
                                                  j))


def _check_recomputable(forward, needed):
  """The backward loop re-runs `needed` (body ops) from the recorded state
  but not the body's side effects: refuse bodies whose values hang on them."""
  body = set(forward._body_ops)
  assigned = set(v for op in body for v in getattr(op, "variables", ()))
  for op in needed:
    inside = [d.name for d in getattr(op, "control_operations", ())
              if d in body]
    if inside:
      raise ValueError(
          "while_loop %r has no gradient: its body makes %r depend on "
          "operations of the body (%s), which the backward loop would have "
          "to re-run" % (forward.name, op.name, ", ".join(inside)))
    var = getattr(op, "variable", None)
    if var is not None and var in assigned:
      raise ValueError(
          "while_loop %r has no gradient: its body reads variable %r (%r) "
          "after assigning it, and the backward loop would read the final "
          "value instead of each iteration's; carry the value as a loop "
          "variable instead" % (forward.name, var.name, op.name))


def while_loop(cond_fn, body_fn, inputs, num_loop_vars=None,
               has_accumulators=False, name=None, **kwargs):
  """Mesh TensorFlow's while loop, with gradients.

  cond_fn(*loop_vars) returns a scalar bool Tensor; body_fn(*loop_vars)
  returns the new loop variables (same shapes and dtypes) and, with
  has_accumulators=True, extra tensors that are summed over the iterations
  (outputs after the loop variables; a deferred allreduce is done once,
  after the loop). Tensors the functions read from outside the loop
  (weights) receive gradients summed over the iterations. kwargs go to
  tf.while_loop (maximum_iterations, parallel_iterations, swap_memory;
  back_prop=False refuses gradients).

  num_loop_vars=k returns only the first k loop variables (and any
  accumulators), as Mesh TensorFlow did; here all inputs stay ordinary loop
  variables (Mesh TensorFlow's variable-based multi-GPU workaround is not
  needed in TF2).

  Variables and host imports created inside the functions are hoisted out
  of the loop. Random ops in the body draw the same numbers in every
  iteration (their values depend on the graph seed, the op's name and the
  element, not on the iteration). Gradients keep one copy of the loop
  state per iteration and re-run the body ops they need; a body whose values
  depend on its own side effects (depend() on a body op, reading a variable
  it assigns) has none, and mtf.gradients says so.

  Example:
    >>> def body(i, h):
    ...   return [i + 1, mtf.tanh(mtf.einsum([h, w], output_shape=h.shape))]
    >>> _, h = control.while_loop(lambda i, h: mtf.less(i, 4), body,
    ...                           [mtf.constant(mesh, 0, dtype=tf.int32), h0])
  """
  inputs = _check_tensors("while_loop", "inputs", inputs)
  if num_loop_vars is not None and not 0 < num_loop_vars <= len(inputs):
    raise ValueError("while_loop: num_loop_vars=%r must be in [1, %d] (the "
                     "number of inputs)" % (num_loop_vars, len(inputs)))
  op = WhileLoopOperation(cond_fn, body_fn, inputs, tf_kwargs=kwargs,
                          has_accumulators=has_accumulators, name=name)
  outs = op.outputs
  if num_loop_vars is None:
    return outs
  return outs[:num_loop_vars] + outs[len(inputs):]


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

  def gradient(self, grad_ys):
    if self._check_internals:
      self._check_internals_unused()
    forward_operations, outputs = self._forward_operations, self.fn_outputs
    if self._inputs != self._created_inputs:
      # A copy (recompute_grad of an enclosing function): grad_fn gets the
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


def clone_operations(ops, input_mapping):
  """Copies ops onto other inputs (Mesh TensorFlow's
  Graph.clone_operations): input_mapping maps original tensors to
  replacements; returns (the new operations, input_mapping extended with
  original output -> copy). Variables and host imports are not copied.
  Copies keep their names, so a random op draws the same numbers.

  Example:
    >>> new_ops, mapping = control.clone_operations(ops, {x: x2})
  """
  mapping = dict(input_mapping)
  graph, new_ops = None, []
  for op in ops:
    if _is_source(op):
      continue
    graph = op.graph
    new = copy.copy(op)
    if isinstance(new, WhileLoopOperation):
      new._grad_ops = []
    new._inputs = [mapping.get(t, t) for t in op.inputs]
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
  read = _external_inputs(computed)
  read += [t for op in kept for t in op.outputs]
  grads_in = [g for g in output_grads if g is not None]
  mapping = {}
  for t in read:
    # The copies wait for the output gradients: they run in the backward
    # pass (TF's executor would otherwise start those that depend only on
    # weights or kept tensors in the forward pass and hold their results),
    # and TensorFlow cannot merge them with the originals.
    mapping[t] = depend(t, grads_in) if control_dependencies else t
  kept = set(kept)
  ops, mapping = clone_operations(
      [op for op in forward_operations if op not in kept], mapping)
  reached = [(mapping.get(t, t), g) for t, g in zip(outputs, output_grads)
             if g is not None]
  grads = autodiff.gradients([t for t, _ in reached],
                             [mapping.get(t, t) for t in all_inputs],
                             grad_ys=[g for _, g in reached], operations=ops)
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


__all__ = [
    "while_loop", "custom_gradient", "recompute_grad", "depend", "Print",
    "clone_operations", "WhileLoopOperation",
    "WhileLoopGradOperation", "CustomGradientOperation", "DependOperation",
    "PrintOperation",
]
