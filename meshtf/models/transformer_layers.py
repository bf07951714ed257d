"""Transformer layers: the Context, attention, feed-forward blocks, masks.

Mesh TensorFlow's `transformer_layers.py` for meshtf. A layer is a
`TransformerLayer` whose `call(context, x)` maps [batch..., length, d_model]
to the same shape and creates its variables under `context.scope` (set by
the LayerStack, e.g. "decoder/layer_001/SelfAttention"). Any callable
`fn(x, context) -> y` can stand in the layer list as well (a FunctionLayer
wraps it): this is the hook for a Mixture-of-Experts layer, which appends
its auxiliary (load-balancing) losses to `context.losses`; the model adds
them to the training loss.

Named dimensions (a layout splits them by name):
  batch, length            the activations' batch and sequence dims
  memory_length            keys / values ("length" renamed)
  d_model, heads, d_kv, d_ff, vocab, max_length

Attention keeps the projections separable (`AttentionParams.compute_q`,
`compute_k`, `compute_v`, `compute_output`): a decoder
(meshtf/models/decoding.py) caches keys and values and computes only the
new position's query, key and value (Context modes "first_part" and
"incremental").

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import transformer_layers as tl
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.zeros(mesh, "batch:2;length:4;d_model:8")
  >>> ctx = tl.Context(mesh, x.shape.dims[:1], x.shape.dims[1],
  ...                  x.shape.dims[2], autoregressive=True)
  >>> ctx.scope = "layer_000/SelfAttention"
  >>> tl.SelfAttention(num_heads=2, key_value_size=4).call(ctx, x).shape
  Shape([batch:2, length:4, d_model:8])
"""
import re

import numpy as np
import tensorflow as tf

import meshtf as mtf
from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import rng
from meshtf.models import dtypes
from meshtf.models import layers
from meshtf.models import norms
from meshtf.models import relative_position
from meshtf.models.sequences import autoregressive_inputs
from meshtf.models.sequences import delimited_lm_inputs_mask
from meshtf.models.sequences import sinusoidal_position_signal
from meshtf.op_kinds import CostKind

# tf.estimator.ModeKeys' values: dropout and z-loss only in "train". The
# decoders (meshtf/models/decoding.py) add Mesh TensorFlow's "first_part"
# (the prefix in parallel, recording key/value caches) and "incremental"
# (one new position, reading and updating them).
MODES = ("train", "eval", "infer", "first_part", "incremental")

# The additive bias for positions a query may not see.
MASK_VALUE = -1e9

ACTIVATIONS = {
    "relu": mtf.relu, "gelu": mtf.gelu, "swish": mtf.swish,
    "silu": mtf.swish, "squared_relu": mtf.squared_relu, "tanh": mtf.tanh,
    "sigmoid": mtf.sigmoid, "linear": None, None: None,
}


def get_activation(activation):
  """An activation function from a name ("relu", "gelu", "swish", "linear",
  ...) or a callable (returned unchanged).

  Example:
    >>> get_activation("gelu") is mtf.gelu
    True
  """
  if callable(activation):
    return activation
  if activation not in ACTIVATIONS:
    raise ValueError("activation %r: use a callable or one of %s" % (
        activation, sorted(k for k in ACTIVATIONS if k)))
  return ACTIVATIONS[activation]


# --- Context ------------------------------------------------------------------
class Context(object):
  """What layers need at call time, made by the model for one call.

  Attributes:
    mesh, batch_dims (list of Dimension), length_dim, model_dim (d_model).
    variable_dtype: a VariableDType (activations in its activation_dtype).
    mode: "train", "eval" or "infer" (dropout, label smoothing and z-loss
      only in "train").
    autoregressive: self-attention sees only earlier positions.
    position: int Tensor [batch..., length] or None (= index in length).
    sequence_id: int Tensor [batch..., length] or None; packed examples
      have ids 1, 2, ... per segment and 0 on padding. Attention stays
      within a segment.
    encoder_output / encoder_sequence_id: for EncDecAttention.
    inputs: the input ids [batch..., length] or None (conv layers zero the
      padding positions, ids 0, with them).
    initial_position: int Tensor [batch...] or None: in "first_part" mode
      the first position to decode (conv layers record the inputs before
      it as their decoding state).
    losses: list to which layers append extra scalar losses (MoE), or None
      when no loss is computed.
    step: optional int scalar Tensor (the training step); dropout masks
      then change from step to step (see `dropout`).
    scope: variable-name prefix of the layer being called.
    shared_params: dict of Tensors shared between the models of a
      Bitransformer (e.g. "embedding").
    cache: dict for values computed once per call (attention masks).
    layer_index: index of the layer being called in its stack.
    states, new_states, constant_states: decoding caches (Mesh TensorFlow's
      names). In "first_part" mode self-attention layers record their keys
      and values ([batch..., heads, memory_length, d_kv]) with
      record_new_states and encoder-decoder attention its constant ones
      with record_constant_state. In "incremental" mode the inputs have no
      length dim, `position` is the scalar int32 position being computed,
      and the layers read the caches in the same order (get_states,
      get_constant_state) and record the updated ones in new_states.

  Example:
    >>> ctx = Context(mesh, [batch], length, d_model, mode="train")
    >>> ctx.train
    True
  """

  def __init__(self, mesh, batch_dims, length_dim, model_dim=None,
               variable_dtype=None, mode="train", autoregressive=False,
               position=None, sequence_id=None, encoder_output=None,
               encoder_sequence_id=None, losses=None, step=None,
               shared_params=None, model=None, states=None, new_states=None,
               constant_states=None, inputs=None, initial_position=None):
    self.mesh = mesh
    self.batch_dims = list(batch_dims)
    self.length_dim = length_dim
    if model_dim is None:   # Mesh TF's Context took it from the model
      model_dim = getattr(model, "model_dim", None)
    if model_dim is None:
      raise ValueError("Context: pass model_dim or a model that has one")
    self.model_dim = model_dim
    # Mesh TF's names: the input ids [batch..., length] (conv layers mask
    # padding with them) and the first position decoding computes.
    self.inputs = inputs
    self.initial_position = initial_position
    self.variable_dtype = variable_dtype or dtypes.VariableDType(tf.float32)
    if mode not in MODES:
      raise ValueError("Context: mode %r is not one of %s" % (mode, MODES))
    self.mode = mode
    self.autoregressive = autoregressive
    self.position = position
    self.sequence_id = sequence_id
    self.encoder_output = encoder_output
    self.encoder_sequence_id = encoder_sequence_id
    self.losses = losses
    self.step = step
    self.shared_params = shared_params if shared_params is not None else {}
    self.model = model
    self.scope = ""
    self.cache = {}
    self.layer_index = 0
    self.states = list(states or [])
    self.new_states = new_states if new_states is not None else []
    self.constant_states = (constant_states if constant_states is not None
                            else [])
    self._next_state = 0
    self._next_constant_state = 0

  @property
  def train(self):
    return self.mode == "train"

  @property
  def incremental(self):
    """True when computing one new position from cached states."""
    return self.mode == "incremental"

  def get_states(self, n):
    """The next n decoding states (incremental mode), in recording order."""
    begin = self._next_state
    if begin + n > len(self.states):
      raise ValueError(
          "Context at %s: a layer asks for states %d..%d but only %d were "
          "given; the first-part pass and the incremental step must call the "
          "same layers" % (self.scope, begin, begin + n - 1, len(self.states)))
    self._next_state += n
    return self.states[begin:begin + n]

  def record_new_states(self, new_states):
    """Appends a layer's (updated) decoding states."""
    self.new_states.extend(new_states)

  def get_constant_state(self):
    """The next state recorded with record_constant_state (a value that
    stays fixed while decoding, e.g. keys of the encoder output)."""
    if self._next_constant_state >= len(self.constant_states):
      raise ValueError(
          "Context at %s: a layer asks for constant state %d but only %d "
          "were recorded in the first-part pass" % (
              self.scope, self._next_constant_state,
              len(self.constant_states)))
    self._next_constant_state += 1
    return self.constant_states[self._next_constant_state - 1]

  def record_constant_state(self, s):
    """Records a value the incremental steps read with get_constant_state."""
    self.constant_states.append(s)

  @property
  def activation_dtype(self):
    return self.variable_dtype.activation_dtype

  def memory_length_dim(self):
    """The keys' dim of self-attention: length renamed "memory_length"."""
    return mtf.Dimension("memory_" + self.length_dim.name,
                         self.length_dim.size)

  def self_attention_mask(self):
    """Additive bias [batch..., length, memory_length] (or a broadcastable
    part of it) for self-attention, or None when everything is visible:
    -1e9 on later positions (autoregressive) and on other segments."""
    if "self_attention_mask" not in self.cache:
      visible = None
      if self.autoregressive:
        pos = mtf.range(self.mesh, self.length_dim, tf.int32)
        visible = mtf.less_equal(
            mtf.range(self.mesh, self.memory_length_dim(), tf.int32), pos)
      if self.sequence_id is not None:
        same = mtf.equal(self.sequence_id,
                         layers.rename_length_to_memory_length(
                             self.sequence_id, self.length_dim.name))
        visible = same if visible is None else mtf.logical_and(same, visible)
      # Laid out as the activations are (per batch with segment ids).
      self.cache["self_attention_mask"] = annotate(self, visibility_to_bias(
          visible, self.activation_dtype))
    return self.cache["self_attention_mask"]

  def encdec_attention_mask(self):
    """Additive bias [batch..., length, memory_length] for attending to the
    encoder output: the same segment when both sequence ids are known, else
    the encoder's non-padding positions, else None."""
    if "encdec_attention_mask" not in self.cache:
      visible = None
      enc = self.encoder_sequence_id
      if enc is not None:
        enc = layers.rename_length_to_memory_length(
            enc, enc.shape.dims[-1].name)
        if self.sequence_id is not None:
          visible = mtf.equal(self.sequence_id, enc)
        else:
          visible = mtf.not_equal(enc, 0)
      self.cache["encdec_attention_mask"] = annotate(self, visibility_to_bias(
          visible, self.activation_dtype))
    return self.cache["encdec_attention_mask"]


def visibility_to_bias(visible, dtype=tf.float32):
  """A bool "may attend" tensor as an additive bias (0 or -1e9); None
  stays None.

  Example:
    >>> bias = visibility_to_bias(mtf.equal(seg, seg_memory))
  """
  if visible is None:
    return None
  return mtf.cast(mtf.logical_not(visible), dtype) * MASK_VALUE


# --- dropout that changes with the step ---------------------------------------
def _fmix32(h):
  """MurmurHash3's finalizer: a bijection of uint32 with full avalanche."""
  shr = lambda x, n: tf.bitwise.right_shift(x, np.uint32(n))  # noqa: E731
  h = tf.bitwise.bitwise_xor(h, shr(h, 16)) * np.uint32(0x85EBCA6B)
  h = tf.bitwise.bitwise_xor(h, shr(h, 13)) * np.uint32(0xC2B2AE35)
  return tf.bitwise.bitwise_xor(h, shr(h, 16))


class StepRandomUniformOperation(graph_lib.Operation):
  """Uniform (0, 1) values that depend on (graph seed, op name, element
  index, step): a fresh layout-invariant draw for every value of the
  scalar integer tensor `step`.

  Each element's 32 Threefry bits (rng.py, a static key from the name)
  are xor-ed with a step word and passed through MurmurHash3's finalizer.
  For a fixed step the finalizer maps i.i.d. uniform words to i.i.d.
  uniform words; across steps its avalanche decorrelates the draws.
  """

  cost_kind = CostKind.FUSIBLE

  def __init__(self, step, shape, dtype=tf.float32, name=None):
    if step.shape.ndims != 0 or not step.dtype.is_integer:
      raise ValueError("step_random_uniform: step %s must be an integer "
                       "scalar, got %s %s" % (step.name, step.dtype.name,
                                              step.shape))
    super().__init__([step], name=name or "step_random_uniform")
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(shape),
                                      dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    key = rng.op_key(self.graph.seed * 1000003, self.name)
    full = out.shape.to_integer_list
    sizes = impl.slice_shape(out.shape)
    if tf.executing_eagerly() or getattr(impl, "jit_compile", ""):
      # Eager: op by op; under XLA: its own fused copy of the generator.
      local = lambda begin, step: _StepUniformSlice(sizes, full, out.dtype)(
          key, begin, step)
    else:
      # A graph: one call of a function that every dropout of this shape
      # shares (rng.shared_function), not ~140 ops of its own.
      shared = rng.shared_function(
          ("step_uniform", tuple(sizes), tuple(full), out.dtype.name),
          lambda: _StepUniformSlice(sizes, full, out.dtype))
      local = lambda begin, step: shared(rng.key_words(key),
                                         tf.cast(begin, tf.int64),
                                         tf.cast(step, tf.int64))
    lowering.set_tensor_lowering(out, impl.slicewise(
        local, impl.laid_out_slice_begin(out.shape),
        lowering.tensors[self._inputs[0]]))


class _StepUniformSlice(object):
  """(key, begin, step) -> one slice of step_random_uniform's values; key
  is op_key's pair of ints or of uint32 tensors. A callable object: each
  tf.function of one is traced once by design (see rng._RandomSlice)."""

  def __init__(self, slice_shape, full_shape, dtype):
    self._sizes = list(slice_shape)
    self._full = list(full_shape)
    self._dtype = dtype

  def __call__(self, key, begin, step):
    bits, _ = rng.random_bits((key[0], key[1]), begin, self._sizes,
                              self._full)
    step = tf.cast(step, tf.int64)
    word = tf.bitwise.bitwise_xor(
        tf.cast(tf.bitwise.bitwise_and(step, 0xFFFFFFFF), tf.uint32)
        * np.uint32(0x9E3779B9),
        tf.cast(tf.bitwise.right_shift(step, 32), tf.uint32)
        * np.uint32(0x27D4EB2F))
    h = _fmix32(tf.bitwise.bitwise_xor(bits, word))
    u = (tf.cast(tf.bitwise.right_shift(h, np.uint32(8)), tf.float32)
         + 0.5) * (1.0 / (1 << 24))
    return tf.cast(u, self._dtype)


def step_random_uniform(step, shape, dtype=tf.float32, name=None):
  """Uniform (0, 1) values, a new layout-invariant draw for each step.

  Example:
    >>> u = step_random_uniform(step, "batch:8;d_model:16", name="noise")
  """
  return StepRandomUniformOperation(step, shape, dtype, name).outputs[0]


def dropout(x, context, rate, broadcast_dims=None, name="dropout"):
  """Dropout in training mode (identity otherwise), layout-invariant.

  With context.step set, the mask is drawn anew for every step value (a
  traced-once training step otherwise reuses one mask forever); without
  it, mtf.dropout's fixed-per-graph mask is used. Dims named in
  broadcast_dims share one mask value.

  Example:
    >>> h = dropout(h, context, 0.1, name=context.scope + "/dropout")
  """
  if not rate or not context.train:
    return x
  if not 0.0 < rate < 1.0:
    raise ValueError("dropout %s: rate %r must be in [0, 1)" % (name, rate))
  names = {mtf.convert_to_dimension(d).name if not isinstance(d, str) else d
           for d in (broadcast_dims or [])}
  noise_shape = mtf.Shape([d for d in x.shape.dims if d.name not in names])
  if context.step is None:
    return mtf.dropout(x, rate=rate, noise_shape=noise_shape, name=name)
  keep_prob = 1.0 - rate
  u = step_random_uniform(context.step, noise_shape, name=name)
  keep = mtf.cast(mtf.less(u, keep_prob), x.dtype)
  return x * keep * (1.0 / keep_prob)


# --- layers -------------------------------------------------------------------
class TransformerLayer(object):
  """Base class: `call(context, x)` returns a tensor of x's shape.

  The constructor records hyperparameters only; variables are made in
  call() under context.scope, so one layer object can serve many graphs.

  Example:
    >>> class Scale(TransformerLayer):
    ...   def call(self, context, x):
    ...     s = mtf.get_variable(context.mesh, context.scope + "/s", [])
    ...     return x * s
  """

  @property
  def name(self):
    return type(self).__name__

  def call(self, context, x):
    raise NotImplementedError("%s must implement call(context, x)" %
                              type(self).__name__)

  def before_stack(self, context, scope):
    """Called by the LayerStack before any layer runs, with the scope the
    layer will run under: where a layer makes what the stack's other layers
    share (T5's one relative bias table), outside every layer's block, so
    that a recomputed (remat) block does not own it."""


class FunctionLayer(TransformerLayer):
  """A layer from a function fn(x, context) -> y (e.g. an MoE layer, which
  appends its auxiliary losses to context.losses when that is a list).
  LayerStack wraps plain callables in its layer list this way.

  Example:
    >>> def moe_ffn(x, context):
    ...   y, metrics = moe.moe_layer(x, context.model_dim, hparams,
    ...                              context.train, context.variable_dtype,
    ...                              name=context.scope)
    ...   if context.losses is not None:
    ...     context.losses.append(metrics["loss"])
    ...   return y
    >>> stack = LayerStack([SelfAttention(), FunctionLayer(moe_ffn, "moe")])
  """

  def __init__(self, fn, name=None):
    if not callable(fn):
      raise TypeError("FunctionLayer: %r is not callable" % (fn,))
    self._fn = fn
    # A variable-name component: "<lambda>" becomes "_lambda_".
    self._name = re.sub(r"[^A-Za-z0-9_.-]", "_", name or getattr(
        fn, "__name__", "FunctionLayer"))

  @property
  def name(self):
    return self._name

  def call(self, context, x):
    return self._fn(x, context)


class AttentionParams(object):
  """The projections of one multi-head attention: q, k, v [d_model, heads,
  d_kv] and o [heads, d_kv, d_model], made once under `name`.

  The 1/sqrt(d_kv) scale is folded into q's initializer. compute_q,
  compute_k, compute_v and compute_output are separate so a decoder can
  cache the memory's keys and values.

  Example:
    >>> p = AttentionParams(mesh, d_model, heads, d_kv, vdt, "dec/att")
    >>> q = p.compute_q(x)                       # [batch, heads, length, d_kv]
    >>> k, v = p.compute_k(memory), p.compute_v(memory)
  """

  def __init__(self, mesh, model_dim, heads_dim, kv_dim, variable_dtype,
               name):
    self.model_dim, self.heads_dim, self.kv_dim = model_dim, heads_dim, kv_dim
    self.wq, self.wk, self.wv, self.wo = layers.multihead_attention_vars(
        mesh, heads_dim, model_dim, kv_dim, variable_dtype=variable_dtype,
        name=name)

  def _project(self, x, w, one_position):
    if w.dtype != x.dtype:
      w = mtf.cast(w, x.dtype)
    if one_position:
      # One position: no length dim (an incremental decoding step).
      if not x.shape.has_dim_name(self.model_dim.name):
        raise ValueError("attention: %s %s has no %r dim" % (
            x.name, x.shape, self.model_dim.name))
      batch = [d for d in x.shape.dims if d.name != self.model_dim.name]
      return mtf.einsum([x, w], output_shape=mtf.Shape(
          batch + [self.heads_dim, self.kv_dim]))
    length_dim = _length_dim(x, self.model_dim)
    batch = [d for d in x.shape.dims
             if d.name not in (length_dim.name, self.model_dim.name)]
    return mtf.einsum([x, w], output_shape=mtf.Shape(
        batch + [self.heads_dim, length_dim, self.kv_dim]))

  def compute_q(self, x, one_position=False):
    """x [batch..., length, d_model] -> [batch..., heads, length, d_kv];
    with one_position, x [batch..., d_model] -> [batch..., heads, d_kv]."""
    return self._project(x, self.wq, one_position)

  def compute_k(self, memory, one_position=False):
    """memory [batch..., memory_length, d_model] -> keys (see compute_q)."""
    return self._project(memory, self.wk, one_position)

  def compute_v(self, memory, one_position=False):
    """memory [batch..., memory_length, d_model] -> values (see compute_q)."""
    return self._project(memory, self.wv, one_position)

  def compute_output(self, o, output_shape):
    """o [batch..., heads, length, d_kv] -> output_shape (with d_model)."""
    wo = self.wo if self.wo.dtype == o.dtype else mtf.cast(self.wo, o.dtype)
    return mtf.einsum([o, wo], output_shape=output_shape)


def _length_dim(x, model_dim):
  """The sequence dim of x: its last dim other than model_dim."""
  dims = [d for d in x.shape.dims if d.name != model_dim.name]
  if len(dims) == len(x.shape.dims) or not dims:
    raise ValueError("attention: %s %s needs a %r dim and a length dim" % (
        x.name, x.shape, model_dim.name))
  return dims[-1]


def attention(q, k, v, memory_length_dim, kv_dim, mask=None, dropout_rate=0.0,
              context=None, name="attention"):
  """softmax(q.k + mask).v over memory_length_dim (q already scaled).

  q: [batch..., heads, length, d_kv]; k, v: [batch..., heads, memory_length,
  d_kv]; mask: additive bias broadcastable to the logits or None. Dropout
  on the weights in training mode (context needed then).

  Example:
    >>> o = attention(q, k, v, memory_length, d_kv, mask)
  """
  logits_shape = mtf.Shape([d for d in q.shape.dims if d.name != kv_dim.name]
                           + [memory_length_dim])
  logits = mtf.einsum([q, k], output_shape=logits_shape)
  # The mask added and the softmax's sums taken in float32; what the
  # backward pass keeps is the weights in v's dtype (norms.softmax).
  weights = norms.softmax(logits, memory_length_dim, bias=mask,
                          dtype=v.dtype)
  if dropout_rate and context is not None:
    weights = dropout(weights, context, dropout_rate, name=name + "/dropout")
  return mtf.einsum([weights, v], output_shape=q.shape)


def annotate(context, x):
  """x laid out as the model's activation_layout says (GSPMD's activation
  annotations: each dim of x the layout names, on its axes; the others
  replicated), or x itself when the model has none. LayerStack annotates
  the residual stream at every layer, attention its queries, keys, values
  and output, the feed-forward layers their hidden activations.

  Example:
    >>> lm = make_unitransformer(..., activation_layout="batch:x;d_model:y")
    >>> h = annotate(context, h)   # [batch:x, length, d_ff]
  """
  rules = getattr(context.model, "activation_layout", None)
  if rules is None or x is None:
    return x
  spec = [(d.name, rules.mesh_axis_names(d.name)) for d in x.shape.dims
          if rules.mesh_axis_names(d.name)]
  return mtf.shard(x, spec)


class SelfAttention(TransformerLayer):
  """Multi-head self-attention (autoregressive when the context says so,
  always within a segment).

  relative_attention_type: None, or T5's relative position bias
  (meshtf/models/relative_position.py): "bias_shared" (one [heads, buckets]
  table per layer stack, held by its first self-attention layer) or "bias"
  (one per layer); relative_attention_num_buckets and
  relative_attention_max_distance as T5 (32, 128).

  Example:
    >>> layer = SelfAttention(num_heads=8, key_value_size=64,
    ...                       relative_attention_type="bias_shared")
  """

  def __init__(self, num_heads=8, key_value_size=128, dropout_rate=0.0,
               relative_attention_type=None, relative_attention_num_buckets=32,
               relative_attention_max_distance=128):
    self.num_heads = num_heads
    self.key_value_size = key_value_size
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_position.check_type(
        relative_attention_type, type(self).__name__)
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.relative_attention_max_distance = relative_attention_max_distance

  def before_stack(self, context, scope):
    if self.relative_attention_type == "bias_shared":
      relative_position.shared_table(self, context, scope,
                                     mtf.Dimension("heads", self.num_heads))

  def make_params(self, context):
    return AttentionParams(
        context.mesh, context.model_dim, mtf.Dimension("heads", self.num_heads),
        mtf.Dimension("d_kv", self.key_value_size), context.variable_dtype,
        context.scope)

  def memory_antecedent(self, context, x):
    """The tensor keys and values are computed from."""
    return layers.rename_length_to_memory_length(x, context.length_dim.name)

  def mask(self, context):
    return context.self_attention_mask()

  def call(self, context, x):
    params = self.make_params(context)
    if context.incremental:
      q = annotate(context, params.compute_q(x, one_position=True))
      k, v, memory_length, mask = self.incremental_memory(context, params, x)
    else:
      memory = self.memory_antecedent(context, x)
      memory_length = _length_dim(memory, context.model_dim)
      q = annotate(context, params.compute_q(x))
      k = annotate(context, params.compute_k(memory))
      v = annotate(context, params.compute_v(memory))
      mask = self.mask(context)
      if context.mode == "first_part":
        self.record_memory(context, k, v)
    bias = relative_position.attention_bias(self, context, params.heads_dim,
                                            memory_length)
    if bias is not None:
      mask = annotate(context, bias if mask is None else mask + bias)
    o = annotate(context, attention(q, k, v, memory_length, params.kv_dim,
                                    mask, self.dropout_rate, context,
                                    name=context.scope))
    return params.compute_output(o, x.shape)

  def record_memory(self, context, k, v):
    """first_part mode: keys and values [batch..., heads, memory_length,
    d_kv] of the whole prefix become the caches the steps update."""
    context.record_new_states([k, v])

  def incremental_memory(self, context, params, x):
    """(k, v, memory_length, mask) for one new position: its key and value
    are written into the caches at context.position (a where on a one-hot
    of the position along memory_length, local on any split) and the query
    sees the positions up to it."""
    k_cache, v_cache = context.get_states(2)
    memory_length = context.memory_length_dim()
    if memory_length not in k_cache.shape.dims:
      raise ValueError("SelfAttention at %s: the key cache %s has no dim %s"
                       % (context.scope, k_cache.shape, memory_length))
    memory_pos = mtf.range(context.mesh, memory_length, tf.int32)
    here = mtf.equal(memory_pos, context.position)
    k = mtf.where(here, params.compute_k(x, one_position=True), k_cache,
                  output_shape=k_cache.shape)
    v = mtf.where(here, params.compute_v(x, one_position=True), v_cache,
                  output_shape=v_cache.shape)
    context.record_new_states([k, v])
    mask = visibility_to_bias(mtf.less_equal(memory_pos, context.position),
                              context.activation_dtype)
    return k, v, memory_length, mask


class EncDecAttention(SelfAttention):
  """Multi-head attention from the decoder to context.encoder_output.

  Example:
    >>> layer = EncDecAttention(num_heads=8, key_value_size=64)
  """

  def __init__(self, num_heads=8, key_value_size=128, dropout_rate=0.0,
               relative_attention_type=None, **unused_relative_kwargs):
    if relative_attention_type is not None:
      raise ValueError("EncDecAttention: relative_attention_type %r: T5's "
                       "relative position bias is for self-attention only"
                       % (relative_attention_type,))
    super().__init__(num_heads, key_value_size, dropout_rate)

  def memory_antecedent(self, context, x):
    enc = context.encoder_output
    if enc is None:
      raise ValueError("EncDecAttention at %s: the context has no "
                       "encoder_output (use it in a Bitransformer decoder)"
                       % context.scope)
    length = _length_dim(enc, context.model_dim)
    return layers.rename_length_to_memory_length(enc, length.name)

  def mask(self, context):
    return context.encdec_attention_mask()

  def record_memory(self, context, k, v):
    """The encoder's keys and values stay fixed while decoding: computed
    once in the first part, outside the decoding loop."""
    context.record_constant_state(k)
    context.record_constant_state(v)

  def incremental_memory(self, context, params, x):
    k, v = context.get_constant_state(), context.get_constant_state()
    return k, v, k.shape.dims[-2], self.mask(context)


class DenseReluDense(TransformerLayer):
  """Feed-forward block: d_model -> d_ff (activation, dropout) -> d_model,
  no biases ("<scope>/wi", "<scope>/wo").

  Example:
    >>> layer = DenseReluDense(hidden_size=2048, dropout_rate=0.1)
  """

  def __init__(self, hidden_size=4096, dropout_rate=0.0, activation="relu"):
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = get_activation(activation)

  def hidden(self, context, x, d_ff):
    return layers.dense(x, d_ff, reduced_dims=[context.model_dim],
                        use_bias=False, activation=self.activation,
                        variable_dtype=context.variable_dtype,
                        name=context.scope + "/wi")

  def call(self, context, x):
    d_ff = mtf.Dimension("d_ff", self.hidden_size)
    h = annotate(context, self.hidden(context, x, d_ff))
    h = dropout(h, context, self.dropout_rate, name=context.scope + "/dropout")
    return layers.dense(h, context.model_dim, reduced_dims=[d_ff],
                        use_bias=False, variable_dtype=context.variable_dtype,
                        name=context.scope + "/wo")


class GatedDenseReluDense(DenseReluDense):
  """Gated feed-forward (GLU variants, e.g. GEGLU): act(x.wi_0) * (x.wi_1),
  dropout, then wo.

  Example:
    >>> layer = GatedDenseReluDense(hidden_size=2048, activation="gelu")
  """

  def __init__(self, hidden_size=4096, dropout_rate=0.0, activation="gelu"):
    super().__init__(hidden_size, dropout_rate, activation)

  def hidden(self, context, x, d_ff):
    def proj(suffix, activation):
      return layers.dense(x, d_ff, reduced_dims=[context.model_dim],
                          use_bias=False, activation=activation,
                          variable_dtype=context.variable_dtype,
                          name=context.scope + "/" + suffix)
    return proj("wi_0", self.activation) * proj("wi_1", None)


__all__ = [
    "Context", "TransformerLayer", "FunctionLayer", "AttentionParams",
    "SelfAttention", "EncDecAttention", "DenseReluDense",
    "GatedDenseReluDense", "attention", "dropout", "step_random_uniform",
    "StepRandomUniformOperation", "get_activation", "visibility_to_bias",
    "sinusoidal_position_signal", "autoregressive_inputs",
    "delimited_lm_inputs_mask", "MASK_VALUE", "MODES",
]
