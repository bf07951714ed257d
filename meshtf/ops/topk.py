"""Selection ops: top_k, top_1, argmax, sort, sample_with_temperature.

They work when the dimension they select along is split over a mesh axis:

  top_k   local top-k of each stripe (with global indices), an allconcat of
          those candidates over the mesh axis, then a final local top-k:
          the global top k are among the candidates. Ties go to the lower
          index, as tf.math.top_k.
  sort    (not in Mesh TensorFlow) an allconcat of the dim, a local sort,
          and each processor keeps its own stripe.

Gradients: the values' gradient flows back to the selected (or permuted)
elements by a scatter-add (meshtf/ops/index.py); indices have none.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;vocab:10")
  >>> values, indices = mtf.top_k(x, mtf.Dimension("vocab", 10),
  ...                             mtf.Dimension("k", 3))
  >>> indices.shape
  Shape([batch:4, k:3])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.op_kinds import CostKind
from meshtf.ops import _local
from meshtf.ops import elementwise
from meshtf.ops import index
from meshtf.ops import random
from meshtf.ops import shape_ops


def _check_orderable(x, op_name):
  if not (x.dtype.is_floating or x.dtype.is_integer):
    raise TypeError("%s: %s has dtype %s, which has no order; cast it to a "
                    "real number type first" % (op_name, x.name, x.dtype.name))


class TopKOperation(graph_lib.Operation):
  """values, indices of the k largest entries of x along reduced_dim.

  Outputs have x's other dims followed by k_dim (k = k_dim.size), largest
  first; with k_dim None, k = 1 and there is no k dim (top_1).
  """

  cost_kind = CostKind.KERNEL

  def __init__(self, x, reduced_dim, k_dim, name=None):
    _check_orderable(x, "top_k")
    reduced_dim = index.find_dim(x, reduced_dim, "top_k", "reduced_dim")
    rest = x.shape - [reduced_dim.name]
    if k_dim is None:
      out_shape, k = rest, 1
    else:
      k_dim = shapes.convert_to_dimension(k_dim)
      k = k_dim.size
      if not 1 <= k <= reduced_dim.size:
        raise ValueError(
            "top_k: k_dim %s:%d asks for %d of the %d entries of "
            "reduced_dim %s; k must be between 1 and %d" % (
                k_dim.name, k, k, reduced_dim.size, reduced_dim.name,
                reduced_dim.size))
      if x.shape.has_dim_name(k_dim.name):
        raise ValueError("top_k: k_dim %r is already a dimension of %s %s; "
                         "pick a new name" % (k_dim.name, x.name, x.shape))
      out_shape = shapes.Shape(rest.dims + [k_dim])
    super().__init__([x], name=name or ("top_k" if k_dim else "top_1"))
    self._dim, self._k_dim, self._k = reduced_dim, k_dim, k
    self._outputs = [graph_lib.Tensor(self, out_shape, x.dtype),
                     graph_lib.Tensor(self, out_shape, tf.int32, index=1)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    x = self._inputs[0]
    return [index.scatter_add(grad_ys[0], self._outputs[1], self._dim,
                              x.shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    names = x.shape.dimension_names
    rest = [n for n in names if n != self._dim.name]
    nb, k = len(rest), self._k
    stripe = impl.slice_shape(x.shape)[names.index(self._dim.name)]

    def local_top_k(t, offset):
      t = _local.transpose_to(t, names, rest + [self._dim.name])
      values, ids = tf.math.top_k(t, min(k, stripe))
      return values, ids + tf.cast(offset, tf.int32)
    # The padding of an uneven stripe ranks below everything (ties go to the
    # lower index, so a real entry equal to the fill still wins).
    lowest = x.dtype.min if x.dtype.is_integer else float("-inf")
    values, ids = impl.slicewise(
        local_top_k, impl.mask_padding(lowering.tensors[x], x.shape, lowest,
                                       [self._dim.name]),
        index.dim_offset(impl, self._dim))
    mesh_axis = impl.split_axis(self._dim)
    if mesh_axis is not None:
      # Every stripe's candidates, in stripe order: equal values keep the
      # lower global index first, so ties resolve as on one device.
      values = impl.allconcat(values, mesh_axis, nb)
      ids = impl.allconcat(ids, mesh_axis, nb)

      def merge(v, i):
        v, pos = tf.math.top_k(v, k)
        return v, tf.gather(i, pos, batch_dims=nb)
      values, ids = impl.slicewise(merge, values, ids)
    if self._k_dim is None:
      values, ids = impl.slicewise(
          lambda v, i: (tf.squeeze(v, -1), tf.squeeze(i, -1)), values, ids)
    else:
      k_axis = impl.split_axis(self._k_dim)
      if k_axis is not None:
        # All k were computed; keep this processor's stripe of k_dim.
        values = impl.allsplit(values, k_axis, nb)
        ids = impl.allsplit(ids, k_axis, nb)
    lowering.set_tensor_lowering(self._outputs[0], values)
    lowering.set_tensor_lowering(self._outputs[1], ids)


def top_k(x, reduced_dim, k_dim, name=None):
  """The k_dim.size largest entries of x along reduced_dim, largest first,
  and their int32 indices: (values, indices), each shaped like x with
  reduced_dim removed and k_dim appended. Ties: lower index first.

  Example:
    >>> gates, experts = mtf.top_k(logits, experts_dim, mtf.Dimension("k", 2))
  """
  op = TopKOperation(x, reduced_dim, k_dim, name=name)
  return op.outputs[0], op.outputs[1]


def top_1(x, reduced_dim, name=None, dtype=tf.int32):
  """(max, argmax) of x along reduced_dim, in Mesh TensorFlow 0.1.21's
  order (values first); both have x's shape without reduced_dim. Ties go
  to the first index.

  Example:
    >>> gate, expert = mtf.top_1(logits, experts_dim)
  """
  op = TopKOperation(x, reduced_dim, None, name=name)
  values, indices = op.outputs[0], op.outputs[1]
  if tf.as_dtype(dtype) != indices.dtype:
    indices = elementwise.cast(indices, dtype)
  return values, indices


def argmax(x, reduced_dim, name=None, dtype=tf.int32):
  """Index of the largest entry of x along reduced_dim (the first one if
  several are equal).

  Example:
    >>> predictions = mtf.argmax(logits, vocab_dim)
  """
  return top_1(x, reduced_dim, name=name, dtype=dtype)[1]


def sample_with_temperature(logits, dim, temperature=1.0, name=None):
  """Samples an int32 index along dim with probability softmax(logits /
  temperature) (the Gumbel-max trick); temperature 0 is argmax.

  The noise comes from mtf.random_uniform, so the sample is the same on
  every layout. temperature may be a number or a meshtf Tensor (broadcast
  by dimension name, e.g. one temperature per batch row).

  Example:
    >>> next_token = mtf.sample_with_temperature(logits, vocab_dim, 0.7)
  """
  dim = index.find_dim(logits, dim, "sample_with_temperature")
  name = name or "sample_with_temperature"
  if not isinstance(temperature, graph_lib.Tensor) and temperature == 0.0:
    return argmax(logits, dim, name=name)
  # float32 noise: -log(-log(u)) is coarse in bfloat16. u stays inside
  # (1e-9, 1), so the noise is finite.
  logits = elementwise.cast(logits, tf.float32)
  if isinstance(temperature, graph_lib.Tensor):
    temperature = elementwise.cast(temperature, tf.float32)
  u = random.random_uniform(logits.mesh, logits.shape, minval=1e-9,
                            maxval=1.0, dtype=tf.float32, name=name + "_noise")
  gumbel = -elementwise.log(-elementwise.log(u))
  return argmax(logits + gumbel * temperature, dim, name=name)


class SortOperation(graph_lib.Operation):
  """Sorted values of x along dim, and the permutation: values[..., i] =
  x[..., permutation[..., i]]. Ties keep their order (a stable sort)."""

  cost_kind = CostKind.KERNEL

  def __init__(self, x, dim, descending=False, name=None):
    _check_orderable(x, "sort")
    dim = index.find_dim(x, dim, "sort")
    super().__init__([x], name=name or "sort")
    self._dim, self._descending = dim, bool(descending)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype),
                     graph_lib.Tensor(self, x.shape, tf.int32, index=1)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    # dx[..., perm[..., i]] = dvalues[..., i]: a scatter-add along dim. The
    # scattered tensors name their position dim differently, since a tensor
    # cannot hold `dim` twice.
    x = self._inputs[0]
    tmp = "_sorted_" + self._dim.name
    dv = shape_ops.rename_dimension(grad_ys[0], self._dim.name, tmp)
    perm = shape_ops.rename_dimension(self._outputs[1], self._dim.name, tmp)
    return [index.scatter_add(dv, perm, self._dim, x.shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    names = x.shape.dimension_names
    rest = [n for n in names if n != self._dim.name]
    axis = names.index(self._dim.name)
    direction = "DESCENDING" if self._descending else "ASCENDING"
    t = impl.unsplit_dim(lowering.tensors[x], x.shape, axis)  # the whole dim

    def local_sort(s):
      s = _local.transpose_to(s, names, rest + [self._dim.name])
      perm = tf.argsort(s, axis=-1, direction=direction, stable=True)
      values = tf.gather(s, perm, batch_dims=len(rest))
      back = lambda z: _local.transpose_to(z, rest + [self._dim.name], names)
      return back(values), back(tf.cast(perm, tf.int32))
    values, perm = impl.slicewise(local_sort, t)
    values = impl.resplit_dim(values, x.shape, axis)
    perm = impl.resplit_dim(perm, x.shape, axis)
    lowering.set_tensor_lowering(self._outputs[0], values)
    lowering.set_tensor_lowering(self._outputs[1], perm)


def sort(x, dim, descending=False, name=None):
  """x sorted along dim (ascending unless descending=True). The gradient
  flows back through the permutation. Not in Mesh TensorFlow.

  Example:
    >>> ranked = mtf.sort(scores, length_dim, descending=True)
  """
  return SortOperation(x, dim, descending, name=name).outputs[0]


# --- selections along one dim ------------------------------------------------
def reduce_first(tensor, reduced_dim, name=None):
  """tensor at index 0 of reduced_dim (that dim removed). Where reduced_dim
  is split, the processors holding index 0 contribute it and the others zeros,
  summed over its mesh axis. The gradient flows to index 0 only.

  Example:
    >>> first_token = mtf.reduce_first(embeddings, length_dim)
  """
  dim = index.find_dim(tensor, reduced_dim, "reduce_first", "reduced_dim")
  return index.gather(tensor, 0, dim, name=name or "reduce_first")


def nth_largest_element(x, n, reduced_dim, name=None):
  """The n-th largest entry of x along reduced_dim, n counted from 0 (n=0
  is the max; Mesh TensorFlow's convention). A top_k with k = n + 1 (its
  candidates are gathered across a split reduced_dim), then entry n.

  Example:
    >>> threshold = mtf.nth_largest_element(scores, 2, vocab_dim)  # 3rd
  """
  dim = index.find_dim(x, reduced_dim, "nth_largest_element", "reduced_dim")
  if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < dim.size:
    raise ValueError(
        "nth_largest_element: n=%r must be an integer in [0, %d) for "
        "reduced_dim %s:%d of %s %s (n counts from 0)" % (
            n, dim.size, dim.name, dim.size, x.name, x.shape))
  k_dim = shapes.Dimension("_top_k_", n + 1)
  values, _ = top_k(x, dim, k_dim, name=name)
  return index.gather(values, n, k_dim)


def nth_smallest_element(x, n, reduced_dim, name=None):
  """The n-th smallest entry of x along reduced_dim, n counted from 0:
  -nth_largest_element(-x, n, reduced_dim).

  Example:
    >>> median = mtf.nth_smallest_element(x, length_dim.size // 2, length_dim)
  """
  return elementwise.negative(nth_largest_element(
      elementwise.negative(x), n, reduced_dim, name=name))


__all__ = ["top_k", "top_1", "argmax", "sample_with_temperature", "sort",
           "reduce_first", "nth_largest_element", "nth_smallest_element"]
