"""The MeshImpl interface every backend implements, and the layout logic
that all backends share (coordinates, groups, slice shapes, reshape plans).

Ops lower themselves only through this interface, so one op definition works
on every backend. A backend supplies a LaidOutTensor type and:

  slicewise(fn, *args)                      local computation per slice
  allreduce(x, mesh_axes, "SUM"|"MAX"|"MIN")
  allconcat(x, mesh_axis, concat_axis)      allgather along one mesh axis
  allsplit(x, mesh_axis, split_axis)        keep own stripe (no communication)
  alltoall(x, mesh_axis, split_axis, concat_axis)
  receive(x, mesh_axis, source_pcoord)      collective permute along an axis
  laid_out_pnum(), laid_out_pcoord(axis)    processor number / coordinate
  import_tf_tensor(x, shape), export_to_tf_tensor(x, shape)
  make_variable_slices(...), read/assign variable slices
"""
import collections

import numpy as np
import tensorflow as tf

from meshtf import shapes
from meshtf.layouts import layout_rules as layout_rules_lib
from meshtf.layouts import tensor_layouts as tensor_layout_lib

CollectiveRecord = collections.namedtuple(
    "CollectiveRecord",
    ["kind", "mesh_axes", "group_size", "elements_per_device"])


class MeshImpl(object):
  """Backend-independent part of a mesh implementation."""

  def __init__(self, shape, layout):
    self._shape = shapes.convert_to_shape(shape)
    self._layout_rules = layout_rules_lib.convert_to_layout_rules(layout)
    layout_rules_lib.validate_layout_rules(self._layout_rules, self._shape)
    self._recorder = None

  shape = property(lambda self: self._shape)
  layout_rules = property(lambda self: self._layout_rules)
  ndims = property(lambda self: self._shape.ndims)
  size = property(lambda self: self._shape.size)

  def __repr__(self):
    return "%s(%s, %r)" % (type(self).__name__, self._shape,
                           self._layout_rules)

  # --- layouts -------------------------------------------------------------
  def tensor_layout(self, arg, tensor_name=None):
    """TensorLayout of a Tensor or Shape (validated; raises LayoutError)."""
    shape = arg if isinstance(arg, shapes.Shape) else getattr(arg, "shape", None)
    if shape is None:
      shape = shapes.convert_to_shape(arg)
    if tensor_name is None and not isinstance(arg, shapes.Shape):
      tensor_name = getattr(arg, "name", None)
    return tensor_layout_lib.tensor_layout(shape, self._shape,
                                           self._layout_rules, tensor_name)

  def tensor_dimension_to_mesh_axis(self, dim):
    return self._layout_rules.tensor_dimension_to_mesh_axis(dim, self._shape)

  def slice_shape(self, tensor_shape):
    layout = self.tensor_layout(tensor_shape)
    return tensor_layout_lib.slice_shape(tensor_shape, self._shape, layout)

  def slice_size(self, tensor_shape):
    n = 1
    for s in self.slice_shape(tensor_shape):
      n *= s
    return n

  def mesh_axis_names(self, mesh_axes):
    return tuple(self._shape.dims[a].name for a in mesh_axes)

  def reduced_mesh_axes(self, input_shape, output_shape):
    """Mesh axes of dims present in input_shape but not output_shape."""
    out_names = set(output_shape.dimension_names)
    axes = []
    for d in input_shape.dims:
      if d.name not in out_names:
        a = self.tensor_dimension_to_mesh_axis(d)
        if a is not None and self._shape.dims[a].size > 1:
          axes.append(a)
    return sorted(set(axes))

  # --- processors ----------------------------------------------------------
  def pnum_to_processor_coordinates(self, pnum):
    coords = []
    for d in reversed(self._shape.dims):
      coords.append(pnum % d.size)
      pnum //= d.size
    return list(reversed(coords))

  def processor_coordinates_to_pnum(self, coords):
    pnum = 0
    for c, d in zip(coords, self._shape.dims):
      pnum = pnum * d.size + c
    return pnum

  def processor_groups(self, mesh_axes):
    """Groups of pnums that differ only along `mesh_axes`, each ordered by
    their coordinates along those axes (row-major); groups are ordered by
    the coordinates along the other axes (row-major)."""
    return self.processor_group_array(mesh_axes).tolist()

  def processor_group_array(self, mesh_axes):
    """processor_groups as an int array [num_groups, group_size]."""
    mesh_axes = sorted(mesh_axes)
    others = [a for a in range(self.ndims) if a not in mesh_axes]
    pnums = np.arange(self.size).reshape(self._shape.to_integer_list or [1])
    pnums = np.transpose(pnums, others + mesh_axes) if self.ndims else pnums
    group_size = int(np.prod([self._shape.dims[a].size for a in mesh_axes]))
    return pnums.reshape([-1, group_size])

  def slice_begin(self, tensor_shape, pnum):
    """Global index where processor pnum's slice starts, per tensor dim."""
    layout = self.tensor_layout(tensor_shape)
    coords = self.pnum_to_processor_coordinates(pnum)
    sizes = tensor_layout_lib.slice_shape(tensor_shape, self._shape, layout)
    return [0 if a is None else coords[a] * s for a, s in zip(layout, sizes)]

  # --- statistics ----------------------------------------------------------
  def record_collective(self, kind, mesh_axes, elements_per_device):
    if self._recorder is not None and mesh_axes:
      group = 1
      for a in mesh_axes:
        group *= self._shape.dims[a].size
      self._recorder(CollectiveRecord(kind, self.mesh_axis_names(mesh_axes),
                                      group, int(elements_per_device)))

  # --- variables and host-side assembly (outside per-device programs) ---
  def make_variable_slices(self, name, shape, dtype, slice_init_fn, trainable):
    """One tf.Variable per processor, initialised from slice_init_fn(begin,
    slice_shape) on its device. Must be called in an eager context."""
    sizes = self.slice_shape(shape)
    # Traced once for all slices (they differ only in `begin`): op-by-op
    # eager Threefry would cost ~0.1 s per slice.
    if getattr(slice_init_fn, "traced", False):
      init = lambda begin: slice_init_fn(begin, sizes)  # noqa: E731
    else:
      init = tf.function(lambda begin: slice_init_fn(begin, sizes),
                         autograph=False)
    out = [None] * self.size  # None: a processor of another worker
    local = self.local_pnums()
    for p in local:
      # Computed on one device and copied: running the function on each
      # device would instantiate (and optimise) it once per device.
      with tf.device(self.devices[local[0]]):
        value = init(tf.constant(self.slice_begin(shape, p), tf.int64))
      with tf.device(self.devices[p]):
        out[p] = tf.Variable(value, dtype=dtype, trainable=trainable,
                             name="%s_slice_%d" % (name.replace("/", "_"), p))
    return out

  def local_pnums(self):
    """Processors whose device belongs to this process (all, unless the
    mesh spans several worker processes)."""
    return list(range(self.size))


  def assemble_slices(self, slice_list, shape, device=None):
    """The full tensor from one slice per processor (in pnum order):
    concatenates along each split mesh axis, last axis first, keeping the
    slices of processor coordinate 0 along replicated axes."""
    layout = self.tensor_layout(shape)
    mesh_to_tensor = layout.mesh_axis_to_tensor_axis(self.ndims)
    with tf.device(device):
      current = dict(enumerate(slice_list))
      for m in reversed(range(self.ndims)):
        t_axis = mesh_to_tensor[m]
        nxt = {}
        for group in self.processor_groups([m]):
          if group[0] not in current:
            continue
          nxt[group[0]] = (current[group[0]] if t_axis is None else
                           tf.concat([current[p] for p in group], t_axis))
        current = nxt
      return tf.identity(current[0])

  def host_allreduce(self, slice_list, mesh_axes, reduction_fn_string):
    """Reduces per-processor tensors over the groups along mesh_axes with
    ordinary TF ops: once on each group's first device, then copied to every
    member's device. Records the collective. Returns the per-processor list."""
    self.record_collective("allreduce_" + reduction_fn_string.lower(),
                           sorted(mesh_axes), slice_list[0].shape.num_elements())
    reducer = _HOST_REDUCERS[reduction_fn_string]
    out = [None] * self.size
    for group in self.processor_groups(mesh_axes):
      with tf.device(self.devices[group[0]]):
        total = reducer([slice_list[p] for p in group])
      for p in group:
        with tf.device(self.devices[p]):
          out[p] = tf.identity(total)
    return out

  def variable_full_value(self, entry):
    """Full value of a VariableEntry, read from its per-slice variables."""
    return self.assemble_slices([v.value() for v in entry.slices],
                                entry.shape)

  # --- generic algorithms built from the primitives ---------------------
  def allreduce_if_needed(self, x, mesh_axes, reduction_fn_string):
    mesh_axes = [a for a in mesh_axes if self._shape.dims[a].size > 1]
    return self.allreduce(x, mesh_axes, reduction_fn_string) if mesh_axes else x

  def shift_by_n_processors(self, x, mesh_axis, offset, wrap):
    """Each processor gets the slice of the one `offset` before it along
    mesh_axis (wrapping around, or zeros past the ends)."""
    n = self.shape.dims[mesh_axis].size
    source = []
    for i in range(n):
      j = i - offset
      source.append(j % n if wrap else (j if 0 <= j < n else None))
    return self.receive(x, mesh_axis, source)

  def reshape(self, x, old_shape, new_shape):
    """Relayouts and reshapes laid-out x from old_shape to new_shape.

    Per mesh axis: a split that selects the same elements keeps its split
    (the old and new dims have the same product of the sizes before them,
    Mesh TensorFlow's rule: e.g. [batch, length] -> [group, group_size] split
    on batch and group is local); split -> unsplit is an allconcat; unsplit
    -> split is a local slice (allsplit); one dim -> another dim on the same
    axis is an alltoall when an unsplit old dim already slices like the new
    dim, else allconcat then allsplit.
    """
    old_layout = list(self.tensor_layout(old_shape))
    new_layout = list(self.tensor_layout(new_shape))
    old_pos = _outer_sizes(old_shape)
    new_pos = _outer_sizes(new_shape)
    to_split_after = []
    for m, mesh_dim in enumerate(self._shape.dims):
      if mesh_dim.size == 1:
        continue
      a = old_layout.index(m) if m in old_layout else None
      b = new_layout.index(m) if m in new_layout else None
      if a is not None and b is not None and old_pos[a] == new_pos[b]:
        continue
      if b is not None:
        twin = _twin(old_shape, old_pos, new_pos[b], mesh_dim.size)
        if a is not None and twin is not None and old_layout[twin] is None:
          x = self.alltoall(x, m, split_axis=twin, concat_axis=a)
          old_layout[a], old_layout[twin] = None, m
          continue
        to_split_after.append((m, b))
      if a is not None:
        x = self.allconcat(x, m, a)
        old_layout[a] = None
    local_new = []
    for i, d in enumerate(new_shape.dims):
      m = new_layout[i]
      split_now = m is not None and m in old_layout
      local_new.append(d.size // self._shape.dims[m].size if split_now
                       else d.size)
    if [d.size for d in old_shape.dims] != [d.size for d in new_shape.dims] \
        or old_shape.ndims != new_shape.ndims:
      x = self.slicewise(_local_reshape(local_new), x)
    for m, b in to_split_after:
      x = self.allsplit(x, m, b)
    return x


def _fold(fn, xs):
  out = xs[0]
  for x in xs[1:]:
    out = fn(out, x)
  return out


_HOST_REDUCERS = {
    "SUM": tf.add_n,
    "MAX": lambda xs: _fold(tf.maximum, xs),
    "MIN": lambda xs: _fold(tf.minimum, xs),
}


def _outer_sizes(shape):
  """Per dim, the product of the sizes of the dims before it. Split n ways,
  a dim gives processor i the i-th n-th of every one of its outer-size
  blocks of the flattened tensor; so in two shapes of equal size, dims with
  the same outer size split n ways select the same elements, in the same
  order (Mesh TensorFlow's cumprod rule)."""
  out, before = [], 1
  for d in shape.dims:
    out.append(before)
    before *= d.size
  return out


def _twin(shape, outer_sizes, outer, n):
  """The dim of shape with the given outer size that can be split n ways
  (at most one: a dim of size >= 2 doubles the next outer size), or None."""
  for i, (o, d) in enumerate(zip(outer_sizes, shape.dims)):
    if o == outer and d.size % n == 0:
      return i
  return None


def _local_reshape(new_slice_shape):
  def fn(t):
    return tf.reshape(t, new_slice_shape)
  return fn
