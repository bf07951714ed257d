"""Search on a logits function: Mesh TensorFlow's beam_search.py
(beam_search, greedy_decode, compute_topk_scores_and_seq) and the pieces
meshtf's decoders share (sample_logits, length_penalty, prompt_length).

A logits_fn(step, ids, states) -> (logits, new states) is the model; the
search runs it in one mtf.while_loop, so it runs on any mesh and layout and
gives the same tokens as one device. meshtf/models/decoding.py builds such
a logits_fn from a Transformer (key/value caches) and re-exports every
name here; `mesh_tensorflow.beam_search` resolves to it under
meshtf.compat.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> from meshtf.models import beam_search
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> vocab = mtf.Dimension("vocab", 4)
  >>> def logits_fn(step, ids, states):    # always token 2
  ...   return mtf.ones(mesh, "batch:2") * mtf.one_hot(
  ...       mtf.constant(mesh, 2, dtype=tf.int32), vocab), states
  >>> ids = beam_search.greedy_decode(
  ...     logits_fn, mtf.zeros(mesh, "batch:2;length:3", dtype=tf.int32))
  >>> ids.shape                             # [[2, 2, 2], [2, 2, 2]]
  Shape([batch:2, length:3])
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


def compute_topk_scores_and_seq(sequences, scores, scores_to_gather, flags,
                                beam_dim, prefix="default"):
  """The beam_dim.size best of sequences' beams by scores.

  sequences: [batch..., old_beam, length]; scores, scores_to_gather
  (e.g. log probabilities where scores are length-penalised) and flags
  (e.g. finished): [batch..., old_beam]. The beams are ranked by scores,
  best first. The gathers are named prefix + "_seq", "_scores", "_flags".

  Returns (sequences [batch..., beam, length], scores_to_gather and flags
  [batch..., beam] of those beams, selector): selector is the float32
  one-hot [batch..., beam, old_beam] of each kept beam's old index.

  Example:
    >>> seq, gathered, flags, sel = compute_topk_scores_and_seq(
    ...     seq_double, scores_double, log_probs_double, finished_double,
    ...     mtf.Dimension("beam", 4), prefix="alive")
  """
  if sequences.shape.ndims < 2:
    raise ValueError("compute_topk_scores_and_seq: sequences %s need "
                     "[batch..., beam, length] dims" % (sequences.shape,))
  old_beam_dim = sequences.shape.dims[-2]
  _, indices = mtf.top_k(scores, old_beam_dim, beam_dim,
                         name=prefix + "_topk")
  selector = mtf.one_hot(indices, old_beam_dim, dtype=tf.float32)

  def gather(t, suffix):
    out = mtf.Shape([beam_dim if d == old_beam_dim else d
                     for d in t.shape.dims])
    return mtf.gather(t, indices, old_beam_dim, output_shape=out,
                      name=prefix + suffix)
  return (gather(sequences, "_seq"), gather(scores_to_gather, "_scores"),
          gather(flags, "_flags"), selector)


def greedy_decode(logits_fn, initial_ids, temperature=0.0,
                  initial_states=None, eos_id=EOS_ID, forced_ids=None,
                  use_tpu=True):
  """Decodes one position per step: argmax at temperature 0, else a sample
  from softmax(logits / temperature) (Mesh TF's beam_search.greedy_decode).

  logits_fn(step, ids, states) -> (logits [..., vocab], new states): step
  is the int32 position being decoded, ids [..., length] the sequences so
  far. Each step adds the token to ids at that position (initial_ids:
  zeros [..., length]); where forced_ids [..., length] is non-zero, its
  token is written instead. The loop stops when every sequence holds
  eos_id or the length is full; a sequence that ended keeps going until
  then, as in Mesh TF. Sampling draws fresh noise per position, the same
  on every layout. use_tpu is accepted for Mesh TF's signature.

  Returns int32 [..., length].

  Example:
    >>> ids = greedy_decode(logits_fn, mtf.zeros(mesh, "batch:8;length:16",
    ...                     dtype=tf.int32), temperature=0.7,
    ...                     initial_states=caches)
  """
  del use_tpu
  _check_ids("greedy_decode", "initial_ids", initial_ids, 1)
  mesh = initial_ids.mesh
  batch_dims = initial_ids.shape.dims[:-1]
  length_dim = initial_ids.shape.dims[-1]
  positions = mtf.range(mesh, length_dim, tf.int32)

  def cond_fn(step, ids, *unused_states):
    ended = mtf.reduce_any(mtf.equal(ids, eos_id), reduced_dim=length_dim)
    return mtf.logical_and(mtf.less(step, length_dim.size),
                           mtf.logical_not(mtf.reduce_all(ended)))

  def body_fn(step, ids, *states):
    logits, new_states = logits_fn(step, ids, states)
    if not set(logits.shape.dims[:-1]) <= set(batch_dims):
      raise ValueError("greedy_decode: logits_fn returned logits %s; they "
                       "must be [..., vocab] with dims of initial_ids %s "
                       "(without its length) before the vocab dim" % (
                           logits.shape, initial_ids.shape))
    token = sample_logits(logits, logits.shape.dims[-1], temperature,
                          step=step, name="greedy_decode/sample")
    if forced_ids is not None:
      forced = _at(forced_ids, step, length_dim)
      token = mtf.where(mtf.equal(forced, 0), token, forced,
                        output_shape=token.shape)
    here = mtf.equal(positions, step)
    ids = mtf.where(here, ids + token, ids, output_shape=ids.shape)
    return [step + 1, ids] + list(new_states)

  start = mtf.constant(mesh, 0, dtype=tf.int32)
  outputs = mtf.while_loop(cond_fn, body_fn,
                           [start, initial_ids] + list(initial_states or []),
                           name="greedy_decode")
  return outputs[1]


__all__ = [
    "EOS_ID", "INF", "length_penalty", "sample_logits", "prompt_length",
    "beam_search", "compute_topk_scores_and_seq", "greedy_decode",
]
