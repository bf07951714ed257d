"""Normalizations whose backward pass keeps what the activations are:
rms_norm, layer_norm and softmax over a dim.

With 16-bit activations (bfloat16) these compute their statistics in
float32, as is standard, but written as plain compositions of meshtf ops
their gradients would keep float32 copies of the whole activation for the
backward pass: softmax kept exp(x - max) and its output, both float32
[batch, heads, length, memory_length] -- 17 GB of the 34 GB a GSPMD 64B
layer stack kept per device. Here each one is a custom gradient
(ops/control.py) that keeps only:

  softmax     its output, in the activations' dtype (dx = y * (dy -
              sum(dy * y)), computed in float32 from it);
  rms_norm    its input x (activations' dtype) and the float32 reciprocal
              root mean square, one number per position;
  layer_norm  x, and the float32 mean and reciprocal deviation per
              position.

The backward pass recomputes the normalized value from them in float32.
In float32 the values are those of the plain composition (the gradients
agree to float rounding); with bfloat16 activations the kept softmax
output is rounded to bfloat16, as the next einsum's operand already was.
Every op is a meshtf op, so any layout works (a split reduced dim makes
the statistics' sums allreduces, as before).

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import norms
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.cast(mtf.random_normal(mesh, "batch:2;d:8"), tf.bfloat16)
  >>> y = norms.rms_norm(x, mtf.Dimension("d", 8))
  >>> y.dtype.name
  'bfloat16'
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.models import dtypes
from meshtf.ops import annotations
from meshtf.ops import control

_HALF = (tf.bfloat16, tf.float16)


def float32(x):
  """x in float32 if it is 16-bit (statistics in 16 bits lose too much)."""
  return mtf.cast(x, tf.float32) if x.dtype in _HALF else x


def _as(x, dtype):
  return mtf.cast(x, dtype) if x.dtype != dtype else x


def _cotangent(dy, primal):
  """dy laid out as its primal is (GSPMD's backward mirrors the forward):
  a gradient arriving as a partial sum is reduced once, into the primal's
  layout (a reduce-scatter where that splits a summed axis), before the
  backward's several readers take it. A no-op without per-tensor layouts."""
  return annotations.LayoutLikeOperation(dy, primal).outputs[0]


def _check_dim(x, dim, what):
  dim = mtf.convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ValueError("%s: %s %s has no dimension %s" % (what, x.name, x.shape,
                                                       dim))
  return dim


def _scope(mesh, name, default):
  return name if name else mesh.graph.unique_name(default)


def norm_variable(x, scope, suffix, dim, initializer):
  """A norm's [dim] variable "<scope>/<suffix>": float32 and returned in
  x's dtype when x is 16-bit (Mesh TF's float32 master with
  activation_dtype=x.dtype)."""
  dtype = (dtypes.VariableDType(tf.float32, activation_dtype=x.dtype)
           if x.dtype in _HALF else x.dtype)
  return mtf.get_variable(x.mesh, scope + "/" + suffix, mtf.Shape([dim]),
                          dtype=dtype, initializer=initializer)


# --- softmax ------------------------------------------------------------------
def softmax(x, dim, bias=None, dtype=None):
  """softmax(x + bias) over dim, computed in float32, returned in dtype
  (default x's), keeping only its output for the backward pass.

  bias: an additive tensor broadcastable to x (an attention mask), or None.

  Example:
    >>> w = softmax(logits, memory_length, bias=mask)   # logits' dtype
  """
  dim = _check_dim(x, dim, "softmax")
  out_dtype = tf.as_dtype(dtype or x.dtype)
  explicit = [x] + ([bias] if bias is not None else [])

  def forward(logits, *maybe_bias):
    z = float32(logits)
    if maybe_bias:
      z = mtf.add(z, _as(maybe_bias[0], z.dtype), output_shape=z.shape)
    return _as(mtf.softmax(z, dim), out_dtype)

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del forward_operations
    y, dy = float32(outputs[0]), output_grads[0]
    if dy is None:
      return [None] * len(all_inputs)
    dy = float32(_cotangent(dy, outputs[0]))
    dz = y * (dy - mtf.reduce_sum(dy * y, reduced_dim=dim))
    grads = [_as(dz, explicit_inputs[0].dtype)]
    if len(explicit_inputs) > 1:
      b = explicit_inputs[1]
      grads.append(_as(mtf.reduce_sum(dz, output_shape=b.shape), b.dtype))
    return grads + [None] * (len(all_inputs) - len(grads))
  return control.custom_gradient(forward, grad_fn, explicit,
                                 check_internals=False)


def cross_entropy(logits, targets, dim, on_value=1.0, off_value=0.0,
                  z_loss=0.0):
  """Per-position cross entropy of softmax(logits) over dim against the
  one-hot of the integer targets (on_value / off_value: label smoothing),
  plus z_loss * logsumexp(logits)^2, in float32. Keeps logits (in their
  dtype), the float32 logsumexp per position and the targets for the
  backward pass, which recomputes the one-hot and the probabilities.

  Example:
    >>> per_token = cross_entropy(logits, targets, vocab, z_loss=1e-4)
  """
  dim = _check_dim(logits, dim, "cross_entropy")

  def one_hot(ids):
    return mtf.one_hot(ids, dim, on_value=on_value, off_value=off_value,
                       dtype=tf.float32)

  def forward(logits):
    z = float32(logits)
    lse = mtf.reduce_logsumexp(z, dim)
    loss = mtf.negative(mtf.reduce_sum((z - lse) * one_hot(targets),
                                       reduced_dim=dim))
    if z_loss:
      loss = loss + z_loss * mtf.square(lse)
    return loss, lse

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del forward_operations
    lse, dloss = outputs[1], output_grads[0]
    if dloss is None:
      return [None] * len(all_inputs)
    dloss = _cotangent(dloss, outputs[0])
    p = mtf.exp(float32(explicit_inputs[0]) - lse)
    hot = one_hot(targets)
    # d/dz of -sum(t * (z - lse)) is p * sum(t) - t; of z * lse^2, 2 z lse p.
    scale = mtf.reduce_sum(hot, reduced_dim=dim)
    if z_loss:
      scale = scale + (2.0 * z_loss) * lse
    dz = dloss * (p * scale - hot)
    return [_as(dz, explicit_inputs[0].dtype)] + [None] * (
        len(all_inputs) - 1)
  loss, _ = control.custom_gradient(forward, grad_fn, [logits],
                                    check_internals=False)
  return loss


# --- normalizations -----------------------------------------------------------
def rms_norm(x, dim, epsilon=1e-6, name="rms_norm"):
  """Root-mean-square normalization over dim with a learned scale.

  x / sqrt(mean(x^2) + epsilon) * scale; variable "<name>/rms_norm_scale"
  (ones) of shape [dim]. Keeps x and the float32 reciprocal root mean
  square per position for the backward pass.

  Example:
    >>> y = rms_norm(x, d_model)
  """
  dim = _check_dim(x, dim, "rms_norm")
  scope = _scope(x.mesh, name, "rms_norm")
  scale = norm_variable(x, scope, "rms_norm_scale", dim,
                        mtf.ones_initializer())

  def forward(x, scale):
    xf = float32(x)
    r = mtf.rsqrt(mtf.reduce_mean(mtf.square(xf), reduced_dim=dim) + epsilon)
    normed = _as(xf * r, x.dtype)
    return mtf.multiply(normed, scale, output_shape=x.shape), r

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del forward_operations
    x, scale = explicit_inputs
    r, dy = outputs[1], output_grads[0]
    if dy is None:
      return [None] * len(all_inputs)
    dy = float32(_cotangent(dy, x))
    n = float32(x) * r
    dscale = mtf.reduce_sum(dy * n, output_shape=scale.shape)
    dn = dy * float32(scale)
    dx = r * (dn - n * mtf.reduce_mean(dn * n, reduced_dim=dim))
    return [_as(dx, x.dtype), _as(dscale, scale.dtype)] + [None] * (
        len(all_inputs) - 2)
  y, _ = control.custom_gradient(forward, grad_fn, [x, scale],
                                 check_internals=False)
  return y


def layer_norm(x, dim, epsilon=1e-6, name="layer_prepostprocess"):
  """Layer normalization over dim with a learned scale and bias.

  (x - mean) / sqrt(variance + epsilon) * scale + bias, the moments taken
  over dim. Variables "<name>/layer_norm_scale" (ones) and
  "<name>/layer_norm_bias" (zeros), of shape [dim]. Keeps x and the
  float32 mean and reciprocal deviation per position for the backward
  pass.

  Example:
    >>> y = layer_norm(x, d_model, name="ln_1")
  """
  dim = _check_dim(x, dim, "layer_norm")
  scope = _scope(x.mesh, name, "layer_norm")
  scale = norm_variable(x, scope, "layer_norm_scale", dim,
                        mtf.ones_initializer())
  bias = norm_variable(x, scope, "layer_norm_bias", dim,
                       mtf.zeros_initializer())

  def forward(x, scale, bias):
    xf = float32(x)
    mean = mtf.reduce_mean(xf, reduced_dim=dim)
    centered = xf - mean
    r = mtf.rsqrt(mtf.reduce_mean(mtf.square(centered), reduced_dim=dim) +
                  epsilon)
    normed = _as(centered * r, x.dtype)
    return mtf.add(normed * scale, bias, output_shape=x.shape), mean, r

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del forward_operations
    x, scale, bias = explicit_inputs
    mean, r, dy = outputs[1], outputs[2], output_grads[0]
    if dy is None:
      return [None] * len(all_inputs)
    dy = float32(_cotangent(dy, x))
    n = (float32(x) - mean) * r
    dscale = mtf.reduce_sum(dy * n, output_shape=scale.shape)
    dbias = mtf.reduce_sum(dy, output_shape=bias.shape)
    dn = dy * float32(scale)
    dx = r * (dn - mtf.reduce_mean(dn, reduced_dim=dim) -
              n * mtf.reduce_mean(dn * n, reduced_dim=dim))
    return [_as(dx, x.dtype), _as(dscale, scale.dtype),
            _as(dbias, bias.dtype)] + [None] * (len(all_inputs) - 3)
  y, _, _ = control.custom_gradient(forward, grad_fn, [x, scale, bias],
                                    check_internals=False)
  return y


__all__ = ["softmax", "rms_norm", "layer_norm", "norm_variable", "float32"]
