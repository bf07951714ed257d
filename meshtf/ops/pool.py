"""Pooling: max_pool2d, avg_pool2d, max_pool3d, avg_pool3d (Mesh TensorFlow's
names; Mesh TensorFlow has them in mtf.layers).

As in Mesh TensorFlow, windows do not overlap: strides == ksize, padding
VALID (positions past the last whole window are dropped). x is [batch...,
spatial..., channels]: the last nd + 1 dims by position are the nd spatial
dims and the channels. A pooled spatial dim keeps its name, with size
size // ksize.

Layouts: everything is local. A split spatial dim needs stripes that ksize
divides into the pooled dim's stripes (then every window lies on one
processor; uneven splits too, e.g. h:10 with ksize 2 on 3 processors:
stripes of 4 pool into stripes of 2 of h:5); otherwise a LayoutError
(a ValueError) names the op, the dim, the mesh axis, the sizes and the fix,
before any TensorFlow work. The gradient is a meshtf op too
(PoolGradOperation: TensorFlow's MaxPoolGrad / AvgPoolGrad on each slice,
so ties go where TensorFlow sends them).

Example:
  >>> import meshtf as mtf
  >>> from meshtf.ops import pool
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:2;h:8;w:6;c:3")
  >>> pool.max_pool2d(x, ksize=(2, 3)).shape
  Shape([batch:2, h:4, w:2, c:3])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import errors
from meshtf.op_kinds import CostKind
from meshtf.ops import conv as conv_lib

_POOL = {("MAX", 2): tf.nn.max_pool2d, ("AVG", 2): tf.nn.avg_pool2d,
         ("MAX", 3): tf.nn.max_pool3d, ("AVG", 3): tf.nn.avg_pool3d}


class _PoolBase(graph_lib.Operation):
  """Shared checks; subclasses set self._x_shape, self._ksize, self._nd,
  self._label."""

  cost_kind = CostKind.KERNEL

  @property
  def _spatial(self):
    return self._x_shape.dims[-(self._nd + 1):-1]

  def unsplittable_dim_names(self):
    """Mesh TF's unsplittable_dims: the spatial dims (meshtf can split
    them when windows tile the stripes; validate_layout checks that)."""
    return frozenset(d.name for d in self._spatial)

  def validate_layout(self, mesh_layout):
    for d, k in zip(self._spatial, self._ksize):
      a = mesh_layout.split_axis(d)
      if a is None:
        continue
      if isinstance(a, tuple):
        raise errors.LayoutError(
            "%s %r: spatial dim %r is split over several mesh axes %s; "
            "split it over one axis (or not at all)." % (
                self._label, self.name, d.name,
                list(mesh_layout.mesh_axis_names(a))))
      m = mesh_layout.shape.dims[a]
      stripe = -(-d.size // m.size)
      # Windows must tile every stripe, and the pooled stripes must line up
      # with the pooled dim's own split (ceil(size // k / n) positions).
      if stripe % k or stripe // k != -(-(d.size // k) // m.size):
        raise errors.LayoutError(
            "%s %r: spatial dim %s:%d is split over mesh axis %r (size %d) "
            "into stripes of %d, which ksize %d does not tile into the "
            "pooled dim's stripes of %d, so a pooling window would straddle "
            "two processors. Make the stripe a multiple of %d (%s a "
            "multiple of %d), or do not split %r." % (
                self._label, self.name, d.name, d.size, m.name, m.size,
                stripe, k, -(-(d.size // k) // m.size), k, d.name,
                k * m.size, d.name))

  def _window(self):
    return [1] + list(self._ksize) + [1]

  def _batch_count(self):
    return self._x_shape.ndims - self._nd - 1


class PoolOperation(_PoolBase):
  """Non-overlapping max or average pooling over the nd spatial dims."""

  def __init__(self, x, ksize, kind, nd, name=None):
    self._label = "%s_pool%dd" % (kind.lower(), nd)
    self._ksize = conv_lib.normalize_window(ksize, nd, self._label, "ksize")
    self._kind, self._nd, self._x_shape = kind, nd, x.shape
    if x.shape.ndims < nd + 1:
      raise ValueError("%s: x %s has %d dims; it needs [batch..., %d spatial "
                       "dims, channels]" % (self._label, x.shape,
                                            x.shape.ndims, nd))
    if kind == "AVG" and not x.dtype.is_floating:
      raise TypeError("%s: x %s has dtype %s; average pooling needs a "
                      "floating dtype" % (self._label, x.name, x.dtype.name))
    dims = list(x.shape.dims)
    for i, k in enumerate(self._ksize):
      axis = x.shape.ndims - 1 - nd + i
      d = dims[axis]
      if d.size < k:
        raise ValueError("%s: ksize %d is larger than spatial dim %s:%d of "
                         "x %s" % (self._label, k, d.name, d.size, x.name))
      dims[axis] = shapes.Dimension(d.name, d.size // k)
    super().__init__([x], name=name or self._label)
    self._outputs = [graph_lib.Tensor(self, shapes.Shape(dims), x.dtype)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    x, y = self._inputs[0], self._outputs[0]
    return [PoolGradOperation(x, y, grad_ys[0], self._ksize, self._kind,
                              self._nd).outputs[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    nb, window = self._batch_count(), self._window()
    fn = _POOL[(self._kind, self._nd)]

    def local(xs):
      flat, batch = conv_lib.flatten_batch(xs, nb)
      out = fn(flat, window, window, "VALID")
      return conv_lib.restore_batch(out, batch)
    lowering.set_tensor_lowering(
        self._outputs[0],
        impl.slicewise(local, lowering.tensors[self._inputs[0]]))


class PoolGradOperation(_PoolBase):
  """dx of a pooling op: MAX needs x and y (where the maxima were), AVG
  only dy."""

  def __init__(self, x, y, dy, ksize, kind, nd, name=None):
    self._label = "%s_pool%dd" % (kind.lower(), nd)
    self._ksize, self._kind, self._nd = tuple(ksize), kind, nd
    self._x_shape = x.shape
    inputs = [x, y, dy] if kind == "MAX" else [dy]
    super().__init__(inputs, name=name or self._label + "_grad")
    self._outputs = [graph_lib.Tensor(self, x.shape, dy.dtype)]

  @property
  def has_gradient(self):
    # Average pooling's gradient is linear in dy: its own gradient is a
    # pool. (Max pooling's second derivative is not provided.)
    return self._kind == "AVG"

  def gradient(self, grad_ys):
    return [PoolOperation(grad_ys[0], self._ksize, "AVG", self._nd).outputs[0]]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    nb, window = self._batch_count(), self._window()
    flat = lambda t: conv_lib.flatten_batch(t, nb)
    args = [lowering.tensors[t] for t in self._inputs]
    if self._kind == "MAX":
      grad = (tf.raw_ops.MaxPoolGrad if self._nd == 2 else
              tf.raw_ops.MaxPool3DGrad)

      def local(xs, ys, dys):
        (xf, batch), (yf, _), (df, _) = flat(xs), flat(ys), flat(dys)
        out = grad(orig_input=xf, orig_output=yf, grad=df, ksize=window,
                   strides=window, padding="VALID")
        return conv_lib.restore_batch(out, batch)
    else:
      grad = (tf.raw_ops.AvgPoolGrad if self._nd == 2 else
              tf.raw_ops.AvgPool3DGrad)
      x_local = impl.slice_shape(self._x_shape)
      batch = x_local[:nb]
      in_shape = [shapes.prod(batch)] + x_local[nb:]

      def local(dys):
        out = grad(orig_input_shape=in_shape, grad=flat(dys)[0], ksize=window,
                   strides=window, padding="VALID")
        return conv_lib.restore_batch(out, batch)
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise(local, *args))


def _pool(x, ksize, kind, nd, name):
  ksize = conv_lib.normalize_window(ksize, nd, "%s_pool%dd" % (kind.lower(),
                                                               nd), "ksize")
  if all(k == 1 for k in ksize):
    return x
  return PoolOperation(x, ksize, kind, nd, name=name).outputs[0]


def max_pool2d(x, ksize=(2, 2), name=None):
  """2D max pooling of x [batch..., h, w, channels] over windows ksize =
  strides (no overlap), padding VALID: h -> h // ksize[0], w -> w //
  ksize[1].

  Example:
    >>> y = max_pool2d(x, ksize=(2, 2))
  """
  return _pool(x, ksize, "MAX", 2, name)


def avg_pool2d(x, ksize=(2, 2), name=None):
  """2D average pooling (see max_pool2d).

  Example:
    >>> y = avg_pool2d(x, ksize=(2, 2))
  """
  return _pool(x, ksize, "AVG", 2, name)


def max_pool3d(x, ksize=(2, 2, 2), name=None):
  """3D max pooling of x [batch..., d, h, w, channels] (see max_pool2d).

  Example:
    >>> y = max_pool3d(x, ksize=(2, 2, 2))
  """
  return _pool(x, ksize, "MAX", 3, name)


def avg_pool3d(x, ksize=(2, 2, 2), name=None):
  """3D average pooling (see max_pool2d).

  Example:
    >>> y = avg_pool3d(x, ksize=(2, 2, 2))
  """
  return _pool(x, ksize, "AVG", 3, name)


__all__ = ["max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d"]
