"""More of Mesh TensorFlow's `mtf.layers` names: noise, losses, compression.

meshtf/compat/layers.py composes these with meshtf's layers into Mesh TF's
`mtf.layers`, so `mtf.layers.multiplicative_jitter` works as in Mesh TF
0.1.21. Like the rest of mtf.layers, each is a composition of
meshtf ops, so any layout works; the random ones draw from meshtf's
layout-invariant RNG (the same numbers on every mesh and layout).

Example:
  >>> from meshtf.compat import layers
  >>> x = layers.multiplicative_jitter(x, epsilon=1e-2)   # x * U(0.99, 1.01)
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.models.conventions import unit_scaling_convention
from meshtf.ops import control


def multiplicative_jitter(x, epsilon=1e-2, name=None):
  """x times noise uniform in [1 - epsilon, 1 + epsilon] (Switch
  Transformer's router input jitter); epsilon 0 returns x.

  Example:
    >>> y = multiplicative_jitter(x, 1e-2)
  """
  if epsilon == 0:
    return x
  noise = mtf.random_uniform(x.mesh, x.shape, minval=1.0 - epsilon,
                             maxval=1.0 + epsilon, dtype=x.dtype,
                             name=name or "multiplicative_jitter")
  return x * noise


def sigmoid_cross_entropy_with_logits(logits, targets):
  """Elementwise sigmoid cross entropy, computed stably:
  relu(x) - x * z + log(1 + exp(-|x|)).

  Example:
    >>> loss = mtf.reduce_mean(sigmoid_cross_entropy_with_logits(l, t))
  """
  if logits.shape != targets.shape:
    raise ValueError(
        "sigmoid_cross_entropy_with_logits: logits %s has shape %s but "
        "targets %s has shape %s; they must match" % (
            logits.name, logits.shape, targets.name, targets.shape))
  return (mtf.relu(logits) - logits * targets +
          mtf.log(1.0 + mtf.exp(-mtf.abs(logits))))


def compress_mean(x, dim, compression_factor):
  """Means of consecutive groups of compression_factor along dim (which
  keeps its name, with size / compression_factor).

  Example:
    >>> compress_mean(x, length, 4).shape   # length:64 -> length:16
  """
  if dim not in x.shape.dims:
    raise ValueError("compress_mean: %s is not a dimension of %s %s" % (
        dim, x.name, x.shape))
  if dim.size % compression_factor:
    raise ValueError("compress_mean: %s does not divide by compression_factor"
                     " %d" % (dim, compression_factor))
  dims = x.shape.dims
  pos = dims.index(dim)
  x = mtf.reshape(x, dims[:pos] + [
      mtf.Dimension(dim.name, dim.size // compression_factor),
      mtf.Dimension("compression_factor", compression_factor)] + dims[pos + 1:])
  return mtf.reduce_mean(x, reduced_dim=x.shape.dims[pos + 1])


def attention_bias_local_block(mesh, block_length, memory_length,
                               dtype=tf.int32):
  """[block_length, memory_length] additive mask for blocked local
  attention: memory_length (its name, 2 * block size) holds the previous
  block, all visible (0), then the current block, where positions to the
  right of the query are hidden (-1e9). Returns float32, as Mesh TF.

  Example:
    >>> bias = attention_bias_local_block(mesh, block, memory)
  """
  memory_length = mtf.Dimension(memory_length.name, block_length.size)
  previous = mtf.zeros(mesh, [block_length, memory_length], dtype=dtype)
  right = mtf.cast(mtf.less(mtf.range(mesh, block_length, dtype=dtype),
                            mtf.range(mesh, memory_length, dtype=dtype)),
                   dtype)
  return mtf.cast(mtf.concat([previous, right], memory_length.name),
                  tf.float32) * -1e9


def annealed_dropout(x, is_training, start_step, end_step, init_rate=None,
                     noise_shape=None, name=None, step=None):
  """Dropout whose rate falls linearly from init_rate at start_step to 0 at
  end_step. step: the training step (an int scalar tf.Tensor or Python
  int); Mesh TF read TF1's global step, which TF2 has not, so pass it.

  Example:
    >>> h = annealed_dropout(h, True, 0, 10000, init_rate=0.1, step=step)
  """
  if step is None:
    raise ValueError(
        "annealed_dropout: pass step= (the training step); Mesh TF read TF1's "
        "global step, which TensorFlow 2 has not")
  if not is_training:
    return x
  fraction = ((tf.cast(step, tf.float32) - float(start_step)) /
              float(end_step - start_step))
  keep_prob = tf.minimum((1.0 - init_rate) + fraction * init_rate, 1.0)
  noise_shape = mtf.convert_to_shape(noise_shape) or x.shape
  uniform = mtf.random_uniform(
      x.mesh, noise_shape, dtype=x.dtype if x.dtype.is_floating else
      tf.float32, name=name or "annealed_dropout")
  # One import of the step-dependent probability, in the draws' dtype
  # (x's own when x is floating, the only case that rescales).
  keep_prob = mtf.import_tf_tensor(
      x.mesh, tf.cast(keep_prob, uniform.dtype), mtf.Shape([]))
  keep = mtf.cast(mtf.less(uniform, keep_prob), x.dtype)
  if x.dtype.is_floating:
    keep /= keep_prob
  return x * keep


def us_einsum(xs, *args, **kwargs):
  """mtf.einsum, divided by sqrt(size of the contracted dims) under the
  unit-scaling convention.

  Example:
    >>> y = us_einsum([x, w], output_shape=[batch, d_ff])
  """
  y = mtf.einsum(xs, *args, **kwargs)
  if unit_scaling_convention():
    kept = set(y.shape.dims)
    contracted = {d for x in xs for d in x.shape.dims if d not in kept}
    y *= mtf.Shape(sorted(contracted, key=lambda d: d.name)).size ** -0.5
  return y


def summary_for_clip_activation_gradient(t, name=None, batch_dims=None):
  """Accepted and ignored, as mtf.scalar_summary (Mesh TF wrote activation
  statistics to TPUEstimator's summaries).

  Example:
    >>> summary_for_clip_activation_gradient(x, "act")   # no-op
  """
  del t, name, batch_dims


def clip_activation_gradient(x, clip_rms_norm=None):
  """Identity forward; backward, each incoming gradient is divided by
  max(1, rms(gradient) / clip_rms_norm) (no clipping when it is None).

  Example:
    >>> x = clip_activation_gradient(x, clip_rms_norm=1.0)
  """
  def forward(t):
    return mtf.identity(t)

  def backward(explicit_inputs, all_inputs, forward_operations, outputs,
               output_grads):
    del explicit_inputs, all_inputs, forward_operations, outputs
    if not clip_rms_norm:
      return output_grads
    clipped = []
    for g in output_grads:
      rms = mtf.sqrt(mtf.reduce_mean(mtf.square(g)))
      clipped.append(g / mtf.maximum(1.0, rms / clip_rms_norm))
    return clipped
  return mtf.custom_gradient(forward, backward, [x])


def multihead_attention_params(mesh, heads, io_channels, kv_channels,
                               variable_dtype, combine=False):
  """Mesh TF's attention weights, each [heads, io_channels, kv_channels]:
  "q", "k" (stddev io**-0.5 * kv**-0.25), "v" (io**-0.5) and "o" ((io *
  heads)**-0.5); combine=True makes one "qkvo" variable [qkvo:4, heads,
  io, kv] (a plain-function initializer: computed on the host, then
  sliced) and returns its four parts.

  Example:
    >>> wq, wk, wv, wo = multihead_attention_params(mesh, heads, d, kv, vdt)
  """
  qk = (io_channels.size ** -0.5) * (kv_channels.size ** -0.25)
  stddevs = [qk, qk, io_channels.size ** -0.5,
             (io_channels.size * heads.size) ** -0.5]
  shape = [heads, io_channels, kv_channels]
  if combine:
    qkvo = mtf.Dimension("qkvo", 4)

    def qkvo_initializer(full_shape, dtype=None, partition_info=None):
      del partition_info
      scale = tf.reshape(tf.constant(stddevs, dtype or tf.float32),
                         [4, 1, 1, 1])
      return tf.random.normal(full_shape, dtype=dtype or tf.float32) * scale
    var = mtf.get_variable(mesh, "qkvo", mtf.Shape([qkvo] + shape),
                           initializer=qkvo_initializer, dtype=variable_dtype)
    return mtf.unstack(var, qkvo)
  return [mtf.get_variable(mesh, n, mtf.Shape(shape), dtype=variable_dtype,
                           initializer=mtf.random_normal_initializer(
                               stddev=s))
          for n, s in zip("qkvo", stddevs)]


def multihead_self_attention_incremental(query_antecedent, prev_k, prev_v,
                                         step_num, master_dtype, slice_dtype,
                                         name="multihead_attention"):
  """One decoding step of self-attention: the query at step_num (int32
  scalar Tensor) [batch..., io] writes its key and value into the caches
  prev_k / prev_v [batch..., heads, memory_length, kv] and attends to the
  positions <= step_num. Returns (y [batch..., io], new_k, new_v). The
  weights are layers.multihead_attention_vars' under `name`.

  Example:
    >>> y, k, v = multihead_self_attention_incremental(
    ...     x, k, v, step, tf.float32, tf.float32)
  """
  from meshtf.models import dtypes  # pylint: disable=g-import-not-at-top
  from meshtf.models import layers  # pylint: disable=g-import-not-at-top
  batch_dims = query_antecedent.shape.dims[:-1]
  io_channels = query_antecedent.shape.dims[-1]
  heads, memory_length, kv_channels = prev_k.shape.dims[-3:]
  wq, wk, wv, wo = layers.multihead_attention_vars(
      query_antecedent.mesh, heads, io_channels, kv_channels,
      variable_dtype=dtypes.VariableDType(master_dtype, slice_dtype,
                                          query_antecedent.dtype), name=name)
  head_shape = mtf.Shape(batch_dims + [heads, kv_channels])
  q, k, v = (mtf.einsum([query_antecedent, w], head_shape)
             for w in (wq, wk, wv))
  here = mtf.one_hot(step_num, memory_length, dtype=prev_k.dtype)
  k = prev_k + mtf.multiply(k, here, output_shape=prev_k.shape)
  v = prev_v + mtf.multiply(v, here, output_shape=prev_v.shape)
  future = mtf.greater(mtf.range(query_antecedent.mesh, memory_length,
                                 dtype=tf.int32), step_num)
  o = layers.dot_product_attention(q, k, v, mtf.cast(future, q.dtype) * -1e9,
                                   is_training=False)
  return mtf.einsum([o, wo], query_antecedent.shape), k, v


def multihead_encdec_attention_incremental(query_antecedent, wq, wo, k, v,
                                           mask, name="multihead_attention"):
  """One decoding step of attention over the encoder's cached keys and
  values k, v [memory dims..., heads, memory_length, kv] with the given
  weights; mask is an additive bias. Returns [query dims..., io].

  Example:
    >>> y = multihead_encdec_attention_incremental(x, wq, wo, k, v, mask)
  """
  from meshtf.models import layers  # pylint: disable=g-import-not-at-top
  del name  # the weights are given
  heads, _, kv_channels = k.shape.dims[-3:]
  q = mtf.einsum([query_antecedent, wq], mtf.Shape(
      query_antecedent.shape.dims[:-1] + [heads, kv_channels]))
  o = layers.dot_product_attention(q, k, v, mask, is_training=False)
  return mtf.einsum([o, wo], query_antecedent.shape)


def reversible_half_residual_and_swap(x1, x1_backwards, x2, x2_backwards, f,
                                      recompute_grads=True):
  """A revnet block (https://arxiv.org/abs/1707.04585): returns (x2,
  x2_backwards, x1 + f(x2), x1_backwards), so chaining blocks alternates the
  halves. With recompute_grads the backward pass rebuilds each block's
  inputs from its outputs (x1 = y1 - f(x2), f re-run on x2) instead of
  keeping them, carrying them in the *_backwards tensors: pass None for
  the first block, then each block's outputs to the next.

  Example:
    >>> x1, x1b, x2, x2b = x, None, x, None
    >>> for f in blocks:
    ...   x1, x1b, x2, x2b = reversible_half_residual_and_swap(
    ...       x1, x1b, x2, x2b, f)
    >>> y = (x1 + x2) * 0.5
  """
  if not recompute_grads:
    return x2, x2_backwards, x1 + f(x2), x1_backwards
  if x1_backwards is None:
    x1_backwards = mtf.zeros_like(x1)
  if x2_backwards is None:
    x2_backwards = mtf.zeros_like(x2)
  fx2_of_forward = []

  def forward(a1, a1_backwards, a2, a2_backwards):
    fx2 = f(a2)
    fx2_of_forward.append(fx2)
    return a2, a2_backwards, a1 + fx2, a1_backwards

  def backward(explicit_inputs, all_inputs, forward_operations, outputs,
               output_grads):
    x2_in = explicit_inputs[2]
    extra_inputs = list(all_inputs[len(explicit_inputs):])
    y1 = outputs[2]
    dy2, dy2_backwards, dy1, dy1_backwards = output_grads
    # The next block handed back this block's outputs through the
    # *_backwards gradients; the last block's are its own outputs.
    x2_again = dy2_backwards if dy2_backwards is not None else outputs[0]
    y1_again = dy1_backwards if dy1_backwards is not None else y1
    fx2 = fx2_of_forward[0]
    last = forward_operations.index(fx2.operation)
    f_ops, mapping = control.clone_operations(forward_operations[:last + 1],
                                              {x2_in: x2_again})
    fx2_again = mapping[fx2]
    if dy1 is None:
      dy1 = mtf.zeros_like(y1)
    grads = mtf.gradients([fx2_again], [x2_again] + extra_inputs,
                          grad_ys=[dy1], operations=f_ops)
    dx2 = grads[0] if dy2 is None else (
        dy2 if grads[0] is None else dy2 + grads[0])
    return [dy1, y1_again - fx2_again, dx2, x2_again] + list(grads[1:])
  return mtf.custom_gradient(forward, backward,
                             [x1, x1_backwards, x2, x2_backwards])


__all__ = ["multiplicative_jitter", "sigmoid_cross_entropy_with_logits",
           "compress_mean", "attention_bias_local_block", "annealed_dropout",
           "us_einsum", "summary_for_clip_activation_gradient",
           "clip_activation_gradient", "multihead_attention_params",
           "multihead_self_attention_incremental",
           "multihead_encdec_attention_incremental",
           "reversible_half_residual_and_swap"]
