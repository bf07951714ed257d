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

from meshtf import shapes
from meshtf.layouts import mesh_layout as mesh_layout_lib
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

  def __init__(self, x, scalar, name=None):
    super().__init__(lambda t: t + tf.cast(scalar, t.dtype), [x], [x.shape],
                     [x.dtype], x.shape.dimension_names,
                     grad_function=lambda op, dy: [dy],
                     name=name or "scalar_add")


class BinaryOpWithBroadcasting(slicewise_lib.SlicewiseOperation):
  """tf_fn(x1, x2) with both broadcast by name to output_shape.

  It has no gradient (a broadcast input's gradient needs a sum across
  processors): use mtf.add / mtf.multiply etc. to differentiate."""

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


class PoolOperation(pool.PoolOperation):
  """Mesh TF's PoolOperation(x, ksize, strides, pool_fn_string) with
  pool_fn_string one of MAX_2D, AVG_2D, MAX_3D, AVG_3D (strides must equal
  ksize: meshtf pools non-overlapping windows)."""

  def __init__(self, x, ksize, strides, pool_fn_string, name=None):
    kind, _, nd = pool_fn_string.partition("_")
    if kind not in ("MAX", "AVG") or nd not in ("2D", "3D"):
      raise ValueError("PoolOperation pool_fn_string %r: use MAX_2D, AVG_2D, "
                       "MAX_3D or AVG_3D" % (pool_fn_string,))
    if list(strides) != list(ksize):
      raise ValueError("PoolOperation: strides %s differ from ksize %s; "
                       "meshtf pools non-overlapping windows" % (
                           list(strides), list(ksize)))
    super().__init__(x, ksize, kind, int(nd[0]), name=name)


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
  strides, padding); all dims splittable, as there."""

  def __init__(self, conv_dimension, is_transpose, input_shape, conv_filter,
               dy, strides, padding, name=None):
    if is_transpose:
      raise ValueError("Conv2or3dBackpropInputOperation(is_transpose=True): "
                       "use mtf.conv2d_transpose / conv3d_transpose")
    super().__init__(dy, conv_filter, input_shape,
                     _window(strides, conv_dimension), padding,
                     conv_dimension, name=name)

  def unsplittable_dim_names(self):
    return frozenset()


class Conv2or3dBackpropFilterOperation(conv.ConvFilterGradOperation):
  """Mesh TF's (conv_dimension, is_transpose, conv_input, filter_shape, dy,
  strides, padding); all dims splittable, as there."""

  def __init__(self, conv_dimension, is_transpose, conv_input, filter_shape,
               dy, strides, padding, name=None):
    if is_transpose:
      raise ValueError("Conv2or3dBackpropFilterOperation(is_transpose=True):"
                       " use mtf.conv2d_transpose / conv3d_transpose")
    super().__init__(conv_input, dy, filter_shape,
                     _window(strides, conv_dimension), padding,
                     conv_dimension, name=name)

  def unsplittable_dim_names(self):
    return frozenset()


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
def list_product(values):
  """The product of a list of numbers (1 for an empty list)."""
  return functools.reduce(operator.mul, values, 1)


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
    "Conv2or3dBackpropFilterOperation", "RandomOperation",
    "ImportLaidOutTensorOperation", "list_product",
    "pnum_to_processor_coordinates", "processor_coordinates_to_pnum",
    "processor_groups", "tensor_dim_to_mesh_dim_size",
    "tensor_dim_to_size_per_split", "log_variable_sizes", "scalar_summary",
]
