"""Mesh TensorFlow's blocked local and memory-compressed attention layers.

meshtf/compat/layers.py (Mesh TF's `mtf.layers`) offers these under Mesh TF
0.1.21's names and arguments:
attention within spatial blocks of an image-like tensor (1-d and 2-d), the
halo exchanges that give each block its neighbours' keys and values, one
decoding step of masked local attention, and memory-compressed attention.
Each is a composition of meshtf ops, so any layout works: a split blocks
dim makes the halo exchange a pair of collective permutes.

The spatial-block layers attend to the zeros a halo brings in past the
image's edges, as Mesh TF's do (its docstrings promise nothing else).

Example:
  >>> from meshtf.compat import layers
  >>> # x: [batch, num_w_blocks, w, io]; each block also sees the previous one
  >>> y = layers.local_self_attention_spatial_blocks(
  ...     x, kv_channels, heads, is_training=True, mask_right=True)
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.compat import layers_extra


def _layers():
  from meshtf.models import layers  # pylint: disable=g-import-not-at-top
  return layers


def _halo(t, blocks_dim, block_size_dim, halo_size, mask_right):
  """t with halo_size positions of the neighbouring blocks along
  block_size_dim: the previous block's (mask_right) or both neighbours';
  zeros where there is no blocks dim."""
  if halo_size <= 0:
    return t
  if blocks_dim is not None:
    exchange = mtf.left_halo_exchange if mask_right else mtf.halo_exchange
    return exchange(t, blocks_dim, block_size_dim, halo_size)
  return mtf.pad(t, [halo_size, 0 if mask_right else halo_size],
                 block_size_dim.name)


def local_1d_halo_exchange(k, v, num_w_blocks, w_dim, mask_right):
  """Keys and values k, v [..., num_w_blocks, w, ...] extended along w_dim
  by one whole block from the previous block (mask_right) or from both
  neighbours; with num_w_blocks None, by zeros. (Mesh TF's own passes the
  dim rather than its size to pad in that case, which fails.)

  Example:
    >>> k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w, True)
  """
  return (_halo(k, num_w_blocks, w_dim, w_dim.size, mask_right),
          _halo(v, num_w_blocks, w_dim, w_dim.size, mask_right))


def local_2d_halo_exchange(k, v, num_h_blocks, h_dim, num_w_blocks, w_dim,
                           mask_right):
  """local_1d_halo_exchange along h, then along w (a corner block comes in
  through its edge neighbour).

  Example:
    >>> k, v = local_2d_halo_exchange(k, v, nh, memory_h, nw, memory_w, False)
  """
  for blocks_dim, size_dim in ((num_h_blocks, h_dim), (num_w_blocks, w_dim)):
    k = _halo(k, blocks_dim, size_dim, size_dim.size, mask_right)
    v = _halo(v, blocks_dim, size_dim, size_dim.size, mask_right)
  return k, v


def attention_bias_local_2d_block(mesh, h_dim, w_dim, memory_h_dim,
                                  memory_w_dim, dtype=tf.int32):
  """Additive mask [h, w, memory_h, memory_w] (memory sizes 2h and 2w: the
  previous block row, then the current one; the previous block column,
  then the current one) for causal 2-d local attention in raster order: a
  query sees the whole previous block row, and in its own block row the
  rows above it, plus in its own row the positions up to itself. Returns
  float32 (0 or -1e9). Mesh TF 0.1.21's own concatenates tensors of
  different dims and fails as written; this is the order its
  docstring describes.

  Example:
    >>> bias = attention_bias_local_2d_block(mesh, h, w, memory_h, memory_w)
  """
  memory_h = mtf.Dimension(memory_h_dim.name, 2 * h_dim.size)
  memory_w = mtf.Dimension(memory_w_dim.name, 2 * w_dim.size)
  row = mtf.range(mesh, memory_h, dtype) - h_dim.size   # < 0: rows above
  col = mtf.range(mesh, memory_w, dtype) - w_dim.size   # < 0: left block
  qi, qj = mtf.range(mesh, h_dim, dtype), mtf.range(mesh, w_dim, dtype)
  later_row = mtf.greater(row, qi)
  same_row_later = mtf.logical_and(mtf.equal(row, qi), mtf.greater(col, qj))
  hidden = mtf.logical_or(later_row, same_row_later)
  hidden = mtf.broadcast(hidden, mtf.Shape([h_dim, w_dim, memory_h,
                                            memory_w]))
  return mtf.cast(hidden, tf.float32) * -1e9


def _attention_vars(mesh, heads, io_channels, kv_channels, master_dtype,
                    slice_dtype, activation_dtype, name, default):
  layers = _layers()
  return layers.multihead_attention_vars(
      mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype,
      activation_dtype, name=name or default)


def local_self_attention_spatial_blocks(
    query_antecedent, kv_channels, heads, is_training, memory_w_dim=None,
    mask_right=False, master_dtype=tf.float32, slice_dtype=tf.float32,
    name=None):
  """Attention within 1-d blocks: query_antecedent [batch, num_w_blocks, w,
  io] attends to its own block and the previous one (mask_right: causal,
  positions right of the query hidden) or both neighbours. Returns the
  same shape. memory_w_dim is accepted and recomputed (Mesh TF's too).

  Example:
    >>> y = local_self_attention_spatial_blocks(x, d_kv, heads, True,
    ...                                         mask_right=True)
  """
  del memory_w_dim
  layers = _layers()
  x = query_antecedent
  w_dim, io_channels = x.shape.dims[-2:]
  batch, num_w_blocks = x.shape.dims[:2]
  wq, wk, wv, wo = _attention_vars(x.mesh, heads, io_channels, kv_channels,
                                   master_dtype, slice_dtype, x.dtype, name,
                                   "multihead_attention")
  memory = mtf.rename_dimension(x, w_dim.name, "memory_" + w_dim.name)
  memory_w_dim = memory.shape.dims[-2]
  q = mtf.einsum([x, wq], mtf.Shape([batch, heads, num_w_blocks, w_dim,
                                     kv_channels]))
  kv_shape = mtf.Shape([batch, heads, num_w_blocks, memory_w_dim,
                        kv_channels])
  k = mtf.einsum([memory, wk], kv_shape)
  v = mtf.einsum([memory, wv], kv_shape)
  k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w_dim, mask_right)
  mask = (layers_extra.attention_bias_local_block(x.mesh, w_dim, memory_w_dim)
          if mask_right else None)
  o = layers.dot_product_attention(q, k, v, mask, is_training=is_training)
  return mtf.einsum([o, wo], mtf.Shape([batch, num_w_blocks, w_dim,
                                        io_channels]))


def local_2d_self_attention_spatial_blocks(
    query_antecedent, kv_channels, heads, is_training, memory_h_dim=None,
    memory_w_dim=None, mask_right=False, master_dtype=tf.float32,
    slice_dtype=tf.float32, name=None):
  """Attention within 2-d blocks: query_antecedent [batch, num_h_blocks,
  num_w_blocks, h, w, io] attends to its block and the neighbouring ones
  (mask_right: the block above, the block to the left and its own, in
  raster order, see attention_bias_local_2d_block). Returns the same shape.

  Example:
    >>> y = local_2d_self_attention_spatial_blocks(x, d_kv, heads, True)
  """
  del memory_h_dim, memory_w_dim
  layers = _layers()
  x = query_antecedent
  h_dim, w_dim, io_channels = x.shape.dims[-3:]
  batch, num_h_blocks, num_w_blocks = x.shape.dims[:3]
  wq, wk, wv, wo = _attention_vars(x.mesh, heads, io_channels, kv_channels,
                                   master_dtype, slice_dtype, x.dtype, name,
                                   "multihead_attention")
  memory = mtf.rename_dimension(x, h_dim.name, "memory_" + h_dim.name)
  memory = mtf.rename_dimension(memory, w_dim.name, "memory_" + w_dim.name)
  memory_h_dim, memory_w_dim = memory.shape.dims[-3:-1]
  blocks = [batch, heads, num_h_blocks, num_w_blocks]
  q = mtf.einsum([x, wq], mtf.Shape(blocks + [h_dim, w_dim, kv_channels]))
  kv_shape = mtf.Shape(blocks + [memory_h_dim, memory_w_dim, kv_channels])
  k = mtf.einsum([memory, wk], kv_shape)
  v = mtf.einsum([memory, wv], kv_shape)
  k, v = local_2d_halo_exchange(k, v, num_h_blocks, memory_h_dim,
                                num_w_blocks, memory_w_dim, mask_right)
  # dot_product_attention takes one memory dim: flatten (h, w) pairs.
  memory_hw = mtf.Dimension("memory_hw", k.shape.dims[-3].size *
                            k.shape.dims[-2].size)
  k = mtf.reshape(k, blocks + [memory_hw, kv_channels])
  v = mtf.reshape(v, blocks + [memory_hw, kv_channels])
  mask = None
  if mask_right:
    mask = attention_bias_local_2d_block(x.mesh, h_dim, w_dim, memory_h_dim,
                                         memory_w_dim)
    mask = mtf.reshape(mask, [h_dim, w_dim, memory_hw])
  o = layers.dot_product_attention(q, k, v, mask, is_training=is_training)
  return mtf.einsum([o, wo], x.shape)


def masked_local_attention_1d_incremental(x, prev_k, prev_v, step_num,
                                          master_dtype=None,
                                          slice_dtype=None, params=None,
                                          name=None):
  """One decoding step of masked_local_attention_1d: x [batch..., io] at
  step_num (int32 scalar) writes its key and value at step_num mod the
  window into the ring caches prev_k / prev_v [batch..., heads, window,
  kv] and attends to the whole window. Returns (y, new_k, new_v).

  Example:
    >>> y, k, v = masked_local_attention_1d_incremental(x, k, v, step)
  """
  layers = _layers()
  batch_dims = x.shape.dims[:-1]
  io_channels = x.shape.dims[-1]
  heads, window_length, kv_channels = prev_k.shape.dims[-3:]
  if params is None:
    params = _attention_vars(x.mesh, heads, io_channels, kv_channels,
                             master_dtype, slice_dtype, x.dtype, name,
                             "masked_local_attention_1d")
  wq, wk, wv, wo = [mtf.cast(w, x.dtype) if w.dtype != x.dtype else w
                    for w in params]
  head_shape = mtf.Shape(batch_dims + [heads, kv_channels])
  q, k, v = (mtf.einsum([x, w], head_shape) for w in (wq, wk, wv))
  here = mtf.equal(mtf.range(x.mesh, window_length, dtype=tf.int32),
                   mtf.mod(step_num, window_length.size))
  k = mtf.where(here, k, prev_k, output_shape=prev_k.shape)
  v = mtf.where(here, v, prev_v, output_shape=prev_v.shape)
  o = layers.dot_product_attention(q, k, v, None, is_training=False)
  return mtf.einsum([o, wo], x.shape), k, v


def multihead_self_attention_memory_compressed(
    x, mask_right, compression_factor, kv_channels, heads, is_training,
    dropout=0.0, dropout_broadcast_dims=None, master_dtype=tf.float32,
    slice_dtype=tf.float32, name="multihead_attention"):
  """Self-attention over a memory shortened compression_factor times by
  group means (compress_mean) along x's length (second-to-last dim); with
  mask_right a query sees a compressed position only once the whole group
  is at or before it. x [batch..., length, io] -> same shape.

  Example:
    >>> y = multihead_self_attention_memory_compressed(
    ...     x, True, 4, d_kv, heads, is_training=True)
  """
  layers = _layers()
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  wq, wk, wv, wo = _attention_vars(x.mesh, heads, io_channels, kv_channels,
                                   master_dtype, slice_dtype, x.dtype, name,
                                   "compressed_attention")
  memory = layers_extra.compress_mean(x, length, compression_factor)
  memory = layers.rename_length_to_memory_length(memory, length.name)
  memory_length = memory.shape.dims[-2]
  q = mtf.einsum([x, wq], mtf.Shape(batch_dims + [heads, length,
                                                  kv_channels]))
  kv_shape = mtf.Shape(batch_dims + [heads, memory_length, kv_channels])
  k = mtf.einsum([memory, wk], kv_shape)
  v = mtf.einsum([memory, wv], kv_shape)
  mask = None
  if mask_right:
    query_pos = mtf.range(x.mesh, length, dtype=tf.int32)
    memory_pos = (mtf.range(x.mesh, memory_length, dtype=tf.int32) *
                  compression_factor + (compression_factor - 1))
    mask = mtf.cast(mtf.greater(memory_pos, query_pos), x.dtype) * -1e9
  o = layers.dot_product_attention(q, k, v, mask, is_training, dropout,
                                   dropout_broadcast_dims, extra_logit=0.0)
  return mtf.einsum([o, wo], mtf.Shape(batch_dims + [length, io_channels]))


__all__ = ["local_1d_halo_exchange", "local_2d_halo_exchange",
           "attention_bias_local_2d_block",
           "local_self_attention_spatial_blocks",
           "local_2d_self_attention_spatial_blocks",
           "masked_local_attention_1d_incremental",
           "multihead_self_attention_memory_compressed"]
