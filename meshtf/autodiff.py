"""Reverse-mode autodiff inside the meshtf graph.

`gradients` adds backward operations to the graph; they are meshtf ops, so
they are laid out and lowered like the forward pass (a data-parallel weight
gradient becomes a local einsum plus an allreduce over the batch axes).

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> w = mtf.get_variable(mesh, "w", "io:3")
  >>> loss = mtf.reduce_sum(mtf.square(w))
  >>> [g.shape for g in mtf.gradients([loss], [w])]
  [Shape([io:3])]
"""
from meshtf import graph as graph_lib


def _check_differentiable(tensors, what, fix):
  """Raises ValueError naming the first tensor whose dtype is not floating
  (its gradient would be None, silently: TF's is too)."""
  for t in tensors:
    dtype = getattr(t, "dtype", None)
    if dtype is not None and not (dtype.is_floating or dtype.is_complex):
      raise ValueError(
          "mtf.gradients: %s %r is %s, which has no gradient: %s" % (
              what, t.name, dtype.name, fix))


def gradients(ys, xs, grad_ys=None, operations=None):
  """d(sum of ys)/d(xs), as meshtf Tensors (None where xs don't affect ys).
  A y or x whose dtype is not floating is a ValueError naming it (its
  gradient would be None).

  Args:
    ys: Tensors to differentiate (scalar or not; grad_ys default to ones).
    xs: Tensors to differentiate with respect to (e.g. variables' values).
    grad_ys: optional upstream gradients, one per y.
    operations: the operations to consider (default: the whole graph).
  """
  from meshtf.ops import io
  ys = list(ys)
  xs = [x.outputs[0] if isinstance(x, graph_lib.Operation) else x for x in xs]
  if not ys:
    raise ValueError("gradients needs at least one y")
  _check_differentiable(ys, "y", "compute it in floating point (a cast to "
                        "an integer type on the way to it stops the gradient "
                        "too)")
  _check_differentiable(xs, "x", "differentiate with respect to "
                        "floating-point tensors (a variable made with "
                        "dtype=tf.float32)")
  graph = ys[0].graph
  # Where the backward pass starts in the graph's order (the plan report's
  # "activations kept for the backward pass" are read after it).
  if graph.backward_start is None:
    graph.backward_start = len(graph.operations)
  operations = list(operations if operations is not None else graph.operations)
  if grad_ys is None:
    grad_ys = [io.ones_like(y) for y in ys]
  # Forward reachability from xs, so we build backward ops only where needed:
  # through ops that have a gradient (the one-hot of an argmax, say, ends
  # the path; a gradient built up to it would be computed and dropped).
  downstream = set(xs)
  for op in operations:
    if op.has_gradient and any(t in downstream for t in op.inputs):
      downstream.update(op.outputs)
  first_backward = len(graph.operations)
  pending = {}
  for y, g in zip(ys, grad_ys):
    pending.setdefault(y, []).append(g)
  summed = {}

  def total(t):
    if t not in summed:
      parts = pending.get(t)
      first = len(graph.operations)
      summed[t] = None if not parts else _sum(parts)
      for new_op in graph.operations[first:]:
        if new_op.gradient_of is None:
          new_op.gradient_of = t
    return summed[t]

  for op in reversed(operations):
    if not op.has_gradient or not any(t in downstream for t in op.inputs):
      continue
    out_grads = [total(t) for t in op.outputs]
    if all(g is None for g in out_grads):
      continue
    if any(g is None for g in out_grads) and not getattr(
        op, "takes_missing_output_grads", False):
      out_grads = [g if g is not None else io.zeros_like(t)
                   for g, t in zip(out_grads, op.outputs)]
    first_new = len(graph.operations)
    in_grads = op.gradient(out_grads)
    kept = [g if (g is not None and t in downstream) else None
            for t, g in zip(op.inputs, in_grads)]
    _drop_unused(graph, first_new, [g for g in kept if g is not None])
    for new_op in graph.operations[first_new:]:
      if new_op.forward_op is None:   # an inner mtf.gradients set its own
        new_op.forward_op = op
    for t, g in zip(op.inputs, kept):
      if g is not None:
        pending.setdefault(t, []).append(g)
  out = [total(x) for x in xs]
  _drop_unread_broadcasts(graph, first_backward, out)
  # The gradients' partial sums (data parallelism) are reduced in fused
  # buckets, issued in backward order as each bucket fills.
  graph_lib.reduce_together(out)
  return out


def _drop_unused(graph, first_new, needed):
  """Removes the ops that op.gradient just added only for inputs that need
  no gradient (e.g. an einsum's data input), so they are never lowered."""
  new_ops = graph.operations[first_new:]
  if not new_ops:
    return
  live = set(needed)
  keep = set()
  for op in reversed(new_ops):
    if any(t in live for t in op.outputs):
      keep.add(op)
      live.update(op.inputs)
  graph.operations[first_new:] = [op for op in new_ops if op in keep]


def _drop_unread_broadcasts(graph, first, out):
  """Removes the broadcasts this backward pass made that nothing reads (a
  gradient rule may read a broadcast's input instead: square's)."""
  from meshtf.ops import elementwise
  # Readers inside sub-graphs (a while loop's body) count too.
  read = {t for op in graph_lib.all_operations(graph.operations)
          for t in op.inputs}
  read.update(t for t in out if t is not None)
  graph.operations[first:] = [
      op for op in graph.operations[first:]
      if not (isinstance(op, elementwise.BroadcastOperation) and
              not any(t in read for t in op.outputs))]


def _sum(parts):
  out = parts[0]
  for p in parts[1:]:
    out = out + p
  return out
