"""A sum pending over mesh axes: a laid-out tensor whose values are partial
sums, still to be added up (allreduced) over some mesh axes.

An op whose local result is partial over the mesh axes of the dims it
contracts or reduces (einsum, reduce_sum, a split one_hot's gather, ...)
returns a PendingSum instead of allreducing at once: elementwise sums of
pending sums over the same axes stay pending, and the lowering fuses the
allreduces of sums read together (meshtf/lowering/bucketing.py). This is
the layout state JAX calls `unreduced` and DTensor `Partial`. It imports no
graph and no engine, so an op family can make one without importing the
Lowering.

Example:
  >>> y = PendingSum(mesh_impl, local_products, ["model"])   # in op.lower
  >>> lowering.set_tensor_lowering(op.outputs[0], y)
  >>> y.to_laid_out_tensor()   # the allreduce, when some op reads y
"""


class PendingSum(object):
  """A laid-out tensor whose allreduce-sum over `mesh_axes` is deferred.

  Elementwise additions of pending sums over the same axes stay pending, so
  a sum of partial results costs one allreduce (Mesh TensorFlow's
  LazyAllreduceSum).
  """

  def __init__(self, mesh_impl, laid_out, mesh_axes):
    self.mesh_impl = mesh_impl
    self.laid_out = laid_out
    self.mesh_axes = tuple(sorted(mesh_axes))
    self._result = None
    # The lowering that made this sum keeps counting its collectives even if
    # the sum is materialised later (e.g. by export_to_tf_tensor).
    self._recorder = mesh_impl._recorder

  @property
  def materialized(self):
    return self._result is not None

  def to_laid_out_tensor(self):
    if self._result is None:
      self._result = self.record_while(self._reduce)
    return self._result

  def set_result(self, laid_out):
    """The reduced value, computed elsewhere (a fused bucket)."""
    self._result = laid_out

  def record_while(self, fn):
    """fn(), with collectives counted by the lowering that made this sum."""
    saved = self.mesh_impl._recorder
    self.mesh_impl._recorder = self._recorder
    try:
      return fn()
    finally:
      self.mesh_impl._recorder = saved

  def _reduce(self):
    return self.mesh_impl.allreduce(self.laid_out, list(self.mesh_axes), "SUM")


def pending_axes(values):
  """Per lowered value, the mesh axes its pending sum still needs (a
  tuple), or None for a value that is not a PendingSum: what
  Operation.keeps_pending reads.

  Example:
    >>> pending_axes([PendingSum(impl, laid_out, [1]), laid_out])
    [(1,), None]
  """
  return [v.mesh_axes if isinstance(v, PendingSum) else None for v in values]


__all__ = ["PendingSum", "pending_axes"]
