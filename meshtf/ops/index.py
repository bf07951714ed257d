"""Index ops: one_hot, range (mtf_range), gather and cumsum.

Every op here works under any layout, including when the dimension it works
along is split over a mesh axis:

  one_hot, range   each processor compares with / counts from the global
                   start of its stripe (no communication).
  gather           each processor looks up the rows it owns and zeroes the
                   others; the stripes add up in an allreduce over the
                   gathered dim's mesh axis (a pending sum). If an indices
                   dim shares that axis, the indices are allconcat-ed first
                   and the sum is reduce-scattered.
  scatter_add      gather's gradient: each processor adds the updates that
                   land in its rows; a pending sum over the indices' axes
                   (or an allconcat of the updates along a shared axis).
  cumsum           local cumsum plus the totals of the preceding stripes
                   (one allconcat of per-stripe totals).

top_k, top_1, argmax, sort and sample_with_temperature live in
meshtf/ops/topk.py.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> ids = mtf.zeros(mesh, "batch:4", dtype=tf.int32)
  >>> mtf.one_hot(ids, mtf.Dimension("vocab", 10)).shape
  Shape([batch:4, vocab:10])
"""
import numbers

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import _local

# Note: this module defines `range` (Mesh TensorFlow's name), so the builtin
# range() is not available in its functions.


# --- helpers shared with meshtf/ops/topk.py ----------------------------------
def find_dim(x, dim, op_name, arg="dim"):
  """The Dimension of x (a Tensor, or a Shape) named like `dim` (a
  Dimension, (name, size) pair or name); raises a ValueError naming the
  op, the argument and the shape."""
  shape = x if isinstance(x, shapes.Shape) else x.shape
  where = "%s %s" % ("shape" if x is shape else x.name, shape)
  if isinstance(dim, str):
    name, size = dim, None
  else:
    d = shapes.convert_to_dimension(dim)
    name, size = d.name, d.size
  for d in shape.dims:
    if d.name == name:
      if size is not None and size != d.size:
        raise ValueError("%s: %s %s:%d does not match %s:%d of %s" % (
            op_name, arg, name, size, name, d.size, where))
      return d
  raise ValueError("%s: %s %r is not a dimension of %s" % (
      op_name, arg, name, where))


def check_integer(t, op_name, arg):
  if not t.dtype.is_integer:
    raise TypeError("%s: %s %s must have an integer dtype, not %s; use "
                    "mtf.cast(%s, tf.int32)" % (op_name, arg, t.name,
                                                t.dtype.name, arg))


def dim_offset(impl, dim):
  """Per processor, the global index where its stripe of dim starts: a
  laid-out int32 scalar, or the number 0 when dim is not split (slicewise
  passes non-laid-out arguments through unchanged). Stripes have
  ceil(size / axis size) positions (uneven splits are padded at the end)."""
  axes = impl.mesh_layout.split_axes(dim)
  if not axes:
    return 0
  stripe = impl.mesh_layout.dim_split(shapes.Shape([dim]), 0).shard_size
  return impl.slicewise(lambda i: tf.cast(i, tf.int32) * stripe,
                        impl.laid_out_shard_index(axes))


# --- one_hot -----------------------------------------------------------------
class OneHotOperation(graph_lib.Operation):
  """y[..., j] = on_value if indices[...] == j else off_value; output_dim is
  appended after the indices' dims. Out-of-range indices give off_value."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, indices, output_dim, on_value, off_value, dtype,
               name=None):
    check_integer(indices, "one_hot", "indices")
    output_dim = shapes.convert_to_dimension(output_dim)
    if indices.shape.has_dim_name(output_dim.name):
      raise ValueError("one_hot: output_dim %r is already a dimension of "
                       "indices %s %s; pick a new name" % (
                           output_dim.name, indices.name, indices.shape))
    super().__init__([indices], name=name or "one_hot")
    self._dim = output_dim
    self._values = (on_value, off_value)
    self._outputs = [graph_lib.Tensor(
        self, shapes.Shape(indices.shape.dims + [output_dim]), dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    depth = impl.slice_shape(out.shape)[-1]
    on, off = self._values

    def local(ids, offset):
      # Shifted into this stripe; indices of other stripes fall outside
      # [0, depth) and tf.one_hot gives them off_value.
      return tf.one_hot(ids - tf.cast(offset, ids.dtype), depth,
                        on_value=tf.cast(on, out.dtype),
                        off_value=tf.cast(off, out.dtype), dtype=out.dtype)
    lowering.set_tensor_lowering(out, impl.slicewise(
        local, lowering.tensors[self._inputs[0]], dim_offset(impl, self._dim)))


def one_hot(indices, output_dim, on_value=1.0, off_value=0.0,
            dtype=tf.float32, name=None):
  """One-hot vectors along output_dim (appended after the indices' dims).

  Indices outside [0, output_dim.size) give all off_value, as tf.one_hot.

  Example:
    >>> y = mtf.one_hot(token_ids, vocab_dim)   # [batch, length, vocab]
  """
  return OneHotOperation(indices, output_dim, on_value, off_value, dtype,
                         name=name).outputs[0]


# --- range -------------------------------------------------------------------
class RangeOperation(graph_lib.Operation):
  """0, 1, ..., dim.size - 1 along dim."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, mesh, dim, dtype, name=None):
    dim = shapes.convert_to_dimension(dim)
    super().__init__([], mesh=mesh, name=name or "range")
    self._dim = dim
    self._outputs = [graph_lib.Tensor(self, shapes.Shape([dim]), dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    n = impl.slice_shape(out.shape)[0]
    # int32 first, then cast: tf.range has no bfloat16 kernel.
    lowering.set_tensor_lowering(out, impl.slicewise(
        lambda offset: tf.cast(tf.range(n, dtype=tf.int32) + offset,
                               out.dtype), dim_offset(impl, self._dim)))


def mtf_range(mesh, dim, dtype, name=None):
  """A 1-D tensor 0, 1, ..., dim.size - 1 along dim (Mesh TensorFlow's
  `mtf.range`); each processor computes its own stripe.

  Example:
    >>> pos = mtf.range(mesh, length_dim, tf.int32)
  """
  return RangeOperation(mesh, dim, dtype, name=name).outputs[0]


range = mtf_range  # pylint: disable=redefined-builtin


# --- gather / scatter_add ----------------------------------------------------
class _LookupPlan(object):
  """How a table (weights) and indices line up in gather and scatter_add.

  shared: dims in both (batch dims: each position looks up its own row),
  ids_only: dims only of the indices, table_only: dims only of the table
  (besides `dim`). The local computation arranges slices as
  table [shared, dim, table_only], indices [shared, ids_only] and
  result [shared, ids_only, table_only].
  """

  def __init__(self, op_name, table_shape, indices_shape, dim):
    if indices_shape.has_dim_name(dim.name):
      raise ValueError(
          "%s: indices shape %s contains the looked-up dimension %r; rename "
          "it in the indices (mtf.rename_dimension)" % (op_name, indices_shape,
                                                        dim.name))
    # Raises if a shared name has two sizes.
    self.union = _local.union_shape([indices_shape, table_shape])
    t_names = table_shape.dimension_names
    i_names = indices_shape.dimension_names
    self.dim = dim
    self.shared = [n for n in i_names if n in t_names]
    self.ids_only = [n for n in i_names if n not in t_names]
    self.table_only = [n for n in t_names if n not in i_names
                       and n != dim.name]
    self.result_shape = shapes.Shape(
        [d for d in self.union.dims if d.name != dim.name])

  def check_result_shape(self, op_name, shape, what):
    shape = shapes.convert_to_shape(shape)
    if set(shape.dims) != set(self.result_shape.dims):
      raise ValueError("%s: %s %s must hold exactly the dims %s (the indices' "
                       "dims and the weights' dims other than %r)" % (
                           op_name, what, shape, self.result_shape,
                           self.dim.name))
    return shape

  def ids_dim_on_dim_axis(self, impl):
    """The indices-only dim that splits over one of the looked-up dim's
    mesh axes, or None. At most one can (the indices are a valid tensor),
    and it is the only way the two operands' layouts can clash: the shared
    and table-only dims sit in one tensor with `dim`, or in the result with
    the indices-only dims."""
    axes = set(impl.mesh_layout.split_axes(self.dim))
    for n in self.ids_only:
      if axes & set(impl.mesh_layout.split_axes(
          self.union.get_dim_by_name(n))):
        return n
    return None


class GatherOperation(graph_lib.Operation):
  """out[shared, ids, rest] = weights[shared, indices[shared, ids], rest]
  (zero where an index is out of range), as einsum([one_hot(indices, dim),
  weights]) without the one-hot tensor."""

  # A split table dim leaves partial sums (each row on one processor).
  cost_kind = CostKind.FUSIBLE
  sums_partials = True

  def __init__(self, weights, indices, dim, output_shape=None, name=None):
    check_integer(indices, "gather", "indices")
    dim = find_dim(weights, dim, "gather")
    self._plan = _LookupPlan("gather", weights.shape, indices.shape, dim)
    out = (self._plan.result_shape if output_shape is None else
           self._plan.check_result_shape("gather", output_shape,
                                         "output_shape"))
    super().__init__([weights, indices], name=name or "gather")
    self._outputs = [graph_lib.Tensor(self, out, weights.dtype)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    weights, indices = self._inputs
    return [scatter_add(grad_ys[0], indices, self._plan.dim, weights.shape),
            None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    weights, indices = self._inputs
    out = self._outputs[0]
    p = self._plan
    w_names = weights.shape.dimension_names
    i_names = indices.shape.dimension_names
    nb = len(p.shared)

    def local(w, ids, offset):
      w = _local.transpose_to(w, w_names, p.shared + [p.dim.name] +
                              p.table_only)
      ids = _local.transpose_to(ids, i_names, p.shared + p.ids_only)
      n = int(w.shape[nb])
      # In range, and in this stripe (an uneven stripe's padding is never
      # read: ids past the dim's end are out of range, not padding).
      in_range = ids < p.dim.size
      ids = ids - tf.cast(offset, ids.dtype)
      mine = tf.logical_and(tf.logical_and(ids >= 0, ids < n), in_range)
      # Rows of other stripes (and out-of-range ids) read row 0, then zero.
      rows = tf.gather(w, tf.where(mine, ids, tf.zeros_like(ids)), axis=nb,
                       batch_dims=nb)
      mine = tf.reshape(mine, mine.shape.as_list() + [1] * len(p.table_only))
      rows = tf.where(mine, rows, tf.zeros_like(rows))
      return _local.transpose_to(rows, p.shared + p.ids_only + p.table_only,
                                 out.shape.dimension_names)
    ids_t = lowering.tensors[indices]
    q = p.ids_dim_on_dim_axis(impl)
    if q is not None:
      # q and dim share a mesh axis, so no processor holds matching stripes
      # of both: look up all of q in the own rows, then reduce-scatter.
      ids_t = impl.unsplit_dim(ids_t, indices.shape, i_names.index(q))
    value = impl.slicewise(local, lowering.tensors[weights], ids_t,
                           dim_offset(impl, p.dim))
    axes = impl.reduced_mesh_axes(p.union, out.shape)  # dim's axis, if split
    if q is not None:
      value = impl.allreduce_and_resplit(value, axes, out.shape,
                                         out.shape.dimension_names.index(q))
    elif axes:
      value = pending_lib.PendingSum(impl, value, axes)
    lowering.set_tensor_lowering(out, value)


class ScatterAddOperation(graph_lib.Operation):
  """The transpose of gather: out (shaped like the weights) is zero except
  out[shared, indices[shared, ids], rest] += updates[shared, ids, rest]."""

  cost_kind = CostKind.KERNEL
  sums_partials = True

  def __init__(self, updates, indices, dim, output_shape, name=None):
    check_integer(indices, "scatter_add", "indices")
    output_shape = shapes.convert_to_shape(output_shape)
    dim = find_dim(output_shape, dim, "scatter_add")
    self._plan = _LookupPlan("scatter_add", output_shape, indices.shape, dim)
    self._plan.check_result_shape("scatter_add", updates.shape,
                                  "updates shape")
    super().__init__([updates, indices], name=name or "scatter_add")
    self._outputs = [graph_lib.Tensor(self, output_shape, updates.dtype)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    updates, indices = self._inputs
    return [gather(grad_ys[0], indices, self._plan.dim,
                   output_shape=updates.shape), None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    updates, indices = self._inputs
    out = self._outputs[0]
    p = self._plan
    u_names = updates.shape.dimension_names
    i_names = indices.shape.dimension_names
    nb = len(p.shared)
    n = impl.slice_shape(out.shape)[out.shape.dimension_names.index(
        p.dim.name)]

    def local(u, ids, offset):
      u = _local.transpose_to(u, u_names, p.shared + p.ids_only + p.table_only)
      ids = _local.transpose_to(ids, i_names, p.shared + p.ids_only)
      batch = ids.shape.as_list()[:nb]
      rows = u.shape.as_list()[nb + len(p.ids_only):]
      groups = shapes.prod(batch)
      ids = tf.reshape(ids - tf.cast(offset, ids.dtype), [groups, -1])
      mine = tf.logical_and(ids >= 0, ids < n)
      # One segment per (batch position, local row); -1 drops an update
      # that belongs to another stripe (or is out of range).
      seg = ids + tf.range(groups, dtype=ids.dtype)[:, None] * n
      seg = tf.where(mine, seg, -tf.ones_like(seg))
      summed = tf.math.unsorted_segment_sum(
          tf.reshape(u, [-1] + rows), tf.reshape(seg, [-1]), groups * n)
      summed = tf.reshape(summed, batch + [n] + rows)
      return _local.transpose_to(summed, p.shared + [p.dim.name] +
                                 p.table_only, out.shape.dimension_names)
    u_t, ids_t = lowering.tensors[updates], lowering.tensors[indices]
    q = p.ids_dim_on_dim_axis(impl)
    gathered = ()
    if q is not None:
      # q shares dim's mesh axis: gather all of q, so that each processor
      # adds every update that lands in its own rows.
      u_t = impl.unsplit_dim(u_t, updates.shape, u_names.index(q))
      ids_t = impl.unsplit_dim(ids_t, indices.shape, i_names.index(q))
      gathered = impl.mesh_layout.split_axes(
          indices.shape.get_dim_by_name(q))
    value = impl.slicewise(local, u_t, ids_t, dim_offset(impl, p.dim))
    # Updates from the indices' other stripes land in the same rows.
    axes = [a for a in impl.reduced_mesh_axes(p.union, out.shape)
            if a not in gathered]
    if axes:
      value = pending_lib.PendingSum(impl, value, axes)
    lowering.set_tensor_lowering(out, value)


def gather(weights, indices, dim, output_shape=None, name=None):
  """Rows of `weights` along `dim` at `indices` (the embedding lookup).

  The result has the indices' dims followed by the weights' other dims
  (dims in both are batch dims: each position reads its own row), or
  output_shape (the same dims, any order). Out-of-range indices give zeros,
  as einsum([one_hot(indices, dim), weights]) would. The gradient w.r.t.
  weights is a scatter-add; indices have none.

  Example:
    >>> emb = mtf.gather(embedding, token_ids, vocab_dim)   # [batch, d_model]
  """
  if isinstance(indices, numbers.Integral):
    from meshtf.ops import io
    indices = io.constant(weights.mesh, indices, shape=[], dtype=tf.int32)
  if weights.dtype == tf.bool:
    # Partial results are summed across stripes: not defined for bool.
    from meshtf.ops import elementwise
    return elementwise.cast(gather(elementwise.cast(weights, tf.int32),
                                   indices, dim, output_shape, name), tf.bool)
  return GatherOperation(weights, indices, dim, output_shape,
                         name=name).outputs[0]


def scatter_add(updates, indices, dim, output_shape, name=None):
  """A tensor of output_shape, zero except that updates[shared, ids, rest]
  is added at row indices[shared, ids] of dim (gather's transpose).

  Example:
    >>> d_embedding = mtf.scatter_add(d_emb, token_ids, vocab_dim,
    ...                               embedding.shape)
  """
  return ScatterAddOperation(updates, indices, dim, output_shape,
                             name=name).outputs[0]


# --- cumsum ------------------------------------------------------------------
class CumsumOperation(graph_lib.Operation):
  """Cumulative sum along dim (exclusive: without the element itself;
  reverse: from the end)."""

  cost_kind = CostKind.REDUCING

  def __init__(self, x, dim, exclusive=False, reverse=False, name=None):
    dim = find_dim(x, dim, "cumsum")
    if not (x.dtype.is_floating or x.dtype.is_integer):
      raise TypeError("cumsum: %s has dtype %s; cast it to a number type "
                      "first" % (x.name, x.dtype.name))
    super().__init__([x], name=name or "cumsum")
    self._dim = dim
    self._exclusive = bool(exclusive)
    self._reverse = bool(reverse)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    # Each input element feeds the outputs after it: a cumsum the other way.
    return [CumsumOperation(grad_ys[0], self._dim, self._exclusive,
                            not self._reverse).outputs[0]]

  def keeps_pending(self, pending_axes, layout):
    """cumsum is linear, so a pending sum stays pending (x's dims never
    use the pending sum's axes, so neither do the stripe totals)."""
    return pending_axes[0] is not None

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    axis = x.shape.dimension_names.index(self._dim.name)
    exclusive, reverse = self._exclusive, self._reverse
    raw = lowering.pending_or_laid_out(x)
    pending = self.keeps_pending(pending_lib.pending_axes([raw]),
                                 impl.mesh_layout)
    t = raw.laid_out if pending else raw
    # An uneven stripe's padding adds nothing to the totals.
    t = impl.mask_padding(t, x.shape, 0, [self._dim.name])

    def local_cumsum(s):
      return tf.cumsum(s, axis=axis, exclusive=exclusive, reverse=reverse)
    mesh_axis = impl.split_axis(self._dim)
    if mesh_axis is None:
      value = impl.slicewise(local_cumsum, t)
    else:
      totals = impl.slicewise(
          lambda s: tf.reduce_sum(s, axis=axis, keepdims=True), t)
      totals = impl.allconcat(totals, mesh_axis, axis)

      def combine(s, all_totals, pcoord):
        # Sum of the stripes before this one (after it, when reversed).
        before = tf.cumsum(all_totals, axis=axis, exclusive=True,
                           reverse=reverse)
        return local_cumsum(s) + tf.gather(before, tf.reshape(pcoord, [1]),
                                           axis=axis)
      value = impl.slicewise(combine, t, totals,
                             impl.laid_out_shard_index(mesh_axis))
    if pending:
      value = pending_lib.PendingSum(impl, value, raw.mesh_axes)
    lowering.set_tensor_lowering(out, value)


def cumsum(x, dim, exclusive=False, name=None):
  """Cumulative sum along dim; exclusive=True leaves each element out
  (starting from 0). The gradient is the reverse cumulative sum.

  Example:
    >>> position = mtf.cumsum(mask, length_dim, exclusive=True)
  """
  return CumsumOperation(x, dim, exclusive, name=name).outputs[0]


__all__ = ["one_hot", "mtf_range", "range", "gather", "scatter_add", "cumsum"]
