"""MeshImpl: the one template every backend fills in.

The geometry (layouts, slices, groups, relayout plans) is the pure
MeshLayout (meshtf/layouts/mesh_layout.py); a MeshImpl holds one and adds
the TensorFlow code. This base class implements every collective once --
it checks and normalises the arguments, records the collective (kind, mesh
axes, group size, elements and bytes per device), pads uneven dims before a
split and strips the padding after a gather -- and calls the backend's hook
for the communication itself:

  _allreduce(x, mesh_axes, "SUM"|"MAX"|"MIN")   x: a LaidOutTensor
  _allconcat(x, mesh_axis, concat_axis)          allgather along one axis
  _alltoall(x, mesh_axis, split_axis, concat_axis)   mesh_axis: one axis
                                                 or a tuple in mesh order
  _receive(x, mesh_axis, source_pcoord)          collective permute

plus slicewise(fn, *xs), laid_out_pcoord(axis) / laid_out_pnum() and the
variable and import/export methods. Backends declare what they are
(`is_spmd`: one per-device program, or one TF tensor per device).

Ops lower themselves only through this interface, so one op definition works
on every backend.
"""
import collections
import contextlib
import threading

import numpy as np
import tensorflow as tf

from meshtf import shapes
from meshtf.layouts import mesh_layout as mesh_layout_lib
from meshtf.layouts import relayout as relayout_lib
from meshtf.layouts import tensor_layouts
from meshtf.layouts.relayout import CollectiveKind
from meshtf.lowering import constants

# What the padding of uneven splits holds when meshtf makes it (imports,
# splits, alltoalls): zeros, or poison under poison_padding().
_PADDING = threading.local()


@contextlib.contextmanager
def poison_padding(enabled=True):
  """Within the block, padding that meshtf creates holds poison -- NaN for
  floats, a huge negative number for signed ints, True for bools -- instead
  of zeros, so that any op reading padding it should ignore corrupts its
  result. The layout-equivalence harness runs every test under it.

  Example:
    >>> with poison_padding():
    ...   lowering = mtf.Lowering(graph, {mesh: impl})
  """
  saved = getattr(_PADDING, "poison", False)
  _PADDING.poison = enabled
  try:
    yield
  finally:
    _PADDING.poison = saved


def padding_fill(dtype):
  """The value new padding of `dtype` holds (see poison_padding)."""
  dtype = tf.as_dtype(dtype)
  if not getattr(_PADDING, "poison", False):
    return np.zeros([], dtype.as_numpy_dtype)
  if dtype.is_floating or dtype.is_complex:
    return np.asarray(np.nan, dtype.as_numpy_dtype)
  if dtype == tf.bool:
    return np.asarray(True)
  if dtype.is_unsigned:
    return np.asarray(dtype.max, dtype.as_numpy_dtype)
  return np.asarray(dtype.min // 2, dtype.as_numpy_dtype)


CollectiveRecord = collections.namedtuple(
    "CollectiveRecord",
    ["kind",                 # a CollectiveKind
     "mesh_axes", "group_size", "elements_per_device", "bytes_per_device"])


# Variables are made eagerly (tf.init_scope) while a MeshFunction's first
# call traces the step. tf.function counts a variable made during its first
# trace as its own and then traces the whole step a second time "without
# variable creation" (the model, autodiff, layouts and lowering twice);
# these variables belong to a VariableStore, not to the function.
NOT_LIFTED = {"experimental_enable_variable_lifting": False}


class LaidOutTensor(object):
  """A tensor's slices: one tf.Tensor per processor (placement), or the one
  local slice of the processor running the program (SPMD)."""

  def __init__(self, tensor_list):
    self.tensor_list = list(tensor_list)

  @property
  def all_slices(self):
    return self.tensor_list

  @property
  def one_slice(self):
    if len(self.tensor_list) != 1:
      raise ValueError("one_slice: this LaidOutTensor holds %d slices"
                       % len(self.tensor_list))
    return self.tensor_list[0]

  def to_laid_out_tensor(self):
    return self

  def __repr__(self):
    return "LaidOutTensor(%d slices, %s)" % (
        len(self.tensor_list), self.tensor_list[0].shape)


class MeshImpl(object):
  """Backend-independent part of a mesh implementation.

  Args:
    shape: a mesh shape ("rows:2;cols:4"), or a MeshLayout (then layout is
      None).
    layout: layout rules ("batch:rows;hidden:cols").
    devices: one device name (or device) per processor, in processor
      (row-major coordinate) order; None for a geometry-only impl.
  """

  LaidOutTensor = LaidOutTensor
  # One per-device program (SimdMeshImpl, TpuMeshImpl) or one TF tensor per
  # processor (PlacementMeshImpl). The SPMD impls also take program options
  # (SimdMeshImpl.program_options: MeshFunction asks is_spmd, not hasattr).
  is_spmd = False
  # Whether XLA compiles the whole lowered program (TPU; the SPMD backend
  # with jit_compile="program"): XLA drops control dependencies and merges
  # identical computations, so ops that must stay apart (a
  # rematerialization and the forward ops it copies: DependOperation) are
  # kept apart by an optimization barrier instead.
  compiled_by_xla = False

  def __init__(self, shape, layout=None, devices=None, layout_rules=None):
    if layout_rules is not None:   # Mesh TF's MeshImpl(shape, layout_rules)
      if layout is not None:
        raise ValueError("MeshImpl: pass layout or layout_rules, not both")
      layout = layout_rules
    self._layout = mesh_layout_lib.MeshLayout.convert(shape, layout)
    self._recorder = None
    self._devices = None
    if devices is not None:
      devices = [d if isinstance(d, str) else d.name for d in devices]
      tensor_layouts.validate_device_count(self.shape, len(devices))
      self._devices = devices

  mesh_layout = property(lambda self: self._layout)
  shape = property(lambda self: self._layout.mesh_shape)
  layout_rules = property(lambda self: self._layout.layout_rules)
  ndims = property(lambda self: self._layout.ndims)
  size = property(lambda self: self._layout.size)
  devices = property(lambda self: list(self._devices or []))
  # Mesh TF's flag: control dependencies between lowered ops work here.
  supports_control_dependencies = True

  def __repr__(self):
    return "%s(%s, %r)" % (type(self).__name__, self.shape, self.layout_rules)

  @contextlib.contextmanager
  def using_layout(self, mesh_layout):
    """Within the block, this impl's geometry is mesh_layout's (same mesh,
    other rules): the computation layout an operation lowers under, or the
    layout of a tensor being exported (meshtf/layouts/assignment.py)."""
    if mesh_layout.mesh_shape != self.shape:
      raise ValueError("using_layout: %r is not on mesh %s" % (mesh_layout,
                                                              self.shape))
    saved, self._layout = self._layout, mesh_layout
    try:
      yield
    finally:
      self._layout = saved

  # --- geometry: the MeshLayout's ------------------------------------------
  def tensor_layout(self, arg, tensor_name=None):
    """TensorLayout of a Tensor or Shape (validated; raises LayoutError)."""
    return self._layout.tensor_layout(arg, tensor_name)

  def tensor_dimension_to_mesh_axis(self, dim):
    return self._layout.tensor_dimension_to_mesh_axis(dim)

  def split_axis(self, dim):
    return self._layout.split_axis(dim)

  def slice_shape(self, tensor_shape):
    return self._layout.slice_shape(tensor_shape)

  def slice_size(self, tensor_shape):
    return self._layout.slice_size(tensor_shape)

  def slice_begin(self, tensor_shape, pnum):
    return self._layout.slice_begin(tensor_shape, pnum)

  def mesh_axis_names(self, mesh_axes):
    return self._layout.mesh_axis_names(mesh_axes)

  def reduced_mesh_axes(self, input_shape, output_shape):
    return self._layout.reduced_mesh_axes(input_shape, output_shape)

  def pnum_to_processor_coordinates(self, pnum):
    return self._layout.pnum_to_processor_coordinates(pnum)

  def processor_coordinates_to_pnum(self, coords):
    return self._layout.processor_coordinates_to_pnum(coords)

  def processor_groups(self, mesh_axes):
    return self._layout.processor_groups(mesh_axes)

  def processor_group_array(self, mesh_axes):
    return self._layout.processor_group_array(mesh_axes)

  def local_pnums(self):
    """Processors whose device belongs to this process (all, unless the
    mesh spans several worker processes)."""
    return list(range(self.size))

  # --- statistics ----------------------------------------------------------
  def record_collective(self, kind, mesh_axes, elements_per_device,
                        itemsize=4):
    if self._recorder is not None and mesh_axes:
      kind = CollectiveKind(kind)
      group = self.shape.group_size(mesh_axes)
      elements = int(elements_per_device)
      self._recorder(CollectiveRecord(
          kind, self.mesh_axis_names(mesh_axes), group, elements,
          relayout_lib.collective_bytes(kind, group, elements, itemsize)))

  def _record(self, kind, mesh_axes, x):
    t = x.tensor_list[0]
    self.record_collective(kind, mesh_axes, t.shape.num_elements(),
                           t.dtype.size)

  def _axes_of_size_above_one(self, mesh_axes):
    for a in mesh_axes:
      if not 0 <= a < self.ndims:
        raise ValueError("mesh axis %r is not an axis of mesh %s"
                         % (a, self.shape))
    return sorted({a for a in mesh_axes if self.shape.dims[a].size > 1})

  # --- the collectives: checks, records, padding; the hooks communicate ----
  def allreduce(self, x, mesh_axes, reduction_fn_string):
    """Reduces ("SUM", "MAX" or "MIN") over the processors that differ
    only along mesh_axes; every member gets the result."""
    if reduction_fn_string not in ("SUM", "MAX", "MIN"):
      raise ValueError("allreduce: reduction %r is not SUM, MAX or MIN"
                       % (reduction_fn_string,))
    axes = self._axes_of_size_above_one(mesh_axes)
    if not axes:
      return x
    self._record(CollectiveKind.allreduce(reduction_fn_string), axes, x)
    return self._allreduce(x, axes, reduction_fn_string)

  def allreduce_bucket(self, xs, mesh_axes, reduction_fn_string="SUM"):
    """Allreduces several laid-out tensors of one dtype as ONE collective:
    each slice flattened, concatenated, reduced, split back and reshaped
    (GShard/GSPMD combine collectives the same way). Returns the reduced
    tensors in order. Every collective costs a fixed latency, so N small
    gradients cost about one allreduce instead of N.

    Example:
      >>> gw, gv = impl.allreduce_bucket([partial_gw, partial_gv], [0])
    """
    xs = list(xs)
    axes = self._axes_of_size_above_one(mesh_axes)
    if not axes or not xs:
      return xs
    slices = [x.tensor_list[0] for x in xs]
    dtypes = {t.dtype for t in slices}
    if len(dtypes) != 1:
      raise ValueError("allreduce_bucket: one dtype per bucket, got %s"
                       % sorted(d.name for d in dtypes))
    shapes_ = [t.shape for t in slices]
    if len(xs) == 1 or not all(s.is_fully_defined() for s in shapes_):
      return [self.allreduce(x, axes, reduction_fn_string) for x in xs]
    if reduction_fn_string not in ("SUM", "MAX", "MIN"):
      raise ValueError("allreduce_bucket: reduction %r is not SUM, MAX or "
                       "MIN" % (reduction_fn_string,))
    sizes = [s.num_elements() for s in shapes_]
    flat = self.slicewise(lambda *ts: tf.concat(
        [tf.reshape(t, constants.int32([-1])) for t in ts],
        constants.int32(0)), *xs)
    self._record(CollectiveKind.allreduce(reduction_fn_string), axes,
                 flat)
    total = self._allreduce(flat, axes, reduction_fn_string)

    def unpack(t):
      return tuple(tf.reshape(p, constants.int32(s.as_list()))
                   for p, s in zip(tf.split(t, constants.int32(sizes)),
                                   shapes_))
    return list(self.slicewise(unpack, total))

  def allreduce_if_needed(self, x, mesh_axes, reduction_fn_string):
    return self.allreduce(x, mesh_axes, reduction_fn_string)

  def allconcat(self, x, mesh_axis, concat_axis, size=None):
    """Concatenates the slices along concat_axis across mesh_axis
    (allgather); mesh_axis may be a tuple of axes (major first: gathered
    minor first). `size`: the true size of the gathered dim, when the
    slices carry padding (an uneven split) -- the result is cut to it."""
    for m in reversed(_axis_tuple(mesh_axis)):
      if self._axes_of_size_above_one([m]):
        self._record(CollectiveKind.ALLCONCAT, [m], x)
        x = self._allconcat(x, m, concat_axis)
    return self._cut(x, concat_axis, size)

  def allsplit(self, x, mesh_axis, split_axis, padded_size=None):
    """Each processor keeps its stripe of split_axis, which it holds whole:
    a local slice, no communication. mesh_axis may be a tuple of axes
    (major first). The dim is first padded to padded_size (default: the
    next multiple of the axes' processors), so uneven splits put their
    padding on the last stripes."""
    axes = [m for m in _axis_tuple(mesh_axis)
            if self.shape.dims[m].size > 1]
    n = self.shape.group_size(axes)
    if n == 1:
      return x
    full = int(x.tensor_list[0].shape[split_axis])
    padded = padded_size or n * -(-full // n)
    x = self.slicewise(lambda t: _pad_to(t, split_axis, padded), x)
    for m in axes:
      size = padded // self.shape.dims[m].size

      def fn(t, pcoord, size=size):
        begin = [0] * t.shape.rank
        begin[split_axis] = tf.cast(pcoord, tf.int32) * size
        sizes = list(t.shape)
        sizes[split_axis] = size
        return tf.slice(t, tf.stack(begin), sizes)
      x = self.slicewise(fn, x, self.laid_out_pcoord(m))
      padded = size
    return x

  def alltoall(self, x, mesh_axis, split_axis, concat_axis, concat_size=None):
    """Stripes of split_axis go to the peers along mesh_axis; what arrives
    is concatenated along concat_axis. split_axis is padded to a multiple
    of the axis size; concat_size (the gathered dim's true size) cuts the
    padding the concatenated stripes carry. mesh_axis may be a tuple of
    axes in mesh order: one alltoall over the group of all of them (the
    stripes in the group's row-major order), (n-1)/n of the slice."""
    axes = [m for m in _axis_tuple(mesh_axis) if self.shape.dims[m].size > 1]
    if list(axes) != sorted(axes):
      raise ValueError("alltoall over mesh axes %s: give them in mesh order"
                       % (list(axes),))
    n = self.shape.group_size(axes)
    if n == 1:
      return x
    x = self.slicewise(lambda t: _pad_to(t, split_axis, n * -(
        -int(t.shape[split_axis]) // n)), x)
    self._record(CollectiveKind.ALLTOALL, axes, x)
    y = self._alltoall(x, axes[0] if len(axes) == 1 else tuple(axes),
                       split_axis, concat_axis)
    return self._cut(y, concat_axis, concat_size)

  def reduce_scatter(self, x, mesh_axis, split_axis, padded_size=None):
    """x holds partial sums over mesh_axis (one axis, or a tuple, major
    first); returns their sum with split_axis split over it, each
    processor keeping its stripe (padded first to padded_size, default the
    next multiple of the axes' processors). Half an allreduce's bytes: the
    pieces travel once (alltoall), then a local sum (TF has no CPU
    reduce-scatter kernel).

    Example:
      >>> g = impl.reduce_scatter(partial_grad, data_axis, 0)
    """
    axes = [m for m in _axis_tuple(mesh_axis) if self.shape.dims[m].size > 1]
    if not axes:
      return x
    n = self.shape.group_size(axes)
    full = int(x.tensor_list[0].shape[split_axis])
    padded = padded_size or n * -(-full // n)
    x = self.slicewise(lambda t: _pad_to(t, split_axis, padded), x)
    for m in axes:
      self._record(CollectiveKind.REDUCE_SCATTER, [m], x)
      x = self._reduce_scatter(x, m, split_axis)
    return x

  def allreduce_and_resplit(self, x, reduce_axes, shape, tensor_axis):
    """The sum of partial sums x over reduce_axes, keeping this processor's
    stripe of dim tensor_axis of shape (held whole in x): a reduce-scatter
    where the dim splits over summed axes, else allreduce + local split."""
    s = self._layout.dim_split(shape, tensor_axis)
    reduce_axes = self._axes_of_size_above_one(reduce_axes)
    if s.is_split and set(s.mesh_axes) <= set(reduce_axes):
      x = self.reduce_scatter(x, s.mesh_axes, tensor_axis, s.padded_size)
      return self.allreduce(x, [a for a in reduce_axes
                                if a not in s.mesh_axes], "SUM")
    return self.resplit_dim(self.allreduce(x, reduce_axes, "SUM"), shape,
                            tensor_axis)

  def receive(self, x, mesh_axis, source_pcoord):
    """Collective permute: the processor at coordinate j along mesh_axis
    gets the slice of the one at source_pcoord[j] (zeros where None)."""
    n = self.shape.dims[mesh_axis].size
    if len(source_pcoord) != n:
      raise ValueError("receive: %d sources for mesh axis %r of size %d"
                       % (len(source_pcoord), self.shape.dims[mesh_axis].name,
                          n))
    if n == 1 and source_pcoord[0] == 0:
      return x
    self._record(CollectiveKind.PERMUTE, [mesh_axis], x)
    return self._receive(x, mesh_axis, list(source_pcoord))

  def _cut(self, x, axis, size):
    if size is None:
      return x
    return self.slicewise(lambda t: _take(t, axis, 0, size)
                          if int(t.shape[axis]) != size else t, x)

  # --- the hooks each backend implements -----------------------------------
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    raise NotImplementedError

  def _allconcat(self, x, mesh_axis, concat_axis):
    raise NotImplementedError

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    raise NotImplementedError

  def _receive(self, x, mesh_axis, source_pcoord):
    raise NotImplementedError

  def _reduce_scatter(self, x, mesh_axis, split_axis):
    """Backends with a native reduce-scatter override this; the default
    sends each peer its piece (alltoall onto a new leading axis) and sums
    what arrives."""
    x = self.slicewise(lambda t: tf.expand_dims(t, 0), x)
    x = self._alltoall(x, mesh_axis, split_axis + 1, 0)
    return self.slicewise(lambda t: tf.reduce_sum(t, 0), x)

  def slicewise(self, fn, *inputs):
    raise NotImplementedError

  def laid_out_pcoord(self, mesh_axis):
    raise NotImplementedError

  # --- built from the collectives ---------------------------------------
  def shift_by_n_processors(self, x, mesh_axis, offset, wrap):
    """Each processor gets the slice of the one `offset` before it along
    mesh_axis (wrapping around, or zeros past the ends)."""
    n = self.shape.dims[mesh_axis].size
    source = []
    for i in range(n):
      j = i - offset
      source.append(j % n if wrap else (j if 0 <= j < n else None))
    return self.receive(x, mesh_axis, source)

  def execute_relayout(self, x, plan):
    """Runs a RelayoutPlan (meshtf/layouts/relayout.py) on laid-out x."""
    kinds = relayout_lib.StepKind
    for step in plan.steps:
      if step.kind is kinds.ALLCONCAT:
        x = self.allconcat(x, step.mesh_axis, step.concat_axis,
                           size=step.concat_size)
      elif step.kind is kinds.ALLTOALL:
        x = self.alltoall(x, step.mesh_axis, step.split_axis,
                          step.concat_axis, concat_size=step.concat_size)
      elif step.kind is kinds.ALLSPLIT:
        x = self.allsplit(x, step.mesh_axis, step.split_axis,
                          step.padded_size)
      elif step.kind is kinds.REDUCE_SCATTER:
        x = self.reduce_scatter(x, step.mesh_axis, step.split_axis,
                                step.padded_size)
      elif step.kind is kinds.RESHAPE:
        x = self.slicewise(
            lambda t, s=list(step.local_shape): tf.reshape(t, s), x)
      else:
        raise ValueError("unknown relayout step %r" % (step.kind,))
    return x

  def reshape(self, x, old_shape, new_shape):
    """Relayouts and reshapes laid-out x from old_shape to new_shape (the
    MeshLayout's relayout plan; see meshtf/layouts/relayout.py)."""
    dtype = x.tensor_list[0].dtype
    return self.execute_relayout(x, self._layout.relayout_plan(
        old_shape, new_shape, dtype.size))

  def unsplit_dim(self, x, shape, tensor_axis):
    """The whole of dim `tensor_axis` of shape on every processor: an
    allconcat over its mesh axes (padding stripped), or x itself where the
    dim is not split."""
    s = self._layout.dim_split(shape, tensor_axis)
    if not s.is_split:
      return x
    return self.allconcat(x, s.mesh_axes, tensor_axis, size=s.size)

  def resplit_dim(self, x, shape, tensor_axis):
    """Keeps this processor's stripe of dim `tensor_axis`, which x holds
    whole, where shape's layout splits it (local; padded if uneven)."""
    s = self._layout.dim_split(shape, tensor_axis)
    if not s.is_split:
      return x
    return self.allsplit(x, s.mesh_axes, tensor_axis, s.padded_size)

  def laid_out_shard_index(self, mesh_axes):
    """Per processor, which stripe of a dim split over mesh_axes (a tuple,
    major first; or one axis) it holds: a laid-out int32 scalar."""
    axes = _axis_tuple(mesh_axes)
    index = self.laid_out_pcoord(axes[0])
    for m in axes[1:]:
      n = self.shape.dims[m].size
      index = self.slicewise(lambda i, c, n=n: i * n + c, index,
                             self.laid_out_pcoord(m))
    return index

  def gather_full(self, x, shape):
    """The full tensor on every processor: each split dim gathered."""
    for i in range(shapes.convert_to_shape(shape).ndims):
      x = self.unsplit_dim(x, shape, i)
    return x

  # --- padding of uneven splits --------------------------------------------
  def padding_mask(self, shape, dim_names=None):
    """A laid-out bool tensor, broadcastable against slices of shape, that
    is False exactly at the padding of shape's uneven dims (those in
    dim_names, if given); None when there is no such padding."""
    pads = [s for s in self._layout.uneven_dims(shape)
            if dim_names is None or s.name in dim_names]
    if not pads:
      return None
    rank = len(shape.dims)
    mask = None
    for s in pads:
      def valid(shard, s=s):
        begin = tf.cast(shard, tf.int32) * s.shard_size
        ok = tf.range(s.shard_size, dtype=tf.int32) + begin < s.size
        view = [1] * rank
        view[s.tensor_axis] = s.shard_size
        return tf.reshape(ok, view)
      m = self.slicewise(valid, self.laid_out_shard_index(s.mesh_axes))
      mask = m if mask is None else self.slicewise(tf.logical_and, mask, m)
    return mask

  def mask_padding(self, x, shape, fill, dim_names=None):
    """x with the padding of shape's uneven dims (those in dim_names, if
    given) replaced by `fill` (e.g. a reduction's identity); x itself when
    the layout pads none of them."""
    mask = self.padding_mask(shape, dim_names)
    if mask is None:
      return x

    def fn(t, ok):
      return tf.where(ok, t, tf.cast(fill, t.dtype))
    return self.slicewise(fn, x, mask)

  def padded_value(self, value, shape):
    """A full tensor padded at the end of each uneven dim of shape to the
    padded size, so that every processor's slice is in range."""
    pads = [[0, s.padding] for s in self._layout.dim_splits(shape)]
    if not any(p[1] for p in pads):
      return value
    return tf.pad(value, pads, constant_values=padding_fill(value.dtype))

  # --- host-side assembly (outside per-device programs) ------------------
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
    values = {}   # slice begin -> its value: replicas share one
    for p in local:
      # Computed on one device and copied: running the function on each
      # device would instantiate (and optimise) it once per device. A slice
      # is a function of its begin alone (layout-invariant initializers),
      # so the processors that replicate it take one computed value: 4x
      # fewer initializer runs for a weight replicated over data:4.
      begin = tuple(self.slice_begin(shape, p))
      if begin not in values:
        with tf.device(self.devices[local[0]]):
          values[begin] = init(tf.constant(begin, tf.int64))
      value = values[begin]
      with tf.device(self.devices[p]):
        # Named by processor, not by variable: TensorFlow's eager runtime
        # builds and caches one wrapped VarHandleOp per distinct name, 1.2
        # ms each (3,176 slices of a T5-small with Adam: 3.8 CPU s, measured
        # at load ~12); the store keeps the variable's name (entry.name).
        out[p] = tf.Variable(value, dtype=dtype, trainable=trainable,
                             name="slice_%d" % p, **NOT_LIFTED)
    return out

  def assemble_slices(self, slice_list, shape, device=None):
    """The full tensor from one slice per processor (in pnum order):
    concatenates along each dim over its mesh axes (minor axis first),
    keeping the slices of processor coordinate 0 along replicated axes,
    then cuts the padding of uneven dims."""
    shape = shapes.convert_to_shape(shape)
    merges = [(m, s.tensor_axis) for s in self._layout.dim_splits(shape)
              for m in reversed(s.mesh_axes)]
    used = {m for m, _ in merges}
    merges += [(m, None) for m in range(self.ndims) if m not in used]
    with tf.device(device):
      current = dict(enumerate(slice_list))
      for m, t_axis in merges:
        nxt = {}
        for group in self.processor_groups([m]):
          if group[0] not in current:
            continue
          nxt[group[0]] = (current[group[0]] if t_axis is None else
                           tf.concat([current[p] for p in group], t_axis))
        current = nxt
      full = current[0]
      sizes = shape.to_integer_list
      if full.shape.as_list() != sizes:
        full = tf.slice(full, [0] * len(sizes), sizes)
      return tf.identity(full)

  def host_allreduce(self, slice_list, mesh_axes, reduction_fn_string):
    """Reduces per-processor tensors over the groups along mesh_axes with
    ordinary TF ops: once on each group's first device, then copied to every
    member's device. Records the collective. Returns the per-processor list."""
    first = slice_list[0]
    self.record_collective(CollectiveKind.allreduce(reduction_fn_string),
                           sorted(mesh_axes), first.shape.num_elements(),
                           first.dtype.size)
    return self._host_reduce(slice_list, mesh_axes, reduction_fn_string)

  def _host_reduce(self, slice_list, mesh_axes, reduction_fn_string):
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
    with self.using_layout(entry.mesh_layout):
      return self.assemble_slices([v.value() for v in entry.slices],
                                  entry.shape)

  def variable_full_values(self, entries):
    """Full values of several VariableEntries, in order (one gathering
    program for all on a multi-worker SPMD mesh: SimdMeshImpl)."""
    return [self.variable_full_value(e) for e in entries]


def _axis_tuple(mesh_axis):
  return tuple(mesh_axis) if isinstance(mesh_axis, (tuple, list)) else (
      mesh_axis,)


def _take(t, axis, begin, size):
  index = [slice(None)] * t.shape.rank
  index[axis] = slice(begin, begin + size)
  return t[tuple(index)]


def _pad_to(t, axis, size):
  """t padded at the end of `axis` to `size` (with padding_fill)."""
  extra = size - int(t.shape[axis])
  if extra <= 0:
    return t
  spec = [[0, 0]] * t.shape.rank
  spec[axis] = [0, extra]
  return tf.pad(t, spec, constant_values=padding_fill(t.dtype))


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
