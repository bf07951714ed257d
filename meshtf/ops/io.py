"""Getting values into a mesh: import_tf_tensor, import_fully_replicated,
constant, zeros, ones and the *_like forms.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.import_tf_tensor(mesh, tf.zeros([8, 4]), "batch:8;io:4")
  >>> mtf.ones_like(x).shape
  Shape([batch:8, io:4])
"""
import weakref

import numpy as np
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import constants
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.op_kinds import CostKind


class ImportOperation(graph_lib.Operation):
  """Brings a full tf.Tensor onto the mesh; each processor takes its slice."""

  cost_kind = CostKind.FREE

  imports_host_slices = True

  def __init__(self, mesh, tf_tensor, shape, name=None):
    shape = shapes.convert_to_shape(shape)
    static = tf_tensor.shape
    if static.rank is not None and (
        static.rank != shape.ndims or
        any(s is not None and s != d.size for s, d in zip(static.as_list(),
                                                           shape.dims))):
      raise ValueError(
          "import_tf_tensor%s: the TensorFlow tensor has shape %s but the "
          "meshtf shape %s has sizes %s; they must match dimension by "
          "dimension" % ("(%s)" % name if name else "", static.as_list()
                         if static.rank is not None else static, shape,
                         shape.to_integer_list))
    super().__init__([], mesh=mesh, name=name or "import")
    self._tf_tensor = tf_tensor
    self._outputs = [graph_lib.Tensor(self, shape, tf_tensor.dtype)]

  def host_slice(self, mesh_impl, pnum):
    """Processor pnum's slice, made on the host before any per-device
    program runs (an SPMD program takes it as an argument)."""
    shape = self._outputs[0].shape
    sizes = mesh_impl.slice_shape(shape)
    with tf.device(mesh_impl.devices[pnum]):
      if sizes == shape.to_integer_list:
        return tf.identity(self._tf_tensor)
      return tf.slice(mesh_impl.padded_value(self._tf_tensor, shape),
                      mesh_impl.slice_begin(shape, pnum), sizes)

  def lower(self, lowering):
    lowering.set_tensor_lowering(
        self._outputs[0], lowering.mesh_impl(self).import_host_slices(self))


def import_tf_tensor(mesh, tf_tensor, shape=None, name=None):
  """A meshtf Tensor holding the full tf.Tensor `tf_tensor`.

  Example:
    >>> x = mtf.import_tf_tensor(mesh, x_tf, mtf.Shape([batch, io]))
  """
  tf_tensor = tf.convert_to_tensor(tf_tensor)
  if shape is None:
    raise ValueError("import_tf_tensor needs a meshtf shape naming each "
                     "dimension, e.g. 'batch:%s'" % (tf_tensor.shape,))
  return ImportOperation(mesh, tf_tensor, shape, name=name).outputs[0]


def import_fully_replicated(mesh, tf_tensor, shape, name=None):
  """Like import_tf_tensor, for a value every processor already holds whole.

  Example:
    >>> step = mtf.import_fully_replicated(mesh, tf.constant(3.0), [])
  """
  return import_tf_tensor(mesh, tf_tensor, shape,
                          name=name or "import_fully_replicated")


# mesh -> {(tf tensor ref, dtype): imported Tensor}: a tf scalar mixed into
# many ops (an optimizer's learning rate, once per variable) is imported once.
_SCALAR_IMPORTS = weakref.WeakKeyDictionary()


def import_tf_scalar(mesh, value, dtype=None, what="a tf.Tensor operand"):
  """A scalar tf.Tensor (or tf.Variable) as a meshtf scalar that every
  processor holds whole: how a TensorFlow scalar mixes into meshtf
  arithmetic (`x * learning_rate`). A symbolic tensor stays symbolic: it is
  an input of the program, read when it runs (never through numpy), so a
  value that changes from call to call (a schedule of the step) does.
  dtype (default: its own) casts between float types or between integer
  types; other mixes raise TypeError. Imported once per mesh and dtype.

  Example:
    >>> lr = tf.constant(0.01)
    >>> s = mtf.import_tf_scalar(mesh, lr, tf.float32)   # Shape([])
    >>> y = x * lr                                        # the same import
  """
  if not isinstance(value, tf.Variable):
    value = tf.convert_to_tensor(value)
  if value.shape.rank != 0:
    raise ValueError(
        "%s has shape %s; only a scalar tf.Tensor mixes with meshtf Tensors "
        "(it has no dimension names). Import it with mtf.import_tf_tensor("
        "mesh, t, shape) naming its dims, e.g. 'batch:%s'"
        % (what, value.shape, value.shape[0] if value.shape.rank else "n"))
  dtype = value.dtype if dtype is None else tf.as_dtype(dtype)
  if dtype != value.dtype:
    if not ((dtype.is_floating and value.dtype.is_floating) or
            (dtype.is_integer and value.dtype.is_integer)):
      raise TypeError(
          "%s is a %s tf.Tensor; the meshtf operand is %s. Cast it first: "
          "tf.cast(t, tf.%s)" % (what, value.dtype.name, dtype.name,
                                 dtype.name))
  cache = _SCALAR_IMPORTS.setdefault(mesh, {})
  key = (value.ref(), dtype)
  if key not in cache:
    # A variable is read here: inside a tf.function, on every call.
    value = tf.cast(value, dtype) if dtype != value.dtype else (
        tf.convert_to_tensor(value))
    cache[key] = import_fully_replicated(mesh, value, shapes.Shape([]),
                                         name="import_tf_scalar")
  return cache[key]


class ImportSlicesOperation(graph_lib.Operation):
  """A tensor whose slices come from slice_fn(begin, size), called on the
  host of each processor for that processor only (per-host input)."""

  cost_kind = CostKind.FREE

  imports_host_slices = True

  def __init__(self, mesh, shape, slice_fn, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "import_slices")
    self._slice_fn = slice_fn
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(shape),
                                      dtype)]

  def host_slice(self, mesh_impl, pnum):
    shape = self._outputs[0].shape
    dtype = self._outputs[0].dtype
    begin = mesh_impl.slice_begin(shape, pnum)
    # slice_fn is asked only for real positions (an uneven split's last
    # slices are shorter, or empty); the padding is added here.
    valid = mesh_impl.mesh_layout.valid_slice_shape(shape, pnum)
    padded = mesh_impl.slice_shape(shape)
    with tf.device(mesh_impl.devices[pnum]):
      if 0 in valid:
        value = tf.zeros(valid, dtype)
      else:
        value = tf.convert_to_tensor(self._slice_fn(begin, valid),
                                     dtype=dtype)
        if value.shape.as_list() != valid:
          raise ValueError(
              "import_slices %r: slice_fn(begin=%s, size=%s) returned shape "
              "%s; it must return exactly the requested slice of %s"
              % (self.name, begin, valid, value.shape.as_list(), shape))
      if valid != padded:
        value = tf.pad(value, [[0, p - v] for p, v in zip(padded, valid)],
                       constant_values=mesh_impl_lib.padding_fill(dtype))
    return value

  def lower(self, lowering):
    lowering.set_tensor_lowering(
        self._outputs[0], lowering.mesh_impl(self).import_host_slices(self))


def import_slices(mesh, shape, slice_fn, dtype=tf.float32, name=None):
  """A tensor built slice by slice: slice_fn(begin, size) returns the part
  of the full tensor starting at `begin` (one int per dim) with `size`.
  Each worker of a multi-worker mesh calls it only for its own processors,
  so each host reads only its share of the input.

  Example:
    >>> x = mtf.import_slices(mesh, [batch, io],
    ...                       lambda begin, size: data[begin[0]:begin[0] + size[0]])
  """
  return ImportSlicesOperation(mesh, shape, slice_fn, dtype, name).outputs[0]


def host_rows(mesh_impl, shape):
  """The indices along shape's first dim that this process's processors
  hold (every index in one process; a worker's share of a multi-worker
  mesh), sorted: the rows of a batch this host must read.

  Example:
    >>> host_rows(impl, "batch:16;length:8")   # worker 1 of 2, batch:data
    [8, 9, 10, 11, 12, 13, 14, 15]
  """
  shape = shapes.convert_to_shape(shape)
  pnums = mesh_impl.local_pnums()
  rows = set()
  for p in pnums:
    begin = int(mesh_impl.slice_begin(shape, p)[0])
    size = mesh_impl.mesh_layout.valid_slice_shape(shape, p)[0]
    rows.update(range(begin, begin + size))
  return sorted(rows)


def import_rows(mesh, local_rows, shape, rows, name=None):
  """A tensor of `shape` of which this host holds only the rows `rows` of
  the first dim (local_rows [len(rows), ...], in that order): each of this
  host's processors takes its slice from them, so a worker of a
  multi-worker mesh reads only its share of a batch (see host_rows).

  Example:
    >>> rows = mtf.host_rows(impl, "batch:16;length:8")
    >>> x = mtf.import_rows(mesh, batch["targets"][rows],
    ...                     "batch:16;length:8", rows)
  """
  shape = shapes.convert_to_shape(shape)
  what = "import_rows%s" % (" (%s)" % name if name else "")
  rows = [int(r) for r in rows]
  local = tf.convert_to_tensor(local_rows)
  if local.shape.rank != shape.ndims or local.shape[0] != len(rows) or (
      local.shape.as_list()[1:] != shape.to_integer_list[1:]):
    raise ValueError(
        "%s: local rows have shape %s but %d rows of %s need shape %s: pass "
        "the rows `rows` names, in order" % (
            what, local.shape.as_list(), len(rows), shape,
            [len(rows)] + shape.to_integer_list[1:]))
  if any(not 0 <= r < shape.dims[0].size for r in rows):
    raise ValueError("%s: rows %s are outside %s" % (
        what, [r for r in rows if not 0 <= r < shape.dims[0].size], shape))
  index = {r: i for i, r in enumerate(rows)}

  def slice_fn(begin, size):
    want = list(range(int(begin[0]), int(begin[0]) + int(size[0])))
    missing = [r for r in want if r not in index]
    if missing:
      raise ValueError(
          "%s: a processor of this host needs rows %d..%d of %s, but the "
          "host holds only %d rows (missing %s); read the rows host_rows() "
          "names" % (what, want[0], want[-1], shape, len(rows), missing[:4]))
    picked = [index[r] for r in want]
    if picked == list(range(picked[0], picked[0] + len(picked))):
      first = picked[0]
      value = local
    else:  # rows out of order: gather them first
      value, first = tf.gather(local, picked), 0
    return tf.slice(value, [first] + [int(b) for b in begin[1:]],
                    [int(s) for s in size])
  return import_slices(mesh, shape, slice_fn, dtype=local.dtype,
                       name=name or "import_rows")


class FillOperation(graph_lib.Operation):
  """A tensor with every element equal to a Python scalar."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, mesh, value, shape, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "fill")
    # Through numpy, so 0 and 1 also fill bool tensors (tf.constant(1, bool)
    # raises), as tf.zeros / tf.ones do.
    self._value = np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(shape),
                                      dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    sizes = impl.slice_shape(out.shape)
    lowering.set_tensor_lowering(out, impl.slicewise(
        lambda: tf.fill(constants.int32(sizes),
                        constants.constant(self._value, out.dtype))))


class ConstantOperation(graph_lib.Operation):
  """A tensor from a numpy array (sliced per processor)."""

  cost_kind = CostKind.FREE

  def __init__(self, mesh, value, shape, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "constant")
    shape = shapes.convert_to_shape(shape)
    value = np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)
    if value.ndim == 0:   # a scalar fills the shape (Mesh TF's Constant)
      value = np.full(shape.to_integer_list, value)
    if list(value.shape) != shape.to_integer_list:
      raise ValueError("constant: value has shape %s but shape %s has sizes %s"
                       % (list(value.shape), shape, shape.to_integer_list))
    self._value = value
    self._outputs = [graph_lib.Tensor(self, shape, dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    lowering.set_tensor_lowering(out, impl.import_tf_tensor(
        tf.constant(self._value), out.shape))


def constant(mesh, value, shape=None, dtype=tf.float32, name=None):
  """A constant tensor: a scalar filled into `shape`, or a numpy array.

  Example:
    >>> half = mtf.constant(mesh, 0.5, shape=[batch], dtype=tf.float32)
  """
  shape = shapes.convert_to_shape(shape if shape is not None else [])
  dtype = tf.as_dtype(dtype)
  if np.ndim(value) == 0:
    return FillOperation(mesh, value, shape, dtype, name=name).outputs[0]
  return ConstantOperation(mesh, value, shape, dtype, name=name).outputs[0]


def zeros(mesh, shape, dtype=tf.float32, name=None):
  """A tensor of zeros.

  Example:
    >>> z = mtf.zeros(mesh, "batch:8;io:4")
  """
  return constant(mesh, 0, shape, dtype, name=name or "zeros")


def ones(mesh, shape, dtype=tf.float32, name=None):
  """A tensor of ones.

  Example:
    >>> o = mtf.ones(mesh, "batch:8;io:4")
  """
  return constant(mesh, 1, shape, dtype, name=name or "ones")


def zeros_like(t, name=None):
  """Zeros with t's mesh, shape and dtype."""
  return zeros(t.mesh, t.shape, t.dtype, name=name)


def ones_like(t, name=None):
  """Ones with t's mesh, shape and dtype."""
  return ones(t.mesh, t.shape, t.dtype, name=name)
