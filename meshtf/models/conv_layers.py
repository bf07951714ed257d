"""Mesh TensorFlow's convolution layers (mtf.layers.conv1d, conv2d, conv3d,
the transposes and the *_with_blocks forms), built on meshtf/ops/conv.py.

Each layer makes its filter with get_variable under a unique prefix (the
first conv2d makes "conv2d/kernel", the next "conv2d_1/kernel"), of shape
[filter dims..., in, out] named fd / fh / fw as in Mesh TensorFlow
([..., out, in] for the transposes). As in Mesh TensorFlow the variable's
master dtype is float32 and it is cast to x's dtype (pass variable_dtype
to change that); the default initializer is TensorFlow's (Glorot uniform).
x's last dim is the in-channels dim; output_dim names the out channels and
must differ from it.

The *_with_blocks layers take an image stored in blocks, [batch, blocks
dims..., within-block dims..., channels]; a layout may split the blocks
dims over mesh axes: each block then gets the halo it needs from its
neighbours (mtf.halo_exchange, collective permutes) before a local conv.
The plain layers work on any layout too (see meshtf/ops/conv.py).

The pooling layers mtf.layers.max_pool2d etc. are meshtf/ops/pool.py's,
re-exported here.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import conv_layers
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.zeros(mesh, "batch:2;h:8;w:8;c:3")
  >>> y = conv_layers.conv2d(x, mtf.Dimension("filters", 16))
  >>> y.shape, [v.name for v in graph.trainable_variables]
  (Shape([batch:2, h:8, w:8, filters:16]), ['conv2d/kernel'])
"""
import math

import tensorflow as tf

from meshtf import shapes
from meshtf.models import dtypes
from meshtf.ops import initializers
from meshtf.ops import conv as conv_ops
from meshtf.ops import elementwise
from meshtf.ops import pool

max_pool2d = pool.max_pool2d
avg_pool2d = pool.avg_pool2d
max_pool3d = pool.max_pool3d
avg_pool3d = pool.avg_pool3d

_FILTER_NAMES = {1: ["fw"], 2: ["fh", "fw"], 3: ["fd", "fh", "fw"]}


def _kernel(x, output_dim, filter_size, nd, transpose, filter_initializer,
            variable_dtype, name, default):
  """(scope, kernel Tensor in x's dtype) for a conv layer."""
  layer = default
  output_dim = shapes.convert_to_dimension(output_dim)
  filter_size = conv_ops.normalize_window(filter_size, nd, layer,
                                          "filter_size")
  if x.shape.ndims < nd + 1:
    raise ValueError("%s: x %s needs [batch..., %d spatial dims, channels]"
                     % (layer, x.shape, nd))
  input_dim = x.shape.dims[-1]
  if output_dim.name in x.shape.dimension_names:
    raise ValueError(
        "%s: output_dim %s:%d has the name of a dim of x %s; name the out "
        "channels differently (e.g. %r) and rename afterwards with "
        "mtf.rename_dimension if needed" % (
            layer, output_dim.name, output_dim.size, x.shape,
            output_dim.name + "_out"))
  scope = x.mesh.graph.unique_name(name or default)
  if variable_dtype is None:
    variable_dtype = dtypes.VariableDType(activation_dtype=x.dtype)
  channels = [output_dim, input_dim] if transpose else [input_dim, output_dim]
  dims = [shapes.Dimension(n, k)
          for n, k in zip(_FILTER_NAMES[nd], filter_size)] + channels
  w = dtypes.get_variable(x.mesh, scope + "/kernel", shapes.Shape(dims),
                          dtype=variable_dtype,
                          initializer=filter_initializer)
  if w.dtype != x.dtype:
    w = elementwise.cast(w, x.dtype)
  return scope, w


def conv1d(x, output_dim, filter_size=3, stride=1, padding="SAME",
           filter_initializer=None, variable_dtype=None, name=None):
  """1D convolution of x [batch..., length, channels] with a kernel [fw,
  channels, output_dim].

  Example:
    >>> y = conv1d(x, mtf.Dimension("filters", 64), filter_size=5)
  """
  scope, w = _kernel(x, output_dim, filter_size, 1, False,
                     _as_conv2d_initializer(filter_initializer),
                     variable_dtype, name, "conv1d")
  return conv_ops.conv(x, w, stride, padding, 1, name=scope + "/conv1d")


def _as_conv2d_initializer(init):
  """Mesh TensorFlow's conv1d was a conv2d with a fake height of 1: it
  called a plain-function initializer with the shape [1, k, in, out]. Such
  a function (a lambda, a mock returning an array of that shape) gets that
  shape here too and its value is reshaped to meshtf's [k, in, out] (the
  fans, hence Glorot's scale, are the same). meshtf and TF/Keras
  initializer objects are shape-agnostic and pass unchanged."""
  if init is None or not callable(init) or isinstance(
      init, initializers.Initializer) or (
          type(init).__name__ in initializers.BY_CLASS_NAME):
    return init

  def fn(shape, dtype=tf.float32):
    value = initializers.call_initializer(init, [1] + list(shape), dtype)
    return tf.reshape(tf.cast(value, dtype), shape)
  fn.__name__ = getattr(init, "__name__", "initializer")
  return fn


def conv2d(x, output_dim, filter_size=(3, 3), strides=(1, 1), padding="SAME",
           filter_initializer=None, variable_dtype=None, name=None):
  """2D convolution of x [batch..., h, w, channels] (NHWC) with a kernel
  [fh, fw, channels, output_dim].

  Example:
    >>> y = conv2d(x, mtf.Dimension("filters", 64), strides=(2, 2))
  """
  scope, w = _kernel(x, output_dim, filter_size, 2, False, filter_initializer,
                     variable_dtype, name, "conv2d")
  return conv_ops.conv(x, w, strides, padding, 2, name=scope + "/conv2d")


def conv3d(x, output_dim, filter_size=(3, 3, 3), strides=(1, 1, 1),
           padding="SAME", filter_initializer=None, variable_dtype=None,
           name=None):
  """3D convolution of x [batch..., d, h, w, channels] (NDHWC) with a
  kernel [fd, fh, fw, channels, output_dim].

  Example:
    >>> y = conv3d(x, mtf.Dimension("filters", 32))
  """
  scope, w = _kernel(x, output_dim, filter_size, 3, False, filter_initializer,
                     variable_dtype, name, "conv3d")
  return conv_ops.conv(x, w, strides, padding, 3, name=scope + "/conv3d")


def conv2d_transpose(x, output_dim, filter_size=(2, 2), strides=(2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """2D transposed convolution of x [batch..., h, w, channels] with a
  kernel [fh, fw, output_dim, channels]: h -> h * stride (SAME).

  Example:
    >>> up = conv2d_transpose(x, mtf.Dimension("filters", 32))
  """
  scope, w = _kernel(x, output_dim, filter_size, 2, True, filter_initializer,
                     variable_dtype, name, "conv2d_transpose")
  return conv_ops.conv_transpose(x, w, strides, padding, 2,
                                 name=scope + "/conv2d_transpose")


def conv3d_transpose(x, output_dim, filter_size=(2, 2, 2), strides=(2, 2, 2),
                     padding="SAME", filter_initializer=None,
                     variable_dtype=None, name=None):
  """3D transposed convolution of x [batch..., d, h, w, channels] with a
  kernel [fd, fh, fw, output_dim, channels].

  Example:
    >>> up = conv3d_transpose(x, mtf.Dimension("filters", 16))
  """
  scope, w = _kernel(x, output_dim, filter_size, 3, True, filter_initializer,
                     variable_dtype, name, "conv3d_transpose")
  return conv_ops.conv_transpose(x, w, strides, padding, 3,
                                 name=scope + "/conv3d_transpose")


def conv2d_with_blocks(x, output_dim, filter_size=(3, 3), strides=(1, 1),
                       padding="SAME", h_blocks_dim=None, w_blocks_dim=None,
                       filter_initializer=None, variable_dtype=None,
                       name=None):
  """conv2d of an image stored in blocks: x [batch, h_blocks, w_blocks, h,
  w, channels] (image row hb * h + i is x[:, hb, :, i]). Split blocks dims
  get a halo exchange; see meshtf.ops.conv.conv2d_with_blocks. Without
  blocks dims this is conv2d.

  Example:
    >>> y = conv2d_with_blocks(x, mtf.Dimension("filters", 64),
    ...                        h_blocks_dim=hb, w_blocks_dim=wb)
  """
  scope, w = _kernel(x, output_dim, filter_size, 2, False, filter_initializer,
                     variable_dtype, name, "conv2d")
  return conv_ops.conv2d_with_blocks(x, w, strides, padding, h_blocks_dim,
                                     w_blocks_dim, name=scope + "/conv2d")


def conv3d_with_blocks(x, output_dim, filter_size=(3, 3, 3),
                       strides=(1, 1, 1), padding="SAME", d_blocks_dim=None,
                       h_blocks_dim=None, filter_initializer=None,
                       variable_dtype=None, name=None, w_blocks_dim=None):
  """conv3d of an image stored in blocks along d, h and (not in Mesh
  TensorFlow) w: x [batch, blocks dims..., d, h, w, channels].

  Example:
    >>> y = conv3d_with_blocks(x, mtf.Dimension("filters", 32),
    ...                        d_blocks_dim=db, h_blocks_dim=hb)
  """
  scope, w = _kernel(x, output_dim, filter_size, 3, False, filter_initializer,
                     variable_dtype, name, "conv3d")
  return conv_ops.conv3d_with_blocks(x, w, strides, padding, d_blocks_dim,
                                     h_blocks_dim, w_blocks_dim,
                                     name=scope + "/conv3d")


def conv2d_transpose_with_blocks(x, output_dim, filter_size=(2, 2),
                                 strides=(2, 2), padding="SAME",
                                 h_blocks_dim=None, w_blocks_dim=None,
                                 filter_initializer=None, variable_dtype=None,
                                 name=None):
  """conv2d_transpose of an image stored in blocks (each block of size B
  becomes one of size B * stride); any filter size.

  Example:
    >>> up = conv2d_transpose_with_blocks(x, mtf.Dimension("filters", 32),
    ...                                   h_blocks_dim=hb)
  """
  scope, w = _kernel(x, output_dim, filter_size, 2, True, filter_initializer,
                     variable_dtype, name, "conv2d_transpose")
  return conv_ops.conv2d_transpose_with_blocks(
      x, w, strides, padding, h_blocks_dim, w_blocks_dim,
      name=scope + "/conv2d_transpose")


def conv3d_transpose_with_blocks(x, output_dim, filter_size=(2, 2, 2),
                                 strides=(2, 2, 2), padding="SAME",
                                 d_blocks_dim=None, h_blocks_dim=None,
                                 filter_initializer=None, variable_dtype=None,
                                 name=None, w_blocks_dim=None):
  """conv3d_transpose of an image stored in blocks along d, h and (not in
  Mesh TensorFlow) w.

  Example:
    >>> up = conv3d_transpose_with_blocks(x, mtf.Dimension("filters", 16),
    ...                                   d_blocks_dim=db)
  """
  scope, w = _kernel(x, output_dim, filter_size, 3, True, filter_initializer,
                     variable_dtype, name, "conv3d_transpose")
  return conv_ops.conv3d_transpose_with_blocks(
      x, w, strides, padding, d_blocks_dim, h_blocks_dim, w_blocks_dim,
      name=scope + "/conv3d_transpose")


def separable_conv1d(x, output_dim, min_relative_pos=-1, max_relative_pos=1,
                     depthwise_filter_initializer_scale=1.0,
                     pointwise_filter_initializer_scale=1.0, name=None,
                     use_bias=True, kernel_depth_weights=None,
                     variable_dtype=None):
  """1D depthwise-separable convolution of x [batch..., length, depth]:
  per relative position p in [min_relative_pos, max_relative_pos] a
  per-channel weight times x shifted by p (zeros past the ends), summed,
  then a dense layer depth -> output_dim. The filter size is
  max_relative_pos - min_relative_pos + 1; position 0 is the output's own.

  Variables (Mesh TensorFlow's names): "<name>/depthwise_dense_<i>/kernel"
  [depth] (and ".../depthwise_dense_0/bias"), "<name>/pointwise_dense/
  kernel" [depth, output_dim] and its bias; name defaults to
  "separable_conv1d" made unique. kernel_depth_weights: optional list of
  one [depth] Tensor per relative position, used instead of the depthwise
  variables. output_dim may have the name of the depth dim (dense renames).

  Example:
    >>> y = separable_conv1d(x, mtf.Dimension("d_model", 8),
    ...                      min_relative_pos=-2, max_relative_pos=0)
  """
  from meshtf.models import layers   # pylint: disable=g-import-not-at-top
  # (layers imports this module; its dense is looked up at call time.)
  from meshtf.ops import slicing   # pylint: disable=g-import-not-at-top
  if max_relative_pos < min_relative_pos:
    raise ValueError("separable_conv1d: max_relative_pos %d < "
                     "min_relative_pos %d" % (max_relative_pos,
                                              min_relative_pos))
  if x.shape.ndims < 2:
    raise ValueError("separable_conv1d: x %s needs [batch..., length, "
                     "depth]" % x.shape)
  depth_dim, length_dim = x.shape.dims[-1], x.shape.dims[-2]
  kernel_size = max_relative_pos - min_relative_pos + 1
  if kernel_depth_weights is not None and len(kernel_depth_weights) != (
      kernel_size):
    raise ValueError("separable_conv1d: %d kernel_depth_weights for a "
                     "filter of size %d" % (len(kernel_depth_weights),
                                            kernel_size))
  scope = name if name else x.mesh.graph.unique_name("separable_conv1d")
  # A truncated normal of variance scale / fan_in (Mesh TF's default; the
  # depthwise kernels reduce nothing: fan_in 1), made by TF's initializer
  # looked up at call time as Mesh TF did; meshtf converts it to its own
  # layout-invariant TruncatedNormalInitializer of the same stddev.
  truncated_normal = tf.compat.v1.truncated_normal_initializer
  depth_std = math.sqrt(depthwise_filter_initializer_scale / kernel_size)
  depthwise = None
  for i in range(kernel_size):
    shifted = slicing.shift(x, -(min_relative_pos + i), length_dim,
                              wrap=False)
    term = layers.dense(
        shifted, new_dims=[], reduced_dims=[], expert_dims=[depth_dim],
        use_bias=use_bias and i == 0, variable_dtype=variable_dtype,
        kernel_weights=(kernel_depth_weights[i] if kernel_depth_weights
                        else None),
        kernel_initializer=truncated_normal(
            stddev=depth_std / 0.87962566103423978),
        name="%s/depthwise_conv_hack/depthwise_dense_%d" % (scope, i))
    depthwise = term if depthwise is None else depthwise + term
  point_std = math.sqrt(pointwise_filter_initializer_scale / depth_dim.size)
  return layers.dense(
      depthwise, new_dims=[shapes.convert_to_dimension(output_dim)],
      reduced_dims=[depth_dim], use_bias=use_bias,
      variable_dtype=variable_dtype,
      kernel_initializer=truncated_normal(
          stddev=point_std / 0.87962566103423978),
      name=scope + "/pointwise_dense")


__all__ = ["conv1d", "separable_conv1d", "conv2d", "conv3d", "conv2d_transpose",
           "conv3d_transpose", "conv2d_with_blocks", "conv3d_with_blocks",
           "conv2d_transpose_with_blocks", "conv3d_transpose_with_blocks",
           "max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d"]
