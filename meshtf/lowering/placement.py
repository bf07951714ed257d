"""PlacementMeshImpl: one TF tensor per processor, placed with tf.device.

Simple and explicit (MPMD): a LaidOutTensor is a list of per-device tensors,
and every collective is built from ordinary TF ops (slice, concat, add_n,
identity) on the devices involved. The graph grows with the mesh size; the
SPMD backend is the one for large meshes.

Example:
  >>> import meshtf as mtf
  >>> impl = mtf.PlacementMeshImpl("all:2", "batch:all", ["/cpu:0", "/cpu:0"])
  >>> impl.size
  2
"""
import tensorflow as tf

from meshtf.lowering import mesh_impl as mesh_impl_lib


class PlacementMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation with one tensor per device (Mesh TensorFlow's
  placement lowering). `devices` lists one device string per processor, in
  processor (row-major coordinate) order."""

  def __init__(self, shape, layout, devices):
    super().__init__(shape, layout, devices)

  def _on(self, pnum):
    return tf.device(self._devices[pnum])

  # --- local computation --------------------------------------------------
  def slicewise(self, fn, *inputs):
    """Applies fn to each processor's slices. Non-LaidOutTensor arguments are
    passed unchanged to every call. Returns a LaidOutTensor, or a tuple of
    them if fn returns a tuple."""
    outs = []
    for pnum in range(self.size):
      args = [x.tensor_list[pnum] if isinstance(x, self.LaidOutTensor) else x
              for x in inputs]
      with self._on(pnum):
        outs.append(fn(*args))
    if isinstance(outs[0], (tuple, list)):
      return tuple(self.LaidOutTensor(list(o)) for o in zip(*outs))
    return self.LaidOutTensor(outs)

  def laid_out_pnum(self):
    return self.slicewise_constant(lambda pnum: pnum)

  def laid_out_pcoord(self, mesh_axis):
    return self.slicewise_constant(
        lambda pnum: self.pnum_to_processor_coordinates(pnum)[mesh_axis])

  def laid_out_slice_begin(self, tensor_shape):
    """Per processor: int64 vector of its slice's global start indices."""
    return self.slicewise_constant(
        lambda pnum: self.slice_begin(tensor_shape, pnum), tf.int64)

  def slicewise_constant(self, value_fn, dtype=tf.int32):
    out = []
    for pnum in range(self.size):
      with self._on(pnum):
        out.append(tf.constant(value_fn(pnum), dtype=dtype))
    return self.LaidOutTensor(out)

  # --- collective hooks: ordinary TF ops on the devices involved ---------
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    # Computed once on the group's first device, then copied.
    return self.LaidOutTensor(self._host_reduce(x.tensor_list, mesh_axes,
                                                reduction_fn_string))

  def _allconcat(self, x, mesh_axis, concat_axis):
    out = [None] * self.size
    for group in self.processor_groups([mesh_axis]):
      parts = [x.tensor_list[p] for p in group]
      for p in group:
        with self._on(p):
          out[p] = tf.concat(parts, axis=concat_axis)
    return self.LaidOutTensor(out)

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    axes = list(mesh_axis) if isinstance(mesh_axis, tuple) else [mesh_axis]
    out = [None] * self.size
    for group in self.processor_groups(axes):
      n = len(group)
      pieces = []
      for p in group:
        with self._on(p):
          pieces.append(tf.split(x.tensor_list[p], n, axis=split_axis))
      for i, p in enumerate(group):
        with self._on(p):
          out[p] = tf.concat([pieces[j][i] for j in range(n)], axis=concat_axis)
    return self.LaidOutTensor(out)

  def _receive(self, x, mesh_axis, source_pcoord):
    out = [None] * self.size
    for group in self.processor_groups([mesh_axis]):
      for i, p in enumerate(group):
        src = source_pcoord[i]
        with self._on(p):
          out[p] = (tf.zeros_like(x.tensor_list[group[0]]) if src is None
                    else tf.identity(x.tensor_list[group[src]]))
    return self.LaidOutTensor(out)

  def run_on_slices(self, fn, *per_device_inputs):
    """Runs fn on LaidOutTensors built from per-device lists of tensors and
    returns the result's per-device list (for custom ops and tests).

    Example:
      >>> sums = impl.run_on_slices(lambda x: impl.allreduce(x, [0], "SUM"),
      ...                           [tf.ones([2])] * impl.size)
    """
    result = fn(*[self.LaidOutTensor([tf.convert_to_tensor(t) for t in x])
                  for x in per_device_inputs])
    return result.tensor_list

  # --- import / export -----------------------------------------------------
  def import_tf_tensor(self, x, shape):
    """Gives each processor its slice of the full tf.Tensor x."""
    sizes = self.slice_shape(shape)
    if sizes == shape.to_integer_list:
      return self.slicewise(tf.identity, x)
    x = self.padded_value(x, shape)
    return self.LaidOutTensor([
        _on_apply(self._on(p), tf.slice, x, self.slice_begin(shape, p), sizes)
        for p in range(self.size)])

  def import_host_slices(self, op):
    """The slices an import op makes on the host, one per processor."""
    return self.LaidOutTensor([op.host_slice(self, p)
                               for p in range(self.size)])

  def export_to_tf_tensor(self, x, shape):
    """Assembles the full tensor from the slices (an allgather's worth of
    copies, on processor 0's device)."""
    return self.assemble_slices(x.tensor_list, shape, self._devices[0])

  # --- variables -----------------------------------------------------------
  def read_variable(self, entry):
    """LaidOutTensor of the current values of a variable's slices."""
    return self.LaidOutTensor([
        _on_apply(self._on(p), lambda v: v.value(), v)
        for p, v in enumerate(entry.slices)])

  def assign_variable(self, entry, value, mode):
    """Assigns ("assign"), adds ("add") or subtracts ("sub") value, slice by
    slice. Returns the assign ops."""
    ops = []
    for p, v in enumerate(entry.slices):
      with self._on(p):
        ops.append(_ASSIGN[mode](v, value.tensor_list[p]))
    return ops


_ASSIGN = {
    "assign": lambda v, x: v.assign(x),
    "add": lambda v, x: v.assign_add(x),
    "sub": lambda v, x: v.assign_sub(x),
}


def _on_apply(device_scope, fn, *args):
  with device_scope:
    return fn(*args)
