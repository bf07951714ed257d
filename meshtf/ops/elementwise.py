"""Elementwise ops: unary math, binary arithmetic with broadcasting by name,
comparisons, logical ops, where, cast, broadcast, identity, stop_gradient.

All are local (no communication): slices of inputs that share dimension
names share layouts, so each processor computes its own output slice.
Addition/subtraction of pending sums stays pending (deferred allreduce).

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> a = mtf.ones(mesh, "batch:2"); b = mtf.ones(mesh, "hidden:3")
  >>> (a * b).shape
  Shape([batch:2, hidden:3])
"""
import math
import numbers

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.op_kinds import CostKind
from meshtf.lowering import constants
from meshtf.lowering import pending as pending_lib
from meshtf.ops import _local


# --- unary ------------------------------------------------------------------
# name -> (tf function, gradient(x, y, dy) built from meshtf ops or None)
def _unary_table():
  return {
      "exp": (tf.exp, lambda x, y, dy: dy * y),
      "log": (tf.math.log, lambda x, y, dy: dy / x),
      "sqrt": (tf.sqrt, lambda x, y, dy: dy * 0.5 / y),
      "rsqrt": (tf.math.rsqrt, lambda x, y, dy: dy * -0.5 * y * y * y),
      "square": (tf.square, _square_gradient),
      "tanh": (tf.tanh, lambda x, y, dy: dy * (1.0 - y * y)),
      "sigmoid": (tf.sigmoid, lambda x, y, dy: dy * y * (1.0 - y)),
      "relu": (tf.nn.relu, lambda x, y, dy: relu_grad(dy, y)),
      "abs": (tf.abs, lambda x, y, dy: dy * sign(x)),
      "sign": (tf.sign, None),
      "negative": (tf.negative, lambda x, y, dy: negative(dy)),
      "reciprocal": (tf.math.reciprocal, lambda x, y, dy: -dy * y * y),
      "sin": (tf.sin, lambda x, y, dy: dy * cos(x)),
      "cos": (tf.cos, lambda x, y, dy: -dy * sin(x)),
      "logical_not": (tf.logical_not, None),
      "identity": (tf.identity, lambda x, y, dy: dy),
  }

_UNARY = None


def _square_gradient(x, y, dy):
  """dy * 2 * x. Where dy is a broadcast of s (a reduction's gradient, as
  in every RMS norm's mean square), 2 * s times x broadcast by the
  multiply: bitwise the same, with no activation-sized broadcast, and no
  product of x and a constant: Grappler reassociates (broadcast(s) * 2) *
  x, and (broadcast(s) * x) * 2, into broadcast(s) * (x * 2), whose x * 2
  TF's executor computes in the forward pass and keeps until the backward
  (one activation-sized tensor per RMS norm, measured on 8 virtual CPUs:
  bench/plan_validation.py --attribute). The unread broadcast is dropped
  (autodiff)."""
  src = dy.operation
  if isinstance(src, BroadcastOperation) and dy.dtype.is_floating:
    return multiply(src.inputs[0] * 2.0, x, output_shape=dy.shape)
  return dy * 2.0 * x


_LINEAR_UNARY = ("negative", "identity")


def _unary_rule(kind):
  global _UNARY
  if _UNARY is None:
    _UNARY = _unary_table()
  return _UNARY[kind]


class UnaryOperation(graph_lib.Operation):
  """y = f(x) elementwise; `kind` names f in the unary table."""

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, kind, x, name=None):
    super().__init__([x], name=name or kind)
    self._kind = kind
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  kind = property(lambda self: self._kind)

  def keeps_pending(self, pending_axes, layout):
    """Negation and identity are linear: the allreduce can wait."""
    return pending_axes[0] is not None and self._kind in _LINEAR_UNARY

  @property
  def has_gradient(self):
    return _unary_rule(self._kind)[1] is not None

  def gradient(self, grad_ys):
    x, y, dy = self._inputs[0], self._outputs[0], grad_ys[0]
    return [_unary_rule(self._kind)[1](x, y, dy)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self._inputs[0]
    raw = lowering.pending_or_laid_out(x)
    fn = _unary_rule(self._kind)[0]
    if self.keeps_pending(pending_lib.pending_axes([raw]), impl.mesh_layout):
      lowering.set_tensor_lowering(self._outputs[0], pending_lib.PendingSum(
          impl, impl.slicewise(fn, raw.laid_out), raw.mesh_axes))
      return
    lowering.set_tensor_lowering(self._outputs[0],
                                 impl.slicewise(fn, lowering.tensors[x]))


def _unary_fn(kind):
  def op(x, name=None):
    return UnaryOperation(kind, x, name=name).outputs[0]
  op.__name__ = kind
  op.__doc__ = ("Elementwise %s(x).\n\n  Example:\n    >>> y = mtf.%s(x)\n"
                % (kind, kind))
  return op

exp = _unary_fn("exp")
log = _unary_fn("log")
sqrt = _unary_fn("sqrt")
rsqrt = _unary_fn("rsqrt")
square = _unary_fn("square")
tanh = _unary_fn("tanh")
sigmoid = _unary_fn("sigmoid")
relu = _unary_fn("relu")
abs = _unary_fn("abs")  # pylint: disable=redefined-builtin
sign = _unary_fn("sign")
negative = _unary_fn("negative")
reciprocal = _unary_fn("reciprocal")
sin = _unary_fn("sin")
cos = _unary_fn("cos")
logical_not = _unary_fn("logical_not")
identity = _unary_fn("identity")


def squared_relu(x):
  """relu(x) ** 2 (Primer's activation).

  Example:
    >>> y = mtf.squared_relu(x)
  """
  return square(relu(x))


def leaky_relu(x, alpha=0.2, name=None):
  """x where x > 0 else alpha * x (0 <= alpha <= 1).

  Example:
    >>> y = mtf.leaky_relu(x, alpha=0.1)
  """
  del name  # Mesh TF's argument; meshtf names ops itself
  return maximum(x, x * alpha)


def elu(x):
  """x where x > 0 else exp(x) - 1.

  Example:
    >>> y = mtf.elu(x)
  """
  # exp of min(x, 0): the unused branch stays finite, so its zero gradient
  # is not 0 * inf.
  return where(greater(x, 0.0), x, exp(minimum(x, 0.0)) - 1.0)


def selu(x):
  """Scaled exponential linear unit (Klambauer et al.).

  Example:
    >>> y = mtf.selu(x)
  """
  alpha, scale = 1.6732632423543772, 1.0507009873554805
  return scale * where(greater(x, 0.0), x,
                       alpha * (exp(minimum(x, 0.0)) - 1.0))


def swish(x):
  """x * sigmoid(x) (also called silu).

  Example:
    >>> y = mtf.swish(x)
  """
  return x * sigmoid(x)


def softplus(x):
  """log(1 + exp(x)), computed without overflow.

  Example:
    >>> y = mtf.softplus(x)
  """
  return relu(x) + log(1.0 + exp(-abs(x)))


def gelu(x):
  """Gaussian error linear unit (tanh approximation, as Mesh TensorFlow).

  Example:
    >>> y = mtf.gelu(x)
  """
  inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
  return 0.5 * x * (1.0 + tanh(inner))


# --- binary ------------------------------------------------------------------
def _binary_table():
  return {
      "add": (tf.add, lambda x, y, z, dy: (dy, dy)),
      "sub": (tf.subtract, lambda x, y, z, dy: (dy, negative(dy))),
      "multiply": (tf.multiply, lambda x, y, z, dy: (dy * y, dy * x)),
      "divide": (tf.divide, lambda x, y, z, dy: (dy / y, -dy * x / (y * y))),
      "maximum": (tf.maximum, lambda x, y, z, dy: (
          dy * cast(greater_equal(x, y), dy.dtype),
          dy * cast(less(x, y), dy.dtype))),
      "minimum": (tf.minimum, lambda x, y, z, dy: (
          dy * cast(less_equal(x, y), dy.dtype),
          dy * cast(greater(x, y), dy.dtype))),
      "pow": (tf.pow, lambda x, y, z, dy: (
          dy * y * pow(x, y - 1.0),
          dy * z * log(where(greater(x, 0.0), x, ones_like_value(x))))),
      # One fused kernel for relu's gradient; its own gradient w.r.t. dy is
      # the same mask, and zero w.r.t. the (piecewise constant) features.
      "relu_grad": (lambda dy, y: tf.raw_ops.ReluGrad(gradients=dy, features=y),
                    lambda x, y, z, dy: (relu_grad(dy, y), y * 0.0)),
      "equal": (tf.equal, None),
      "not_equal": (tf.not_equal, None),
      "less": (tf.less, None),
      "less_equal": (tf.less_equal, None),
      "greater": (tf.greater, None),
      "greater_equal": (tf.greater_equal, None),
      "logical_and": (tf.logical_and, None),
      "logical_or": (tf.logical_or, None),
      "logical_xor": (tf.math.logical_xor, None),
      "floordiv": (tf.math.floordiv, None),
      "mod": (tf.math.floormod, None),
  }

_BINARY = None
_BOOL_OUTPUT = ("equal", "not_equal", "less", "less_equal", "greater",
                "greater_equal", "logical_and", "logical_or", "logical_xor")


def _binary_rule(kind):
  global _BINARY
  if _BINARY is None:
    _BINARY = _binary_table()
  return _BINARY[kind]


def ones_like_value(x):
  from meshtf.ops import io
  return io.ones_like(x)


class BinaryOperation(graph_lib.Operation):
  """z = f(x, y) with broadcasting by dimension name.

  The output shape is x's dims followed by y's dims missing from x, unless
  output_shape is given.
  """

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, kind, x, y, output_shape=None, name=None):
    if x.dtype != y.dtype:
      raise TypeError("%s: operands %s (%s) and %s (%s) differ in dtype; "
                      "cast one first" % (kind, x.name, x.dtype.name, y.name,
                                          y.dtype.name))
    super().__init__([x, y], name=name or kind)
    self._kind = kind
    shape = _local.union_shape([x.shape, y.shape])
    if output_shape is not None:
      output_shape = shapes.convert_to_shape(output_shape)
      if set(output_shape.dims) != set(shape.dims):
        raise ValueError("%s: output_shape %s must hold exactly the dims %s"
                         % (kind, output_shape, shape))
      shape = output_shape
    dtype = tf.bool if kind in _BOOL_OUTPUT else x.dtype
    self._outputs = [graph_lib.Tensor(self, shape, dtype)]

  kind = property(lambda self: self._kind)

  def keeps_pending(self, pending_axes, layout):
    """A sum or difference of two sums pending over the same mesh axes,
    neither broadcast, is still one allreduce, later."""
    x, y = self._inputs
    out = self._outputs[0]
    ax, ay = pending_axes
    return (self._kind in ("add", "sub") and ax is not None and ax == ay
            and x.shape == out.shape and y.shape == out.shape)

  @property
  def has_gradient(self):
    return _binary_rule(self._kind)[1] is not None

  def gradient(self, grad_ys):
    from meshtf.ops import reductions
    x, y = self._inputs
    z, dy = self._outputs[0], grad_ys[0]
    gx, gy = _binary_rule(self._kind)[1](x, y, z, dy)
    def fit(g, t):
      if g.shape != t.shape:
        g = reductions.reduce_sum(g, output_shape=t.shape)
      return g
    return [fit(gx, x), fit(gy, y)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self._inputs
    out = self._outputs[0]
    fn = _binary_rule(self._kind)[0]
    rx = lowering.pending_or_laid_out(x)
    ry = lowering.pending_or_laid_out(y)
    if self.keeps_pending(pending_lib.pending_axes([rx, ry]),
                          impl.mesh_layout):
      lowering.set_tensor_lowering(out, pending_lib.PendingSum(
          impl, impl.slicewise(fn, rx.laid_out, ry.laid_out), rx.mesh_axes))
      return
    def local(a, b):
      return fn(_local.expand_to(a, x.shape, out.shape),
                _local.expand_to(b, y.shape, out.shape))
    lowering.set_tensor_lowering(
        out, impl.slicewise(local, lowering.tensors[x], lowering.tensors[y]))


class ScalarMultiplyOperation(graph_lib.Operation):
  """y = scalar * x for a Python number (linear: keeps sums pending)."""

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, x, scalar, name=None):
    super().__init__([x], name=name or "scalar_multiply")
    self._scalar = scalar
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [grad_ys[0] * self._scalar]

  def keeps_pending(self, pending_axes, layout):
    return pending_axes[0] is not None

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    raw = lowering.pending_or_laid_out(self._inputs[0])
    dtype = self._inputs[0].dtype
    fn = lambda t: t * constants.constant(self._scalar, dtype)
    if self.keeps_pending(pending_lib.pending_axes([raw]), impl.mesh_layout):
      value = pending_lib.PendingSum(impl, impl.slicewise(fn, raw.laid_out),
                                      raw.mesh_axes)
    else:
      value = impl.slicewise(fn, raw)
    lowering.set_tensor_lowering(self._outputs[0], value)


def _to_tensor(v, like):
  """Python numbers become scalar constants on the other operand's mesh; a
  scalar tf.Tensor (or tf.Variable), e.g. a learning rate computed from the
  step, is imported as a replicated scalar, read when the program runs."""
  if isinstance(v, graph_lib.Tensor):
    return v
  from meshtf.ops import io
  if tf.is_tensor(v) or isinstance(v, tf.Variable):
    return io.import_tf_scalar(like.mesh, v, like.dtype)
  return io.constant(like.mesh, v, shape=[], dtype=like.dtype)


def _binary_fn(kind):
  def op(x1, x2, output_shape=None, name=None):
    if not isinstance(x1, graph_lib.Tensor) and not isinstance(
        x2, graph_lib.Tensor):
      raise TypeError("%s needs at least one meshtf Tensor operand" % kind)
    if isinstance(x2, numbers.Number) and not isinstance(x2, bool) \
        and output_shape is None and x1.dtype.is_floating:
      if kind == "multiply":
        return ScalarMultiplyOperation(x1, x2, name=name).outputs[0]
      if kind == "divide":
        return ScalarMultiplyOperation(x1, 1.0 / x2, name=name).outputs[0]
    if isinstance(x1, numbers.Number) and kind == "multiply" \
        and x2.dtype.is_floating and output_shape is None:
      return ScalarMultiplyOperation(x2, x1, name=name).outputs[0]
    a = _to_tensor(x1, x2 if isinstance(x2, graph_lib.Tensor) else None)
    b = _to_tensor(x2, a)
    return BinaryOperation(kind, a, b, output_shape, name=name).outputs[0]
  op.__name__ = kind
  op.__doc__ = ("Elementwise %s of x1 and x2, broadcasting by dimension "
                "name.\n\n  Example:\n    >>> z = mtf.%s(x, y)\n" % (kind, kind))
  return op

add = _binary_fn("add")
sub = _binary_fn("sub")
subtract = sub
multiply = _binary_fn("multiply")
divide = _binary_fn("divide")
maximum = _binary_fn("maximum")
minimum = _binary_fn("minimum")
pow = _binary_fn("pow")  # pylint: disable=redefined-builtin
equal = _binary_fn("equal")
not_equal = _binary_fn("not_equal")
less = _binary_fn("less")
less_equal = _binary_fn("less_equal")
greater = _binary_fn("greater")
greater_equal = _binary_fn("greater_equal")
logical_and = _binary_fn("logical_and")
logical_or = _binary_fn("logical_or")
logical_xor = _binary_fn("logical_xor")
relu_grad = _binary_fn("relu_grad")
floordiv = _binary_fn("floordiv")
mod = _binary_fn("mod")


def add_n(xs):
  """Sum of a list of tensors (pending sums stay pending); 0 (a Python int)
  for an empty list, as in Mesh TensorFlow, so `loss + mtf.add_n(extra)`
  works when a model has no extra losses.

  Example:
    >>> s = mtf.add_n([a, b, c])
    >>> mtf.add_n([])
    0
  """
  xs = list(xs)
  if not xs:
    return 0
  out = xs[0]
  for x in xs[1:]:
    out = add(out, x)
  return out


# --- where, cast, broadcast, stop_gradient -------------------------------------
class WhereOperation(graph_lib.Operation):
  """where(condition, x, y) with broadcasting over all three by name."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, condition, x, y, output_shape=None, name=None):
    if condition.dtype != tf.bool:
      raise TypeError("where: condition %s must be bool, not %s" %
                      (condition.name, condition.dtype.name))
    if x.dtype != y.dtype:
      raise TypeError("where: %s and %s differ in dtype" % (x.name, y.name))
    super().__init__([condition, x, y], name=name or "where")
    shape = (shapes.convert_to_shape(output_shape) if output_shape is not None
             else _local.union_shape([x.shape, y.shape, condition.shape]))
    self._outputs = [graph_lib.Tensor(self, shape, x.dtype)]

  def gradient(self, grad_ys):
    from meshtf.ops import io, reductions
    c, x, y = self._inputs
    dy = grad_ys[0]
    zero = io.zeros_like(dy)
    gx, gy = where(c, dy, zero), where(c, zero, dy)
    fit = lambda g, t: (g if g.shape == t.shape
                        else reductions.reduce_sum(g, output_shape=t.shape))
    return [None, fit(gx, x), fit(gy, y)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    c, x, y = self._inputs
    out = self._outputs[0]
    def local(cs, xs, ys):
      cs = _local.expand_to(cs, c.shape, out.shape)
      xs = _local.expand_to(xs, x.shape, out.shape)
      ys = _local.expand_to(ys, y.shape, out.shape)
      target = tf.broadcast_dynamic_shape(
          tf.broadcast_dynamic_shape(tf.shape(cs), tf.shape(xs)), tf.shape(ys))
      return tf.where(tf.broadcast_to(cs, target), xs, ys)
    lowering.set_tensor_lowering(out, impl.slicewise(
        local, lowering.tensors[c], lowering.tensors[x], lowering.tensors[y]))


def where(condition, if_true, if_false, output_shape=None, name=None):
  """Elementwise if_true where condition else if_false (numbers allowed
  for either).

  Example:
    >>> z = mtf.where(mtf.greater(x, 0.0), x, 0.0)
  """
  x, y = if_true, if_false
  if not isinstance(x, graph_lib.Tensor):
    x = _to_tensor(x, y)
  if not isinstance(y, graph_lib.Tensor):
    y = _to_tensor(y, x)
  return WhereOperation(condition, x, y, output_shape, name).outputs[0]


class CastOperation(graph_lib.Operation):
  """Casts x to dtype (gradient casts back for floating dtypes)."""

  cost_kind = CostKind.FUSIBLE
  elementwise = True

  def __init__(self, x, dtype, name=None):
    super().__init__([x], name=name or "cast")
    self._outputs = [graph_lib.Tensor(self, x.shape, tf.as_dtype(dtype))]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating and self._outputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    return [cast(grad_ys[0], self._inputs[0].dtype)]

  # Set by a loop's gradient on the casts whose results it sums over the
  # iterations (control/loops.py): a pending sum then stays pending, to be
  # reduced once after the loop. Elsewhere a cast reduces it first, in the
  # narrower dtype (fewer bytes sent).
  sums_later = False

  @property
  def widens(self):
    """Whether this casts a float to a float at least as wide (bfloat16 ->
    float32): the sum of the cast parts is the cast sum, rounded no more."""
    x, y = self._inputs[0].dtype, self._outputs[0].dtype
    return x.is_floating and y.is_floating and y.size >= x.size

  def keeps_pending(self, pending_axes, layout):
    return pending_axes[0] is not None and self.sums_later and self.widens

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dtype = self._outputs[0].dtype
    fn = lambda t: tf.cast(t, dtype)  # noqa: E731
    raw = lowering.pending_or_laid_out(self._inputs[0])
    if self.keeps_pending(pending_lib.pending_axes([raw]), impl.mesh_layout):
      lowering.set_tensor_lowering(self._outputs[0], pending_lib.PendingSum(
          impl, impl.slicewise(fn, raw.laid_out), raw.mesh_axes))
      return
    lowering.set_tensor_lowering(self._outputs[0], impl.slicewise(
        fn, lowering.tensors[self._inputs[0]]))


def cast(x, dtype, name=None):
  """x converted to dtype.

  Example:
    >>> m = mtf.cast(mtf.greater(x, 0.0), tf.float32)
  """
  if tf.as_dtype(dtype) == x.dtype:
    return x
  return CastOperation(x, dtype, name=name).outputs[0]


def to_float(x, name=None):
  """cast(x, tf.float32)."""
  return cast(x, tf.float32, name=name)


def to_bfloat16(x, name=None):
  """cast(x, tf.bfloat16)."""
  return cast(x, tf.bfloat16, name=name)


def to_int32(x, name=None):
  """cast(x, tf.int32)."""
  return cast(x, tf.int32, name=name)


class BroadcastOperation(graph_lib.Operation):
  """Broadcasts x to new_shape (a superset of its dims, any order)."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, new_shape, name=None):
    new_shape = shapes.convert_to_shape(new_shape)
    if not x.shape.is_subshape_of(new_shape):
      raise ValueError("broadcast: %s has dims %s not all in new shape %s"
                       % (x.name, x.shape, new_shape))
    super().__init__([x], name=name or "broadcast")
    self._outputs = [graph_lib.Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    from meshtf.ops import reductions
    return [reductions.reduce_sum(grad_ys[0], output_shape=self._inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    target = impl.slice_shape(out.shape)
    lowering.set_tensor_lowering(out, impl.slicewise(
        lambda t: tf.broadcast_to(_local.expand_to(t, x.shape, out.shape),
                                  target), lowering.tensors[x]))


def broadcast(x, new_shape, name=None):
  """x broadcast to new_shape.

  Example:
    >>> y = mtf.broadcast(bias, [batch, hidden])
  """
  new_shape = shapes.convert_to_shape(new_shape)
  if x.shape == new_shape:
    return x
  return BroadcastOperation(x, new_shape, name=name).outputs[0]


class StopGradientOperation(graph_lib.Operation):
  """Identity whose gradient is not propagated."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, name=None):
    super().__init__([x], name=name or "stop_gradient")
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def lower(self, lowering):
    lowering.set_tensor_lowering(self._outputs[0], lowering.mesh_impl(
        self).slicewise(tf.stop_gradient, lowering.tensors[self._inputs[0]]))


def stop_gradient(x, name=None):
  """x, with no gradient flowing back through it.

  Example:
    >>> m = mtf.stop_gradient(mtf.reduce_max(x))
  """
  return StopGradientOperation(x, name=name).outputs[0]


__all__ = [
    "exp", "log", "sqrt", "rsqrt", "square", "tanh", "sigmoid", "relu", "gelu",
    "abs", "sign", "negative", "reciprocal", "sin", "cos", "logical_not",
    "identity", "add", "sub", "subtract", "multiply", "divide", "maximum",
    "minimum", "pow", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "add_n",
    "where", "cast", "to_float", "broadcast", "stop_gradient",
    "squared_relu", "leaky_relu", "elu", "selu", "swish", "softplus",
    "floordiv", "mod", "to_bfloat16", "to_int32",
]
