"""Reductions: reduce_sum/mean/max/min/logsumexp, softmax, log_softmax, and
the selections reduce_first, nth_largest_element, nth_smallest_element.

Local reduction of each slice, then an allreduce over the mesh axes of the
reduced dims (sums are deferred as pending sums). The selections build on
gather and top_k, which handle a split reduced dim.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;vocab:10")
  >>> mtf.reduce_sum(x, reduced_dim=mtf.Dimension("vocab", 10)).shape
  Shape([batch:4])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import constants
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import _local
from meshtf.ops import elementwise

_LOCAL = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max, "MIN": tf.reduce_min}


def identity_of(reduction, dtype):
  """The value that does not change a SUM / MAX / MIN reduction of dtype:
  what the padding of an uneven split is replaced by before reducing.

  Example:
    >>> identity_of("MAX", tf.float32)
    -inf
  """
  dtype = tf.as_dtype(dtype)
  if reduction == "SUM":
    return 0
  if dtype == tf.bool:
    return reduction == "MIN"
  if dtype.is_floating:
    return float("-inf") if reduction == "MAX" else float("inf")
  return dtype.min if reduction == "MAX" else dtype.max


class ReduceOperation(graph_lib.Operation):
  """Reduces x to output_shape (a subset of its dims) with SUM, MAX or MIN."""

  cost_kind = CostKind.REDUCING

  def __init__(self, x, output_shape, reduction, name=None):
    output_shape = shapes.convert_to_shape(output_shape)
    if not output_shape.is_subshape_of(x.shape):
      raise ValueError("reduce_%s: output_shape %s is not a subset of the "
                       "dims of %s %s" % (reduction.lower(), output_shape,
                                          x.name, x.shape))
    super().__init__([x], name=name or "reduce_" + reduction.lower())
    self._reduction = reduction
    self._outputs = [graph_lib.Tensor(self, output_shape, x.dtype)]

  # "SUM", "MAX" or "MIN".
  reduction = property(lambda self: self._reduction)
  # A sum over a split dim leaves partial sums (reduced later); a max or
  # min is allreduced at once.
  sums_partials = property(lambda self: self._reduction == "SUM")
  split_reduction = reduction

  def flops(self, layout, tile=0):
    """One per local input element."""
    del tile
    return sum(layout.slice_size(t.shape) for t in self._inputs)

  def gradient(self, grad_ys):
    x, y, dy = self._inputs[0], self._outputs[0], grad_ys[0]
    dy_b = elementwise.broadcast(dy, x.shape)
    if self._reduction == "SUM":
      return [dy_b]
    # Ties share the gradient equally, as TensorFlow's reduce_max does.
    mask = elementwise.cast(elementwise.equal(
        x, elementwise.broadcast(y, x.shape)), x.dtype)
    count = reduce_sum(mask, output_shape=y.shape)
    return [dy_b * mask / elementwise.broadcast(count, x.shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    names = x.shape.dimension_names
    axes = [i for i, n in enumerate(names)
            if n not in out.shape.dimension_names]
    kept = [n for n in names if n in out.shape.dimension_names]
    fn = _LOCAL[self._reduction]
    def local(t):
      if axes:
        t = fn(t, axis=constants.int32(axes))
      return _local.transpose_to(t, kept, out.shape.dimension_names)
    # The padding of an unevenly split reduced dim must not count.
    value = impl.mask_padding(lowering.tensors[x], x.shape,
                              identity_of(self._reduction, x.dtype),
                              [names[i] for i in axes])
    value = impl.slicewise(local, value)
    mesh_axes = impl.reduced_mesh_axes(x.shape, out.shape)
    if mesh_axes:
      if self.sums_partials:
        value = pending_lib.PendingSum(impl, value, mesh_axes)
      else:
        value = impl.allreduce(value, mesh_axes, self._reduction)
    lowering.set_tensor_lowering(out, value)


def _output_shape(x, output_shape, reduced_dim):
  if output_shape is not None:
    return shapes.convert_to_shape(output_shape)
  if reduced_dim is None:
    return shapes.Shape([])
  dims = reduced_dim if isinstance(reduced_dim, (list, tuple, shapes.Shape)) \
      and not isinstance(reduced_dim, shapes.Dimension) else [reduced_dim]
  names = {d if isinstance(d, str) else shapes.convert_to_dimension(d).name
           for d in dims}
  missing = names - set(x.shape.dimension_names)
  if missing:
    raise ValueError("reduce over %s: %s %s has no such dimension" %
                     (sorted(missing), x.name, x.shape))
  return x.shape - list(names)


def _reduce(reduction):
  def op(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
         name=None):
    assert disable_positional_args is None, "use keyword arguments"
    out = _output_shape(x, output_shape, reduced_dim)
    if out == x.shape:
      return x
    return ReduceOperation(x, out, reduction, name=name).outputs[0]
  op.__name__ = "reduce_" + reduction.lower()
  op.__doc__ = (
      "%s over the dims of x not in output_shape (or over reduced_dim; over "
      "everything if neither is given).\n\n  Example:\n    >>> "
      "s = mtf.reduce_%s(x, reduced_dim=vocab)\n" % (reduction.title(),
                                                     reduction.lower()))
  return op

reduce_sum = _reduce("SUM")
reduce_max = _reduce("MAX")
reduce_min = _reduce("MIN")


def reduce_mean(x, disable_positional_args=None, output_shape=None,
                reduced_dim=None, name=None):
  """Mean over the reduced dims.

  Example:
    >>> loss = mtf.reduce_mean(mtf.square(y))
  """
  assert disable_positional_args is None, "use keyword arguments"
  out = _output_shape(x, output_shape, reduced_dim)
  s = reduce_sum(x, output_shape=out, name=name)
  return s * (float(out.size) / float(x.shape.size)) if x.shape.size else s


def reduce_any(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Logical or of a bool tensor over the reduced dims.

  Example:
    >>> any_pad = mtf.reduce_any(mtf.equal(ids, 0), reduced_dim=length)
  """
  assert disable_positional_args is None, "use keyword arguments"
  as_int = elementwise.cast(x, tf.int32)
  return elementwise.cast(reduce_max(as_int, output_shape=output_shape,
                                     reduced_dim=reduced_dim, name=name),
                          tf.bool)


def reduce_all(x, disable_positional_args=None, output_shape=None,
               reduced_dim=None, name=None):
  """Logical and of a bool tensor over the reduced dims.

  Example:
    >>> all_valid = mtf.reduce_all(mask, reduced_dim=length)
  """
  assert disable_positional_args is None, "use keyword arguments"
  as_int = elementwise.cast(x, tf.int32)
  return elementwise.cast(reduce_min(as_int, output_shape=output_shape,
                                     reduced_dim=reduced_dim, name=name),
                          tf.bool)


def reduce_logsumexp(x, reduced_dim=None, extra_logit=None, name=None,
                     output_shape=None):
  """log(sum(exp(x))) over the reduced dims, computed stably; extra_logit:
  a logit of that value added to every sum (Mesh TF's argument).

  Example:
    >>> lse = mtf.reduce_logsumexp(logits, vocab)
  """
  del name
  out = _output_shape(x, output_shape, reduced_dim)
  m = elementwise.stop_gradient(reduce_max(x, output_shape=out))
  lse = m + elementwise.log(reduce_sum(elementwise.exp(x - m),
                                       output_shape=out))
  if extra_logit is not None:
    lse = reduce_logsumexp_with_extra(lse, extra_logit)
  return lse


def log_softmax(x, reduced_dim, extra_logit=None, name=None):
  """x - logsumexp(x) over reduced_dim.

  Example:
    >>> logp = mtf.log_softmax(logits, vocab)
  """
  del name
  lse = reduce_logsumexp(x, reduced_dim)
  if extra_logit is not None:
    lse = reduce_logsumexp_with_extra(lse, extra_logit)
  return x - lse


def reduce_logsumexp_with_extra(lse, extra_logit):
  # log(exp(lse) + exp(extra)) for an implicit extra logit (Mesh TensorFlow).
  from meshtf.ops import io
  e = io.constant(lse.mesh, extra_logit, lse.shape, lse.dtype)
  m = elementwise.stop_gradient(elementwise.maximum(lse, e))
  return m + elementwise.log(elementwise.exp(lse - m) + elementwise.exp(e - m))


def softmax(x, reduced_dim, extra_logit=None, name=None):
  """exp(log_softmax(x)) over reduced_dim.

  Example:
    >>> p = mtf.softmax(logits, vocab)
  """
  return elementwise.exp(log_softmax(x, reduced_dim, extra_logit, name))
