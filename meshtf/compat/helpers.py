"""More of Mesh TensorFlow's ops.py names: operation classes with
gradients, binary-op helpers and small utilities, under Mesh TF's names and
signatures (meshtf's own spellings are mtf.add, mtf.minimum, mtf.pow, ...).

What ops.py has and meshtf deliberately has not (TF1 estimator hooks,
lazy allreduces, stacked variables) is listed in the README's "Differences
from Mesh TensorFlow".

Example:
  >>> mtf.is_subsequence([1, 3], [1, 2, 3])
  True
  >>> print(mtf.pretty_print_counters([("params/a", 2), ("params/b", 3)]))
  params: 5
   params/a: 2
   params/b: 3
"""
import collections

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import layout_rules as layout_rules_lib
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.ops import elementwise
from meshtf.ops import io
from meshtf.compat import op_classes
from meshtf.ops import reductions


class AddOperation(op_classes.BinaryOpWithBroadcasting):
  """x1 + x2 broadcast by name to output_shape, with its gradient (each
  input's is dy summed to its shape).

  Example:
    >>> z = mtf.AddOperation(x, y, output_shape=[batch, d]).outputs[0]
  """

  def __init__(self, x1, x2, output_shape, name=None):
    super().__init__(tf.add, x1, x2, output_shape, x1.dtype,
                     name=name or "add")

  has_gradient = True

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    return [reductions.reduce_sum(dy, output_shape=x.shape)
            for x in self.inputs]


class MinMaxOperation(op_classes.BinaryOpWithBroadcasting):
  """tf.minimum / tf.maximum broadcast by name; the gradient goes to every
  input equal to the result (both, on ties, as in Mesh TF).

  Example:
    >>> z = mtf.MinMaxOperation(tf.maximum, x, y, x.shape).outputs[0]
  """

  def __init__(self, tf_fn, x1, x2, output_shape, name=None):
    super().__init__(tf_fn, x1, x2, output_shape, x1.dtype,
                     name=name or "min_max")

  has_gradient = True

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    out = self.outputs[0]
    return [reductions.reduce_sum(
        dy * elementwise.cast(elementwise.equal(x, out), dy.dtype),
        output_shape=x.shape) for x in self.inputs]


def mtf_pow(x, y):
  """Mesh TF's name for mtf.pow (meshtf's is also right for x <= 0)."""
  return elementwise.pow(x, y)


def mtf_abs(x):
  """Mesh TF's name for mtf.abs."""
  return elementwise.abs(x)


def binary_arguments_to_tensors(x1, x2):
  """(x1, x2) as Tensors: a number becomes a scalar Tensor of the other's
  dtype on its mesh.

  Example:
    >>> a, b = mtf.binary_arguments_to_tensors(x, 2.0)   # b: Shape([])
  """
  is_1, is_2 = (isinstance(x, graph_lib.Tensor) for x in (x1, x2))
  if not (is_1 or is_2):
    raise ValueError("binary_arguments_to_tensors: neither %r nor %r is a "
                     "meshtf Tensor; at least one must be" % (x1, x2))
  if is_1 and is_2:
    return x1, x2
  if is_1:
    return x1, io.import_tf_tensor(
        x1.mesh, tf.convert_to_tensor(x2, dtype=x1.dtype), shapes.Shape([]))
  return io.import_tf_tensor(
      x2.mesh, tf.convert_to_tensor(x1, dtype=x2.dtype), shapes.Shape([])), x2


def is_subsequence(short_seq, long_seq):
  """Whether short_seq's items appear in long_seq in the same order.

  Example:
    >>> is_subsequence("ac", "abc"), is_subsequence("ca", "abc")
    (True, False)
  """
  items = iter(long_seq)
  return all(any(x == y for y in items) for x in short_seq)


def verify_no_new_dims(input_shapes, output_shape):
  """Raises ValueError if output_shape has a dim no input shape has.

  Example:
    >>> verify_no_new_dims([x.shape], y.shape)
  """
  known = set()
  for s in input_shapes:
    known.update(shapes.convert_to_shape(s).dims)
  output_shape = shapes.convert_to_shape(output_shape)
  new = [d for d in output_shape.dims if d not in known]
  if new:
    raise ValueError("output shape %s has dimension(s) %s that no input "
                     "shape (%s) has" % (output_shape, new, ", ".join(
                         str(s) for s in input_shapes)))


def pnum_to_group(mesh_shape, group_dims, pnum):
  """The group number of processor pnum when the mesh axes group_dims
  (indices) are reduced over: its index among the other axes.

  Example:
    >>> pnum_to_group(mtf.convert_to_shape("r:2;c:4"), [1], 6)
    1
  """
  mesh_shape = shapes.convert_to_shape(mesh_shape)
  coord = op_classes.pnum_to_processor_coordinates(mesh_shape, pnum)
  rest = [i for i in range(mesh_shape.ndims) if i not in group_dims]
  return op_classes.processor_coordinates_to_pnum(
      shapes.Shape([mesh_shape.dims[i] for i in rest]),
      [coord[i] for i in rest])


def pretty_print_counters(counters):
  """(name, number) pairs as an indented tree: a name "a/b" also counts
  toward "a".

  Example:
    >>> print(pretty_print_counters([("p/a", 1), ("p/b", 2)]))
    p: 3
     p/a: 1
     p/b: 2
  """
  totals = collections.defaultdict(int)
  for name, value in counters:
    prefixes = {name[:i] for i, c in enumerate(name) if c == "/"} | {name}
    for p in prefixes:
      totals[p] += value
  return "\n".join(" " * name.count("/") + "%s: %.3g" % (name, value)
                   for name, value in sorted(totals.items()))


def parallel(devices, fn, *args, **kwargs):
  """[fn(args[0][i], ..., **{k: v[i]}) on devices[i] for each i]: every
  argument is a list with one entry per device.

  Example:
    >>> sums = parallel(["/cpu:0", "/cpu:0"], tf.add, [a0, a1], [b0, b1])
  """
  if not isinstance(devices, list):
    raise ValueError("parallel: devices must be a list, got %r" % (devices,))
  for x in list(args) + list(kwargs.values()):
    if not isinstance(x, list) or len(x) != len(devices):
      raise ValueError("parallel: argument %r is not a list with one entry "
                       "per device (%d devices)" % (x, len(devices)))
  out = []
  for i, device in enumerate(devices):
    with tf.device(device):
      out.append(fn(*[x[i] for x in args],
                    **{k: v[i] for k, v in kwargs.items()}))
  return out


def transpose_list_of_lists(lol):
  """[[a, b], [c, d]] -> [[a, c], [b, d]].

  Example:
    >>> transpose_list_of_lists([[1, 2], [3, 4]])
    [[1, 3], [2, 4]]
  """
  if not lol:
    raise ValueError("transpose_list_of_lists: the list is empty")
  return [list(x) for x in zip(*lol)]


_BINARY = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum}
_REDUCE = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max, "MIN": tf.reduce_min}


def binary_reduction_fn(reduction_fn_string):
  """The TF function combining two values for "SUM", "MAX" or "MIN".

  Example:
    >>> binary_reduction_fn("MAX") is tf.maximum
    True
  """
  return _lookup(_BINARY, reduction_fn_string, "binary_reduction_fn")


def reduction_fn(reduction_fn_string):
  """The TF reduction for "SUM", "MAX" or "MIN".

  Example:
    >>> reduction_fn("SUM") is tf.reduce_sum
    True
  """
  return _lookup(_REDUCE, reduction_fn_string, "reduction_fn")


def _lookup(table, key, what):
  if key not in table:
    raise ValueError("%s: unknown reduction %r; use one of %s" % (
        what, key, ", ".join(sorted(table))))
  return table[key]


def pool_fn(pool_fn_string):
  """The TF pooling for "AVG_2D", "AVG_3D", "MAX_2D" or "MAX_3D", on
  [<batch dims>, <spatial dims>, channels] with any number of batch dims.

  Example:
    >>> y = pool_fn("MAX_2D")(x, [2, 2], [2, 2], "VALID")
  """
  kinds = {"AVG_2D": (tf.nn.avg_pool2d, 2), "AVG_3D": (tf.nn.avg_pool3d, 3),
           "MAX_2D": (tf.nn.max_pool2d, 2), "MAX_3D": (tf.nn.max_pool3d, 3)}
  tf_pool, nd = _lookup(kinds, pool_fn_string, "pool_fn")

  def fn(x, ksize, strides, padding):
    batch = tf.shape(x)[:-(nd + 1)]
    flat = tf.reshape(x, tf.concat([[-1], tf.shape(x)[-(nd + 1):]], 0))
    y = tf_pool(flat, ksize, strides, padding)
    return tf.reshape(y, tf.concat([batch, tf.shape(y)[1:]], 0))
  return fn


def conv2d_backprop_input(input_shape, conv_filter, dy, strides, padding,
                          name=None):
  """d(conv2d)/d(input) given dy (like tf.nn.conv2d_backprop_input).

  Example:
    >>> dx = mtf.conv2d_backprop_input(x.shape, w, dy, [1, 1, 1, 1], "SAME")
  """
  return op_classes.Conv2or3dBackpropInputOperation(
      2, False, input_shape, conv_filter, dy, strides, padding,
      name=name).outputs[0]


def conv2d_backprop_filter(conv_input, filter_shape, dy, strides, padding,
                           name=None):
  """d(conv2d)/d(filter) given dy (like tf.nn.conv2d_backprop_filter).

  Example:
    >>> dw = mtf.conv2d_backprop_filter(x, w.shape, dy, [1, 1, 1, 1], "SAME")
  """
  return op_classes.Conv2or3dBackpropFilterOperation(
      2, False, conv_input, filter_shape, dy, strides, padding,
      name=name).outputs[0]


def conv3d_backprop_input(input_shape, conv_filter, dy, strides, padding,
                          name=None):
  """d(conv3d)/d(input) given dy.

  Example:
    >>> dx = mtf.conv3d_backprop_input(x.shape, w, dy, [1] * 5, "SAME")
  """
  return op_classes.Conv2or3dBackpropInputOperation(
      3, False, input_shape, conv_filter, dy, strides, padding,
      name=name).outputs[0]


def conv3d_backprop_filter(conv_input, filter_shape, dy, strides, padding,
                           name=None):
  """d(conv3d)/d(filter) given dy.

  Example:
    >>> dw = mtf.conv3d_backprop_filter(x, w.shape, dy, [1] * 5, "SAME")
  """
  return op_classes.Conv2or3dBackpropFilterOperation(
      3, False, conv_input, filter_shape, dy, strides, padding,
      name=name).outputs[0]


def convert_to_layout_rules(x):
  """Mesh TensorFlow's convert_to_layout_rules: LayoutRules from a string
  ("batch:batch,d_ff:model"), dict, pair list or LayoutRules, with Mesh TF's
  semantics: a rule naming a mesh axis that a mesh lacks is inactive on that
  mesh (one warning naming it when a mesh layout drops it), so T5's default
  rules run on "batch:8" as on "model:4,batch:2". meshtf's own
  MeshLayout(mesh, "rules") and binary refuse such a rule (a typo).

  Example:
    >>> rules = mtf.convert_to_layout_rules("ensemble:ensemble,batch:batch")
    >>> mtf.MeshLayout("batch:8", rules).layout_rules.pairs   # one warning
    [('batch', 'batch')]
  """
  return layout_rules_lib.convert_to_layout_rules(x).with_absent_axes(
      "inactive")


def mesh_tf_layout_rules(layout):
  """A MeshImpl's layout argument with Mesh TF's semantics (None stays
  None: the shape is then a MeshLayout, whose rules are already set)."""
  return None if layout is None else convert_to_layout_rules(layout)


class LayoutRules(layout_rules_lib.LayoutRules):
  """Mesh TensorFlow's LayoutRules (`mesh_tensorflow.LayoutRules` after
  meshtf.compat.install()): meshtf's, with rules naming an axis a mesh lacks
  inactive on that mesh by default.

  Example:
    >>> LayoutRules([("batch", "batch"), ("heads", "model")]).absent_axes
    <AbsentAxes.INACTIVE: 'inactive'>
  """

  def __init__(self, pairs, absent_axes="inactive"):
    super().__init__(pairs, absent_axes)


class MeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh TensorFlow's ops.MeshImpl(shape, layout_rules) (the geometry-only
  base; `mesh_tensorflow.MeshImpl` after meshtf.compat.install()): meshtf's,
  with Mesh TF's layout-rule semantics (see convert_to_layout_rules).

  Example:
    >>> MeshImpl("batch:4", layout_rules="batch:batch,heads:model").size
    4
  """

  def __init__(self, shape, layout=None, devices=None, layout_rules=None):
    super().__init__(shape, mesh_tf_layout_rules(layout), devices,
                     mesh_tf_layout_rules(layout_rules))


def import_laid_out_tensor(mesh, laid_out_tensor, shape, name=None):
  """A Tensor from per-processor slices already laid out as the mesh's
  layout will place `shape` (for expert users, as in Mesh TF).

  Example:
    >>> t = mtf.import_laid_out_tensor(mesh, laid_out, "batch:8;d:4")
  """
  return op_classes.ImportLaidOutTensorOperation(
      mesh, laid_out_tensor, shapes.convert_to_shape(shape),
      name=name).outputs[0]


__all__ = ["AddOperation", "MinMaxOperation", "mtf_pow", "mtf_abs",
           "binary_arguments_to_tensors", "is_subsequence",
           "verify_no_new_dims", "pnum_to_group", "pretty_print_counters",
           "parallel", "transpose_list_of_lists", "binary_reduction_fn",
           "reduction_fn", "pool_fn", "import_laid_out_tensor",
           "conv2d_backprop_input", "conv2d_backprop_filter",
           "conv3d_backprop_input", "conv3d_backprop_filter",
           "convert_to_layout_rules"]
