"""Slicing ops: slice (mtf_slice), pad, concat, split, stack, unstack, shift,
halo_exchange, left_halo_exchange, dynamic_shift, pool_tensor_1d and
stride_tensor_1d.

Mesh TensorFlow refused most of these when the dimension they work along was
split over a mesh axis. Here every op works under any layout:

  slice, pad,      the dim is gathered (allconcat over its mesh axis), the op
  concat, split,   runs locally on the whole dim, and the result keeps only
  unstack          this processor's stripe again (allsplit, no communication)
                   where the output dim is split.
  stack            local tf.stack, then allsplit if the new dim is split.
  shift            local when the dim is not split; otherwise a halo
                   exchange: each processor receives the boundary stripe it
                   needs from the processors `offset` positions before it
                   (at most two collective permutes, of |offset| mod stripe
                   and stripe - |offset| mod stripe elements).
  halo_exchange,   composed of shift, slice and concat (Mesh TF's algorithm).
  left_halo_exchange
  dynamic_shift    a gather along the dim at per-position source indices (an
                   allreduce over the dim's mesh axis where it is split).
  pool_tensor_1d,  a reshape pool_dim -> [pool_dim, tmp_pool] (MeshImpl.reshape
  stride_tensor_1d does the relayout), then a reduction or slice of tmp_pool.

A dim whose size changes keeps its name, and so its mesh axis; a size the
axis does not divide is split unevenly (padded, see
meshtf/layouts/mesh_layout.py): mtf.slice(x, 0, 7, "length") with length
split 4 ways gives stripes of 2, the last one holding 1 position and 1 of
padding. shift along an unevenly split dim gathers the dim (allconcat),
shifts it locally and keeps the own stripe.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.ops import slicing
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;length:8")
  >>> slicing.slice(x, 2, 4, "length").shape
  Shape([batch:4, length:4])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.op_kinds import CostKind

_builtin_slice = slice  # this module defines `slice` (Mesh TF's name)


# --- helpers -----------------------------------------------------------------
def _find_dim(shape, dim, op_name, arg="dim"):
  """(axis, Dimension) of the dim of `shape` named like dim (a name,
  Dimension or (name, size)); raises a ValueError naming the op."""
  name = dim if isinstance(dim, str) else shapes.convert_to_dimension(dim).name
  for i, d in enumerate(shape.dims):
    if d.name == name:
      return i, d
  raise ValueError("%s: %s %r is not a dimension of %s" % (op_name, arg, name,
                                                          shape))


def _resized(shape, axis, size):
  dims = list(shape.dims)
  dims[axis] = shapes.Dimension(dims[axis].name, size)
  return shapes.Shape(dims)


def _unsplit(impl, laid, shape, axis):
  """The whole of tensor axis `axis` on every processor (an allconcat over
  its mesh axis, padding cut, or nothing when it is not split)."""
  return impl.unsplit_dim(laid, shape, axis)


def _resplit(impl, laid, shape, axis):
  """Keeps this processor's stripe of `axis` where `shape` splits it (a
  local slice, padded if uneven; the data is already everywhere)."""
  return impl.resplit_dim(laid, shape, axis)


def _local_slice(t, axis, begin, size):
  index = [_builtin_slice(None)] * t.shape.rank
  index[axis] = _builtin_slice(begin, begin + size)
  return t[tuple(index)]


class _FloatGradient(object):
  """Mixin: only floating-point inputs have gradients."""

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating


# --- slice / pad -------------------------------------------------------------
class _WholeDim(object):
  """An op that needs its dim (self._dim) whole on each processor: Mesh
  TF's unsplittable_dims (meshtf's lowering gathers it if it is split)."""

  def unsplittable_dim_names(self):
    return frozenset([self._dim.name])


class SliceOperation(_WholeDim, _FloatGradient, graph_lib.Operation):
  """x[..., begin:begin + size, ...] along slice_dim_name; the output dim
  keeps the name, with the new size."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, begin, size, slice_dim_name, name=None):
    axis, dim = _find_dim(x.shape, slice_dim_name, "slice", "slice_dim_name")
    begin, size = int(begin), int(size)
    if begin < 0 or size < 0 or begin + size > dim.size:
      raise ValueError("slice: [%d, %d) is outside %s:%d of %s %s" % (
          begin, begin + size, dim.name, dim.size, x.name, x.shape))
    super().__init__([x], name=name or "slice")
    self._axis, self._dim, self._begin, self._size = axis, dim, begin, size
    self._outputs = [graph_lib.Tensor(self, _resized(x.shape, axis, size),
                                      x.dtype)]

  def gradient(self, grad_ys):
    after = self._dim.size - self._begin - self._size
    return [pad(grad_ys[0], [self._begin, after], self._dim.name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    axis, begin, size = self._axis, self._begin, self._size
    t = _unsplit(impl, lowering.tensors[x], x.shape, axis)
    t = impl.slicewise(lambda s: _local_slice(s, axis, begin, size), t)
    lowering.set_tensor_lowering(out, _resplit(impl, t, out.shape, axis))


def mtf_slice(x, begin, size, slice_dim_name, name=None):
  """x[begin:begin + size] along the dim named slice_dim_name (which keeps
  its name). If that dim is split over a mesh axis, its stripes are
  gathered (allconcat), sliced, and split again (local; padded when the
  axis does not divide size). The gradient is a pad.

  Example:
    >>> first_half = mtf.slice(x, 0, length_dim.size // 2, "length")
  """
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


slice = mtf_slice  # pylint: disable=redefined-builtin


class PadOperation(_WholeDim, _FloatGradient, graph_lib.Operation):
  """Zeros before and after x along dim_name (same name, larger size)."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, paddings, dim_name, name=None):
    axis, dim = _find_dim(x.shape, dim_name, "pad", "dim_name")
    before, after = [int(p) for p in paddings]
    if before < 0 or after < 0:
      raise ValueError("pad: paddings %s must be >= 0" % (list(paddings),))
    super().__init__([x], name=name or "pad")
    self._axis, self._dim, self._paddings = axis, dim, (before, after)
    self._outputs = [graph_lib.Tensor(
        self, _resized(x.shape, axis, dim.size + before + after), x.dtype)]

  def gradient(self, grad_ys):
    return [mtf_slice(grad_ys[0], self._paddings[0], self._dim.size,
                      self._dim.name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    axis, (before, after) = self._axis, self._paddings

    def local(s):
      spec = [[0, 0]] * s.shape.rank
      spec[axis] = [before, after]
      return tf.pad(s, spec)
    t = _unsplit(impl, lowering.tensors[x], x.shape, axis)
    t = impl.slicewise(local, t)
    lowering.set_tensor_lowering(out, _resplit(impl, t, out.shape, axis))


def pad(x, paddings, dim_name, name=None):
  """x with paddings[0] zeros before and paddings[1] after along dim_name.
  A split dim is gathered (allconcat), padded and split again (local;
  unevenly if the axis does not divide the new size). The gradient is a
  slice.

  Example:
    >>> y = mtf.pad(x, [1, 0], "length")   # length:8 -> length:9
  """
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]


# --- concat / split ----------------------------------------------------------
class ConcatOperation(_FloatGradient, graph_lib.Operation):
  """Inputs equal in shape except the size of concat_dim_name; the output
  dim has the summed size."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, xs, concat_dim_name, name=None):
    xs = list(xs)
    if not xs:
      raise ValueError("concat: needs at least one tensor")
    axis, _ = _find_dim(xs[0].shape, concat_dim_name, "concat",
                        "concat_dim_name")
    for x in xs:
      if x.dtype != xs[0].dtype:
        raise TypeError("concat: dtypes differ: %s is %s, %s is %s" % (
            xs[0].name, xs[0].dtype.name, x.name, x.dtype.name))
      if (x.shape.ndims != xs[0].shape.ndims or
          _resized(x.shape, axis, 0) != _resized(xs[0].shape, axis, 0)):
        raise ValueError(
            "concat: %s %s and %s %s must have the same dims, in the same "
            "order, except for the size of %r" % (
                xs[0].name, xs[0].shape, x.name, x.shape, concat_dim_name))
    super().__init__(xs, name=name or "concat")
    self._axis = axis
    self._sizes = [x.shape.dims[axis].size for x in xs]
    self._outputs = [graph_lib.Tensor(
        self, _resized(xs[0].shape, axis, sum(self._sizes)), xs[0].dtype)]

  def unsplittable_dim_names(self):
    return frozenset([self._outputs[0].shape.dims[self._axis].name])

  def gradient(self, grad_ys):
    name = self._outputs[0].shape.dims[self._axis].name
    out, begin = [], 0
    for size in self._sizes:
      out.append(mtf_slice(grad_ys[0], begin, size, name))
      begin += size
    return out

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out, axis = self._outputs[0], self._axis
    parts = [_unsplit(impl, lowering.tensors[x], x.shape, axis)
             for x in self._inputs]
    t = impl.slicewise(lambda *s: tf.concat(list(s), axis), *parts)
    lowering.set_tensor_lowering(out, _resplit(impl, t, out.shape, axis))


def concat(xs, concat_dim_name, name=None):
  """The tensors xs joined along concat_dim_name (the dim keeps its name;
  its size is the sum). Where that dim is split, each input is gathered
  (allconcat), joined locally and the result split again (local). The
  gradient is slices.

  Example:
    >>> y = mtf.concat([x1, x2], "length")   # length:4 + length:8 -> 12
  """
  xs = list(xs)
  if len(xs) == 1:
    return xs[0]
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


class SplitOperation(_WholeDim, _FloatGradient, graph_lib.Operation):
  """Pieces of x along split_dim (each keeps the name, with its size)."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, split_dim, num_or_size_splits, name=None):
    axis, dim = _find_dim(x.shape, split_dim, "split", "split_dim")
    if isinstance(num_or_size_splits, int):
      n = num_or_size_splits
      if n <= 0 or dim.size % n:
        raise ValueError("split: %s:%d does not split into %d equal parts"
                         % (dim.name, dim.size, n))
      sizes = [dim.size // n] * n
    else:
      sizes = [int(s) for s in num_or_size_splits]
      if sum(sizes) != dim.size or min(sizes) < 0:
        raise ValueError("split: sizes %s must be >= 0 and sum to %s:%d" % (
            sizes, dim.name, dim.size))
    super().__init__([x], name=name or "split")
    self._axis, self._dim, self._sizes = axis, dim, sizes
    self._outputs = [graph_lib.Tensor(self, _resized(x.shape, axis, s),
                                      x.dtype, index=i)
                     for i, s in enumerate(sizes)]

  def gradient(self, grad_ys):
    # autodiff has replaced missing output gradients with zeros.
    return [concat(grad_ys, self._dim.name)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, axis, sizes = self._inputs[0], self._axis, self._sizes
    t = _unsplit(impl, lowering.tensors[x], x.shape, axis)
    begin = 0
    for out, size in zip(self._outputs, sizes):
      piece = impl.slicewise(
          lambda s, b=begin, n=size: _local_slice(s, axis, b, n), t)
      lowering.set_tensor_lowering(out, _resplit(impl, piece, out.shape, axis))
      begin += size


def split(x, split_dim, num_or_size_splits, name=None):
  """A list of pieces of x along split_dim (a number of equal pieces, or a
  list of sizes), as tf.split. A split split_dim is gathered (allconcat)
  and each piece split again (local). The gradient is a concat.

  Example:
    >>> q, k, v = mtf.split(qkv, "heads3", 3)
  """
  return SplitOperation(x, split_dim, num_or_size_splits, name=name).outputs


# --- stack / unstack ---------------------------------------------------------
class StackOperation(_WholeDim, _FloatGradient, graph_lib.Operation):
  """Equal-shaped xs stacked along a new dim dim_name:len(xs) at `axis`."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, xs, dim_name, axis, name=None):
    xs = list(xs)
    if not xs:
      raise ValueError("stack: needs at least one tensor")
    for x in xs:
      if x.shape != xs[0].shape or x.dtype != xs[0].dtype:
        raise ValueError("stack: %s (%s %s) and %s (%s %s) differ" % (
            xs[0].name, xs[0].shape, xs[0].dtype.name, x.name, x.shape,
            x.dtype.name))
    if xs[0].shape.has_dim_name(dim_name):
      raise ValueError("stack: %r is already a dimension of %s" % (
          dim_name, xs[0].shape))
    ndims = xs[0].shape.ndims
    if not -ndims - 1 <= axis <= ndims:
      raise ValueError("stack: axis %d out of range for %s" % (
          axis, xs[0].shape))
    axis = axis % (ndims + 1)
    super().__init__(xs, name=name or "stack")
    self._axis = axis
    self._dim = shapes.Dimension(dim_name, len(xs))
    dims = list(xs[0].shape.dims)
    dims.insert(axis, self._dim)
    self._outputs = [graph_lib.Tensor(self, shapes.Shape(dims), xs[0].dtype)]

  def gradient(self, grad_ys):
    return unstack(grad_ys[0], self._dim)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out, axis = self._outputs[0], self._axis
    t = impl.slicewise(lambda *s: tf.stack(list(s), axis),
                       *[lowering.tensors[x] for x in self._inputs])
    # Every processor holds all the stacked tensors' slices: keep its stripe.
    lowering.set_tensor_lowering(out, _resplit(impl, t, out.shape, axis))


def stack(xs, dim_name, axis=0, name=None):
  """The equal-shaped tensors xs stacked along a new dim dim_name:len(xs)
  at position `axis`. Local; if the new dim is split, each processor keeps
  its stripe (no communication). The gradient is unstack.

  Example:
    >>> y = mtf.stack([a, b, c], "parts", axis=0)   # [parts:3, ...]
  """
  return StackOperation(xs, dim_name, axis, name=name).outputs[0]


class UnstackOperation(_WholeDim, _FloatGradient, graph_lib.Operation):
  """One tensor per index of dim, without that dim."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, dim, name=None):
    axis, dim = _find_dim(x.shape, dim, "unstack")
    super().__init__([x], name=name or "unstack")
    self._axis, self._dim = axis, dim
    rest = x.shape - [dim]
    self._outputs = [graph_lib.Tensor(self, rest, x.dtype, index=i)
                     for i in range(dim.size)]

  def gradient(self, grad_ys):
    return [stack(grad_ys, self._dim.name, self._axis)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, axis = self._inputs[0], self._axis
    t = _unsplit(impl, lowering.tensors[x], x.shape, axis)
    for i, out in enumerate(self._outputs):
      lowering.set_tensor_lowering(out, impl.slicewise(
          lambda s, i=i: tf.gather(s, i, axis=axis), t))


def unstack(x, dim, name=None):
  """A list of dim.size tensors: x at each index of dim, without dim. A
  split dim is gathered first (allconcat over its mesh axis). The gradient
  is stack.

  Example:
    >>> a, b, c = mtf.unstack(y, parts_dim)
  """
  return UnstackOperation(x, dim, name=name).outputs


# --- shift / halo_exchange ---------------------------------------------------
class ShiftOperation(_FloatGradient, graph_lib.Operation):
  """out[i] = x[i - offset] along dim: zeros shifted in (wrap=False) or a
  rotation (wrap=True)."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, offset, dim, wrap, name=None):
    axis, dim = _find_dim(x.shape, dim, "shift")
    super().__init__([x], name=name or "shift")
    self._axis, self._dim = axis, dim
    self._offset, self._wrap = int(offset), bool(wrap)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    # Each element moved by +offset: its gradient moves back.
    return [shift(grad_ys[0], -self._offset, self._dim, self._wrap)]

  def permutes(self, layout):
    """The halo exchange along a dim split evenly over one mesh axis
    (lower(): with stripe s and offset q * s + r, r elements from one
    neighbour and s - r from another), [(mesh axis, elements per
    device)]; a pipeline's buffer moves one stage each iteration this way.
    Empty where the lowering moves nothing between neighbours (no offset,
    a shift past the end) or shifts the whole dim locally (unsplit, or
    split unevenly or over several axes).

    Example:
      >>> mtf.shift(x, 1, "length", wrap=False).operation.permutes(layout)
      [(0, 32)]
    """
    x = self._inputs[0]
    n, offset = self._dim.size, self._offset
    if self._wrap:
      offset %= n
    elif abs(offset) >= n:
      return []
    split = layout.dim_split(x.shape, self._axis)
    if not offset or len(split.mesh_axes) != 1 or not split.is_even:
      return []
    stripe = n // layout.axis_size(split.mesh_axis)
    q, r = offset // stripe, offset % stripe
    per_element = layout.slice_size(x.shape) // stripe
    out = []
    if r:
      out.append((split.mesh_axis, r * per_element))
    if q:
      out.append((split.mesh_axis, (stripe - r if r else stripe) *
                  per_element))
    return out

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out, axis = self._inputs[0], self._outputs[0], self._axis
    n, offset, wrap = self._dim.size, self._offset, self._wrap
    if wrap:
      offset %= n
    t = lowering.tensors[x]
    if offset == 0:
      lowering.set_tensor_lowering(out, t)
      return
    if not wrap and abs(offset) >= n:
      lowering.set_tensor_lowering(out, impl.slicewise(tf.zeros_like, t))
      return
    split = impl.mesh_layout.dim_split(x.shape, axis)
    if len(split.mesh_axes) != 1 or not split.is_even:
      # Unsplit, or split unevenly or over several axes (where a halo from
      # one neighbour along one axis does not do): shift the whole dim
      # locally (gathered first if split).
      t = _unsplit(impl, t, x.shape, axis)
      t = impl.slicewise(lambda s: _local_shift(s, axis, offset, wrap), t)
      lowering.set_tensor_lowering(out, _resplit(impl, t, x.shape, axis))
      return
    mesh_axis = split.mesh_axis
    # Halo exchange. With stripe s and offset = q * s + r (0 <= r < s), the
    # out stripe of processor p is [last r of stripe p-q-1, first s-r of
    # stripe p-q]: each sender slices before sending, so only s elements
    # travel per processor.
    s = n // impl.shape.dims[mesh_axis].size
    q, r = offset // s, offset % s
    parts = []
    if r:
      tail = impl.slicewise(lambda v: _local_slice(v, axis, s - r, r), t)
      parts.append(impl.shift_by_n_processors(tail, mesh_axis, q + 1, wrap))
    head = t if r == 0 else impl.slicewise(
        lambda v: _local_slice(v, axis, 0, s - r), t)
    if q:
      head = impl.shift_by_n_processors(head, mesh_axis, q, wrap)
    parts.append(head)
    value = parts[0] if len(parts) == 1 else impl.slicewise(
        lambda *v: tf.concat(list(v), axis), *parts)
    lowering.set_tensor_lowering(out, value)


def _local_shift(t, axis, offset, wrap):
  if wrap:
    return tf.roll(t, offset, axis)
  n = t.shape[axis]
  spec = [[0, 0]] * t.shape.rank
  if offset > 0:
    spec[axis] = [offset, 0]
    return _local_slice(tf.pad(t, spec), axis, 0, n)
  spec[axis] = [0, -offset]
  return _local_slice(tf.pad(t, spec), axis, -offset, n)


def shift(x, offset, dim, wrap, name=None):
  """x shifted by offset along dim (out[i] = x[i - offset]), filling with
  zeros (wrap=False) or rotating (wrap=True, as tf.roll). Local when dim is
  not split; otherwise a halo exchange: each processor receives the
  |offset| mod stripe boundary elements from one neighbour and the rest
  of its stripe from another (collective permutes along dim's mesh axis).
  The gradient is shift by -offset.

  Example:
    >>> previous = mtf.shift(x, 1, length_dim, wrap=False)
  """
  return ShiftOperation(x, offset, dim, wrap, name=name).outputs[0]


def halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Concatenates halo_size elements from the neighbouring blocks (along
  blocks_dim) on both sides of block_size_dim, which grows by 2*halo_size
  (Mesh TensorFlow's algorithm: shifts of whole blocks and of the margins,
  then one concat). Communication is that of shift (permutes along
  blocks_dim's mesh axis) and concat (an allconcat if block_size_dim is
  split). Blocks past the ends give zeros unless wrap.

  Example:
    >>> y = mtf.halo_exchange(x, blocks_dim, block_size_dim, 1)
  """
  return _exchange_halos(x, blocks_dim, block_size_dim, halo_size, wrap,
                         "halo_exchange", right_side=True)


def left_halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Like halo_exchange, on the left side only: each block gets the last
  halo_size elements before it (from the previous blocks along blocks_dim)
  prepended, and block_size_dim grows by halo_size. Used by causal local
  attention. Blocks before the first give zeros unless wrap.

  Example:
    >>> k = mtf.left_halo_exchange(k, num_blocks, memory_block_length, 128)
  """
  return _exchange_halos(x, blocks_dim, block_size_dim, halo_size, wrap,
                         "left_halo_exchange", right_side=False)


def _exchange_halos(x, blocks_dim, block_size_dim, halo_size, wrap, op_name,
                    right_side):
  """The halo_size elements before each block (and after it, if right_side)
  concatenated on block_size_dim: whole neighbouring blocks by shifts along
  blocks_dim, then the partial margins."""
  blocks_dim = _find_dim(x.shape, blocks_dim, op_name, "blocks_dim")[1]
  block_size_dim = _find_dim(x.shape, block_size_dim, op_name,
                             "block_size_dim")[1]
  if halo_size == 0:
    return x
  partial = halo_size % block_size_dim.size
  complete = halo_size // block_size_dim.size
  before, after = [], []
  for i in range(1, complete + 1):
    before.insert(0, shift(x, i, blocks_dim, wrap))
    if right_side:
      after.append(shift(x, -i, blocks_dim, wrap))
  if partial:
    tail = mtf_slice(x, block_size_dim.size - partial, partial,
                     block_size_dim.name)
    before.insert(0, shift(tail, complete + 1, blocks_dim, wrap))
    if right_side:
      head = mtf_slice(x, 0, partial, block_size_dim.name)
      after.append(shift(head, -(complete + 1), blocks_dim, wrap))
  return concat(before + [x] + after, block_size_dim.name)


# --- dynamic_shift -----------------------------------------------------------
def dynamic_shift(x, offset, dim, wrap, name=None):
  """x shifted along dim by a per-position amount: out[..., i, ...] =
  x[..., i - offset[...], ...], zeros shifted in (wrap=False) or a rotation
  (wrap=True). offset is an integer Tensor whose dims are a subset of x's
  other dims (Mesh TensorFlow's mtf.dynamic_shift), e.g. one shift per
  batch row.

  A gather along dim at the source positions: where dim is split, each
  processor reads the sources in its own stripe and the stripes add up (an
  allreduce over dim's mesh axis). The gradient is the scatter back.

  Example:
    >>> y = mtf.dynamic_shift(x, shift_per_row, length_dim, wrap=False)
  """
  from meshtf.ops import elementwise
  from meshtf.ops import index
  from meshtf.ops import shape_ops
  _, dim = _find_dim(x.shape, dim, "dynamic_shift")
  if not isinstance(offset, graph_lib.Tensor):
    raise TypeError("dynamic_shift: offset %r must be an integer meshtf "
                    "Tensor (for a fixed offset use mtf.shift)" % (offset,))
  if not offset.dtype.is_integer:
    raise TypeError("dynamic_shift: offset %s has dtype %s, not an integer "
                    "dtype; cast it with mtf.cast(offset, tf.int32)" % (
                        offset.name, offset.dtype.name))
  if offset.shape.has_dim_name(dim.name):
    raise ValueError("dynamic_shift: offset %s %s may not contain the shifted "
                     "dim %r" % (offset.name, offset.shape, dim.name))
  for d in offset.shape.dims:
    if d not in x.shape.dims:
      raise ValueError(
          "dynamic_shift: offset %s %s must use only dims of x %s %s (other "
          "than %r); %s:%d is not one" % (offset.name, offset.shape, x.name,
                                          x.shape, dim.name, d.name, d.size))
  name = name or "dynamic_shift"
  # The output positions under a temporary (unsplit) name, then renamed.
  tmp = shapes.Dimension("_dynamic_shift_" + dim.name, dim.size)
  if x.shape.has_dim_name(tmp.name):
    raise ValueError("dynamic_shift: x %s already has a dim named %r" % (
        x.shape, tmp.name))
  position = index.mtf_range(x.mesh, tmp, offset.dtype, name=name + "_range")
  source = elementwise.sub(position, offset)
  if wrap:
    source = elementwise.mod(source, dim.size)  # floor mod: non-negative
  # Sources outside [0, dim.size) read zeros (gather's out-of-range rule).
  out_shape = shapes.Shape([tmp if d.name == dim.name else d
                            for d in x.shape.dims])
  y = index.gather(x, source, dim, output_shape=out_shape, name=name)
  return shape_ops.rename_dimension(y, tmp.name, dim.name)


# --- pool_tensor_1d / stride_tensor_1d ---------------------------------------
def _blocked(tensor, pool_dim, pool_size, op_name):
  """tensor reshaped so pool_dim:n becomes [pool_dim:n/pool_size,
  tmp_pool:pool_size] (a reshape: an allconcat + local slice where pool_dim
  is split, local otherwise)."""
  axis, dim = _find_dim(tensor.shape, pool_dim, op_name, "pool_dim")
  if pool_size <= 0 or dim.size % pool_size:
    raise ValueError("%s: pool_size %d does not divide %s:%d" % (
        op_name, pool_size, dim.name, dim.size))
  tmp = shapes.Dimension("tmp_pool", pool_size)
  if tensor.shape.has_dim_name(tmp.name):
    raise ValueError("%s: %s already has a dim named tmp_pool" % (
        op_name, tensor.shape))
  from meshtf.ops import shape_ops
  dims = list(tensor.shape.dims)
  dims[axis:axis + 1] = [shapes.Dimension(dim.name, dim.size // pool_size),
                         tmp]
  return shape_ops.reshape(tensor, shapes.Shape(dims)), tmp


def pool_tensor_1d(tensor, pool_dim, reduce_fn=None, pool_size=2):
  """Pools non-overlapping windows of pool_size along pool_dim (which keeps
  its name, with size / pool_size) with reduce_fn (default reduce_mean;
  called as reduce_fn(x, reduced_dim=dim)). Communication is that of the
  reshape (see _blocked) and of the reduction (none: tmp_pool is unsplit).

  Example:
    >>> y = mtf.pool_tensor_1d(x, length_dim, mtf.reduce_max, pool_size=2)
  """
  if reduce_fn is None:
    from meshtf.ops import reductions
    reduce_fn = reductions.reduce_mean
  x, tmp = _blocked(tensor, pool_dim, pool_size, "pool_tensor_1d")
  return reduce_fn(x, reduced_dim=tmp)


def stride_tensor_1d(tensor, pool_dim, pool_size=2):
  """Every pool_size-th element along pool_dim (starting at 0); pool_dim
  keeps its name, with size / pool_size. A reshape, a local slice of the
  unsplit tmp_pool dim, and a reshape dropping it.

  Example:
    >>> y = mtf.stride_tensor_1d(x, length_dim, pool_size=2)
  """
  from meshtf.ops import shape_ops
  x, tmp = _blocked(tensor, pool_dim, pool_size, "stride_tensor_1d")
  x = mtf_slice(x, 0, 1, tmp.name)
  return shape_ops.reshape(x, x.shape - [tmp.name])


__all__ = ["mtf_slice", "slice", "pad", "concat", "split", "stack", "unstack",
           "shift", "halo_exchange", "left_halo_exchange", "dynamic_shift",
           "pool_tensor_1d", "stride_tensor_1d"]
