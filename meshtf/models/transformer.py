"""Transformer models: LayerStack, Unitransformer (e.g. a decoder-only
language model) and Bitransformer (encoder-decoder), as in Mesh
TensorFlow's `transformer.py`.

Activations are [batch, length, d_model]; the logits [batch, length, vocab].
All weights carry named dims (d_model, heads, d_kv, d_ff, vocab,
max_length), so a layout such as the Mesh-TensorFlow paper's
"batch:rows;vocab:cols;d_ff:cols;heads:cols" gives data + model
parallelism with no change to the model. Residual blocks are pre-norm:
x + dropout(layer(norm(x))), with a final norm.

Features (T2T / Mesh TensorFlow names), int32 [batch, length]:
  targets, inputs (Bitransformer or non-autoregressive models),
  {inputs,targets}_segmentation (packed examples: 1, 2, ... per segment,
  0 on padding), {inputs,targets}_position, and optionally targets_weights
  (a loss mask multiplied into the non-padding weights).

Decoding (meshtf/models/decoding.py): Unitransformer.sample_autoregressive
and beam_search, Bitransformer.decode -- cached keys and values, one
mtf.while_loop, any layout.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import transformer
  >>> model = transformer.make_unitransformer(vocab_size=16, d_model=8,
  ...     num_layers=1, num_heads=2, d_kv=4, d_ff=16, max_length=8)
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> targets = mtf.ones(mesh, "batch:2;length:8", dtype=tf.int32)
  >>> logits, loss, metrics = transformer.compute_logits_loss_metrics(
  ...     model, {"targets": targets})
  >>> logits.shape
  Shape([batch:2, length:8, vocab:128])
"""
import tensorflow as tf

import meshtf as mtf
from meshtf import graph as graph_lib
from meshtf.layouts import layout_rules as layout_rules_lib
from meshtf.models import decoding
from meshtf.models import dtypes
from meshtf.models import layer_stack as layer_stack_lib
from meshtf.models import layers
from meshtf.models import norms
from meshtf.models import pipeline as pipeline_lib
from meshtf.models import transformer_layers as tl

# Mesh TF's transformer module held these; its code uses them from here.
LayerStack = layer_stack_lib.LayerStack
NORMS = layer_stack_lib.NORMS
Context = tl.Context
TransformerLayer = tl.TransformerLayer


def _round_up(n, divisor):
  return -(-n // divisor) * divisor


# --- Unitransformer -----------------------------------------------------------
class Unitransformer(object):
  """One layer stack with embeddings and (optionally) output logits.

  An autoregressive model with an output vocabulary is a language model
  (or a Bitransformer's decoder); output_vocab_size=None makes an encoder
  that returns the final hidden states [batch, length, d_model].

  Args:
    layer_stack: a LayerStack.
    d_model: model width.
    input_vocab_size / output_vocab_size: vocabularies (rounded up to a
      multiple of vocab_divisor; the dims are both named "vocab").
    autoregressive: self-attention sees only earlier positions.
    max_length: size of the learned position table ("max_length").
    shared_embedding_and_softmax_weights: logits = x . embedding / sqrt(d).
    label_smoothing, z_loss: loss options (training mode only).
    positional_embedding: True / "learned", "sinusoidal", or False / None.
    loss_on_targets_only: [inputs, EOS, targets, EOS] language-model
      examples: no loss on the inputs part (through the first EOS).
    loss_denominator: divide the summed loss by this number instead of the
      number of weighted tokens.
    eos_id: the end-of-sequence id (loss_on_targets_only).
    layout, mesh_shape: optional, for layers that look at the mesh (MoE),
      as in Mesh TensorFlow.
    activation_layout: optional layout of the activations, apart from the
      rules that lay out the weights (GSPMD's sharding annotations, e.g.
      its "2D finalized" "batch:x;d_model:y;d_ff:y;heads:y"): the layers
      annotate their activations with it (transformer_layers.annotate).

  Example:
    >>> lm = Unitransformer(make_layer_stack(2, 4, 16, 64), d_model=32,
    ...                     input_vocab_size=256, output_vocab_size=256,
    ...                     autoregressive=True, max_length=128)
  """

  def __init__(self, layer_stack, d_model=1024, input_vocab_size=None,
               output_vocab_size=None, autoregressive=False, max_length=512,
               shared_embedding_and_softmax_weights=False,
               label_smoothing=0.0, z_loss=1e-4, name="transformer",
               vocab_divisor=128, positional_embedding=True,
               loss_on_targets_only=False, loss_denominator=None, eos_id=1,
               layout=None, mesh_shape=None, activation_layout=None):
    if not input_vocab_size:
      raise ValueError("Unitransformer %s: input_vocab_size is required" %
                       name)
    if autoregressive and not output_vocab_size:
      raise ValueError("Unitransformer %s: an autoregressive model needs an "
                       "output_vocab_size" % name)
    if positional_embedding not in (True, False, None, "learned",
                                    "sinusoidal"):
      raise ValueError("Unitransformer %s: positional_embedding %r is not "
                       "True/'learned', 'sinusoidal' or False" % (
                           name, positional_embedding))
    self.layer_stack = layer_stack
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.input_vocab_dim = mtf.Dimension(
        "vocab", _round_up(input_vocab_size, vocab_divisor))
    self.output_vocab_dim = (mtf.Dimension(
        "vocab", _round_up(output_vocab_size, vocab_divisor))
                             if output_vocab_size else None)
    self.autoregressive = autoregressive
    self.max_length_dim = mtf.Dimension("max_length", max_length)
    self.shared_embedding_and_softmax_weights = (
        shared_embedding_and_softmax_weights)
    if shared_embedding_and_softmax_weights and self.output_vocab_dim and (
        self.output_vocab_dim != self.input_vocab_dim):
      raise ValueError("Unitransformer %s: shared embedding and softmax "
                       "weights need equal vocabularies (%d vs %d)" % (
                           name, input_vocab_size, output_vocab_size))
    self.label_smoothing = label_smoothing
    self.z_loss = z_loss
    self.name = name
    self.positional_embedding = (
        "learned" if positional_embedding is True else
        positional_embedding or None)
    self.loss_on_targets_only = loss_on_targets_only
    self.loss_denominator = loss_denominator
    self.eos_id = eos_id
    # Some layers (MoE) size their groups by the mesh: context.model.layout.
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.activation_layout = (
        None if not activation_layout
        else layout_rules_lib.convert_to_layout_rules(activation_layout))

  # -- pieces ------------------------------------------------------------------
  def embedding_weights(self, mesh, variable_dtype, shared_params=None):
    """The [vocab, d_model] input embedding (shared_params["embedding"] if
    present), "<name>/embedding"."""
    if shared_params and "embedding" in shared_params:
      return shared_params["embedding"]
    return dtypes.get_variable(
        mesh, self.name + "/embedding",
        mtf.Shape([self.input_vocab_dim, self.model_dim]),
        dtype=variable_dtype, initializer=mtf.random_normal_initializer())

  def _position_signal(self, context, x):
    position = context.position
    if position is None:
      position = mtf.range(context.mesh, context.length_dim, tf.int32)
    if self.positional_embedding == "sinusoidal":
      return tl.sinusoidal_position_signal(position, self.model_dim, x.dtype)
    table = dtypes.get_variable(
        context.mesh, self.name + "/positional_embedding",
        mtf.Shape([self.max_length_dim, self.model_dim]),
        dtype=context.variable_dtype,
        initializer=mtf.random_normal_initializer())
    return mtf.gather(table, position, self.max_length_dim)

  def _call_internal(self, context, inputs):
    """Logits [batch..., length, vocab] (hidden states for an encoder)."""
    embedding = self.embedding_weights(context.mesh, context.variable_dtype,
                                       context.shared_params)
    x = mtf.gather(embedding, inputs, self.input_vocab_dim)
    if self.positional_embedding:
      x = mtf.add(x, self._position_signal(context, x), output_shape=x.shape)
    context.scope = self.name
    x = self.layer_stack.call(context, x)
    if self.output_vocab_dim is None:
      return x
    out_shape = mtf.Shape(x.shape.dims[:-1] + [self.output_vocab_dim])
    if self.shared_embedding_and_softmax_weights:
      return mtf.einsum([x * (self.model_dim.size ** -0.5), embedding],
                        output_shape=out_shape)
    return layers.dense(x, self.output_vocab_dim,
                        reduced_dims=[self.model_dim], use_bias=False,
                        variable_dtype=context.variable_dtype,
                        name=self.name + "/logits")

  def _check_ids(self, what, t, like=None):
    if t is None:
      return
    if not isinstance(t, graph_lib.Tensor) or not t.dtype.is_integer:
      raise ValueError("Unitransformer %s: %s must be an integer meshtf "
                       "Tensor [batch..., length], got %r" % (self.name, what,
                                                             t))
    if t.shape.ndims < 1:
      raise ValueError("Unitransformer %s: %s has no length dim (shape %s)"
                       % (self.name, what, t.shape))
    if like is not None and t.shape != like.shape:
      raise ValueError("Unitransformer %s: %s has shape %s but inputs have "
                       "shape %s" % (self.name, what, t.shape, like.shape))

  def make_context(self, inputs, mode="train", variable_dtype=None,
                   sequence_id=None, position=None, encoder_output=None,
                   encoder_sequence_id=None, shared_params=None, step=None,
                   losses=None):
    """The Context of one call on inputs [batch..., length]."""
    return tl.Context(
        inputs.mesh, inputs.shape.dims[:-1], inputs.shape.dims[-1],
        self.model_dim, variable_dtype=variable_dtype, mode=mode,
        autoregressive=self.autoregressive, position=position,
        sequence_id=sequence_id, encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id, losses=losses, step=step,
        shared_params=shared_params, model=self)

  # -- calls -------------------------------------------------------------------
  def call_with_metrics(self, inputs, targets=None, compute_loss=True,
                        mode="train", variable_dtype=None, sequence_id=None,
                        position=None, encoder_output=None,
                        encoder_sequence_id=None, shared_params=None,
                        step=None, loss_weights=None):
    """(logits, loss, metrics) for all positions in parallel.

    inputs, targets: int [batch..., length] (for a language model, inputs =
    autoregressive_inputs(targets)). loss and metrics are None unless
    compute_loss (then targets are required). metrics: "loss" (the
    training objective), "token_loss" (mean per-token cross entropy with
    smoothing and z-loss when training), "accuracy", "num_tokens" and
    "extra_loss" (losses layers appended to the context, e.g. MoE).

    Example:
      >>> logits, loss, metrics = lm.call_with_metrics(
      ...     autoregressive_inputs(targets), targets)
    """
    self._check_ids("inputs", inputs)
    self._check_ids("targets", targets, inputs)
    for what, t in (("sequence_id", sequence_id), ("position", position)):
      self._check_ids(what, t, inputs)
    if compute_loss and (targets is None or self.output_vocab_dim is None):
      raise ValueError("Unitransformer %s: compute_loss needs targets and an "
                       "output vocabulary" % self.name)
    context = self.make_context(
        inputs, mode, variable_dtype, sequence_id, position, encoder_output,
        encoder_sequence_id, shared_params, step,
        losses=[] if compute_loss else None)
    logits = self._call_internal(context, inputs)
    if not compute_loss:
      return logits, None, None
    loss, metrics = self.compute_loss(context, logits, targets, loss_weights)
    return logits, loss, metrics

  def call_simple(self, inputs, targets=None, compute_loss=True,
                  mode="train", variable_dtype=None, sequence_id=None,
                  position=None, encoder_output=None,
                  encoder_sequence_id=None, shared_params=None, step=None,
                  loss_weights=None):
    """(logits, loss) as in Mesh TensorFlow; see call_with_metrics.

    Example:
      >>> logits, loss = lm.call_simple(inputs, targets, compute_loss=True)
    """
    logits, loss, _ = self.call_with_metrics(
        inputs, targets, compute_loss, mode, variable_dtype, sequence_id,
        position, encoder_output, encoder_sequence_id, shared_params, step,
        loss_weights)
    return logits, loss

  # -- decoding (meshtf/models/decoding.py) ---------------------------------
  def sample_autoregressive(self, partial_sequences, stop_at_token=1,
                            max_steps=None, temperature=0.0,
                            variable_dtype=None, encoder_output=None,
                            encoder_sequence_id=None, encoder_inputs=None,
                            shared_params=None, has_partial_sequences=True,
                            encoder_layer_outputs=None, never_end=False,
                            remove_partial_sequences=False,
                            sampling_keep_top_k=-1, bos_id=0):
    """Samples a continuation of each row of partial_sequences [batch...,
    length] (its prompt: the prefix up to the first 0), one token at a time
    with cached keys and values, in one mtf.while_loop. temperature 0.0 is
    greedy. encoder_inputs and encoder_layer_outputs are Mesh TensorFlow
    arguments no meshtf layer reads. See decoding.sample_autoregressive.

    Example:
      >>> ids = lm.sample_autoregressive(prompts, temperature=0.0)
    """
    del encoder_inputs, encoder_layer_outputs
    return decoding.sample_autoregressive(
        self, partial_sequences, stop_at_token, max_steps, temperature,
        variable_dtype, encoder_output, encoder_sequence_id, shared_params,
        has_partial_sequences, never_end, remove_partial_sequences,
        sampling_keep_top_k, bos_id)

  def beam_search(self, inputs, decode_length, variable_dtype=None,
                  encoder_output=None, encoder_sequence_id=None,
                  encoder_inputs=None, alpha=0.6, shared_params=None,
                  encoder_layer_outputs=None, bos_id=0, prompts=None):
    """Beam search from inputs: int32 zeros [batch..., beam, length];
    returns the best beam [batch..., length]. prompts: None or int32
    [batch..., length], each row's prompt (its prefix up to the first 0)
    to continue; the result starts with it. See decoding.beam_search.

    Example:
      >>> best = lm.beam_search(mtf.zeros(mesh, "batch:8;beam:4;length:16",
      ...                                 dtype=tf.int32), decode_length=16,
      ...                       prompts=prompt_ids)  # [batch:8, length:16]
    """
    del encoder_inputs, encoder_layer_outputs
    return decoding.model_beam_search(
        self, inputs, decode_length, variable_dtype, encoder_output,
        encoder_sequence_id, alpha, shared_params, bos_id, prompts=prompts)

  def target_weights(self, context, targets, loss_weights=None):
    """float32 [batch..., length]: 1 on non-padding targets (times
    loss_weights; 0 on the inputs part with loss_on_targets_only)."""
    w = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
    if self.loss_on_targets_only:
      inputs_part = tl.delimited_lm_inputs_mask(
          targets, context.sequence_id, self.eos_id, context.length_dim)
      w = w * mtf.cast(mtf.logical_not(inputs_part), tf.float32)
    if loss_weights is not None:
      w = mtf.multiply(w, mtf.cast(loss_weights, tf.float32),
                       output_shape=w.shape)
    return w

  def compute_loss(self, context, logits, targets, loss_weights=None):
    """(scalar loss, metrics): weighted mean cross entropy over tokens, plus
    the context's extra losses."""
    vocab = self.output_vocab_dim
    smoothing = self.label_smoothing if context.train else 0.0
    off_value = smoothing / vocab.size
    # Kept for the backward pass: the logits in their dtype, not float32
    # copies or the one-hot targets (norms.cross_entropy).
    per_token = norms.cross_entropy(
        logits, targets, vocab, on_value=1.0 - smoothing + off_value,
        off_value=off_value, z_loss=self.z_loss if context.train else 0.0)
    logits = mtf.cast(logits, tf.float32)
    weights = self.target_weights(context, targets, loss_weights)
    # Accuracy: the target's logit is the largest (ties count as right).
    target_logit = mtf.reduce_sum(logits * mtf.one_hot(targets, vocab),
                                  reduced_dim=vocab)
    correct = mtf.cast(mtf.greater_equal(
        target_logit, mtf.reduce_max(logits, reduced_dim=vocab)), tf.float32)
    # The three sums over the tokens, all made before any is read: with the
    # batch split they go out as one fused allreduce, not three.
    num_tokens, loss_sum, correct_sum = mtf.reduce_together([
        mtf.reduce_sum(weights), mtf.reduce_sum(per_token * weights),
        mtf.reduce_sum(correct * weights)])
    token_loss = loss_sum / mtf.maximum(num_tokens, 1.0)
    # The objective: the mean over tokens, or Mesh TF's fixed denominator
    # (T5: batch x length), which weighs every token of a step alike.
    loss = (loss_sum * (1.0 / self.loss_denominator) if self.loss_denominator
            else token_loss)
    metrics = {
        "token_loss": token_loss,
        "accuracy": correct_sum / mtf.maximum(num_tokens, 1.0),
        "num_tokens": num_tokens,
    }
    if context.losses:
      extra = mtf.add_n([mtf.cast(l, tf.float32) for l in context.losses])
      metrics["extra_loss"] = extra
      loss = loss + extra
    metrics["loss"] = loss
    return loss, metrics


# --- Bitransformer ------------------------------------------------------------
class Bitransformer(object):
  """Encoder-decoder: an encoder Unitransformer (no output vocabulary) and
  an autoregressive decoder Unitransformer with EncDecAttention layers.

  shared_embedding: one "shared/embedding" table for the encoder inputs and
  the decoder (vocabularies must match).

  Example:
    >>> model = make_bitransformer(vocab_size=32000, d_model=512,
    ...                            num_layers=6, num_heads=8, d_kv=64,
    ...                            d_ff=2048)
  """

  def __init__(self, encoder, decoder, shared_embedding=True):
    if encoder.output_vocab_dim is not None:
      raise ValueError("Bitransformer: the encoder must have no output "
                       "vocabulary (output_vocab_size=None)")
    if not decoder.autoregressive:
      raise ValueError("Bitransformer: the decoder must be autoregressive")
    if shared_embedding and (encoder.input_vocab_dim !=
                             decoder.input_vocab_dim):
      raise ValueError("Bitransformer: shared_embedding needs equal "
                       "vocabularies (%s vs %s)" % (encoder.input_vocab_dim,
                                                    decoder.input_vocab_dim))
    if encoder.model_dim != decoder.model_dim:
      raise ValueError("Bitransformer: encoder d_model %d != decoder d_model "
                       "%d" % (encoder.model_dim.size, decoder.model_dim.size))
    self.encoder = encoder
    self.decoder = decoder
    self.shared_embedding = shared_embedding

  def _shared_params(self, mesh, variable_dtype):
    if not self.shared_embedding:
      return {}
    return {"embedding": dtypes.get_variable(
        mesh, "shared/embedding",
        mtf.Shape([self.encoder.input_vocab_dim, self.encoder.model_dim]),
        dtype=variable_dtype or dtypes.VariableDType(tf.float32),
        initializer=mtf.random_normal_initializer())}

  def encode(self, inputs, mode="train", variable_dtype=None,
             encoder_sequence_id=None, encoder_position=None,
             shared_params=None, step=None):
    """The encoder output [batch..., length, d_model] (kept separate so a
    decoder can reuse it across decoding steps).

    Example:
      >>> enc = model.encode(inputs)
    """
    if shared_params is None:
      shared_params = self._shared_params(inputs.mesh, variable_dtype)
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    out, _, _ = self.encoder.call_with_metrics(
        inputs, None, False, mode, variable_dtype, encoder_sequence_id,
        encoder_position, shared_params=shared_params, step=step)
    return out

  def call_with_metrics(self, inputs, targets, compute_loss=True,
                        mode="train", variable_dtype=None,
                        encoder_sequence_id=None, decoder_sequence_id=None,
                        encoder_position=None, decoder_position=None,
                        step=None, loss_weights=None):
    """(logits, loss, metrics): encode inputs, decode targets shifted right.

    Without sequence ids, padding (id 0) is its own segment in both.
    Extra losses of encoder layers (MoE) are added to the decoder's loss.

    Example:
      >>> logits, loss, metrics = model.call_with_metrics(inputs, targets)
    """
    shared = self._shared_params(inputs.mesh, variable_dtype)
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    if decoder_sequence_id is None:
      decoder_sequence_id = mtf.minimum(targets, 1)
    self.encoder._check_ids("inputs", inputs)
    self.decoder._check_ids("targets", targets)
    enc_ctx = self.encoder.make_context(
        inputs, mode, variable_dtype, encoder_sequence_id, encoder_position,
        shared_params=shared, step=step, losses=[] if compute_loss else None)
    encoder_output = self.encoder._call_internal(enc_ctx, inputs)
    dec_inputs = tl.autoregressive_inputs(targets, decoder_sequence_id)
    dec_ctx = self.decoder.make_context(
        dec_inputs, mode, variable_dtype, decoder_sequence_id,
        decoder_position, encoder_output, encoder_sequence_id, shared, step,
        losses=list(enc_ctx.losses or []) if compute_loss else None)
    logits = self.decoder._call_internal(dec_ctx, dec_inputs)
    if not compute_loss:
      return logits, None, None
    loss, metrics = self.decoder.compute_loss(dec_ctx, logits, targets,
                                              loss_weights)
    return logits, loss, metrics

  def decode(self, inputs, variable_dtype=None, beam_size=1, alpha=0.6,
             temperature=0.0, sampling_keep_top_k=-1,
             decode_length_multiplier=1.5, decode_length_constant=10,
             max_decode_length=None):
    """Encodes inputs [batch..., length] once, then samples (beam_size 1;
    temperature 0.0 is greedy) or beam-searches the decoder with cached
    keys and values. Returns int32 [batch..., length] (length
    max_decode_length if given). See decoding.bitransformer_decode.

    Example:
      >>> outputs = model.decode(inputs, beam_size=4, alpha=0.6)
    """
    return decoding.bitransformer_decode(
        self, inputs, variable_dtype, beam_size, alpha, temperature,
        sampling_keep_top_k, decode_length_multiplier,
        decode_length_constant, max_decode_length)

  def call_simple(self, inputs, targets, compute_loss=True, mode="train",
                  variable_dtype=None, encoder_sequence_id=None,
                  decoder_sequence_id=None, encoder_position=None,
                  decoder_position=None, step=None, loss_weights=None):
    """(logits, loss) as in Mesh TensorFlow; see call_with_metrics."""
    logits, loss, _ = self.call_with_metrics(
        inputs, targets, compute_loss, mode, variable_dtype,
        encoder_sequence_id, decoder_sequence_id, encoder_position,
        decoder_position, step, loss_weights)
    return logits, loss


# --- builders -----------------------------------------------------------------
def make_layer_stack(num_layers=6, num_heads=8, d_kv=64, d_ff=2048,
                     dropout_rate=0.0, encdec=False, gated=False,
                     activation=None, norm_type="rms_norm",
                     feedforward_layer_fn=None, norm_epsilon=1e-6,
                     pipeline_stages=1, num_microbatches=1,
                     circular_repeats=1, remat="none",
                     relative_attention_type=None,
                     relative_attention_num_buckets=32,
                     relative_attention_max_distance=128,
                     mask_padding=False):
  """A LayerStack of num_layers blocks: SelfAttention, EncDecAttention
  (encdec), then a feed-forward layer: DenseReluDense (relu), or
  GatedDenseReluDense (gelu) with gated=True, or feedforward_layer_fn(i)
  when given (a TransformerLayer or fn(x, context) -> y, e.g. an MoE
  layer every other block; returning None uses the default).
  pipeline_stages, num_microbatches, circular_repeats: all 1 (the
  default) runs the blocks in order; otherwise they run as a pipeline
  (meshtf/models/pipeline.py) with the same numbers. remat: what each block
  keeps for the backward pass (meshtf/models/remat.py: "none", "full",
  "einsum_outputs", "weight_einsum_outputs"). relative_attention_*: T5's
  relative position bias in the self-attention layers (SelfAttention);
  mask_padding: Mesh TF's zeroing of padding positions (LayerStack).

  Example:
    >>> stack = make_layer_stack(2, num_heads=4, d_kv=16, d_ff=64,
    ...                          feedforward_layer_fn=lambda i: None,
    ...                          relative_attention_type="bias_shared")
  """
  blocks = []
  for i in range(num_layers):
    blocks.append(tl.SelfAttention(
        num_heads, d_kv, dropout_rate, relative_attention_type,
        relative_attention_num_buckets, relative_attention_max_distance))
    if encdec:
      blocks.append(tl.EncDecAttention(num_heads, d_kv, dropout_rate))
    ffn = feedforward_layer_fn(i) if feedforward_layer_fn else None
    if ffn is None:
      cls = tl.GatedDenseReluDense if gated else tl.DenseReluDense
      ffn = cls(d_ff, dropout_rate, activation or (
          "gelu" if gated else "relu"))
    blocks.append(ffn)
  pipe = None
  if max(pipeline_stages, num_microbatches, circular_repeats) > 1:
    pipe = pipeline_lib.LayerPipeline(pipeline_stages, num_microbatches,
                                      circular_repeats)
  return LayerStack(blocks, dropout_rate, norm_epsilon, norm_type, pipe,
                    remat=remat, mask_padding=mask_padding)


# make_layer_stack's keywords that make_unitransformer and make_bitransformer
# pass through (the others go to Unitransformer).
_STACK_KEYS = ("gated", "activation", "norm_type", "feedforward_layer_fn",
               "norm_epsilon", "pipeline_stages", "num_microbatches",
               "circular_repeats", "remat", "relative_attention_type",
               "relative_attention_num_buckets",
               "relative_attention_max_distance", "mask_padding")


def make_unitransformer(vocab_size, d_model=512, num_layers=6, num_heads=8,
                        d_kv=64, d_ff=2048, max_length=512, dropout_rate=0.0,
                        autoregressive=True, name="decoder", **kwargs):
  """A decoder-only language model (or, autoregressive=False, an encoder
  with output logits). Keyword arguments of make_layer_stack (gated,
  activation, norm_type, feedforward_layer_fn, remat) and of Unitransformer
  (label_smoothing, z_loss, positional_embedding, vocab_divisor, ...).

  Example:
    >>> lm = make_unitransformer(vocab_size=32000, d_model=1024,
    ...                          num_layers=2, num_heads=16, d_kv=64,
    ...                          d_ff=4096)
  """
  stack_kwargs = {k: kwargs.pop(k) for k in _STACK_KEYS if k in kwargs}
  stack = make_layer_stack(num_layers, num_heads, d_kv, d_ff, dropout_rate,
                           **stack_kwargs)
  return Unitransformer(stack, d_model, vocab_size, vocab_size,
                        autoregressive, max_length, name=name, **kwargs)


def make_bitransformer(vocab_size, d_model=512, num_layers=6, num_heads=8,
                       d_kv=64, d_ff=2048, max_length=512, dropout_rate=0.0,
                       num_decoder_layers=None, shared_embedding=True,
                       **kwargs):
  """An encoder-decoder with num_layers encoder blocks and
  num_decoder_layers (default num_layers) decoder blocks; other keyword
  arguments as make_unitransformer (applied to both).

  Example:
    >>> model = make_bitransformer(vocab_size=32000, num_layers=6)
  """
  stack_kwargs = {k: kwargs.pop(k) for k in _STACK_KEYS if k in kwargs}
  encoder = Unitransformer(
      make_layer_stack(num_layers, num_heads, d_kv, d_ff, dropout_rate,
                       **stack_kwargs),
      d_model, vocab_size, None, False, max_length, name="encoder", **kwargs)
  decoder = Unitransformer(
      make_layer_stack(num_decoder_layers or num_layers, num_heads, d_kv,
                       d_ff, dropout_rate, encdec=True, **stack_kwargs),
      d_model, vocab_size, vocab_size, True, max_length, name="decoder",
      **kwargs)
  return Bitransformer(encoder, decoder, shared_embedding)


# --- features -> logits, loss, metrics ----------------------------------------
def import_features(mesh, features, batch_dim_name="batch",
                    length_dim_name="length", rows=None, batch_size=None):
  """TF / numpy arrays [batch, length] -> meshtf Tensors with dims
  batch and length (meshtf Tensors pass through).

  With rows (a worker's share of a multi-worker mesh, see mtf.host_rows)
  the arrays hold only those rows of a batch of batch_size, in order, and
  each processor of this host takes its slice from them (mtf.import_rows).

  Example:
    >>> feats = import_features(mesh, {"targets": tf.zeros([8, 16], tf.int32)})
    >>> feats["targets"].shape
    Shape([batch:8, length:16])
  """
  if rows is not None and batch_size is None:
    raise ValueError("import_features: rows=%s needs the global batch_size"
                     % (list(rows)[:4],))
  out = {}
  for name, value in sorted(features.items()):
    if isinstance(value, graph_lib.Tensor):
      out[name] = value
      continue
    value = tf.convert_to_tensor(value)
    if value.dtype == tf.int64:
      value = tf.cast(value, tf.int32)   # numpy's default integers
    if value.shape.rank != 2:
      raise ValueError("import_features: feature %r has shape %s; features "
                       "are [batch, length]" % (name, value.shape))
    b, l = value.shape.as_list()
    if rows is not None:
      shape = mtf.Shape([mtf.Dimension(batch_dim_name, batch_size),
                         mtf.Dimension(length_dim_name, l)])
      out[name] = mtf.import_rows(mesh, value, shape, rows,
                                  name="feature_" + name)
      continue
    out[name] = mtf.import_tf_tensor(
        mesh, value, mtf.Shape([mtf.Dimension(batch_dim_name, b),
                                mtf.Dimension(length_dim_name, l)]),
        name="feature_" + name)
  return out


def compute_logits_loss_metrics(model, features, mode="train", step=None,
                                variable_dtype=None):
  """(logits, loss, metrics) of a Unitransformer or Bitransformer on a
  batch of meshtf features (see the module docstring for their names).

  A language model (autoregressive Unitransformer) reads
  autoregressive_inputs(targets); a non-autoregressive one reads "inputs".

  Example:
    >>> logits, loss, metrics = compute_logits_loss_metrics(
    ...     lm, import_features(mesh, {"targets": ids}))
  """
  if "targets" not in features:
    raise ValueError("compute_logits_loss_metrics: features %s have no "
                     "'targets'" % sorted(features))
  targets = features["targets"]
  weights = features.get("targets_weights")
  if isinstance(model, Bitransformer):
    if "inputs" not in features:
      raise ValueError("compute_logits_loss_metrics: a Bitransformer needs "
                       "'inputs' (features %s)" % sorted(features))
    return model.call_with_metrics(
        features["inputs"], targets, True, mode, variable_dtype,
        features.get("inputs_segmentation"),
        features.get("targets_segmentation"), features.get("inputs_position"),
        features.get("targets_position"), step, weights)
  if not isinstance(model, Unitransformer):
    raise TypeError("compute_logits_loss_metrics: %r is not a Unitransformer "
                    "or Bitransformer" % (model,))
  sequence_id = features.get("targets_segmentation")
  if model.autoregressive:
    inputs = tl.autoregressive_inputs(targets, sequence_id)
  elif "inputs" in features:
    inputs = features["inputs"]
  else:
    raise ValueError("compute_logits_loss_metrics: a non-autoregressive "
                     "model needs 'inputs'")
  return model.call_with_metrics(
      inputs, targets, True, mode, variable_dtype, sequence_id,
      features.get("targets_position"), step=step, loss_weights=weights)


def loss_fn(model, mode="train", variable_dtype=None):
  """A training.TrainStep loss function for model: (mesh, tf features,
  step) -> (loss, metrics).

  Example:
    >>> step_fn = training.TrainStep(loss_fn(lm), impl, optimizer)
  """
  def fn(mesh, features, step=None):
    _, loss, metrics = compute_logits_loss_metrics(
        model, import_features(mesh, features), mode, step, variable_dtype)
    return loss, metrics
  return fn


__all__ = [
    "LayerStack", "Unitransformer", "Bitransformer", "make_layer_stack",
    "make_unitransformer", "make_bitransformer", "import_features",
    "compute_logits_loss_metrics", "loss_fn",
]
