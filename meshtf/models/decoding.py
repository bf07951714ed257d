"""Decoding for meshtf Transformers: incremental sampling / greedy decoding
with key-value caches, and beam search (Mesh TensorFlow's
`Unitransformer.sample_autoregressive`, `Unitransformer.beam_search`,
`Bitransformer.decode`). The searches on a logits function (Mesh
TensorFlow's beam_search.py: beam_search, greedy_decode,
compute_topk_scores_and_seq) are in meshtf/models/beam_search.py; this
module re-exports them.

How a decoder runs:
  1. first part: the model runs once over the whole prefix in parallel
     (Context mode "first_part"). Every SelfAttention records its keys and
     values [batch..., heads, memory_length, d_kv] as the initial caches;
     every EncDecAttention records the encoder output's keys and values as
     constant states (computed once, outside the loop).
  2. one mtf.while_loop over positions: each iteration feeds the token at
     position i - 1 (no length dim) through the model in "incremental"
     mode. A self-attention computes q, k, v for position i only, writes k
     and v into its caches where memory_position == i (local on any split
     of memory_length) and attends over the caches with memory_position
     <= i. The program has one copy of the model whatever the length.

Everything is a meshtf op, so decoding runs on any mesh and layout, on both
backends, and gives the same tokens as one device: the loop's condition is
a scalar reduced over the whole batch; sampling draws Gumbel noise from
`transformer_layers.step_random_uniform`, which depends on (graph seed, op
name, element index, step) only, with the position as the step, so each
position draws fresh numbers and every layout draws the same ones.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> from meshtf.models import transformer
  >>> lm = transformer.make_unitransformer(vocab_size=16, d_model=8,
  ...     num_layers=1, num_heads=2, d_kv=4, d_ff=16, max_length=8,
  ...     vocab_divisor=1)
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> prompt = mtf.import_tf_tensor(mesh, tf.constant([[5, 6, 0, 0, 0, 0,
  ...     0, 0]]), "batch:1;length:8")
  >>> ids = lm.sample_autoregressive(prompt, temperature=0.0)
  >>> ids.shape
  Shape([batch:1, length:8])
"""
import numbers

import tensorflow as tf

import meshtf as mtf
from meshtf import graph as graph_lib
from meshtf.models import transformer_layers as tl
# Mesh TF's beam_search.py names (mesh_tensorflow.beam_search resolves here)
# and the pieces the decoders below share.
from meshtf.models.beam_search import _at
from meshtf.models.beam_search import _check_ids
from meshtf.models.beam_search import _check_sampling
from meshtf.models.beam_search import _EXCLUDED_LOGIT
from meshtf.models.beam_search import beam_search
from meshtf.models.beam_search import compute_topk_scores_and_seq
from meshtf.models.beam_search import EOS_ID
from meshtf.models.beam_search import greedy_decode
from meshtf.models.beam_search import INF
from meshtf.models.beam_search import length_penalty
from meshtf.models.beam_search import prompt_length
from meshtf.models.beam_search import sample_logits


# --- the model in incremental mode --------------------------------------------
def incremental_logits_fn(model, ids, variable_dtype=None, encoder_output=None,
                          encoder_sequence_id=None, shared_params=None,
                          has_partial_sequences=True, bos_id=0):
  """Runs the first part of a decoder and returns (logits_fn, states).

  model: an autoregressive Unitransformer. ids: int32 [batch..., length];
  its batch dims (a beam dim included) are the decoding batch. The model
  runs once over autoregressive_inputs(ids) in "first_part" mode; states
  are the caches it recorded (zeros without has_partial_sequences, when
  the prefix is empty and its keys are never read).

  logits_fn(position, ids, states) -> (logits [batch..., vocab], new
  states): the next-token logits at `position` (a scalar int32 Tensor),
  fed ids[..., position - 1] (bos_id at position 0), in "incremental" mode.
  It is beam_search's logits_fn.

  Example:
    >>> logits_fn, states = incremental_logits_fn(lm, ids)
    >>> logits, states = logits_fn(position, ids, states)  # in a loop body
  """
  if not getattr(model, "autoregressive", False) or (
      model.output_vocab_dim is None):
    raise ValueError("decoding: %r is not an autoregressive Unitransformer "
                     "with an output vocabulary" % (model,))
  batch_dims, length_dim = ids.shape.dims[:-1], ids.shape.dims[-1]
  if (model.positional_embedding == "learned"
      and length_dim.size > model.max_length_dim.size):
    raise ValueError(
        "decoding %s: ids have %s:%d positions but the learned position "
        "table has max_length %d; decode at most max_length positions" % (
            model.name, length_dim.name, length_dim.size,
            model.max_length_dim.size))
  mesh = ids.mesh

  def context(mode, **kwargs):
    return tl.Context(
        mesh, batch_dims, length_dim, model.model_dim,
        variable_dtype=variable_dtype, mode=mode, autoregressive=True,
        encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id, shared_params=shared_params,
        model=model, **kwargs)

  first = context("first_part")
  inputs = tl.autoregressive_inputs(ids, length_dim=length_dim)
  if bos_id:
    is_first = mtf.equal(mtf.range(mesh, length_dim, tf.int32), 0)
    inputs = mtf.where(is_first, bos_id, inputs, output_shape=inputs.shape)
  model._call_internal(first, inputs)  # pylint: disable=protected-access
  states = list(first.new_states)
  if not has_partial_sequences:
    states = [mtf.zeros_like(s) for s in states]
  constant_states = list(first.constant_states)

  def logits_fn(position, ids_now, states_now):
    prev = _at(ids_now, position - 1, length_dim)
    if bos_id:
      prev = mtf.where(mtf.equal(position, 0), bos_id, prev,
                       output_shape=prev.shape)
    ctx = context("incremental", position=position, states=states_now,
                  constant_states=constant_states)
    logits = model._call_internal(ctx, prev)  # pylint: disable=protected-access
    if len(ctx.new_states) != len(states_now):
      raise ValueError(
          "decoding %s: the incremental step recorded %d states for the %d "
          "the first part recorded; a layer must record one updated state "
          "per state it reads" % (model.name, len(ctx.new_states),
                                  len(states_now)))
    return logits, list(ctx.new_states)
  return logits_fn, states


def sample_autoregressive(model, partial_sequences, stop_at_token=EOS_ID,
                          max_steps=None, temperature=0.0,
                          variable_dtype=None, encoder_output=None,
                          encoder_sequence_id=None, shared_params=None,
                          has_partial_sequences=True, never_end=False,
                          remove_partial_sequences=False,
                          sampling_keep_top_k=-1, bos_id=0,
                          name="sample_autoregressive"):
  """Continues each row of partial_sequences one token at a time with
  cached keys and values (Unitransformer.sample_autoregressive).

  partial_sequences: int32 [batch..., length]; each row's prompt is its
  prefix up to the first 0, the positions after it are generated. A row
  stops after it generates stop_at_token (None: never) or max_steps
  tokens; the loop ends when every row has stopped or the length is full.
  Positions a row did not generate stay 0 (Mesh TensorFlow kept sampling
  into them). temperature 0.0 is greedy (argmax); sampling_keep_top_k
  samples among the k largest logits; never_end forbids stop_at_token;
  remove_partial_sequences shifts each row left by its prompt length.

  Returns int32 [batch..., length].

  Example:
    >>> ids = sample_autoregressive(lm, prompts, temperature=0.7,
    ...                             sampling_keep_top_k=20)
  """
  _check_ids(name, "partial_sequences", partial_sequences, 1)
  if max_steps is not None and (not isinstance(max_steps, numbers.Integral)
                                or max_steps < 1):
    raise ValueError("%s: max_steps=%r must be None or a positive integer"
                     % (name, max_steps))
  if never_end and stop_at_token is None:
    raise ValueError("%s: never_end needs a stop_at_token" % name)
  _check_sampling(name, temperature, sampling_keep_top_k)
  ids0 = partial_sequences
  mesh = ids0.mesh
  length_dim = ids0.shape.dims[-1]
  vocab_dim = model.output_vocab_dim
  logits_fn, states = incremental_logits_fn(
      model, ids0, variable_dtype, encoder_output, encoder_sequence_id,
      shared_params, has_partial_sequences, bos_id)
  if has_partial_sequences:
    n_prompt = prompt_length(ids0, length_dim)
    start = mtf.reduce_min(n_prompt)
  else:
    n_prompt = mtf.zeros(mesh, ids0.shape.dims[:-1], dtype=tf.int32)
    start = mtf.constant(mesh, 0, dtype=tf.int32)
  # A row whose prompt fills the length has nothing to generate.
  done0 = mtf.greater_equal(n_prompt, length_dim.size)
  positions = mtf.range(mesh, length_dim, tf.int32)

  def cond_fn(i, ids, done, *unused_states):
    return mtf.logical_and(mtf.less(i, length_dim.size),
                           mtf.logical_not(mtf.reduce_all(done)))

  def body_fn(i, ids, done, *cache):
    logits, new_states = logits_fn(i, ids, list(cache))
    if never_end:
      logits = logits + mtf.one_hot(
          mtf.constant(mesh, stop_at_token, dtype=tf.int32), vocab_dim,
          on_value=_EXCLUDED_LOGIT, off_value=0.0, dtype=logits.dtype)
    token = sample_logits(logits, vocab_dim, temperature, sampling_keep_top_k,
                          step=i, name=name + "/sample")
    generating = mtf.logical_and(mtf.greater_equal(i, n_prompt),
                                 mtf.logical_not(done))
    write = mtf.logical_and(generating, mtf.equal(positions, i))
    ids = mtf.where(write, token, ids, output_shape=ids.shape)
    stop = mtf.zeros(mesh, done.shape, dtype=tf.bool)
    if stop_at_token is not None:
      stop = mtf.equal(token, stop_at_token)
    if max_steps is not None:
      stop = mtf.logical_or(stop, mtf.greater_equal(i + 1 - n_prompt,
                                                    max_steps))
    done = mtf.logical_or(done, mtf.logical_and(generating, stop),
                          output_shape=done.shape)
    return [i + 1, ids, done] + new_states

  outputs = mtf.while_loop(cond_fn, body_fn, [start, ids0, done0] + states,
                           name=name)
  ids = outputs[1]
  if has_partial_sequences and remove_partial_sequences:
    ids = mtf.dynamic_shift(ids, -n_prompt, length_dim, wrap=False)
  return ids


# --- beam search --------------------------------------------------------------
def model_beam_search(model, inputs, decode_length=None, variable_dtype=None,
                      encoder_output=None, encoder_sequence_id=None,
                      alpha=0.6, shared_params=None, bos_id=0,
                      eos_id=None, return_scores=False, prompts=None):
  """Beam search of an autoregressive Unitransformer
  (Unitransformer.beam_search).

  inputs: int32 zeros [batch..., beam, length] (as in Mesh TensorFlow;
  they give the beam dim). prompts: None or int32 [batch..., length], one
  prompt per row (its prefix up to the first 0), shared by the row's
  beams: the search continues each prompt (see beam_search; the score's
  length penalty counts the prompt's positions, decode_length counts
  positions, the prompt included). Returns the best beam [batch...,
  length], the prompt followed by the generated tokens (and its scores
  [batch...] with return_scores). eos_id defaults to model.eos_id.

  The prompt is fed token by token through the cached loop (forced steps),
  so the caches start empty and fill one position per step.

  Example:
    >>> best = model_beam_search(lm, mtf.zeros(mesh, "batch:8;beam:4;"
    ...                          "length:16", dtype=tf.int32), alpha=0.6,
    ...                          prompts=prompt_ids)   # [batch:8, length:16]
  """
  _check_ids("beam_search", "inputs", inputs, 2)
  beam_dim = inputs.shape.dims[-2]
  # No first part over the prompts: beam_search forces them one position at
  # a time, and each forced step writes that position's keys and values.
  logits_fn, states = incremental_logits_fn(
      model, inputs, variable_dtype, encoder_output, encoder_sequence_id,
      shared_params, has_partial_sequences=False, bos_id=bos_id)
  beams, scores = beam_search(
      logits_fn, inputs, alpha, states=states,
      eos_id=model.eos_id if eos_id is None else eos_id,
      decode_length=decode_length, prompts=prompts)
  best = mtf.gather(beams, 0, beam_dim)
  if return_scores:
    return best, mtf.gather(scores, 0, beam_dim)
  return best


def bitransformer_decode(model, inputs, variable_dtype=None, beam_size=1,
                         alpha=0.6, temperature=0.0, sampling_keep_top_k=-1,
                         decode_length_multiplier=1.5,
                         decode_length_constant=10, max_decode_length=None):
  """Encodes inputs once, then samples (beam_size 1) or beam-searches the
  decoder (Bitransformer.decode).

  inputs: int32 [batch..., length] (0 is padding). The output has length
  max_decode_length (default: the inputs' length); beam search decodes at
  most max input length * decode_length_multiplier +
  decode_length_constant tokens. Returns int32 [batch..., length].

  Example:
    >>> outputs = bitransformer_decode(model, inputs, beam_size=4)
  """
  _check_ids("decode", "inputs", inputs, 1)
  if not isinstance(beam_size, numbers.Integral) or beam_size < 1:
    raise ValueError("decode: beam_size=%r must be a positive integer"
                     % (beam_size,))
  if beam_size > 1 and (isinstance(temperature, graph_lib.Tensor)
                        or temperature != 0.0):
    raise ValueError("decode: beam search (beam_size=%d) is deterministic; "
                     "use temperature 0.0 or beam_size 1" % beam_size)
  mesh = inputs.mesh
  # pylint: disable=protected-access
  shared = model._shared_params(mesh, variable_dtype)
  encoder_sequence_id = mtf.minimum(inputs, 1)
  encoder_output = model.encode(inputs, mode="infer",
                                variable_dtype=variable_dtype,
                                encoder_sequence_id=encoder_sequence_id,
                                shared_params=shared)
  batch_dims, length_dim = inputs.shape.dims[:-1], inputs.shape.dims[-1]
  if max_decode_length is not None:
    length_dim = mtf.Dimension(length_dim.name, max_decode_length)
  decoder = model.decoder
  if beam_size == 1:
    return sample_autoregressive(
        decoder, mtf.zeros(mesh, batch_dims + [length_dim], dtype=tf.int32),
        stop_at_token=decoder.eos_id, temperature=temperature,
        variable_dtype=variable_dtype, encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id, shared_params=shared,
        has_partial_sequences=False, sampling_keep_top_k=sampling_keep_top_k)
  beam_dim = mtf.Dimension("beam", beam_size)
  input_length = mtf.reduce_sum(mtf.cast(mtf.not_equal(inputs, 0), tf.float32),
                                reduced_dim=inputs.shape.dims[-1])
  decode_length = mtf.cast(mtf.reduce_max(input_length)
                           * decode_length_multiplier
                           + decode_length_constant, tf.int32)
  return model_beam_search(
      decoder, mtf.zeros(mesh, batch_dims + [beam_dim, length_dim],
                         dtype=tf.int32),
      decode_length, variable_dtype, encoder_output, encoder_sequence_id,
      alpha, shared)


__all__ = [
    "EOS_ID", "INF", "length_penalty", "sample_logits", "prompt_length",
    "incremental_logits_fn", "sample_autoregressive", "beam_search",
    "compute_topk_scores_and_seq", "greedy_decode", "model_beam_search",
    "bitransformer_decode",
]
