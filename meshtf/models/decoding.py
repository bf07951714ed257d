"""Decoding for meshtf Transformers: incremental sampling / greedy decoding
with key-value caches, and beam search (Mesh TensorFlow's
`Unitransformer.sample_autoregressive`, `Unitransformer.beam_search`,
`Bitransformer.decode` and `beam_search.beam_search`).

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

# Mesh TensorFlow's end-of-sequence id and the "-infinity" of beam search
# (a finite number: -INF + x stays ordered and never becomes NaN).
EOS_ID = 1
INF = 1e7
# Added to the logits of tokens that may not be sampled.
_EXCLUDED_LOGIT = -1e9


# --- small pieces -------------------------------------------------------------
def length_penalty(length, alpha, dtype=tf.float32):
  """GNMT's length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016);
  beam search divides a sequence's log probability by it. length: a number
  or an integer/float meshtf Tensor.

  Example:
    >>> length_penalty(7, 0.6)          # ((5 + 7) / 6) ** 0.6
    1.5157165665103982
  """
  if isinstance(length, graph_lib.Tensor):
    return mtf.pow((mtf.cast(length, dtype) + 5.0) / 6.0,
                   mtf.constant(length.mesh, alpha, dtype=dtype))
  return ((5.0 + length) / 6.0) ** alpha


def _check_ids(op_name, what, t, min_dims):
  if not isinstance(t, graph_lib.Tensor) or t.dtype != tf.int32:
    raise ValueError("%s: %s must be an int32 meshtf Tensor, got %r" % (
        op_name, what, t))
  if t.shape.ndims < min_dims:
    raise ValueError("%s: %s has shape %s; it needs at least %d dims (%s)" % (
        op_name, what, t.shape, min_dims,
        "[batch..., beam, length]" if min_dims == 2 else "[batch..., length]"))


def _check_sampling(op_name, temperature, sampling_keep_top_k):
  if sampling_keep_top_k != -1 and (
      not isinstance(sampling_keep_top_k, numbers.Integral)
      or sampling_keep_top_k <= 0):
    raise ValueError("%s: sampling_keep_top_k=%r must be -1 (no limit) or a "
                     "positive integer" % (op_name, sampling_keep_top_k))
  if not isinstance(temperature, graph_lib.Tensor) and not (
      isinstance(temperature, numbers.Real) and temperature >= 0):
    raise ValueError("%s: temperature=%r must be a number >= 0 (0 is "
                     "greedy) or a float meshtf Tensor" % (op_name,
                                                          temperature))


def sample_logits(logits, vocab_dim, temperature=0.0, sampling_keep_top_k=-1,
                  step=None, name=None):
  """A token id per position of logits [..., vocab]: argmax at temperature
  0, else a sample from softmax(logits / temperature) (the Gumbel-max
  trick), restricted to the sampling_keep_top_k largest logits unless it
  is -1.

  The noise depends on (graph seed, name, element index) and on the
  integer scalar Tensor `step` (e.g. the decoding position), so a sampling
  op inside a while loop draws fresh numbers in every iteration; the
  result is the same on every layout. Without `step` it is
  mtf.sample_with_temperature (one draw per graph). temperature may be a
  number or a float Tensor broadcast by name (one per batch row, say).
  Ties at the k-th largest logit keep all tied entries.

  Example:
    >>> ids = sample_logits(logits, vocab_dim, 0.8, sampling_keep_top_k=40,
    ...                     step=position)
  """
  dims = [d for d in logits.shape.dims if d.name == getattr(
      vocab_dim, "name", vocab_dim)]
  if not dims:
    raise ValueError("sample_logits: logits %s %s have no dim %r" % (
        logits.name, logits.shape, vocab_dim))
  vocab_dim = dims[0]
  name = name or "sample_logits"
  _check_sampling("sample_logits", temperature, sampling_keep_top_k)
  if sampling_keep_top_k != -1:
    if sampling_keep_top_k < vocab_dim.size:
      kth = mtf.nth_largest_element(logits, sampling_keep_top_k - 1,
                                    vocab_dim, name=name + "/kth_largest")
      logits = mtf.where(mtf.less(logits, kth), _EXCLUDED_LOGIT, logits,
                         output_shape=logits.shape)
  if not isinstance(temperature, graph_lib.Tensor) and temperature == 0.0:
    return mtf.argmax(logits, vocab_dim, name=name)
  if step is None:
    return mtf.sample_with_temperature(logits, vocab_dim, temperature,
                                       name=name)
  # float32 noise: -log(-log(u)) is coarse in bfloat16; u is in (0, 1).
  logits = mtf.cast(logits, tf.float32)
  if isinstance(temperature, graph_lib.Tensor):
    temperature = mtf.cast(temperature, tf.float32)
  u = tl.step_random_uniform(step, logits.shape, name=name + "/noise")
  gumbel = -mtf.log(-mtf.log(u))
  noisy = mtf.add(logits, gumbel * temperature, output_shape=logits.shape)
  return mtf.argmax(noisy, vocab_dim, name=name)


def _at(ids, position, length_dim):
  """ids[..., position] (0 where position is out of range), any split."""
  here = mtf.one_hot(position, length_dim, dtype=ids.dtype)
  return mtf.reduce_sum(ids * here, reduced_dim=length_dim)


def prompt_length(partial_sequences, length_dim=None):
  """int32 [batch...]: the number of leading non-zero tokens of each row
  (the prompt is the prefix up to the first 0).

  Example:
    >>> n = prompt_length(ids)     # [[5, 6, 0, 7]] -> [2]
  """
  length_dim = length_dim or partial_sequences.shape.dims[-1]
  pos = mtf.range(partial_sequences.mesh, length_dim, tf.int32)
  first_zero = mtf.where(mtf.equal(partial_sequences, 0), pos,
                         length_dim.size,
                         output_shape=partial_sequences.shape)
  return mtf.reduce_min(first_zero, reduced_dim=length_dim)


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
def beam_search(logits_fn, initial_ids, alpha, states=None, eos_id=EOS_ID,
                stop_early=True, decode_length=None, use_tpu=True,
                dtype=tf.float32, layout=None, mesh_shape=None,
                num_prefilter=2, name="beam_search", prompts=None):
  """Beam search with GNMT length penalties (Mesh TensorFlow's
  beam_search.beam_search), in one mtf.while_loop.

  Each step grows every alive beam by every token, keeps the 2 * beam best
  candidates by score = log P / length_penalty(step + 1, alpha), moves
  those ending in eos_id to the `finished` set (the beam best finished
  sequences so far) and keeps the beam best others alive (their states
  follow them: each state is gathered along the beam dim by the parent
  beam). With stop_early the search ends once no alive beam can still beat
  the worst finished one (every log P only falls).

  Prompts (meshtf's addition): while position i is inside a row's prompt,
  the token at i is forced: it adds 0 to the log probability and every
  other token gets -INF, so beam 0 stays the only live beam through the
  prompt, and a forced token never finishes a sequence (even if it is
  eos_id). The search proper starts after each row's prompt; rows may have
  prompts of different lengths. log P sums the generated tokens only, but
  the length penalty counts every position, the prompt included: a
  sequence ending at position n scores log P / length_penalty(n + 1).

  Candidates grown from the -INF beams (the copies of beam 0 at the start,
  the losers of a forced step) are junk: they never join the finished set,
  whatever token they end in (their score -INF / penalty would beat the
  -INF of an empty finished slot), and they never outrank a real candidate.

  Args:
    logits_fn: (step, ids [batch..., beam, length], states) -> (logits
      [batch..., beam, vocab], new states); step is the scalar int32
      position being decoded.
    initial_ids: int32 [batch..., beam, length], zeros.
    alpha: the length penalty's exponent.
    states: meshtf Tensors with the beam dim (e.g. key/value caches).
    eos_id: the end-of-sequence id.
    stop_early: stop once the best sequences are certain.
    decode_length: the number of positions to decode, the prompt included
      (int or scalar int Tensor; capped at the length): the search runs
      positions 0 .. decode_length - 1.
    use_tpu, layout, mesh_shape, num_prefilter: accepted for Mesh
      TensorFlow's signature and unused: meshtf's top_k is exact on a split
      vocab (per-beam top 2 * beam, then the top over the candidates).
    dtype: float type of log probabilities and scores.
    name: the loop's name.
    prompts: None or int32 [batch..., length] (initial_ids' dims without
      the beam dim): each row's prompt is its prefix up to the first 0 (see
      prompt_length), shared by the row's beams. All zeros is the same as
      None.

  Returns:
    (sequences [batch..., beam, length], scores [batch..., beam]), best
    first; each sequence holds its row's prompt, then the generated tokens.
    Rows where nothing finished return the alive beams, scored with the
    penalty of their length (Mesh TensorFlow left those unpenalised).
    Beams scored below -INF / 2 are fillers (fewer than beam sequences
    finished).

  Example:
    >>> beams, scores = beam_search(logits_fn, zeros_ids, alpha=0.6,
    ...                             states=caches, prompts=prompt_ids)
  """
  del use_tpu, layout, mesh_shape, num_prefilter
  _check_ids(name, "initial_ids", initial_ids, 2)
  states = list(states or [])
  batch_dims = initial_ids.shape.dims[:-2]
  beam_dim, length_dim = initial_ids.shape.dims[-2:]
  n_beam = beam_dim.size
  mesh = initial_ids.mesh
  for s in states:
    if beam_dim not in s.shape.dims:
      raise ValueError("%s: state %s %s has no beam dim %s; states are "
                       "reordered along it" % (name, s.name, s.shape,
                                               beam_dim))
  double_dim = mtf.Dimension("double_beam", 2 * n_beam)
  triple_dim = mtf.Dimension("triple_beam", 3 * n_beam)
  old_beam_dim = mtf.Dimension("old_beam", n_beam)
  for d in (double_dim, triple_dim, old_beam_dim):
    if initial_ids.shape.has_dim_name(d.name):
      raise ValueError("%s: initial_ids %s use the name %r, which beam "
                       "search needs for its own dims" % (
                           name, initial_ids.shape, d.name))
  batch_by_beam = mtf.Shape(batch_dims + [beam_dim])
  if prompts is not None:
    want = mtf.Shape(batch_dims + [length_dim])
    if (not isinstance(prompts, graph_lib.Tensor)
        or prompts.dtype != tf.int32
        or set(prompts.shape.dims) != set(want.dims)
        or prompts.shape.ndims != want.ndims):
      raise ValueError(
          "%s: prompts %s must be an int32 meshtf Tensor with initial_ids' "
          "dims without the beam dim %s, i.e. %s (initial_ids %s); pass one "
          "prompt per row, shared by its beams (e.g. mtf.gather(ids, 0, "
          "%r) of ids with a beam dim)" % (
              name, getattr(prompts, "shape", prompts), beam_dim, want,
              initial_ids.shape, beam_dim.name))
  if decode_length is None:
    decode_length = mtf.constant(mesh, length_dim.size, dtype=tf.int32)
  elif isinstance(decode_length, graph_lib.Tensor):
    decode_length = mtf.minimum(mtf.cast(decode_length, tf.int32),
                                length_dim.size)
  else:
    decode_length = mtf.constant(mesh, min(int(decode_length),
                                           length_dim.size), dtype=tf.int32)
  positions = mtf.range(mesh, length_dim, tf.int32)
  if prompts is not None:
    n_prompt = prompt_length(prompts, length_dim)
    # Every beam (and every filler of the finished set) starts with the
    # prompt; the forced steps write the same tokens again.
    initial_ids = mtf.where(mtf.less(positions, n_prompt), prompts,
                            initial_ids, output_shape=initial_ids.shape)

  # Beam 0 starts alone; the others' -INF keeps their copies out.
  alive_log_probs = mtf.broadcast(mtf.one_hot(
      mtf.constant(mesh, 0, dtype=tf.int32), beam_dim, on_value=0.0,
      off_value=-INF, dtype=dtype), batch_by_beam)
  finished_scores = mtf.constant(mesh, -INF, batch_by_beam, dtype=dtype)
  finished_flags = mtf.zeros(mesh, batch_by_beam, dtype=tf.bool)

  def gather_beams(t, index, dim, new_dim):
    """t's entries along dim at index [batch..., new_dim] (new_dim in
    place of dim)."""
    out = mtf.Shape([new_dim if d == dim else d for d in t.shape.dims])
    return mtf.gather(t, index, dim, output_shape=out)

  def grow_topk(i, alive_seq, alive_log_probs, cache):
    logits, new_cache = logits_fn(i, alive_seq, cache)
    vocab = [d for d in logits.shape.dims if d not in batch_by_beam.dims]
    if len(vocab) != 1 or logits.shape.ndims != len(batch_by_beam.dims) + 1:
      raise ValueError("%s: logits_fn returned logits %s; they must be %s "
                       "plus a vocab dim" % (name, logits.shape,
                                             batch_by_beam))
    vocab_dim = vocab[0]
    step_log_probs = mtf.log_softmax(mtf.cast(logits, dtype), vocab_dim)
    forcing = None
    if prompts is not None:
      # Inside a row's prompt only the prompt token may follow (log P + 0).
      forcing = mtf.less(i, n_prompt)
      forced = mtf.one_hot(_at(prompts, i, length_dim), vocab_dim,
                           on_value=0.0, off_value=-INF, dtype=dtype)
      step_log_probs = mtf.where(forcing, forced, step_log_probs,
                                 output_shape=step_log_probs.shape)
    log_probs = mtf.add(step_log_probs, alive_log_probs,
                        output_shape=logits.shape)
    penalty = length_penalty(i + 1, alpha, dtype)
    scores = log_probs / penalty
    # The best 2 * beam of beam x vocab: each beam's best 2 * beam (top_k
    # on a split vocab is exact), then the best of those candidates.
    per_beam = mtf.Dimension("beam_top", min(2 * n_beam, vocab_dim.size))
    cand_dim = mtf.Dimension("beam_candidates", n_beam * per_beam.size)
    beam_scores, beam_ids = mtf.top_k(scores, vocab_dim, per_beam)
    flat = mtf.Shape(batch_dims + [cand_dim])
    beam_scores = mtf.reshape(mtf.transpose(
        beam_scores, mtf.Shape(batch_dims + [beam_dim, per_beam])), flat)
    beam_ids = mtf.reshape(mtf.transpose(
        beam_ids, mtf.Shape(batch_dims + [beam_dim, per_beam])), flat)
    top_scores, top_cand = mtf.top_k(beam_scores, cand_dim, double_dim)
    top_ids = mtf.gather(beam_ids, top_cand, cand_dim)
    top_parent = mtf.floordiv(top_cand, per_beam.size)
    top_seq = gather_beams(alive_seq, top_parent, beam_dim, double_dim)
    top_seq = mtf.where(mtf.equal(positions, i), top_ids, top_seq,
                        output_shape=top_seq.shape)
    top_log_probs = top_scores * penalty
    # Junk (log P <= -INF / 2, grown from a -INF beam or a token a prompt
    # excluded) never finishes: dividing by the penalty lifts -INF above
    # the -INF of an empty finished slot. Nor does a forced prompt token.
    top_finished = mtf.logical_and(mtf.equal(top_ids, eos_id),
                                   mtf.greater(top_log_probs, -INF / 2))
    if forcing is not None:
      top_finished = mtf.logical_and(top_finished, mtf.logical_not(forcing),
                                     output_shape=top_finished.shape)
    return (top_seq, top_log_probs, top_scores, top_finished, top_parent,
            new_cache)

  def body_fn(i, alive_seq, alive_log_probs, finished_seq, finished_scores,
              finished_flags, *cache):
    (top_seq, top_log_probs, top_scores, top_finished, top_parent,
     new_cache) = grow_topk(i, alive_seq, alive_log_probs, list(cache))
    finished_f = mtf.cast(top_finished, dtype)
    # Alive: the best candidates that have not ended.
    _, keep = mtf.top_k(top_scores + finished_f * -INF, double_dim, beam_dim)
    alive_seq = gather_beams(top_seq, keep, double_dim, beam_dim)
    # A finished candidate kept alive (fewer than beam others) is dead:
    # -INF, so it is never extended past its EOS into a real candidate.
    alive_log_probs = gather_beams(top_log_probs + finished_f * -INF, keep,
                                   double_dim, beam_dim)
    parent = gather_beams(top_parent, keep, double_dim, beam_dim)
    new_cache = [gather_beams(mtf.rename_dimension(s, beam_dim.name,
                                                   old_beam_dim.name),
                              parent, old_beam_dim, beam_dim)
                 for s in new_cache]
    # Finished: the best of the old finished and the candidates that ended.
    def join(old, new):
      return mtf.concat([mtf.rename_dimension(old, beam_dim.name,
                                              triple_dim.name),
                         mtf.rename_dimension(new, double_dim.name,
                                              triple_dim.name)],
                        triple_dim.name)
    all_scores = join(finished_scores, top_scores + (1.0 - finished_f) * -INF)
    _, best = mtf.top_k(all_scores, triple_dim, beam_dim)
    finished_seq = gather_beams(join(finished_seq, top_seq), best, triple_dim,
                                beam_dim)
    finished_scores = gather_beams(all_scores, best, triple_dim, beam_dim)
    finished_flags = gather_beams(join(finished_flags, top_finished), best,
                                  triple_dim, beam_dim)
    return [i + 1, alive_seq, alive_log_probs, finished_seq, finished_scores,
            finished_flags] + new_cache

  def cond_fn(i, unused_alive_seq, alive_log_probs, unused_finished_seq,
              finished_scores, finished_flags, *unused_cache):
    more = mtf.less(i, decode_length)
    if not stop_early:
      return more
    # The best score the best alive beam could still reach: its log P can
    # only fall, and the penalty is largest at the full length.
    best_alive = mtf.gather(alive_log_probs, 0, beam_dim) / length_penalty(
        decode_length, alpha, dtype)
    flags = mtf.cast(finished_flags, dtype)
    worst_finished = mtf.reduce_min(finished_scores * flags,
                                    reduced_dim=beam_dim)
    none_finished = 1.0 - mtf.cast(mtf.reduce_any(finished_flags,
                                                  reduced_dim=beam_dim), dtype)
    worst_finished = worst_finished + none_finished * -INF
    certain = mtf.reduce_all(mtf.greater(worst_finished, best_alive))
    return mtf.logical_and(more, mtf.logical_not(certain))

  outputs = mtf.while_loop(
      cond_fn, body_fn,
      [mtf.constant(mesh, 0, dtype=tf.int32), initial_ids, alive_log_probs,
       initial_ids, finished_scores, finished_flags] + states, name=name)
  steps, alive_seq, alive_log_probs, finished_seq, finished_scores = (
      outputs[:5])
  any_finished = mtf.reduce_any(outputs[5], reduced_dim=beam_dim)
  sequences = mtf.where(any_finished, finished_seq, alive_seq,
                        output_shape=finished_seq.shape)
  scores = mtf.where(any_finished, finished_scores,
                     alive_log_probs / length_penalty(steps, alpha, dtype),
                     output_shape=finished_scores.shape)
  return sequences, scores


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
    "model_beam_search", "bitransformer_decode",
]
