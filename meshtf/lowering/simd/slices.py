"""What an SPMD program run leaves on the host: each device's slice of an
output (PerDeviceSlices), and partial sums that left the program unreduced
(HostPendingSum, summed on the host when exported).

Example:
  >>> from meshtf.lowering.simd import slices
  >>> out = slices.PerDeviceSlices([tf.ones([2]), tf.ones([2])])
  >>> len(out.all_slices)
  2
"""
from meshtf.lowering import lowering as lowering_lib


class PerDeviceSlices(object):
  """The slices of one tensor on every device, after a program ran."""

  def __init__(self, tensor_list, whole=False):
    self.tensor_list = list(tensor_list)
    self.whole = whole  # each entry is already the full tensor

  all_slices = property(lambda self: self.tensor_list)


class HostPendingSum(lowering_lib.PendingSum):
  """Partial sums that left the program unreduced; exporting one sums them
  over their groups on the host (counted as an allreduce)."""

  def _reduce(self):
    return PerDeviceSlices(self.mesh_impl.host_allreduce(
        self.laid_out.tensor_list, list(self.mesh_axes), "SUM"))
