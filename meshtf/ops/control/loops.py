"""while_loop, differentiable: a loop's cond and body are meshtf sub-graphs
lowered by the loop itself inside a tf.while_loop; its gradient is a
backward loop over the recorded iterations (see meshtf/ops/control).

Example:
  >>> i, y = loops.while_loop(lambda i, x: mtf.less(i, 3),
  ...                         lambda i, x: [i + 1, x * 2.0], [i0, x])
"""
# The ops here own sub-graphs and reach into each other's parts.
# pylint: disable=protected-access
import tensorflow as tf

from meshtf import autodiff
from meshtf import graph as graph_lib
from meshtf.op_kinds import CostKind
from meshtf.ops.control.subgraphs import _Parameters
from meshtf.ops.control.subgraphs import _capture
from meshtf.ops.control.subgraphs import _hoist_sources
from meshtf.ops.control.subgraphs import _external_inputs
from meshtf.ops.control.subgraphs import _live_ops
from meshtf.ops.control.subgraphs import _check_tensors
from meshtf.ops.control.subgraphs import _bind
from meshtf.ops.control.subgraphs import _zeros
from meshtf.ops.control.subgraphs import _accumulate
from meshtf.ops.control.subgraphs import _finish_sum
from meshtf.ops.control.subgraphs import _counted
from meshtf.ops.control.subgraphs import _tf_while_loop


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

  cost_kind = CostKind.KERNEL

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
  # The backward loops mtf.gradients made of this one (each reads the
  # recorded states its state_used names).
  gradient_loops = property(lambda self: list(self._grad_ops))

  @property
  def trip_count(self):
    """The iterations a run makes, when known before running:
    maximum_iterations given as a Python int (a pipeline's loop), else
    None. The plan counts the body's flops, collectives and recorded
    states this many times."""
    n = self._tf_kwargs.get("maximum_iterations")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else None

  # The new loop state each iteration leaves for the next (the
  # accumulators' parts are added to their sums as soon as they are made).
  loop_carried = property(lambda self: list(self._body_out[:self._n]))

  @property
  def summed_outputs(self):
    """[(output, body tensor)] of the accumulators: the output is the body
    tensor summed over the iterations (a pending sum reduced once, after
    the loop)."""
    return list(zip(self._outputs[self._n:], self._body_out[self._n:]))

  @property
  def recorded_state(self):
    """Indices of the loop variables whose every state the gradients in
    the graph may read (what the forward loop records per iteration)."""
    return sorted(set(i for g in self._grad_ops for i in g.state_used))

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
      with _counted(impl, self.trip_count):
        return lowered_body(step, state, acc, hist)

    def lowered_body(step, state, acc, hist):
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

  cost_kind = CostKind.KERNEL

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
    for g in self._captured_grads:
      _sum_after_widening(g)
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

  forward = property(lambda self: self._forward)
  # The forward body's ops each backward iteration re-runs (from the
  # recorded state) before the body's gradient.
  recomputed_operations = property(lambda self: list(self._needed))
  # The backward loop walks the forward loop's iterations.
  trip_count = property(lambda self: self._forward.trip_count)

  @property
  def summed_outputs(self):
    """[(output, body tensor)]: the outside tensors' gradients, each summed
    over the iterations (pending sums reduced once, after the loop)."""
    n = len(self._floats)
    return list(zip(self._outputs[n:], self._captured_grads))

  @property
  def loop_carried(self):
    """The tensors each iteration of the backward body leaves for the
    next: the loop variables' cotangents (the outside tensors' gradients
    are added to their sums as soon as they are made)."""
    return [g for g in self._loop_grads if g is not None]

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
      with _counted(impl, fwd.trip_count):
        return lowered_body(k, g, c)

    def lowered_body(k, g, c):
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


def _sum_after_widening(t, depth=0):
  """Marks the widening casts (bfloat16 -> float32) that make t, a
  gradient the backward loop sums over the iterations, directly or through
  adds: their partial sums stay pending into the loop's float32 sum, which
  is reduced once after the loop (not once per iteration, in bfloat16)."""
  from meshtf.ops import elementwise
  op = t.operation
  if isinstance(op, elementwise.CastOperation) and op.widens:
    op.sums_later = True
  elif (isinstance(op, elementwise.BinaryOperation) and op.kind == "add"
        and depth < 16):
    for x in op.inputs:
      _sum_after_widening(x, depth + 1)


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
