"""Mesh TensorFlow's `mtf.layers`, built only from meshtf ops.

Every layer is a composition of einsum, reductions, elementwise ops, gather
and get_variable, so any layout that the lowering accepts works: a layer adds
no communication of its own beyond what its einsums and reductions need.

Variables are named under a prefix (`name`, made unique in the graph), so a
model can hold many layers: the first `dense` makes "dense/kernel" and
"dense/bias", the second "dense_1/kernel" and "dense_1/bias".

Attention follows Mesh TensorFlow's convention: keys and values carry the
memory dim under another name than the queries' length dim ("memory_length"
for "length"); masks are additive bias tensors (0 to attend, -1e9 not to).

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import layers
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.zeros(mesh, "batch:2;d_model:4")
  >>> h = layers.dense(x, mtf.Dimension("d_ff", 8), activation=mtf.relu)
  >>> [v.name for v in graph.trainable_variables]
  ['dense/kernel', 'dense/bias']
"""
import math

import tensorflow as tf

import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import norms
from meshtf.models.conventions import unit_scaling_convention


# --- helpers -----------------------------------------------------------------
def _dim_list(dims):
  """None, a Dimension, a Shape or a list of Dimensions -> list."""
  if dims is None:
    return []
  if isinstance(dims, mtf.Dimension):
    return [dims]
  if isinstance(dims, mtf.Shape):
    return list(dims.dims)
  return [mtf.convert_to_dimension(d) for d in dims]


def _scope(mesh, name, default):
  """The variable-name prefix: `name` as given (as Mesh TensorFlow's
  variable scopes: a second call with the same name, e.g. a decoder's
  incremental step, reuses the variables), else `default` made unique."""
  return name if name else mesh.graph.unique_name(default)


def _variable_dtype(variable_dtype, x, master_dtype=None, slice_dtype=None):
  """variable_dtype, else Mesh TF's VariableDType(master_dtype, slice_dtype,
  x.dtype): 16-bit activations keep float32 variables, as there."""
  if variable_dtype is not None:
    return variable_dtype
  if master_dtype is None:
    master_dtype = (tf.float32 if x.dtype in (tf.bfloat16, tf.float16)
                    else x.dtype)
  return dtypes.VariableDType(master_dtype, slice_dtype, x.dtype)


def _check_dims(x, dims, what, present=True):
  names = set(x.shape.dimension_names)
  for d in dims:
    if (d.name in names) != present:
      raise ValueError("%s: %s %s %s dimension %s" % (
          what, x.name, x.shape, "has no" if present else "already has",
          d.name))


# --- dense's initializers ----------------------------------------------------
class DenseInitializer(object):
  """An initializer layers.dense calls with (reduced_dims, new_dims) to get
  the kernel's initializer (Mesh TF's protocol: fans from named dims, not
  from dim positions).

  Example:
    >>> class Ones(DenseInitializer):
    ...   def __call__(self, reduced_dims, new_dims):
    ...     return mtf.ones_initializer()
    >>> y = layers.dense(x, d_ff, kernel_initializer=Ones())
  """

  def __call__(self, reduced_dims, new_dims):
    raise NotImplementedError("a DenseInitializer defines __call__("
                              "reduced_dims, new_dims)")


class DenseVarianceScalingInitializer(DenseInitializer):
  """dense's default kernel initializer, Mesh TF's dense initializer
  (`mtf.layers.VarianceScalingInitializer`; not the TF-style
  mtf.ops.initializers.VarianceScalingInitializer, which takes its fans
  from dim positions): stddev sqrt(scale / n), n the product of the
  reduced dims' sizes (fan_in), of the new dims' (fan_out) or their mean
  (fan_avg), or 1 under the unit-scaling convention (fan_in only).
  distribution "normal" draws a normal of that stddev truncated at two
  stddevs (tf.truncated_normal_initializer's sense: the drawn values'
  spread is ~0.88 of it), "uniform" draws from [-limit, limit],
  limit = stddev * sqrt(3).

  Example:
    >>> init = DenseVarianceScalingInitializer(scale=2.0, mode="fan_avg")
    >>> y = layers.dense(x, d_ff, kernel_initializer=init)
  """

  def __init__(self, scale=1.0, mode="fan_in", distribution="normal"):
    self.scale = scale
    self.mode = mode.lower()
    self.distribution = distribution.lower()
    if self.mode not in ("fan_in", "fan_out", "fan_avg"):
      raise ValueError("VarianceScalingInitializer mode %r: use fan_in, "
                       "fan_out or fan_avg" % (mode,))
    if self.distribution not in ("normal", "uniform"):
      raise ValueError("VarianceScalingInitializer distribution %r: use "
                       "normal or uniform" % (distribution,))

  def __call__(self, reduced_dims, new_dims):
    fan_in = math.prod(d.size for d in reduced_dims)
    fan_out = math.prod(d.size for d in new_dims)
    scale = self.scale
    if unit_scaling_convention():
      if self.mode != "fan_in":
        raise ValueError("VarianceScalingInitializer mode %r: the unit-"
                         "scaling convention works with fan_in only"
                         % (self.mode,))
    else:
      scale /= max(1.0, {"fan_in": fan_in, "fan_out": fan_out,
                         "fan_avg": (fan_in + fan_out) / 2.0}[self.mode])
    stddev = scale ** 0.5
    if self.distribution == "normal":
      return mtf.truncated_normal_initializer(stddev=stddev)
    limit = stddev * 3.0 ** 0.5
    return mtf.random_uniform_initializer(minval=-limit, maxval=limit)


# --- dense -------------------------------------------------------------------
def dense(x, new_dims, reduced_dims=None, expert_dims=None, use_bias=True,
          activation=None, master_dtype=None, slice_dtype=None,
          variable_dtype=None, kernel_initializer=None, kernel_weights=None,
          name=None, **unused_kwargs):
  """A fully connected layer: einsum of x with a kernel, plus a bias.

  The kernel has shape expert_dims + reduced_dims + new_dims; the output has
  x's dims without reduced_dims, followed by new_dims. reduced_dims defaults
  to x's last dim. expert_dims are dims of x kept in the output (batch-like)
  that the weights also carry: one kernel per expert. new_dims may be empty
  (with expert_dims: one weight per expert element, a depthwise product).
  A new dim may have the name of a reduced one (Mesh TensorFlow allows it:
  "d_model" -> "d_model" of another size); the reduced one is then named
  "_<name>" in the kernel. The default kernel initializer is Mesh
  TensorFlow's VarianceScalingInitializer(): a normal of stddev
  sqrt(1 / fan_in) truncated at two stddevs, fan_in the product of the
  reduced dims' sizes. kernel_initializer may also be a DenseInitializer
  (called with reduced_dims and new_dims, as in Mesh TF). kernel_weights: a
  Tensor to use as the kernel instead of a variable. The arguments are Mesh
  TF's, in its order (master_dtype / slice_dtype: the deprecated form of
  variable_dtype).

  Example:
    >>> h = dense(x, mtf.Dimension("d_ff", 2048), activation=mtf.relu,
    ...           name="ffn")          # variables "ffn/kernel", "ffn/bias"
  """
  new_dims = _dim_list(new_dims)
  reduced_dims = (list(x.shape.dims[-1:]) if reduced_dims is None
                  else _dim_list(reduced_dims))
  expert_dims = _dim_list(expert_dims)
  if not new_dims and not expert_dims:
    raise ValueError("dense: new_dims and expert_dims are both empty")
  _check_dims(x, reduced_dims, "dense reduced_dims")
  _check_dims(x, expert_dims, "dense expert_dims")
  # A reduced dim named like a new dim: rename it in x first, so that the
  # kernel's dims have distinct names (a Shape cannot repeat a name).
  new_names = {d.name for d in new_dims}
  for i, d in enumerate(reduced_dims):
    if d.name in new_names:
      x = mtf.rename_dimension(x, d.name, "_" + d.name)
      reduced_dims[i] = mtf.Dimension("_" + d.name, d.size)
  _check_dims(x, new_dims, "dense new_dims", present=False)
  reduced_names = {d.name for d in reduced_dims}
  if reduced_names & {d.name for d in expert_dims}:
    raise ValueError("dense: a dim cannot be both reduced and expert")
  scope = _scope(x.mesh, name, "dense")
  vdt = _variable_dtype(variable_dtype, x, master_dtype, slice_dtype)
  w = kernel_weights
  if w is None:
    # Looked up in this module at call time (tests may replace it).
    w = get_dense_kernel_weights(x, new_dims, reduced_dims, expert_dims,
                                 kernel_initializer, scope, vdt)
  output_shape = mtf.Shape([d for d in x.shape.dims
                            if d.name not in reduced_names] + new_dims)
  y = mtf.einsum([x, w], output_shape=output_shape, name=scope + "/einsum")
  if unit_scaling_convention():  # Mesh TF's us_einsum
    y = y * float(mtf.Shape(reduced_dims).size) ** -0.5
  if use_bias:
    b = dtypes.get_variable(x.mesh, scope + "/bias",
                            mtf.Shape(expert_dims + new_dims), dtype=vdt,
                            initializer=mtf.zeros_initializer())
    b = mtf.cast(b, y.dtype) if b.dtype != y.dtype else b
    y = mtf.add(y, b, output_shape=output_shape)
  if activation is not None:
    y = activation(y)
  return y


def get_dense_kernel_weights(x, new_dims, reduced_dims, expert_dims,
                             kernel_initializer, name=None,
                             variable_dtype=None, master_dtype=None,
                             slice_dtype=None):
  """dense's kernel variable, expert_dims + reduced_dims + new_dims, in x's
  dtype, named "<name>/kernel" (name as given, else "dense" made unique).

  Example:
    >>> w = get_dense_kernel_weights(x, [d_ff], [d_model], [], None, "ffn")
    >>> w.shape                       # [d_model, d_ff], variable ffn/kernel
  """
  reduced_dims = _dim_list(reduced_dims)
  if kernel_initializer is None:
    kernel_initializer = DenseVarianceScalingInitializer()
  if isinstance(kernel_initializer, DenseInitializer):
    kernel_initializer = kernel_initializer(reduced_dims, _dim_list(new_dims))
  scope = _scope(x.mesh, name, "dense")
  w = dtypes.get_variable(
      x.mesh, scope + "/kernel",
      mtf.Shape(_dim_list(expert_dims) + reduced_dims + _dim_list(new_dims)),
      dtype=_variable_dtype(variable_dtype, x, master_dtype, slice_dtype),
      initializer=kernel_initializer)
  return mtf.cast(w, x.dtype) if w.dtype != x.dtype else w


# --- normalization -----------------------------------------------------------
# rms_norm and layer_norm live in norms.py: their backward passes keep the
# activations' dtype (x) and float32 statistics per position only.
_float32 = norms.float32
rms_norm = norms.rms_norm
layer_norm = norms.layer_norm


# --- embedding and loss ------------------------------------------------------
def embedding_weights(mesh, vocab_dim, output_dim, variable_dtype=None,
                      name="embedding", ensemble_dim=None, initializer=None):
  """The [vocab_dim, output_dim] embedding table "<name>/embedding"
  (standard normal by default); with ensemble_dim (a dim or a list of
  dims, Mesh TF's argument) one table per ensemble member, [ensemble...,
  vocab_dim, output_dim].

  Example:
    >>> table = embedding_weights(mesh, vocab_dim, d_model)
  """
  scope = _scope(mesh, name, "embedding")
  if initializer is None:
    initializer = mtf.random_normal_initializer()
  ensemble = _dim_list(ensemble_dim)
  return dtypes.get_variable(
      mesh, scope + "/embedding",
      mtf.Shape(ensemble + [vocab_dim, output_dim]),
      dtype=variable_dtype or tf.float32, initializer=initializer)


def embedding(indices, vocab_dim, output_dim, variable_dtype=None,
              name="embedding", initializer=None):
  """Looks indices up in a learned [vocab_dim, output_dim] table.

  The result has the indices' dims followed by output_dim. Splitting
  vocab_dim over a mesh axis makes each processor look up its own rows and
  sums the partial results.

  Example:
    >>> emb = embedding(token_ids, vocab_dim, d_model)   # [batch, length, d_model]
  """
  vocab_dim = mtf.convert_to_dimension(vocab_dim)
  output_dim = mtf.convert_to_dimension(output_dim)
  table = embedding_weights(indices.mesh, vocab_dim, output_dim,
                            variable_dtype, name, initializer=initializer)
  return mtf.gather(table, indices, vocab_dim)


def softmax_cross_entropy_with_logits(logits, targets, vocab_dim, z_loss=0.0):
  """Per-example cross entropy of soft targets against softmax(logits).

  Returns -sum(targets * log_softmax(logits)) over vocab_dim, plus
  z_loss * logsumexp(logits)^2 when z_loss is nonzero (it keeps the logits'
  normalizer near zero). targets has the logits' shape (e.g. a one_hot).

  Example:
    >>> loss = softmax_cross_entropy_with_logits(
    ...     logits, mtf.one_hot(targets, vocab_dim), vocab_dim, z_loss=1e-4)
  """
  vocab_dim = mtf.convert_to_dimension(vocab_dim)
  if set(logits.shape.dimension_names) != set(targets.shape.dimension_names):
    raise ValueError("softmax_cross_entropy_with_logits: logits %s and "
                     "targets %s differ in shape" % (logits.shape,
                                                      targets.shape))
  _check_dims(logits, [vocab_dim], "softmax_cross_entropy_with_logits")
  targets = mtf.cast(targets, logits.dtype) if targets.dtype != logits.dtype \
      else targets
  lse = mtf.reduce_logsumexp(logits, vocab_dim)
  log_probs = logits - lse
  loss = mtf.negative(mtf.reduce_sum(log_probs * targets,
                                     reduced_dim=vocab_dim))
  if z_loss:
    loss = loss + z_loss * mtf.square(lse)
  return loss


# --- feed-forward ------------------------------------------------------------
def dense_relu_dense(x, hidden_channels, is_training=None, dropout=0.0,
                     dropout_broadcast_dims=None, master_dtype=None,
                     slice_dtype=None, name=None, activation=mtf.relu,
                     variable_dtype=None, **unused_kwargs):
  """The Transformer feed-forward block: dense, activation, dropout, dense.

  io_channels is x's last dim; both kernels have no bias ("<name>/wi/kernel"
  [io, hidden], "<name>/wo/kernel" [hidden, io]). Dims in
  dropout_broadcast_dims share one dropout mask; is_training=False turns
  dropout off (Mesh TF's arguments, in its order).

  Example:
    >>> y = dense_relu_dense(x, mtf.Dimension("d_ff", 2048), dropout=0.1)
  """
  io_channels = x.shape.dims[-1]
  hidden_channels = mtf.convert_to_dimension(hidden_channels)
  if is_training is False:
    dropout = 0.0
  if variable_dtype is None and (master_dtype or slice_dtype):
    variable_dtype = _variable_dtype(None, x, master_dtype, slice_dtype)
  scope = _scope(x.mesh, name, "dense_relu_dense")
  h = dense(x, hidden_channels, use_bias=False, activation=activation,
            variable_dtype=variable_dtype, name=scope + "/wi")
  h = _dropout(h, dropout, dropout_broadcast_dims, scope + "/dropout")
  return dense(h, io_channels, use_bias=False, variable_dtype=variable_dtype,
               name=scope + "/wo")


def _dropout(x, rate, broadcast_dims, name):
  if not rate:
    return x
  noise_shape = None
  if broadcast_dims:
    names = {mtf.convert_to_dimension(d).name if not isinstance(d, str) else d
             for d in broadcast_dims}
    noise_shape = mtf.Shape([d for d in x.shape.dims if d.name not in names])
  return mtf.dropout(x, rate=rate, noise_shape=noise_shape, name=name)


# --- attention ---------------------------------------------------------------
def rename_length_to_memory_length(x, length_name="length",
                                   memory_length_name=None):
  """x with dim length_name renamed to memory_length_name, by default
  "memory_" + length_name (keys, values and masks index the memory that
  way).

  Example:
    >>> m = rename_length_to_memory_length(x)   # [batch, memory_length, d]
  """
  return mtf.rename_dimension(x, length_name,
                              memory_length_name or "memory_" + length_name)


def dot_product_attention(q, k, v, mask, is_training=None, dropout=0.0,
                          dropout_broadcast_dims=None, extra_logit=None):
  """softmax(q . k + mask) . v, no scaling (fold it into q).

  q: [..., length, d_k]; k: [..., memory_length, d_k]; v: [...,
  memory_length, d_v] (the memory dim is k's second-to-last). mask is an
  additive bias broadcastable to [..., length, memory_length], or None.
  Returns [..., length, d_v]. is_training=False turns dropout off (Mesh
  TF's arguments, in its order).

  Example:
    >>> o = dot_product_attention(q, k, v, attention_mask_autoregressive(pos))
  """
  length_kv = k.shape.dims[-2]
  logits_shape = mtf.Shape(q.shape.dims[:-1] + [length_kv])
  logits = _float32(mtf.einsum([q, k], output_shape=logits_shape))
  if mask is not None:
    if mask.dtype != logits.dtype:
      mask = mtf.cast(mask, logits.dtype)
    logits = mtf.add(logits, mask, output_shape=logits_shape)
  # The softmax in float32 for 16-bit inputs; its weights back in v's dtype.
  weights = mtf.softmax(logits, length_kv, extra_logit=extra_logit)
  if weights.dtype != v.dtype:
    weights = mtf.cast(weights, v.dtype)
  if is_training is False:   # Mesh TF's flag: no dropout outside training
    dropout = 0.0
  weights = _dropout(weights, dropout, dropout_broadcast_dims,
                     "attention_dropout")
  depth_v = v.shape.dims[-1]
  return mtf.einsum([weights, v],
                    output_shape=mtf.Shape(q.shape.dims[:-1] + [depth_v]))


def multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                             master_dtype=None, slice_dtype=None,
                             activation_dtype=None,
                             name="multihead_attention", variable_dtype=None):
  """The four projection weights (q, k, v: [io, heads, kv]; o: [heads, kv,
  io]) under "<name>/q", ... The 1/sqrt(kv) attention scale is folded into
  q's initializer. The dtypes are Mesh TF's (master_dtype, slice_dtype,
  activation_dtype), or variable_dtype (a VariableDType, also accepted in
  master_dtype's place).

  Example:
    >>> wq, wk, wv, wo = multihead_attention_vars(mesh, heads, d_model, d_kv)
  """
  scope = _scope(mesh, name, "multihead_attention")
  if isinstance(master_dtype, dtypes.VariableDType):
    variable_dtype, master_dtype = master_dtype, None
  vdt = variable_dtype or (
      dtypes.VariableDType(master_dtype, slice_dtype, activation_dtype)
      if master_dtype or slice_dtype or activation_dtype else tf.float32)
  io_kv = mtf.Shape([io_channels, heads, kv_channels])

  def var(n, shape, stddev):
    return dtypes.get_variable(
        mesh, scope + "/" + n, shape, dtype=vdt,
        initializer=mtf.random_normal_initializer(stddev=stddev))
  wq = var("q", io_kv, (io_channels.size * kv_channels.size) ** -0.5)
  wk = var("k", io_kv, io_channels.size ** -0.5)
  wv = var("v", io_kv, io_channels.size ** -0.5)
  wo = var("o", mtf.Shape([heads, kv_channels, io_channels]),
           (heads.size * kv_channels.size) ** -0.5)
  return wq, wk, wv, wo


def multihead_attention(query_antecedent, memory_antecedent, mask,
                        kv_channels, heads, is_training=None, dropout=0.0,
                        dropout_broadcast_dims=None, master_dtype=None,
                        slice_dtype=None, name="multihead_attention",
                        variable_dtype=None, **unused_kwargs):
  """Multi-head attention with learned projections.

  query_antecedent: [batch..., length, io]; memory_antecedent: [batch...,
  memory_length, io] or None for self-attention (then it is the query with
  length renamed to "memory_" + length). mask: additive bias over [...,
  length, memory_length] or None. Returns [batch..., length, io].

  Example:
    >>> y = multihead_attention(x, None, mask, mtf.Dimension("d_kv", 64),
    ...                         mtf.Dimension("heads", 8))
  """
  kv_channels = mtf.convert_to_dimension(kv_channels)
  heads = mtf.convert_to_dimension(heads)
  batch_dims = list(query_antecedent.shape.dims[:-2])
  query_length, io_channels = query_antecedent.shape.dims[-2:]
  if variable_dtype is None and (master_dtype or slice_dtype):
    variable_dtype = _variable_dtype(None, query_antecedent, master_dtype,
                                     slice_dtype)
  wq, wk, wv, wo = multihead_attention_vars(
      query_antecedent.mesh, heads, io_channels, kv_channels,
      variable_dtype=variable_dtype, name=name)
  if memory_antecedent is None:
    memory_antecedent = rename_length_to_memory_length(query_antecedent,
                                                       query_length.name)
  memory_batch_dims = list(memory_antecedent.shape.dims[:-2])
  memory_length = memory_antecedent.shape.dims[-2]
  dt = query_antecedent.dtype
  wq, wk, wv, wo = [mtf.cast(w, dt) if w.dtype != dt else w
                    for w in (wq, wk, wv, wo)]
  q = mtf.einsum([query_antecedent, wq], output_shape=mtf.Shape(
      batch_dims + [heads, query_length, kv_channels]))
  k = mtf.einsum([memory_antecedent, wk], output_shape=mtf.Shape(
      memory_batch_dims + [heads, memory_length, kv_channels]))
  v = mtf.einsum([memory_antecedent, wv], output_shape=mtf.Shape(
      memory_batch_dims + [heads, memory_length, kv_channels]))
  o = dot_product_attention(q, k, v, mask, is_training=is_training,
                            dropout=dropout,
                            dropout_broadcast_dims=dropout_broadcast_dims)
  return mtf.einsum([o, wo], output_shape=mtf.Shape(
      batch_dims + [query_length, io_channels]))


# --- masks -------------------------------------------------------------------
def attention_mask_autoregressive(query_pos, dtype=tf.float32):
  """Bias that forbids attending to later positions: -1e9 where
  memory_pos > query_pos. query_pos: integer positions over a dim named
  e.g. "length" (mtf.range); the result is [length, memory_length].

  Example:
    >>> mask = attention_mask_autoregressive(mtf.range(mesh, length, tf.int32))
  """
  memory_pos = rename_length_to_memory_length(
      query_pos, query_pos.shape.dims[-1].name)
  return mtf.cast(mtf.less(query_pos, memory_pos), dtype) * -1e9


def attention_mask_ignore_padding(inputs, dtype=tf.float32):
  """Bias that ignores padding (id 0) in the memory: [batch, memory_length],
  -1e9 where inputs == 0. inputs: integer ids [batch, length].

  Example:
    >>> mask = attention_mask_ignore_padding(token_ids)
  """
  inputs = rename_length_to_memory_length(inputs, inputs.shape.dims[-1].name)
  return mtf.cast(mtf.equal(inputs, 0), dtype) * -1e9


def attention_mask_same_segment(query_segment, memory_segment=None,
                                dtype=tf.float32):
  """Bias that keeps attention within a segment: [batch, length,
  memory_length], -1e9 where the segment ids differ. memory_segment
  defaults to query_segment (over "length", renamed to "memory_length").

  Example:
    >>> mask = attention_mask_same_segment(segment_ids)
  """
  if memory_segment is None:
    memory_segment = query_segment
  memory_segment = rename_length_to_memory_length(
      memory_segment, memory_segment.shape.dims[-1].name)
  return mtf.cast(mtf.not_equal(query_segment, memory_segment), dtype) * -1e9



# --- dense_product, batch_norm, local attention ------------------------------
def dense_product(x, reduced_dims, new_dims, activation_functions=None,
                  name="dense_product", **kwargs):
  """The elementwise product of several dense layers of x, one per entry of
  activation_functions (Mesh TensorFlow's gated units: ["linear",
  "sigmoid"] is a GLU, ["gelu", None] a GEGLU).

  Each activation is a function, the name of a meshtf op ("relu", "gelu",
  "sigmoid", ...), or None / "linear" for none. With several factors the
  layers are named "<name>_0", "<name>_1", ... (one factor: "<name>").
  kwargs go to dense (use_bias, kernel_initializer, variable_dtype, ...).

  Example:
    >>> h = dense_product(x, [d_model], [d_ff], ["gelu", None])   # GEGLU
  """
  acts = (list(activation_functions)
          if isinstance(activation_functions, (list, tuple))
          else [activation_functions])
  fns = []
  for a in acts:
    if a is None or a == "linear":
      fns.append(None)
    elif isinstance(a, str):
      fn = getattr(mtf, a, None)
      if not callable(fn):
        raise ValueError("dense_product: activation %r is not a meshtf op; "
                         "use e.g. \"relu\", \"gelu\", \"sigmoid\", "
                         "\"linear\" or a function" % a)
      fns.append(fn)
    elif callable(a):
      fns.append(a)
    else:
      raise TypeError("dense_product: activation %r must be a function, a "
                      "meshtf op name or None" % (a,))
  if len(fns) == 1:
    names = [name]
  else:
    scope = _scope(x.mesh, name, "dense_product")
    names = ["%s_%d" % (scope, i) for i in range(len(fns))]
  factors = [dense(x, new_dims, reduced_dims=reduced_dims, activation=fn,
                   name=n, **kwargs) for fn, n in zip(fns, names)]
  out = factors[0]
  for f in factors[1:]:
    out = mtf.multiply(out, f)
  return out


def batch_norm(x, is_training, momentum, epsilon=1e-9, dims_idx_start=0,
               dims_idx_end=-1, init_zero=False, name=None,
               dims_to_normalize=None):
  """Batch normalization (Mesh TensorFlow's signature); returns
  (output, update_ops).

  The dims x.shape.dims[dims_idx_start:dims_idx_end] (or dims_to_normalize)
  are normalized over: mean and variance are taken over them, per position
  of the other dims. Where a normalized dim (the batch) is split, the
  moments are allreduced, so the statistics are those of the whole batch.
  Variables under "<name>/" (default "batch_norm"): batch_norm_scale (ones,
  or zeros if init_zero), batch_norm_bias (zeros), and the non-trainable
  bn_moving_mean (standard normal, as Mesh TensorFlow) and
  bn_moving_variance (ones), all shaped like the other dims.

  Training: normalizes with the batch moments; update_ops are two assigns,
  moving = momentum * moving + (1 - momentum) * batch moment (the variance
  is the biased one). Otherwise: normalizes with the moving moments and
  update_ops is []. Output: normalized * scale + bias, shaped like x.

  Example:
    >>> y, updates = batch_norm(x, True, momentum=0.99, dims_idx_end=-1)
  """
  if dims_to_normalize is not None:
    norm_dims = _dim_list(dims_to_normalize)
    _check_dims(x, norm_dims, "batch_norm dims_to_normalize")
  else:
    norm_dims = x.shape.dims[dims_idx_start:dims_idx_end]
  if not norm_dims:
    raise ValueError(
        "batch_norm: no dim of %s %s to normalize over (dims_idx_start=%d, "
        "dims_idx_end=%d); pass the batch dims, e.g. dims_to_normalize=[batch]"
        % (x.name, x.shape, dims_idx_start, dims_idx_end))
  if not x.dtype.is_floating:
    raise TypeError("batch_norm: %s has dtype %s; it needs a float tensor"
                    % (x.name, x.dtype.name))
  reduced_shape = x.shape - [d.name for d in norm_dims]
  scope = _scope(x.mesh, name, "batch_norm")

  def var(suffix, initializer, trainable=True):
    return mtf.get_variable(x.mesh, scope + "/" + suffix, reduced_shape,
                            initializer=initializer, trainable=trainable,
                            activation_dtype=x.dtype)
  scale = var("batch_norm_scale", mtf.zeros_initializer() if init_zero
              else mtf.ones_initializer())
  bias = var("batch_norm_bias", mtf.zeros_initializer())
  moving_mean = var("bn_moving_mean",
                    mtf.random_normal_initializer(stddev=1.0), False)
  moving_variance = var("bn_moving_variance", mtf.ones_initializer(), False)
  if is_training:
    mean = mtf.reduce_mean(x, output_shape=reduced_shape)
    centered = x - mean
    variance = mtf.reduce_mean(mtf.square(centered),
                               output_shape=reduced_shape)
    norm_x = centered * mtf.rsqrt(variance + epsilon)
    updates = [
        mtf.assign(moving_mean,
                   momentum * moving_mean + (1.0 - momentum) * mean,
                   name=scope + "/bn_mean_update"),
        mtf.assign(moving_variance,
                   momentum * moving_variance + (1.0 - momentum) * variance,
                   name=scope + "/bn_var_update")]
  else:
    norm_x = (x - moving_mean) * mtf.rsqrt(moving_variance + epsilon)
    updates = []
  return mtf.add(norm_x * scale, bias, output_shape=x.shape), updates


def masked_local_attention_1d(x, kv_channels, heads, is_training=None,
                              window_size=128, master_dtype=tf.float32,
                              slice_dtype=tf.float32, length_per_split=None,
                              return_kv=None, params=None, name=None):
  """Causal local self-attention: position p attends to positions
  (p - window_size, p] (Mesh TensorFlow's mtf.layers signature).

  x: [batch..., length, io_channels]; returns the same shape. The length is
  cut into blocks; each block's keys and values get the window_size
  positions before the block prepended (left_halo_exchange: a shift along
  the blocks dim, i.e. collective permutes when length is split), so the
  attention is block-local. The blocks dim keeps length's name, so it is
  split like length: the block length is the largest divisor of
  length_per_split (the length per processor; default the whole length)
  that is at most max(window_size, 128), and a layout that splits length
  must split it into whole blocks (else the lowering raises a LayoutError:
  pass length_per_split). The numbers do not depend on the block length.

  Positions before 0 are masked out. (Mesh TensorFlow's code attends to its
  zero-padded keys there, and masks by block length rather than by window,
  so a query can see up to block_length earlier positions; this follows its
  docstring, which is also layout-independent.)

  params: an optional (wq, wk, wv, wo) as from multihead_attention_vars
  (else variables "<name>/q", ...). return_kv: an optional list to which
  the keys and values [batch..., heads, length, kv_channels] are appended.
  master_dtype / slice_dtype: the variables' dtypes (activations use x's).

  Example:
    >>> y = masked_local_attention_1d(
    ...     x, mtf.Dimension("d_kv", 64), mtf.Dimension("heads", 8),
    ...     window_size=128)
  """
  from meshtf.ops import slicing
  kv_channels = mtf.convert_to_dimension(kv_channels)
  heads = mtf.convert_to_dimension(heads)
  if x.shape.ndims < 2:
    raise ValueError("masked_local_attention_1d: x %s %s needs [batch..., "
                     "length, io_channels]" % (x.name, x.shape))
  batch_dims = list(x.shape.dims[:-2])
  length, io_channels = x.shape.dims[-2:]
  window_size = int(window_size)
  if window_size < 1:
    raise ValueError("masked_local_attention_1d: window_size must be >= 1, "
                     "got %d" % window_size)
  per_split = length.size if length_per_split is None else int(
      length_per_split)
  if per_split < 1 or length.size % per_split:
    raise ValueError(
        "masked_local_attention_1d: length_per_split=%r must divide the "
        "length %s:%d" % (length_per_split, length.name, length.size))
  if params is None:
    params = multihead_attention_vars(
        x.mesh, heads, io_channels, kv_channels,
        variable_dtype=dtypes.VariableDType(master_dtype, slice_dtype,
                                            x.dtype),
        name=name or "masked_local_attention_1d")
  wq, wk, wv, wo = [mtf.cast(w, x.dtype) if w.dtype != x.dtype else w
                    for w in params]
  qkv_shape = mtf.Shape(batch_dims + [heads, length, kv_channels])
  q = mtf.einsum([x, wq], output_shape=qkv_shape)
  block = max(window_size, 128)
  while per_split % block:
    block -= 1
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  # Same name as length: the blocks are split the way length is.
  num_blocks = mtf.Dimension(length.name, length.size // block)
  q = mtf.reshape(q, batch_dims + [heads, num_blocks, query_block,
                                   kv_channels])
  # Keys and values travel together: one halo exchange (one pair of
  # collective permutes where length is split) for both.
  pair = mtf.Dimension("_local_attention_kv", 2)
  if wv.shape != wk.shape:
    wv = mtf.transpose(wv, wk.shape)  # same dims, maybe in another order
  kv = mtf.einsum([x, mtf.stack([wk, wv], pair.name, axis=0)],
                  output_shape=mtf.Shape([pair] + qkv_shape.dims))
  if return_kv is not None:
    return_kv.extend(mtf.unstack(kv, pair))
  kv = mtf.reshape(kv, [pair] + batch_dims + [heads, num_blocks,
                                              memory_block, kv_channels])
  k, v = mtf.unstack(slicing.left_halo_exchange(kv, num_blocks, memory_block,
                                                window_size), pair)
  padded = mtf.Dimension(memory_block.name, block + window_size)
  # Memory index m of a block starting at s holds position s - window + m;
  # query index i holds s + i, i.e. memory index i + window.
  mpos = mtf.range(x.mesh, padded, tf.int32)
  qpos = mtf.range(x.mesh, query_block, tf.int32) + window_size
  start = mtf.range(x.mesh, num_blocks, tf.int32) * block
  hidden = mtf.logical_or(mtf.greater(mpos, qpos),  # the future
                          mtf.less_equal(mpos, qpos - window_size))  # too old
  hidden = mtf.logical_or(hidden, mtf.less(start + mpos, window_size))  # < 0
  mask = mtf.cast(hidden, x.dtype) * -1e9
  o = dot_product_attention(q, k, v, mask)
  o = mtf.reshape(o, batch_dims + [heads, length, kv_channels])
  return mtf.einsum([o, wo], output_shape=mtf.Shape(
      batch_dims + [length, io_channels]))


def weights_nonzero(targets, dtype=tf.float32):
  """1 where targets != 0, else 0 (Mesh TF's loss weights for padded ids).

  Example:
    >>> w = layers.weights_nonzero(targets)   # float32, targets' shape
  """
  return mtf.cast(mtf.not_equal(targets, mtf.zeros_like(targets)), dtype)


def corr(x, dim, epsilon=1e-20, name="pearson_correlation"):
  """Pearson correlation between the entries of dim, over all other dims
  (tfp.stats.correlation with dim as the event axis). Returns
  [dim_1, dim_2] (dim renamed twice).

  Example:
    >>> c = layers.corr(x, channels)   # [channels_1:3, channels_2:3]
  """
  del name
  centered = x - mtf.reduce_mean(x, output_shape=[dim])
  a = mtf.rename_dimension(centered, dim.name, dim.name + "_1")
  b = mtf.rename_dimension(centered, dim.name, dim.name + "_2")
  d1, d2 = a.shape.get_dim_by_name(dim.name + "_1"), b.shape.get_dim_by_name(
      dim.name + "_2")
  cov = mtf.einsum([a, b], output_shape=[d1, d2])
  norm_a = mtf.sqrt(mtf.reduce_sum(mtf.square(a), output_shape=[d1])) + epsilon
  norm_b = mtf.sqrt(mtf.reduce_sum(mtf.square(b), output_shape=[d2])) + epsilon
  return cov / (norm_a * norm_b)


__all__ = [
    "dense", "get_dense_kernel_weights", "layer_norm", "rms_norm",
    "embedding_weights", "embedding",
    "softmax_cross_entropy_with_logits", "dense_relu_dense",
    "rename_length_to_memory_length", "dot_product_attention",
    "multihead_attention_vars", "multihead_attention",
    "attention_mask_autoregressive", "attention_mask_ignore_padding",
    "attention_mask_same_segment", "dense_product", "batch_norm",
    "masked_local_attention_1d", "weights_nonzero", "corr",
    "DenseInitializer", "DenseVarianceScalingInitializer",
]
