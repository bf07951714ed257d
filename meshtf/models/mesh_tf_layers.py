"""More of Mesh TensorFlow's `mtf.layers` names: noise, losses, compression.

layers.py re-exports these, so `mtf.layers.multiplicative_jitter` works as
in Mesh TF 0.1.21. Like the rest of mtf.layers, each is a composition of
meshtf ops, so any layout works; the random ones draw from meshtf's
layout-invariant RNG (the same numbers on every mesh and layout).

Example:
  >>> from meshtf.models import layers
  >>> x = layers.multiplicative_jitter(x, epsilon=1e-2)   # x * U(0.99, 1.01)
"""
import tensorflow as tf

import meshtf as mtf


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
  keep = mtf.cast(mtf.less(uniform, mtf.import_tf_tensor(
      x.mesh, tf.cast(keep_prob, uniform.dtype), mtf.Shape([]))), x.dtype)
  if x.dtype.is_floating:
    keep /= mtf.import_tf_tensor(x.mesh, tf.cast(keep_prob, x.dtype),
                                 mtf.Shape([]))
  return x * keep


__all__ = ["multiplicative_jitter", "sigmoid_cross_entropy_with_logits",
           "compress_mean", "attention_bias_local_block", "annealed_dropout"]
