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
from meshtf import shapes
from meshtf.models import dtypes
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
  scope, w = _kernel(x, output_dim, filter_size, 1, False, filter_initializer,
                     variable_dtype, name, "conv1d")
  return conv_ops.conv(x, w, stride, padding, 1, name=scope + "/conv1d")


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


__all__ = ["conv1d", "conv2d", "conv3d", "conv2d_transpose",
           "conv3d_transpose", "conv2d_with_blocks", "conv3d_with_blocks",
           "conv2d_transpose_with_blocks", "conv3d_transpose_with_blocks",
           "max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d"]
