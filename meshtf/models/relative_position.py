"""T5's relative position bias: a learned [heads, buckets] table whose
entry for (query position i, memory position j) is added to the attention
logits, the bucket a log-spaced function of j - i.

T5 (Raffel et al. 2020, section 2.1; Mesh TensorFlow's
transformer_layers.SelfAttention with relative_attention_type "bias" or
"bias_shared") has no other position signal. Distances below
num_buckets / 2 (per direction) get a bucket each; longer ones share
log-spaced buckets up to max_distance, beyond which all distances share the
last. The encoder's attention is bidirectional (half the buckets for each
direction); the decoder's causal (every bucket for looking back).

"bias_shared" makes one table per layer stack, held by its first
self-attention layer (T5's checkpoints: block_000 only), and reused by the
others; "bias" gives each self-attention layer its own.

With named dims the bias is one more additive term of the logits: the
buckets [length, memory_length] (or [batch, length, memory_length] for
packed examples, from their per-segment positions) gather rows of the
table into [heads, ..., length, memory_length], laid out like the logits
by the ordinary rules (heads split where heads split), so any layout gives
the same numbers. Incremental decoding computes the one query position's
row from context.position.

Example:
  >>> layer = SelfAttention(num_heads=8, key_value_size=64,
  ...                       relative_attention_type="bias_shared")
  >>> bucket = relative_position_bucket(rel, bidirectional=True)   # int32
"""
import math

import tensorflow as tf

import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import layers

TYPES = (None, "bias", "bias_shared")
VARIABLE = "relative_attention_bias"


def check_type(relative_attention_type, where):
  """relative_attention_type, or a ValueError naming where it was given."""
  if relative_attention_type not in TYPES:
    raise ValueError("%s: relative_attention_type %r is not one of None, "
                     "'bias' (one table per layer) or 'bias_shared' (one per "
                     "stack, as T5)" % (where, relative_attention_type))
  return relative_attention_type


def relative_position_bucket(relative_position, bidirectional=True,
                             num_buckets=32, max_distance=128):
  """int32 buckets in [0, num_buckets) of relative_position (memory position
  minus query position; an int32 meshtf Tensor), as T5 defines them.

  bidirectional: half the buckets for each sign (the encoder); otherwise
  positive distances (later positions) share bucket 0 with distance 0.
  The arithmetic is T5's own, in float32, so boundaries fall where a T5
  checkpoint's table expects them.

  Example:
    >>> rel = mtf.range(mesh, memory_length, tf.int32) - position
    >>> relative_position_bucket(rel, bidirectional=False)
  """
  n = relative_position * -1
  ret = None
  if bidirectional:
    num_buckets //= 2
    ret = mtf.to_int32(mtf.less(n, 0)) * num_buckets
    n = mtf.abs(n)
  else:
    n = mtf.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = mtf.less(n, max_exact)
  # log(0) is -inf; those entries are small and take n below.
  val_if_large = mtf.to_int32(
      mtf.log(mtf.to_float(n) / float(max_exact))
      / math.log(max_distance / max_exact)
      * float(num_buckets - max_exact)) + max_exact
  val_if_large = mtf.minimum(val_if_large, num_buckets - 1)
  small_or_large = mtf.where(is_small, n, val_if_large)
  return small_or_large if ret is None else ret + small_or_large


def _relative_positions(context, memory_length_dim):
  """memory position - query position: [memory_length] while decoding one
  position, else [(batch...,) length, memory_length]."""
  memory_position = mtf.range(context.mesh, memory_length_dim, tf.int32)
  if context.incremental:
    return memory_position - context.position
  position = context.position
  if position is None:
    position = mtf.range(context.mesh, context.length_dim, tf.int32)
  else:
    memory_position = layers.rename_length_to_memory_length(
        position, context.length_dim.name)
  return memory_position - position


def _buckets_dim(layer):
  return mtf.Dimension("buckets", layer.relative_attention_num_buckets)


def _variable(context, scope, heads_dim, buckets_dim):
  table = dtypes.get_variable(
      context.mesh, scope + "/" + VARIABLE,
      mtf.Shape([heads_dim, buckets_dim]), dtype=context.variable_dtype,
      initializer=mtf.random_normal_initializer(
          stddev=heads_dim.size ** -0.5))
  if table.dtype != context.activation_dtype:
    table = mtf.cast(table, context.activation_dtype)
  return table


def shared_table(layer, context, scope, heads_dim):
  """Makes the stack's one table ("bias_shared") under scope, the first
  self-attention layer's, once per call of the stack (LayerStack calls it
  before any layer runs: outside the layers' recomputed blocks)."""
  key = (VARIABLE, heads_dim, _buckets_dim(layer))
  if key not in context.cache:
    context.cache[key] = _variable(context, scope, heads_dim,
                                   _buckets_dim(layer))
  return context.cache[key]


def _table(layer, context, heads_dim, buckets_dim):
  """The [heads, buckets] table: the stack's shared one (made by
  shared_table under the first self-attention layer's scope; here when the
  layer runs outside a LayerStack), or the layer's own ("bias")."""
  if layer.relative_attention_type == "bias_shared":
    return shared_table(layer, context, context.scope, heads_dim)
  return _variable(context, context.scope, heads_dim, buckets_dim)


def attention_bias(layer, context, heads_dim, memory_length_dim):
  """The relative position bias of a self-attention layer for this call:
  [heads, (batch...,) length, memory_length] in the activation dtype
  ([heads, memory_length] while decoding one position), or None when the
  layer has no relative attention.

  Example:
    >>> bias = attention_bias(self, context, params.heads_dim, memory_length)
  """
  if layer.relative_attention_type is None:
    return None
  buckets_dim = _buckets_dim(layer)
  bucket = relative_position_bucket(
      _relative_positions(context, memory_length_dim),
      bidirectional=not context.autoregressive,
      num_buckets=buckets_dim.size,
      max_distance=layer.relative_attention_max_distance)
  table = _table(layer, context, heads_dim, buckets_dim)
  return mtf.gather(table, bucket, buckets_dim)


__all__ = ["relative_position_bucket", "attention_bias", "check_type",
           "TYPES"]
