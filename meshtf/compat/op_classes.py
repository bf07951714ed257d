"""Mesh TensorFlow's ops.py names that meshtf spells otherwise.

Operation classes under their Mesh TF names and constructor signatures
(mtf.Conv2dOperation, mtf.Constant, mtf.ScalarAddOperation, ...), and
ops.py's helper functions (list_product, processor_groups,
tensor_dim_to_mesh_dim_size, log_variable_sizes, scalar_summary, ...), so
that Mesh TF model code runs unchanged. Each is a thin adapter over
meshtf's own op; the semantics are meshtf's (layout-invariant).

Example:
  >>> mtf.list_product([2, 3, 4])
  24
  >>> mtf.pnum_to_processor_coordinates(mtf.convert_to_shape("r:2;c:4"), 6)
  [1, 2]
"""
import functools
import operator

from absl import logging
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import mesh_layout as mesh_layout_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import conv
from meshtf.ops import elementwise
from meshtf.ops import io
from meshtf.ops import pool
from meshtf.ops import random as random_ops
from meshtf.ops import slicewise as slicewise_lib
from meshtf.ops import variables
from meshtf.ops import _local

# Classes whose meshtf constructor already takes Mesh TF's arguments.
Constant = io.ConstantOperation
StopGradient = elementwise.StopGradientOperation
ReadVariable = variables.ReadVariableOperation


class ScalarAddOperation(slicewise_lib.SlicewiseOperation):
  """x + scalar (Mesh TF's class; mtf.add with a number is the same)."""

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, x, scalar, name=None):
    super().__init__(lambda t: t + tf.cast(scalar, t.dtype), [x], [x.shape],
                     [x.dtype], x.shape.dimension_names,
                     grad_function=lambda op, dy: [dy],
                     name=name or "scalar_add")


class BinaryOpWithBroadcasting(slicewise_lib.SlicewiseOperation):
  """tf_fn(x1, x2) with both broadcast by name to output_shape.

  It has no gradient (a broadcast input's gradient needs a sum across
  processors): use mtf.add / mtf.multiply etc. to differentiate."""

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, tf_fn, x1, x2, output_shape, output_dtype, name=None):
    output_shape = shapes.convert_to_shape(output_shape)

    def fn(a, b):
      return tf_fn(_local.expand_to(a, x1.shape, output_shape),
                   _local.expand_to(b, x2.shape, output_shape))
    super().__init__(fn, [x1, x2], [output_shape], [output_dtype],
                     output_shape.dimension_names + x1.shape.dimension_names +
                     x2.shape.dimension_names,
                     name=name or "binary_op_with_broadcasting")

  has_gradient = False


def binary_op_with_broadcasting(tf_fn, x1, x2, output_shape=None,
                                output_dtype=None):
  """Mesh TF's helper: tf_fn(x1, x2) broadcast by dim name.

  Example:
    >>> z = mtf.binary_op_with_broadcasting(tf.less, x, y)
  """
  if not isinstance(x2, type(x1)):   # a number: Mesh TF's scalar case
    return slicewise_lib.slicewise(lambda t: tf_fn(t, x2), [x1],
                                   output_dtype=output_dtype)
  output_shape = (shapes.convert_to_shape(output_shape) if output_shape
                  else _local.union_shape([x1.shape, x2.shape]))
  return BinaryOpWithBroadcasting(tf_fn, x1, x2, output_shape,
                                  output_dtype or x1.dtype).outputs[0]


def _pool_kind(pool_fn_string, ksize, strides, label):
  """("MAX" or "AVG", nd) of a Mesh TF pool_fn_string."""
  kind, _, nd = str(pool_fn_string).partition("_")
  if kind not in ("MAX", "AVG") or nd not in ("2D", "3D"):
    raise ValueError("%s pool_fn_string %r: use MAX_2D, AVG_2D, MAX_3D or "
                     "AVG_3D" % (label, pool_fn_string))
  if list(strides) != list(ksize):
    raise ValueError("%s: strides %s differ from ksize %s; meshtf pools "
                     "non-overlapping windows" % (label, list(strides),
                                                  list(ksize)))
  if len(ksize) != int(nd[0]):
    raise ValueError("%s: ksize %s needs %s entries for %s" % (
        label, list(ksize), nd[0], pool_fn_string))
  return kind, int(nd[0])


class PoolOperation(pool.PoolOperation):
  """Mesh TF's PoolOperation(x, ksize, strides, pool_fn_string) with
  pool_fn_string one of MAX_2D, AVG_2D, MAX_3D, AVG_3D (strides must equal
  ksize: meshtf pools non-overlapping windows)."""

  def __init__(self, x, ksize, strides, pool_fn_string, name=None):
    kind, nd = _pool_kind(pool_fn_string, ksize, strides, "PoolOperation")
    super().__init__(x, ksize, kind, nd, name=name)


class Conv2dOperation(conv.ConvOperation):
  """Mesh TF's Conv2dOperation(conv_input, conv_filter, strides, padding)."""

  def __init__(self, conv_input, conv_filter, strides, padding, name=None):
    super().__init__(conv_input, conv_filter, _window(strides, 2), padding,
                     2, name=name)


class Conv3dOperation(conv.ConvOperation):
  """Mesh TF's Conv3dOperation(conv_input, conv_filter, strides, padding)."""

  def __init__(self, conv_input, conv_filter, strides, padding, name=None):
    super().__init__(conv_input, conv_filter, _window(strides, 3), padding,
                     3, name=name)


def _window(strides, nd):
  """Mesh TF's [1, s1, .., snd, 1] strides as meshtf's nd window."""
  strides = list(strides)
  return strides[1:-1] if len(strides) == nd + 2 else strides


class Conv2or3dBackpropInputOperation(conv.ConvInputGradOperation):
  """Mesh TF's (conv_dimension, is_transpose, input_shape, conv_filter, dy,
  strides, padding); all dims splittable, as there. is_transpose=True is
  the input gradient of a transposed convolution: the convolution of dy
  with the filter (a meshtf ConvOperation, checked to give input_shape)."""

  def __new__(cls, conv_dimension, is_transpose, input_shape, conv_filter,
              dy, strides, padding, name=None):
    if is_transpose:
      return _TransposeInputGrad(conv_dimension, input_shape, conv_filter,
                                 dy, strides, padding, name)
    return super().__new__(cls)

  def __init__(self, conv_dimension, is_transpose, input_shape, conv_filter,
               dy, strides, padding, name=None):
    del is_transpose  # False here (__new__ built the other kind)
    super().__init__(dy, conv_filter, input_shape,
                     _window(strides, conv_dimension), padding,
                     conv_dimension, name=name)

  def unsplittable_dim_names(self):
    return frozenset()


class _TransposeInputGrad(conv.ConvOperation):
  """d(conv_transpose)/d(input) = conv(dy, filter)."""

  def __init__(self, nd, input_shape, conv_filter, dy, strides, padding,
               name=None):
    label = "conv%dd_transpose" % nd
    super().__init__(dy, conv_filter, _window(strides, nd), padding, nd,
                     name=name or label + "_backprop", label=label)
    input_shape = shapes.convert_to_shape(input_shape)
    if self.outputs[0].shape != input_shape:
      raise ValueError(
          "%s backprop input: conv of dy %s with filter %s gives %s, not "
          "input_shape %s; check strides %s and padding %s" % (
              label, dy.shape, conv_filter.shape, self.outputs[0].shape,
              input_shape, list(strides), padding))

  def unsplittable_dim_names(self):
    return frozenset()


class Conv2or3dBackpropFilterOperation(conv.ConvFilterGradOperation):
  """Mesh TF's (conv_dimension, is_transpose, conv_input, filter_shape, dy,
  strides, padding); all dims splittable, as there. is_transpose=True is
  the filter gradient of a transposed convolution (conv_input its input,
  dy the gradient of its output): the roles of the two swap."""

  def __init__(self, conv_dimension, is_transpose, conv_input, filter_shape,
               dy, strides, padding, name=None):
    if is_transpose:
      conv_input, dy = dy, conv_input
    super().__init__(conv_input, dy, filter_shape,
                     _window(strides, conv_dimension), padding,
                     conv_dimension, name=name)

  def unsplittable_dim_names(self):
    return frozenset()


class Conv2dTransposeOperation(conv.ConvInputGradOperation):
  """Mesh TF's Conv2dTransposeOperation(conv_input, conv_filter, strides,
  padding): conv_input [batch..., h, w, in], conv_filter [fh, fw, out,
  in]; h and w grow by the strides (VALID: plus max(f - s, 0), as
  tf.nn.conv2d_transpose; Mesh TF assumed SAME's sizes)."""

  _nd = 2

  def __init__(self, conv_input, conv_filter, strides, padding, name=None):
    nd, label = self._nd, "conv%dd_transpose" % self._nd
    window = conv.normalize_window(_window(strides, nd), nd, label,
                                   "strides")
    padding = conv.normalize_padding(padding, label)
    shape, _ = conv.transpose_output_shape(label, conv_input, conv_filter,
                                           window, padding, nd)
    super().__init__(conv_input, conv_filter, shape, window, padding, nd,
                     name=name or label, label=label)


class Conv3dTransposeOperation(Conv2dTransposeOperation):
  """Mesh TF's Conv3dTransposeOperation(conv_input, conv_filter, strides,
  padding) (see Conv2dTransposeOperation)."""

  _nd = 3


def _transpose_grad(nd, kind, *args, name=None):
  cls = (Conv2or3dBackpropInputOperation if kind == "input" else
         Conv2or3dBackpropFilterOperation)
  return cls(nd, True, *args, name=name).outputs[0]


def conv2d_transpose_backprop_input(input_shape, conv_filter, dy, strides,
                                    padding, name=None):
  """d(conv2d_transpose)/d(input): conv2d of dy with the filter.

  Example:
    >>> dx = mtf.conv2d_transpose_backprop_input(x.shape, f, dy,
    ...                                          [1, 2, 2, 1], "SAME")
  """
  return _transpose_grad(2, "input", input_shape, conv_filter, dy, strides,
                         padding, name=name)


def conv2d_transpose_backprop_filter(conv_input, filter_shape, dy, strides,
                                     padding, name=None):
  """d(conv2d_transpose)/d(filter) (conv_input: the transpose's input).

  Example:
    >>> df = mtf.conv2d_transpose_backprop_filter(x, f.shape, dy,
    ...                                           [1, 2, 2, 1], "SAME")
  """
  return _transpose_grad(2, "filter", conv_input, filter_shape, dy, strides,
                         padding, name=name)


def conv3d_transpose_backprop_input(input_shape, conv_filter, dy, strides,
                                    padding, name=None):
  """d(conv3d_transpose)/d(input).

  Example:
    >>> dx = mtf.conv3d_transpose_backprop_input(x.shape, f, dy, [1] * 5,
    ...                                          "SAME")
  """
  return _transpose_grad(3, "input", input_shape, conv_filter, dy, strides,
                         padding, name=name)


def conv3d_transpose_backprop_filter(conv_input, filter_shape, dy, strides,
                                     padding, name=None):
  """d(conv3d_transpose)/d(filter).

  Example:
    >>> df = mtf.conv3d_transpose_backprop_filter(x, f.shape, dy, [1] * 5,
    ...                                           "SAME")
  """
  return _transpose_grad(3, "filter", conv_input, filter_shape, dy, strides,
                         padding, name=name)


class PoolBackPropOperation(pool._PoolBase):  # pylint: disable=protected-access
  """Mesh TF's pooling gradient (x, y, dy, ksize, strides, pool_fn_string),
  with its semantics: MAX sends dy to every position equal to its window's
  maximum (ties all get it; meshtf's own max-pool gradient follows
  TensorFlow and picks one), AVG spreads dy / window size. Windows do not
  overlap (strides == ksize) and must tile x's spatial dims."""

  def __init__(self, x, y, dy, ksize, strides, pool_fn_string, name=None):
    kind, nd = _pool_kind(pool_fn_string, ksize, strides,
                          "PoolBackPropOperation")
    self._label = "pool_backprop"
    self._ksize, self._kind, self._nd = tuple(ksize), kind, nd
    self._x_shape = x.shape
    for d, k in zip(self._spatial, self._ksize):
      if d.size % k:
        raise ValueError(
            "pool_backprop: spatial dim %s:%d of x %s does not divide by "
            "ksize %d (Mesh TF's pool_backprop needs whole windows)" % (
                d.name, d.size, x.name, k))
    super().__init__([x, y, dy], name=name or "pool_backprop")
    self._outputs = [graph_lib.Tensor(self, x.shape, dy.dtype)]

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    first = -(self._nd + 1)

    def upscale(t):
      for i, k in enumerate(self._ksize):
        t = tf.repeat(t, k, axis=first + i)
      return t

    if self._kind == "MAX":
      def local(xs, ys, dys):
        return tf.cast(tf.equal(xs, upscale(ys)), dys.dtype) * upscale(dys)
    else:
      window = float(functools.reduce(operator.mul, self._ksize, 1))

      def local(xs, ys, dys):
        del xs, ys
        return upscale(dys) / tf.constant(window, dys.dtype)
    args = [lowering.tensors[t] for t in self._inputs]
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise(local, *args))


def pool_backprop(x, y, dy, ksize, strides, pool_fn_string, name=None):
  """Mesh TF's pool_backprop: dx of y = pool(x) given dy (see
  PoolBackPropOperation).

  Example:
    >>> dx = mtf.pool_backprop(x, y, dy, [2, 2], [2, 2], "MAX_2D")
  """
  return PoolBackPropOperation(x, y, dy, ksize, strides, pool_fn_string,
                               name=name).outputs[0]


class RandomOperation(random_ops.RandomOperation):
  """Mesh TF's RandomOperation(mesh, shape, tf_fn, **kwargs) for tf_fn a
  uniform or normal TF sampler: drawn by meshtf's layout-invariant rng."""

  def __init__(self, mesh, shape, tf_fn, **kwargs):
    name = getattr(tf_fn, "__name__", "")
    dtype = kwargs.get("dtype", tf.float32)
    if "uniform" in name:
      dist, params = "uniform", (kwargs.get("minval", 0.0),
                                 kwargs.get("maxval", 1.0))
    elif "normal" in name:
      dist, params = "normal", (kwargs.get("mean", 0.0),
                                kwargs.get("stddev", 1.0))
    else:
      raise ValueError("RandomOperation: tf_fn %r is neither a uniform nor a "
                       "normal sampler; meshtf draws those two layout-"
                       "invariantly (mtf.random_uniform, mtf.random_normal)"
                       % (tf_fn,))
    super().__init__(mesh, shape, dist, params, kwargs.get("seed") or 0,
                     dtype, name=kwargs.get("name"))


class ImportLaidOutTensorOperation(io.ImportSlicesOperation):
  """Mesh TF's import of per-processor slices: laid_out_tensor holds one
  slice per processor in `tensor_list`. Every dim is unsplittable, as in
  Mesh TF (its slices define the layout)."""

  def __init__(self, mesh, laid_out_tensor, shape, name=None):
    shape = shapes.convert_to_shape(shape)
    slices = list(laid_out_tensor.tensor_list)
    dtype = getattr(slices[0], "dtype", tf.float32)
    super().__init__(mesh, shape, None, dtype,
                     name=name or "import_laid_out_tensor")
    self._slices = slices

  def host_slice(self, mesh_impl, pnum):
    """Processor pnum's slice, as given (it must match the layout)."""
    return tf.convert_to_tensor(self._slices[pnum], self._outputs[0].dtype)

  def unsplittable_dim_names(self):
    return frozenset(self._outputs[0].shape.dimension_names)


# --- ops.py helper functions -------------------------------------------------
def list_product(l):  # pylint: disable=invalid-name (Mesh TF's keyword)
  """The product of a list of numbers (1 for an empty list)."""
  return functools.reduce(operator.mul, l, 1)


def pnum_to_processor_coordinates(mesh_shape, pnum):
  """Row-major coordinates of processor pnum on mesh_shape."""
  return mesh_layout_lib.MeshLayout(mesh_shape).pnum_to_processor_coordinates(
      pnum)


def processor_coordinates_to_pnum(mesh_shape, coord):
  """The processor number at coordinates coord of mesh_shape."""
  return mesh_layout_lib.MeshLayout(mesh_shape).processor_coordinates_to_pnum(
      coord)


def processor_groups(mesh_shape, group_dims):
  """Lists of processors that differ only along mesh axes group_dims
  (indices), e.g. the groups of an allreduce over those axes.

  Example:
    >>> mtf.processor_groups(mtf.convert_to_shape("r:2;c:2"), [1])
    [[0, 1], [2, 3]]
  """
  return mesh_layout_lib.MeshLayout(mesh_shape).processor_groups(
      list(group_dims))


def tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim):
  """How many ways the layout splits tensor_dim (1 if not split, or when
  the mesh or the layout is not given: a model built without them, as
  Mesh TF's Unitransformer(layout=None, mesh_shape=None), sees one
  processor). layout may also be a MeshLayout (then mesh_shape is None):
  the product of the sizes of the axes a multi-axis rule splits it over.

  Example:
    >>> tensor_dim_to_mesh_dim_size("batch:rows+cols", "rows:2;cols:4",
    ...                             mtf.Dimension("batch", 64))
    8
  """
  if isinstance(layout, mesh_layout_lib.MeshLayout):
    layout_obj = layout
  elif mesh_shape is None or layout is None:
    return 1
  else:
    layout_obj = mesh_layout_lib.MeshLayout(mesh_shape, layout)
  axes = layout_obj.split_axes(tensor_dim)
  return list_product([layout_obj.mesh_shape.dims[a].size for a in axes])


def tensor_dim_to_size_per_split(layout, mesh_shape, tensor_dim):
  """tensor_dim's size on each processor; Mesh TF needs even splits."""
  n = tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim)
  if tensor_dim.size % n:
    raise ValueError("%s does not split evenly %d ways" % (tensor_dim, n))
  return tensor_dim.size // n


def log_variable_sizes(var_list=None, tag=None, verbose=False,
                       mesh_to_impl=None, log_file=None):
  """Logs each variable's shape and the total parameter count.

  var_list: meshtf Variable operations (or their Tensors). Returns the
  total number of parameters (Mesh TF logged it only).
  """
  del mesh_to_impl
  total = 0
  for v in var_list or []:
    op = getattr(v, "operation", v)
    total += op.shape.size
    if verbose:
      logging.info("Variable %s size %d shape %s", op.name, op.shape.size,
                   op.shape)
  message = "%s count: %d" % (tag or "Trainable Variables", total)
  logging.info(message)
  if log_file is not None:
    log_file.write(message + "\n")
  return total


def scalar_summary(name, x):
  """Accepted and ignored: Mesh TF collected scalars for TPUEstimator's
  host_call; meshtf's training loop writes its own tf.summary scalars.

  Example:
    >>> mtf.scalar_summary("loss", loss)   # no-op
  """
  del name, x


__all__ = [
    "Constant", "StopGradient", "ReadVariable",
    "ScalarAddOperation", "BinaryOpWithBroadcasting",
    "binary_op_with_broadcasting", "PoolOperation", "Conv2dOperation",
    "Conv3dOperation", "Conv2or3dBackpropInputOperation",
    "Conv2or3dBackpropFilterOperation", "Conv2dTransposeOperation",
    "Conv3dTransposeOperation", "conv2d_transpose_backprop_input",
    "conv2d_transpose_backprop_filter", "conv3d_transpose_backprop_input",
    "conv3d_transpose_backprop_filter", "PoolBackPropOperation",
    "pool_backprop", "RandomOperation",
    "ImportLaidOutTensorOperation", "list_product",
    "pnum_to_processor_coordinates", "processor_coordinates_to_pnum",
    "processor_groups", "tensor_dim_to_mesh_dim_size",
    "tensor_dim_to_size_per_split", "log_variable_sizes", "scalar_summary",
]
