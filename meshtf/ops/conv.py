"""Convolutions: conv1d, conv2d, conv3d, conv2d_transpose, conv3d_transpose
and the *_with_blocks forms, with Mesh TensorFlow's names and conventions.
Pooling is in meshtf/ops/pool.py.

Shapes: conv_input is [batch..., spatial..., in_channels] -- the last nd + 1
dims, by position, are the nd spatial dims and the channels; every dim
before them is a batch dim. conv_filter is [filter spatial..., in_channels,
out_channels] ([..., out_channels, in_channels] for the transposes, as
tf.nn.conv2d_transpose). An output spatial dim keeps its input's name, with
the new size. padding is "SAME" or "VALID", as TensorFlow; strides are nd
numbers, or nd + 2 with ones at both ends (Mesh TensorFlow's [1, sh, sw, 1]).

Every convolution is one of three meshtf operations, each built from the
others' gradients, so the backward pass is laid out and lowered like the
forward one:

  ConvOperation             y  = conv(x, f)
  ConvInputGradOperation    dx = conv^T(dy, f)  (also the transposed convs)
  ConvFilterGradOperation   df = sum over batch and positions of x * dy

Layouts (what each split costs):
  batch dims       local; the filter gradient sums over them: a pending
                   allreduce over their mesh axes.
  in channels      each processor's conv is a partial sum over its channels:
                   a pending allreduce (deferred past adds, as einsum).
  out channels     local.
  filter spatial   the filter is gathered first (allconcat; it is small).
  spatial dims     a halo exchange: each processor receives the `lo`
                   positions before its stripe and the `hi` after it from its
                   neighbours (collective permutes; zeros past the image
                   edges, which is the SAME padding), then runs a VALID conv
                   locally. The input gradient is its adjoint: a local
                   transposed conv into the extended stripe, whose margins go
                   back to the neighbours they came from and are added. The
                   filter gradient sums over positions: a pending allreduce.
                   This needs output stripes that line up with the input
                   stripes (output size x stride == input size, e.g. SAME
                   padding with stripes divisible by the stride); any other
                   case raises a LayoutError (a ValueError) before any
                   TensorFlow work. Uneven splits (stripes of ceil(size /
                   n)) work the same way: the padding at the end of the
                   last stripes is zeroed first and reads as SAME padding;
                   every input's padding is zeroed, so no sum counts it.

Blocks (the *_with_blocks forms, as Mesh TensorFlow): an image dim may be
stored as a blocks dim (among the batch dims) times a within-block dim,
image position = block * block_size + offset. The ops take the blocks dims
as an argument: each processor's blocks are contiguous in the image, so
locally they are merged with their within-block dim and the blocks dim's
mesh axis is treated as a split of the image dim (the same halo exchange,
along the blocks dim's mesh axis), with no extra graph ops.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.ops import conv
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:2;h:8;w:8;ci:3")
  >>> f = mtf.ones(mesh, "fh:3;fw:3;ci:3;co:4")
  >>> conv.conv2d(x, f, [1, 2, 2, 1], "SAME").shape
  Shape([batch:2, h:4, w:4, co:4])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import errors
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind
from meshtf.ops.conv_slices import flatten_batch  # noqa: F401
from meshtf.ops.conv_slices import halo_extend  # noqa: F401
from meshtf.ops.conv_slices import halo_reduce  # noqa: F401
from meshtf.ops.conv_slices import restore_batch  # noqa: F401
from meshtf.ops.conv_slices import tf_conv  # noqa: F401
from meshtf.ops.conv_slices import tf_filter_grad  # noqa: F401
from meshtf.ops.conv_slices import tf_input_grad  # noqa: F401


# --- arguments ---------------------------------------------------------------
def normalize_window(values, nd, op_name, arg):
  """nd positive ints from an int, nd numbers, or nd + 2 numbers with ones
  at both ends (TensorFlow's NHWC form)."""
  if isinstance(values, int):
    out = [values] * nd
  else:
    out = [int(v) for v in values]
    if len(out) == nd + 2:
      if out[0] != 1 or out[-1] != 1:
        raise ValueError(
            "%s: %s %s must be 1 for the batch and channel positions; give "
            "%d numbers, e.g. %s" % (op_name, arg, list(values), nd,
                                     out[1:-1]))
      out = out[1:-1]
  if len(out) != nd or min(out) < 1:
    raise ValueError("%s: %s %r must be %d positive integers (or %d with ones "
                     "at both ends)" % (op_name, arg, values, nd, nd + 2))
  return tuple(out)


def normalize_padding(padding, op_name):
  p = str(padding).upper()
  if p not in ("SAME", "VALID"):
    raise ValueError("%s: padding %r: use \"SAME\" or \"VALID\"" % (
        op_name, padding))
  return p


def conv_size(n, k, stride, padding):
  """(output size, zeros before, zeros after) of a conv along one dim of
  size n with filter size k, as TensorFlow pads."""
  if padding == "SAME":
    out = -(-n // stride)
    total = max((out - 1) * stride + k - n, 0)
  else:
    out = (n - k) // stride + 1 if n >= k else 0
    total = 0
  return out, total // 2, total - total // 2


def transpose_size(m, k, stride, padding):
  """Output size of a transposed conv of input size m (Keras's rule; the
  conv of that size has size m again)."""
  return m * stride if padding == "SAME" else m * stride + max(k - stride, 0)


def _shape_str(shape):
  return errors.describe_shape(shape)


def _dim_name(d):
  return d if isinstance(d, str) else shapes.convert_to_dimension(d).name


def _resolve_blocks(op_name, x_shape, nd, blocks, x_label):
  """blocks (one Dimension, name or None per spatial dim) as dims of x's
  batch part."""
  blocks = list(blocks) if blocks is not None else [None] * nd
  if len(blocks) != nd:
    raise ValueError("%s: %d blocks dims for %d spatial dims" % (
        op_name, len(blocks), nd))
  batch = x_shape.dims[:-(nd + 1)]
  out = []
  for b in blocks:
    if b is None:
      out.append(None)
      continue
    found = [d for d in batch if d.name == _dim_name(b)]
    if not found:
      raise ValueError(
          "%s: blocks dim %r must be a dim of %s %s before its %d spatial "
          "dims" % (op_name, _dim_name(b), x_label, _shape_str(x_shape), nd))
    if found[0] in out:
      raise ValueError("%s: blocks dim %r is given twice" % (op_name,
                                                             found[0].name))
    out.append(found[0])
  return out


class _Geometry(object):
  """Dims and sizes of y = conv(x, f), x [batch..., spatial..., in],
  f [filter spatial..., in, out], with optional blocks dims; raises a
  ValueError on a mismatch.

  The conv is computed on the "image" view: the blocks dims leave the
  batch dims (`batch`) and multiply their spatial dims (`spatial`:
  Dimensions with the image sizes). `y_shape` is the real output shape.
  """

  def __init__(self, op_name, nd, x_shape, f_shape, strides, padding,
               blocks=None, x_label="conv_input", f_label="conv_filter"):
    if x_shape.ndims < nd + 1:
      raise ValueError(
          "%s: %s %s has %d dims; it needs [batch..., %d spatial dims, "
          "channels]" % (op_name, x_label, _shape_str(x_shape), x_shape.ndims,
                         nd))
    if f_shape.ndims != nd + 2:
      raise ValueError(
          "%s: %s %s must have %d dims: [%d filter spatial dims, "
          "in_channels, out_channels]" % (op_name, f_label,
                                          _shape_str(f_shape), nd + 2, nd))
    self.nd, self.strides, self.padding = nd, strides, padding
    self.blocks = _resolve_blocks(op_name, x_shape, nd, blocks, x_label)
    self.real_batch = x_shape.dims[:-(nd + 1)]
    self.batch = [d for d in self.real_batch if d not in self.blocks]
    self.within = x_shape.dims[-(nd + 1):-1]
    self.spatial = [shapes.Dimension(w.name, w.size * (b.size if b else 1))
                    for w, b in zip(self.within, self.blocks)]
    self.in_dim = x_shape.dims[-1]
    self.filter_spatial = f_shape.dims[:nd]
    f_in, self.out_dim = f_shape.dims[nd], f_shape.dims[nd + 1]
    if f_in != self.in_dim:
      raise ValueError(
          "%s: the in-channels dim of %s %s is %s:%d, but the channels dim "
          "of %s %s is %s:%d; they must be the same dimension" % (
              op_name, f_label, _shape_str(f_shape), f_in.name, f_in.size,
              x_label, _shape_str(x_shape), self.in_dim.name,
              self.in_dim.size))
    self.pads, self.out_spatial, y_within = [], [], []
    for d, w, b, fd, st in zip(self.spatial, self.within, self.blocks,
                               self.filter_spatial, strides):
      out, lo, hi = conv_size(d.size, fd.size, st, padding)
      if out < 1:
        raise ValueError(
            "%s: filter dim %s:%d is larger than spatial dim %s:%d of %s "
            "with padding VALID; use padding SAME or a smaller filter" % (
                op_name, fd.name, fd.size, d.name, d.size, x_label))
      if b is not None and (out * st != d.size or w.size % st):
        raise ValueError(
            "%s: the image along %s x %s (%d x %d) with filter %s:%d, stride "
            "%d and padding %s does not decompose into blocks: each output "
            "block must come from its input block and its neighbours. Use "
            "padding SAME (or VALID with a filter no larger than the stride) "
            "and a block size %s:%d that the stride divides" % (
                op_name, b.name, w.name, b.size, w.size, fd.name, fd.size, st,
                padding, w.name, w.size))
      self.pads.append((lo, hi))
      self.out_spatial.append(shapes.Dimension(d.name, out))
      y_within.append(shapes.Dimension(w.name, out // (b.size if b else 1)))
    names = [d.name for d in x_shape.dims[:-1]]
    if self.out_dim.name in names:
      raise ValueError(
          "%s: the out-channels dim %s of %s is also a dim of %s %s; give "
          "it another name" % (op_name, self.out_dim.name, f_label, x_label,
                               _shape_str(x_shape)))
    self.y_shape = shapes.Shape(self.real_batch + y_within + [self.out_dim])
    # Local merge of blocks into their spatial dims: the real axes in image
    # order (each blocks axis right before its within-block axis).
    nbr = len(self.real_batch)
    bidx = [None if b is None else self.real_batch.index(b)
            for b in self.blocks]
    self._perm = [i for i in range(nbr) if i not in bidx]
    for i, bi in enumerate(bidx):
      self._perm += ([] if bi is None else [bi]) + [nbr + i]
    self._perm.append(nbr + nd)
    self._bidx = bidx

  @property
  def has_blocks(self):
    return any(b is not None for b in self.blocks)

  def image_sizes(self, real_sizes):
    """Local sizes in the image view from a real slice's sizes."""
    nbr = len(self.real_batch)
    out = [real_sizes[i] for i in self._perm[:len(self.batch)]]
    for i, bi in enumerate(self._bidx):
      out.append(real_sizes[nbr + i] * (1 if bi is None else real_sizes[bi]))
    return out + [real_sizes[-1]]

  def to_image(self, t):
    """Per slice: real order -> image view (blocks merged)."""
    if not self.has_blocks:
      return t
    sizes = t.shape.as_list()
    return tf.reshape(tf.transpose(t, self._perm), self.image_sizes(sizes))

  def from_image(self, t, real_sizes):
    """Per slice: image view -> real order with the given local sizes."""
    if not self.has_blocks:
      return t
    t = tf.reshape(t, [real_sizes[i] for i in self._perm])
    inverse = [self._perm.index(i) for i in range(len(self._perm))]
    return tf.transpose(t, inverse)


# --- the three operations ----------------------------------------------------
class _ConvBase(graph_lib.Operation):
  """Shared layout logic. Subclasses set self._geom (the geometry of the
  forward conv), self._x_shape (the forward input's real shape),
  self._label (the user-facing op name for messages) and self._roles (what
  the forward conv's input and output are to the user)."""

  _roles = ("input", "output")
  # Each is a kernel whose split input channels leave partial sums.
  cost_kind = CostKind.KERNEL
  sums_partials = True
  # Which input is the forward conv's output y (None: this op's output).
  _y_input = None

  def flops(self, layout, tile=0):
    """The forward conv's multiply-adds, which every conv op does: 2 x
    local y x the filter window x the local input channels."""
    del tile
    g = self._geom
    y = (self._outputs[0] if self._y_input is None
         else self._inputs[self._y_input])
    window = shapes.prod(d.size for d in g.filter_spatial)
    return 2 * layout.slice_size(y.shape) * window * layout.slice_size(
        [g.in_dim])

  def _spatial_plan(self, impl):
    """Per spatial dim of the image view: (tensor axis, mesh axis or None,
    local stripe, zeros / halo before, after). A blocked dim is split by
    its blocks dim's mesh axis."""
    g, nb = self._geom, len(self._geom.batch)
    plan = []
    for i, (d, b, (lo, hi)) in enumerate(zip(g.spatial, g.blocks, g.pads)):
      a = impl.split_axis(b if b is not None else d)
      if a is None:
        stripe = d.size
      else:  # ceil: uneven splits are padded at the end
        n = impl.shape.dims[a].size
        stripe = (-(-b.size // n) * (d.size // b.size) if b is not None
                  else -(-d.size // n))
      plan.append((nb + i, a, stripe, lo, hi))
    return plan

  def validate_layout(self, mesh_layout):
    g = self._geom
    x_role, y_role = self._roles
    for d, w, b, od, fd, st in zip(g.spatial, g.within, g.blocks,
                                   g.out_spatial, g.filter_spatial,
                                   g.strides):
      for spatial in (w, b) if b is not None else (w,):
        axes = mesh_layout.split_axes(spatial)
        if len(axes) > 1:
          raise errors.LayoutError(
              "%s %r: %s dim %r is split over several mesh axes %s; the "
              "halo exchange runs along one mesh axis. Split %r over one "
              "axis (or not at all)." % (
                  self._label, self.name, "blocks" if spatial is b else
                  "spatial", spatial.name,
                  list(mesh_layout.mesh_axis_names(axes)), spatial.name))
      a = mesh_layout.split_axis(w)
      if a is not None and b is not None:
        m = mesh_layout.shape.dims[a]
        raise errors.LayoutError(
            "%s %r: within-block dim %r is split over mesh axis %r: a "
            "processor's part of the image would not be contiguous. Split "
            "the blocks dim %r instead." % (self._label, self.name, w.name,
                                            m.name, b.name))
      if a is None:
        continue
      m = mesh_layout.shape.dims[a]
      if od.size * st != d.size or (
          -(-od.size // m.size) * st != -(-d.size // m.size)):
        raise errors.LayoutError(
            "%s %r: spatial dim %r is split over mesh axis %r (size %d), "
            "but with filter %s:%d, stride %d and padding %s the %s's %s:%d "
            "(stripes of %s) times the stride does not equal the %s's %s:%d "
            "(stripes of %s), so a window would need data from beyond the "
            "neighbouring processors. Use padding SAME with stripes that the "
            "stride divides, or %s_with_blocks, or do not split %r." % (
                self._label, self.name, d.name, m.name, m.size, fd.name,
                fd.size, st, g.padding, y_role, d.name, od.size,
                _stripes(od.size, m.size), x_role, d.name, d.size,
                _stripes(d.size, m.size),
                self._label.replace("_with_blocks", ""), d.name))

  def _filter(self, lowering, f_tensor):
    """The filter's slice with its spatial dims whole (allconcat where a
    layout splits them) and the padding of uneven channel splits zeroed."""
    impl = lowering.mesh_impl(self)
    f = _zero_padding(lowering, f_tensor)
    for i in range(self._geom.nd):
      f = impl.unsplit_dim(f, f_tensor.shape, i)
    return f

  def _extend(self, lowering, x_tensor):
    """x's slice in the image view with every spatial stripe extended by
    its halo (or zero padding). The conv and its filter gradient extend the
    same x the same way: the lowering keeps the result, so the halo
    travels once."""
    impl = lowering.mesh_impl(self)
    plan = tuple(self._spatial_plan(impl))
    cache = lowering.__dict__.setdefault("_conv_halo_cache", {})
    # Only within one TF graph (a loop body is traced into its own).
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    key = (x_tensor, tuple(self._geom.blocks), plan, graph)
    if key not in cache:
      # Zeroed padding of uneven splits reads as the zeros SAME padding
      # puts past the end of a spatial dim, and adds nothing to a sum.
      x = impl.slicewise(self._geom.to_image,
                         _zero_padding(lowering, x_tensor))
      for axis, a, stripe, lo, hi in plan:
        x = halo_extend(impl, x, axis, a, stripe, lo, hi)
      cache[key] = x
    return cache[key]

  def _extended_sizes(self, impl):
    """Local image-view sizes of the forward input's slice once extended."""
    sizes = self._geom.image_sizes(impl.slice_shape(self._x_shape))
    for axis, _, stripe, lo, hi in self._spatial_plan(impl):
      sizes[axis] = stripe + lo + hi
    return sizes


def _zero_padding(lowering, t):
  """t's laid-out value with the padding of its uneven dims zeroed."""
  return lowering.mesh_impl(t).mask_padding(lowering.tensors[t], t.shape, 0)


def _stripes(size, n):
  return "%d" % -(-size // n)


class ConvOperation(_ConvBase):
  """y = conv(x, f) over nd spatial dims (see the module docstring)."""

  def __init__(self, conv_input, conv_filter, strides, padding, nd,
               blocks=None, name=None, label=None):
    self._label = label or "conv%dd" % nd
    strides = normalize_window(strides, nd, self._label, "strides")
    padding = normalize_padding(padding, self._label)
    _check_dtypes(self._label, conv_input, conv_filter)
    geom = _Geometry(self._label, nd, conv_input.shape, conv_filter.shape,
                     strides, padding, blocks)
    super().__init__([conv_input, conv_filter], name=name or self._label)
    self._geom, self._x_shape = geom, conv_input.shape
    self._outputs = [graph_lib.Tensor(self, geom.y_shape, conv_input.dtype)]

  def unsplittable_dim_names(self):
    """Mesh TF's unsplittable_dims: spatial and filter-spatial dims (meshtf
    splits spatial dims with a halo exchange; this is for Mesh TF code)."""
    g = self._geom
    return frozenset(d.name for d in list(g.within) + list(g.filter_spatial))

  def gradient(self, grad_ys):
    x, f = self._inputs
    g, dy = self._geom, grad_ys[0]
    return [conv_input_grad(dy, f, x.shape, g.strides, g.padding, g.blocks),
            conv_filter_grad(x, dy, f.shape, g.strides, g.padding, g.blocks)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x_t, f_t = self._inputs
    g, out = self._geom, self._outputs[0]
    nb, y_sizes = len(g.batch), impl.slice_shape(out.shape)
    f = self._filter(lowering, f_t)
    x = self._extend(lowering, x_t)

    def local(xs, fs):
      flat, batch = flatten_batch(xs, nb)
      y = restore_batch(tf_conv(flat, fs, g.strides), batch)
      return g.from_image(y, y_sizes)
    y = impl.slicewise(local, x, f)
    axes = impl.mesh_layout.split_axes(g.in_dim)
    if axes:  # partial sums over this processor's in channels
      y = pending_lib.PendingSum(impl, y, axes)
    lowering.set_tensor_lowering(out, y)


class ConvInputGradOperation(_ConvBase):
  """dx = conv^T(dy, f): the gradient of conv(x, f) with respect to x, of
  shape input_shape. Also conv*_transpose's forward op."""

  _y_input = 0   # dy

  def __init__(self, dy, conv_filter, input_shape, strides, padding, nd,
               blocks=None, name=None, label=None):
    self._label = label or "conv%dd" % nd
    strides = normalize_window(strides, nd, self._label, "strides")
    padding = normalize_padding(padding, self._label)
    _check_dtypes(self._label, dy, conv_filter)
    input_shape = shapes.convert_to_shape(input_shape)
    geom = _Geometry(self._label, nd, input_shape, conv_filter.shape,
                     strides, padding, blocks, x_label="the output")
    if geom.y_shape != dy.shape:
      raise ValueError(
          "%s: input %s does not fit filter %s, strides %s and padding %s: "
          "expected %s" % (self._label, _shape_str(dy.shape),
                           _shape_str(conv_filter.shape), list(strides),
                           padding, _shape_str(geom.y_shape)))
    super().__init__([dy, conv_filter],
                     name=name or self._label + "_input_grad")
    self._geom, self._x_shape = geom, input_shape
    if "_transpose" in self._label:
      self._roles = ("output", "input")
    self._outputs = [graph_lib.Tensor(self, input_shape, dy.dtype)]

  def gradient(self, grad_ys):
    dy, f = self._inputs
    g, ddx = self._geom, grad_ys[0]
    return [conv(ddx, f, g.strides, g.padding, g.nd, blocks=g.blocks),
            conv_filter_grad(ddx, dy, f.shape, g.strides, g.padding,
                             g.blocks)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dy_t, f_t = self._inputs
    g, out = self._geom, self._outputs[0]
    nb = len(g.batch)
    f = self._filter(lowering, f_t)
    sizes = self._extended_sizes(impl)

    def local(dys, fs):
      flat, batch = flatten_batch(g.to_image(dys), nb)
      dx = tf_input_grad(flat, fs, [shapes.prod(batch)] + sizes[nb:], g.strides)
      return restore_batch(dx, batch)
    dx = impl.slicewise(local, _zero_padding(lowering, dy_t), f)
    for axis, a, stripe, lo, hi in reversed(self._spatial_plan(impl)):
      dx = halo_reduce(impl, dx, axis, a, stripe, lo, hi)
    if g.has_blocks:
      x_sizes = impl.slice_shape(out.shape)
      dx = impl.slicewise(lambda t: g.from_image(t, x_sizes), dx)
    axes = impl.mesh_layout.split_axes(g.out_dim)
    if axes:  # partial sums over this processor's out channels
      dx = pending_lib.PendingSum(impl, dx, axes)
    lowering.set_tensor_lowering(out, dx)


class ConvFilterGradOperation(_ConvBase):
  """df: the gradient of conv(x, f) with respect to f, of filter_shape."""

  _y_input = 1   # dy

  def __init__(self, conv_input, dy, filter_shape, strides, padding, nd,
               blocks=None, name=None, label=None):
    self._label = label or "conv%dd" % nd
    strides = normalize_window(strides, nd, self._label, "strides")
    padding = normalize_padding(padding, self._label)
    _check_dtypes(self._label, conv_input, dy)
    filter_shape = shapes.convert_to_shape(filter_shape)
    geom = _Geometry(self._label, nd, conv_input.shape, filter_shape,
                     strides, padding, blocks, f_label="filter_shape")
    if geom.y_shape != dy.shape:
      raise ValueError(
          "%s: dy %s does not fit input %s, filter %s, strides %s and "
          "padding %s: expected %s" % (
              self._label, _shape_str(dy.shape),
              _shape_str(conv_input.shape), _shape_str(filter_shape),
              list(strides), padding, _shape_str(geom.y_shape)))
    super().__init__([conv_input, dy],
                     name=name or self._label + "_filter_grad")
    self._geom, self._x_shape = geom, conv_input.shape
    self._outputs = [graph_lib.Tensor(self, filter_shape, dy.dtype)]

  def gradient(self, grad_ys):
    x, dy = self._inputs
    g, ddf = self._geom, grad_ys[0]
    return [conv_input_grad(dy, ddf, x.shape, g.strides, g.padding, g.blocks),
            conv(x, ddf, g.strides, g.padding, g.nd, blocks=g.blocks)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x_t, dy_t = self._inputs
    g, out = self._geom, self._outputs[0]
    nb, nd = len(g.batch), g.nd
    x = self._extend(lowering, x_t)
    local_filter = impl.slice_shape(out.shape)
    f_sizes = [d.size for d in g.filter_spatial] + local_filter[nd:]

    def local(xs, dys):
      xs, _ = flatten_batch(xs, nb)
      dys, _ = flatten_batch(g.to_image(dys), nb)
      return tf_filter_grad(xs, dys, f_sizes, g.strides)
    df = impl.slicewise(local, x, _zero_padding(lowering, dy_t))
    # Summed over this processor's batch rows, blocks and positions.
    reduced = sorted({a for d in dy_t.shape.dims[:-1]
                      for a in impl.mesh_layout.split_axes(d)})
    filter_dims = [i for i, d in enumerate(out.shape.dims[:nd])
                   if impl.mesh_layout.split_axes(d)]
    if filter_dims:
      # A split filter dim may share a mesh axis with a reduced dim: the
      # sum then lands split (a reduce-scatter where the axes allow).
      first, rest = filter_dims[0], filter_dims[1:]
      df = impl.allreduce_and_resplit(df, reduced, out.shape, first)
      for i in rest:
        df = impl.resplit_dim(df, out.shape, i)
    elif reduced:
      df = pending_lib.PendingSum(impl, df, reduced)
    lowering.set_tensor_lowering(out, df)


def _check_dtypes(op_name, a, b):
  if not a.dtype.is_floating or a.dtype != b.dtype:
    raise TypeError("%s: %s (%s) and %s (%s) must have the same floating "
                    "dtype; cast with mtf.cast" % (op_name, a.name,
                                                   a.dtype.name, b.name,
                                                   b.dtype.name))


# --- public functions --------------------------------------------------------
def conv(conv_input, conv_filter, strides, padding, nd, name=None,
         blocks=None):
  """The nd-dimensional convolution behind conv1d / conv2d / conv3d and
  the *_with_blocks forms (blocks: one blocks dim or None per spatial
  dim)."""
  label = "conv%dd%s" % (nd, "_with_blocks" if blocks and any(blocks) else "")
  return ConvOperation(conv_input, conv_filter, strides, padding, nd,
                       blocks=blocks, name=name or label,
                       label=label).outputs[0]


def conv_input_grad(dy, conv_filter, input_shape, strides, padding,
                    blocks=None, name=None):
  """The gradient of a conv with respect to its input, as a meshtf op."""
  nd = conv_filter.shape.ndims - 2
  return ConvInputGradOperation(dy, conv_filter, input_shape, strides,
                                padding, nd, blocks=blocks,
                                name=name).outputs[0]


def conv_filter_grad(conv_input, dy, filter_shape, strides, padding,
                     blocks=None, name=None):
  """The gradient of a conv with respect to its filter, as a meshtf op."""
  nd = shapes.convert_to_shape(filter_shape).ndims - 2
  return ConvFilterGradOperation(conv_input, dy, filter_shape, strides,
                                 padding, nd, blocks=blocks,
                                 name=name).outputs[0]


def _check_filter_dims(op_name, conv_filter, given):
  """Named filter spatial dims (Mesh TensorFlow's optional arguments) must
  be the filter's leading dims, in order."""
  for i, d in enumerate(given):
    if d is None:
      continue
    actual = conv_filter.shape.dims[i] if conv_filter.shape.ndims > i else None
    size = None if isinstance(d, str) else shapes.convert_to_dimension(d).size
    if actual is None or actual.name != _dim_name(d) or (
        size is not None and size != actual.size):
      raise ValueError(
          "%s: filter spatial dim %d is %s but %r was given; a filter is "
          "[filter spatial dims..., in_channels, out_channels], in that "
          "order (transpose it with mtf.transpose)" % (
              op_name, i, actual, d))


def conv1d(conv_input, conv_filter, stride=1, padding="SAME", name=None):
  """1D convolution, as tf.nn.conv1d: conv_input [batch..., w, in],
  conv_filter [fw, in, out] -> [batch..., w', out].

  Example:
    >>> y = conv1d(x, f, stride=1, padding="SAME")   # x [b, length, ci]
  """
  return conv(conv_input, conv_filter, stride, padding, 1, name=name)


def conv2d(conv_input, conv_filter, strides, padding, filter_h_dim=None,
           filter_w_dim=None, name=None):
  """2D convolution, as tf.nn.conv2d (NHWC): conv_input [batch..., h, w,
  in], conv_filter [fh, fw, in, out] -> [batch..., h', w', out], h' and w'
  keeping the names h and w. filter_h_dim / filter_w_dim, if given, must
  be the filter's first two dims.

  Example:
    >>> y = conv2d(x, f, [1, 1, 1, 1], "SAME")
  """
  _check_filter_dims("conv2d", conv_filter, [filter_h_dim, filter_w_dim])
  return conv(conv_input, conv_filter, strides, padding, 2, name=name)


def conv3d(conv_input, conv_filter, strides, padding, filter_d_dim=None,
           filter_h_dim=None, filter_w_dim=None, name=None):
  """3D convolution, as tf.nn.conv3d (NDHWC): conv_input [batch..., d, h,
  w, in], conv_filter [fd, fh, fw, in, out] -> [batch..., d', h', w', out].

  Example:
    >>> y = conv3d(x, f, [1, 1, 1, 1, 1], "SAME")
  """
  _check_filter_dims("conv3d", conv_filter,
                     [filter_d_dim, filter_h_dim, filter_w_dim])
  return conv(conv_input, conv_filter, strides, padding, 3, name=name)


def conv_transpose(conv_input, conv_filter, strides, padding, nd, name=None,
                   blocks=None):
  """The nd-dimensional transposed convolution: conv_input [batch...,
  spatial..., in], conv_filter [filter spatial..., out, in]; each output
  spatial size is size * stride (SAME) or size * stride + max(k - stride,
  0) (VALID). blocks: as conv (a blocked dim's block size is multiplied by
  the stride)."""
  blocked = blocks is not None and any(b is not None for b in blocks)
  label = "conv%dd_transpose%s" % (nd, "_with_blocks" if blocked else "")
  strides = normalize_window(strides, nd, label, "strides")
  padding = normalize_padding(padding, label)
  shape, blocks = transpose_output_shape(label, conv_input, conv_filter,
                                         strides, padding, nd, blocks)
  return ConvInputGradOperation(conv_input, conv_filter, shape, strides,
                                padding, nd, blocks=blocks,
                                name=name or label, label=label).outputs[0]


def transpose_output_shape(label, conv_input, conv_filter, strides, padding,
                           nd, blocks=None):
  """(output shape, resolved blocks) of a transposed convolution (see
  conv_transpose), checking the filter's dims against the input's."""
  x, f = conv_input, conv_filter
  if f.shape.ndims != nd + 2:
    raise ValueError("%s: conv_filter %s must have %d dims: [%d filter "
                     "spatial dims, out_channels, in_channels]" % (
                         label, _shape_str(f.shape), nd + 2, nd))
  if x.shape.ndims < nd + 1 or f.shape.dims[nd + 1] != x.shape.dims[-1]:
    raise ValueError(
        "%s: the last dim of conv_filter %s (its in-channels) must be the "
        "channels dim (the last) of conv_input %s" % (
            label, _shape_str(f.shape), _shape_str(x.shape)))
  blocks = _resolve_blocks(label, x.shape, nd, blocks, "conv_input")
  dims = list(x.shape.dims)
  for i, (fd, st, b) in enumerate(zip(f.shape.dims[:nd], strides, blocks)):
    axis = len(dims) - 1 - nd + i
    d = dims[axis]
    if b is not None and padding == "VALID" and fd.size > st:
      raise ValueError(
          "%s: padding VALID with filter %s:%d larger than the stride %d "
          "widens the image along %s by %d, which does not decompose into "
          "blocks of %s; use padding SAME" % (label, fd.name, fd.size, st,
                                               d.name, fd.size - st, b.name))
    size = (d.size * st if b is not None else
            transpose_size(d.size, fd.size, st, padding))
    dims[axis] = shapes.Dimension(d.name, size)
  out_dim = f.shape.dims[nd]
  if out_dim.name in [d.name for d in dims[:-1]]:
    raise ValueError("%s: the out-channels dim %s of conv_filter is also a "
                     "dim of conv_input %s; give it another name" % (
                         label, out_dim.name, _shape_str(x.shape)))
  dims[-1] = out_dim
  return shapes.Shape(dims), blocks


def conv2d_transpose(conv_input, conv_filter, strides, padding, name=None):
  """2D transposed convolution, as tf.nn.conv2d_transpose: conv_input
  [batch..., h, w, in], conv_filter [fh, fw, out, in] -> [batch..., h * sh,
  w * sw, out] (SAME; VALID adds max(f - s, 0)). It is the input gradient
  of conv2d, lowered as such (halo exchange where h or w is split).

  Example:
    >>> up = conv2d_transpose(x, f, [1, 2, 2, 1], "SAME")   # h:4 -> h:8
  """
  return conv_transpose(conv_input, conv_filter, strides, padding, 2, name)


def conv3d_transpose(conv_input, conv_filter, strides, padding, name=None):
  """3D transposed convolution, as tf.nn.conv3d_transpose: conv_input
  [batch..., d, h, w, in], conv_filter [fd, fh, fw, out, in].

  Example:
    >>> up = conv3d_transpose(x, f, [1, 2, 2, 2, 1], "SAME")
  """
  return conv_transpose(conv_input, conv_filter, strides, padding, 3, name)


def conv2d_with_blocks(conv_input, conv_filter, strides, padding,
                       h_blocks_dim=None, w_blocks_dim=None, name=None):
  """conv2d of an image stored in blocks: conv_input [batch..., h_blocks,
  w_blocks, h, w, in] holds image row hb * h.size + i at (hb, i); the
  output has the same blocks dims and blocks of h / stride. A layout may
  split the blocks dims: each processor gets the halo it needs from its
  neighbours along the blocks dim's mesh axis (collective permutes) and
  runs a local VALID conv. Needs padding SAME (or VALID with a filter no
  larger than the stride) and block sizes that the strides divide; any
  filter size. Without blocks dims this is conv2d.

  Example:
    >>> y = conv2d_with_blocks(x, f, [1, 1, 1, 1], "SAME",
    ...                        h_blocks_dim=hb, w_blocks_dim=wb)
  """
  return conv(conv_input, conv_filter, strides, padding, 2, name=name,
              blocks=[h_blocks_dim, w_blocks_dim])


def conv3d_with_blocks(conv_input, conv_filter, strides, padding,
                       d_blocks_dim=None, h_blocks_dim=None,
                       w_blocks_dim=None, name=None):
  """conv3d of an image stored in blocks along d, h and/or w (see
  conv2d_with_blocks).

  Example:
    >>> y = conv3d_with_blocks(x, f, [1, 1, 1, 1, 1], "SAME",
    ...                        d_blocks_dim=db, h_blocks_dim=hb)
  """
  return conv(conv_input, conv_filter, strides, padding, 3, name=name,
              blocks=[d_blocks_dim, h_blocks_dim, w_blocks_dim])


def conv2d_transpose_with_blocks(conv_input, conv_filter, strides, padding,
                                 h_blocks_dim=None, w_blocks_dim=None,
                                 name=None):
  """conv2d_transpose of an image stored in blocks (see
  conv2d_with_blocks): blocks of size B become blocks of B * stride; any
  filter size with padding SAME.

  Example:
    >>> up = conv2d_transpose_with_blocks(x, f, [1, 2, 2, 1], "SAME",
    ...                                   h_blocks_dim=hb)
  """
  return conv_transpose(conv_input, conv_filter, strides, padding, 2, name,
                        blocks=[h_blocks_dim, w_blocks_dim])


def conv3d_transpose_with_blocks(conv_input, conv_filter, strides, padding,
                                 d_blocks_dim=None, h_blocks_dim=None,
                                 w_blocks_dim=None, name=None):
  """conv3d_transpose of an image stored in blocks (see
  conv2d_transpose_with_blocks).

  Example:
    >>> up = conv3d_transpose_with_blocks(x, f, [1, 2, 2, 2, 1], "SAME",
    ...                                   d_blocks_dim=db)
  """
  return conv_transpose(conv_input, conv_filter, strides, padding, 3, name,
                        blocks=[d_blocks_dim, h_blocks_dim, w_blocks_dim])


__all__ = ["conv1d", "conv2d", "conv3d", "conv2d_transpose",
           "conv3d_transpose", "conv2d_with_blocks", "conv3d_with_blocks",
           "conv2d_transpose_with_blocks", "conv3d_transpose_with_blocks"]
