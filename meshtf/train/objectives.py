"""Training objectives as preprocessors on a stream of tokenized examples,
and the packer that fills rows with them. numpy only (no TensorFlow): each
function takes a numpy Generator, so an example's noise is a function of
the stream's seed and its place in the stream.

Objectives (task.objective), each a generator over token-id documents (a
list of ids, no EOS; or an (input ids, target ids) pair):

  lm               next-token LM: each document + EOS, cut into pieces of
                   at most `length` tokens (nothing is truncated away)
  seq2seq          (input, target) pairs, each + EOS, cut to `length`
  prefix_lm        T5's prefix_lm: each document is cut into segments of at
                   most length - 1 tokens; a segment of n tokens splits at a
                   point uniform in 1..n-1 into inputs (the prefix) and
                   targets (the rest), each + EOS (T5's
                   random_prefix_noise_mask with noise_density 0.5)
  span_corruption  T5's span corruption: a random chunk of at most 65,536
                   tokens of each document (select_random_chunk), the chunks
                   concatenated and split into segments of the raw length
                   whose corrupted inputs fill `length` (random_spans_helper:
                   568 tokens for inputs of 512 and targets of 114); each
                   segment's noise mask is random_spans_noise_mask (noise
                   density 0.15, mean noise span length 3); inputs keep the
                   non-noise tokens with one sentinel per noise span, targets
                   the noise spans, each after its sentinel
                   (noise_span_to_unique_sentinel /
                   nonnoise_span_to_unique_sentinel); both + EOS

An objective yields examples: {"targets": ids} or {"inputs": ids,
"targets": ids}. For a decoder-only model (decoder_only=True) an example
with inputs becomes one sequence, inputs then targets, with the loss on the
targets part only ("targets_loss").

Example:
  >>> rng = np.random.default_rng(0)
  >>> mask = random_spans_noise_mask(568, 0.15, 3.0, rng)
  >>> int(mask.sum()), int((np.diff(mask.astype(int)) == 1).sum())
  (85, 28)
"""
import numpy as np

from meshtf.train import data as data_lib

EOS = 1
PAD = 0
OBJECTIVES = ("lm", "seq2seq", "prefix_lm", "span_corruption")
# select_random_chunk's max_length in T5's span_corruption.
MAX_CHUNK_TOKENS = 65536


# --- T5's noise, from its definitions ------------------------------------------
def random_segmentation(num_items, num_segments, rng):
  """Lengths of a random partition of num_items items into num_segments
  non-empty segments (T5's _random_segmentation: the first item of each
  segment is chosen by shuffling num_segments - 1 markers among the
  num_items - 1 gaps).

  Example:
    >>> random_segmentation(10, 3, np.random.default_rng(0)).sum()
    10
  """
  markers = np.zeros(num_items - 1, np.int64)
  markers[:num_segments - 1] = 1
  rng.shuffle(markers)
  first_in_segment = np.concatenate([[0], markers])
  segment_id = np.cumsum(first_in_segment)
  return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(length, noise_density, mean_noise_span_length,
                            rng):
  """A [length] bool mask of noise tokens as T5 defines it: round(length *
  noise_density) noise tokens (at least 1, at most length - 1) in
  round(noise tokens / mean_noise_span_length) spans (at least 1); noise and
  non-noise span lengths are random partitions; the mask starts with a
  non-noise span and alternates.

  Example:
    >>> m = random_spans_noise_mask(20, 0.15, 3.0, np.random.default_rng(1))
    >>> int(m.sum()), bool(m[0])
    (3, False)
  """
  if noise_density == 0.0:
    return np.zeros(length, bool)
  orig_length = length
  length = max(length, 2)   # T5: avoids degeneracy
  num_noise_tokens = int(np.round(length * noise_density))
  num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
  num_noise_spans = int(np.round(num_noise_tokens / mean_noise_span_length))
  num_noise_spans = max(num_noise_spans, 1)
  num_nonnoise_tokens = length - num_noise_tokens
  noise_lengths = random_segmentation(num_noise_tokens, num_noise_spans, rng)
  nonnoise_lengths = random_segmentation(num_nonnoise_tokens,
                                         num_noise_spans, rng)
  interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(
      [num_noise_spans * 2])
  span_starts = np.cumsum(interleaved)[:-1]
  span_start_indicator = np.zeros(length, np.int64)
  span_start_indicator[span_starts] = 1
  span_num = np.cumsum(span_start_indicator)
  return (span_num % 2 == 1)[:orig_length]


def noise_span_to_unique_sentinel(tokens, noise_mask, first_sentinel):
  """T5's inputs: each noise span replaced by one sentinel, the first
  `first_sentinel` (vocab size - 1: <extra_id_0>), the next one less.

  Example:
    >>> noise_span_to_unique_sentinel(np.array([5, 6, 7, 8]),
    ...     np.array([False, True, True, False]), 99).tolist()
    [5, 99, 8]
  """
  tokens = np.asarray(tokens)
  prev_is_noise = np.concatenate([[False], noise_mask[:-1]])
  first_noise = noise_mask & ~prev_is_noise
  subsequent_noise = noise_mask & prev_is_noise
  sentinel = first_sentinel + 1 - np.cumsum(first_noise)
  out = np.where(first_noise, sentinel, tokens)
  return out[~subsequent_noise]


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, first_sentinel):
  """T5's targets: the noise spans, each after its sentinel (the inputs'
  function with the mask inverted)."""
  return noise_span_to_unique_sentinel(tokens, ~noise_mask, first_sentinel)


def span_corruption_lengths(inputs_length, noise_density=0.15,
                            mean_noise_span_length=3.0):
  """(raw tokens per segment, targets length) so that a segment's
  corrupted inputs with EOS are at most inputs_length long: T5's
  random_spans_helper (one sentinel per span in inputs and targets).

  Example:
    >>> span_corruption_lengths(512)
    (568, 114)
  """
  def lengths(tokens_length):
    num_noise = int(round(tokens_length * noise_density))
    num_nonnoise = tokens_length - num_noise
    num_spans = int(round(num_noise / mean_noise_span_length))
    return num_nonnoise + num_spans + 1, num_noise + num_spans + 1
  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  inputs, targets = lengths(tokens_length)
  if noise_density == 0.5 and targets > inputs:   # T5's "minor hack"
    tokens_length -= 1
    targets -= 1
  return tokens_length, targets


def max_noise_spans(tokens_length, noise_density=0.15,
                    mean_noise_span_length=3.0):
  """The most noise spans (= sentinels) a segment of tokens_length makes.

  Example:
    >>> max_noise_spans(568)
    28
  """
  num_noise = min(max(int(round(max(tokens_length, 2) * noise_density)), 1),
                  max(tokens_length, 2) - 1)
  return max(int(round(num_noise / mean_noise_span_length)), 1)


# --- objectives -------------------------------------------------------------------
class Objective(object):
  """An objective with its settings: `examples(documents, rng)` turns a
  unit's documents (token-id lists, or (input, target) pairs of them) into
  examples in the model's format.

  Args:
    name: one of OBJECTIVES.
    length: the row length (inputs and targets).
    decoder_only: the model is a decoder-only LM: inputs and targets of an
      example become one sequence with the loss on the targets.
    first_sentinel: span_corruption's first sentinel id (vocab size - 1).
    noise_density, mean_noise_span_length: span_corruption's.

  Example:
    >>> obj = Objective("span_corruption", 512, first_sentinel=32099)
    >>> obj.tokens_length, obj.targets_length
    (568, 114)
  """

  def __init__(self, name, length, decoder_only=False, first_sentinel=None,
               noise_density=0.15, mean_noise_span_length=3.0):
    if name not in OBJECTIVES:
      raise ValueError("objective %r is unknown: use one of %s" % (
          name, ", ".join(OBJECTIVES)))
    self.name = name
    self.length = int(length)
    self.decoder_only = bool(decoder_only)
    self.first_sentinel = first_sentinel
    self.noise_density = float(noise_density)
    self.mean_noise_span_length = float(mean_noise_span_length)
    if name == "span_corruption":
      self.tokens_length, self.targets_length = self._span_lengths()

  def _span_lengths(self):
    if not self.decoder_only:
      return span_corruption_lengths(self.length, self.noise_density,
                                     self.mean_noise_span_length)
    # One sequence: corrupted inputs and targets (each with EOS) together.
    tokens_length = 1
    while True:
      n = tokens_length + 1
      num_noise = int(round(n * self.noise_density))
      spans = int(round(num_noise / self.mean_noise_span_length))
      if (n - num_noise + spans + 1) + (num_noise + spans + 1) > self.length:
        break
      tokens_length = n
    num_noise = int(round(tokens_length * self.noise_density))
    spans = int(round(num_noise / self.mean_noise_span_length))
    return tokens_length, num_noise + spans + 1

  @property
  def pairs(self):
    """True when the objective reads (input, target) pairs."""
    return self.name == "seq2seq"

  @property
  def features(self):
    """The example features the model sees."""
    if self.decoder_only or self.name == "lm":
      return ("targets",)
    return ("inputs", "targets")

  def examples(self, documents, rng):
    """The examples of a unit's documents (an iterable), as a generator."""
    fn = {"lm": self._lm, "seq2seq": self._seq2seq,
          "prefix_lm": self._prefix_lm,
          "span_corruption": self._span_corruption}[self.name]
    for example in fn(documents, rng):
      yield self._shaped(example)

  def _shaped(self, example):
    """Decoder-only: inputs then targets in one sequence, the loss on the
    targets (and their EOS) only."""
    if "inputs" not in example or not self.decoder_only:
      return example
    x, y = example["inputs"][:-1], example["targets"]   # one EOS, at the end
    seq = np.concatenate([x, y])[:self.length]
    loss = np.zeros(len(seq), np.int32)
    loss[min(len(x), len(seq)):] = 1
    return {"targets": seq, "targets_loss": loss}

  def _lm(self, documents, rng):
    del rng
    for doc in documents:
      ids = np.append(np.asarray(doc, np.int32), EOS)
      for start in range(0, len(ids), self.length):
        yield {"targets": ids[start:start + self.length]}

  def _seq2seq(self, documents, rng):
    del rng
    for x, y in documents:
      yield {"inputs": _with_eos(x, self.length),
             "targets": _with_eos(y, self.length)}

  def _prefix_lm(self, documents, rng):
    # Each side + EOS fits `length`; a decoder-only sequence (prefix,
    # suffix, one EOS) too.
    room = max(self.length - 1, 2)
    for doc in documents:
      doc = np.asarray(doc, np.int32)
      for start in range(0, len(doc), room):
        segment = doc[start:start + room]
        if len(segment) < 2:
          continue
        cut = int(rng.integers(1, len(segment)))
        yield {"inputs": np.append(segment[:cut], EOS),
               "targets": np.append(segment[cut:], EOS)}

  def _span_corruption(self, documents, rng):
    n = self.tokens_length
    carry = np.zeros([0], np.int32)
    for doc in documents:
      doc = np.asarray(doc, np.int32)
      if len(doc) > MAX_CHUNK_TOKENS:   # select_random_chunk
        chunks = -(-len(doc) // MAX_CHUNK_TOKENS)
        start = MAX_CHUNK_TOKENS * int(rng.integers(0, chunks))
        doc = doc[start:start + MAX_CHUNK_TOKENS]
      carry = np.concatenate([carry, doc])
      while len(carry) >= n:
        yield self._corrupted(carry[:n], rng)
        carry = carry[n:]
    if len(carry) >= 2:    # the unit's last, shorter segment
      yield self._corrupted(carry, rng)

  def _corrupted(self, tokens, rng):
    mask = random_spans_noise_mask(len(tokens), self.noise_density,
                                   self.mean_noise_span_length, rng)
    return {"inputs": np.append(noise_span_to_unique_sentinel(
                tokens, mask, self.first_sentinel), EOS).astype(np.int32),
            "targets": np.append(nonnoise_span_to_unique_sentinel(
                tokens, mask, self.first_sentinel), EOS).astype(np.int32)}


def _with_eos(ids, length):
  ids = np.asarray(ids, np.int32)[:max(length - 1, 0)]
  return np.append(ids, EOS).astype(np.int32)


# --- packing ------------------------------------------------------------------------
class Packer(object):
  """Greedy packing of a stream of examples into rows of `length`, as
  meshtf.train.data.pack does for a list: an example joins the current row
  if every one of its features still fits, else the row is complete.
  add(example) returns the rows it completed; flush() the last one.

  A row is {feature: [length] int32, feature_segmentation (example number
  in the row, 0: padding), feature_position, "targets_weights": [length]
  float32 (1 where the loss counts: a targets token, or only the targets
  part of a decoder-only example's sequence)}.

  Example:
    >>> p = Packer(("targets",), 6)
    >>> p.add({"targets": np.array([5, 6, 1])}) + p.add({"targets": [7, 1]})
    []
    >>> p.flush()[0]["targets_segmentation"].tolist()
    [1, 1, 1, 2, 2, 0]
  """

  def __init__(self, features, length):
    self.features = tuple(features)
    self.length = int(length)
    self._group = []
    self._used = dict.fromkeys(self.features, 0)

  def add(self, example):
    ex = {k: np.asarray(example[k], np.int32)[:self.length]
          for k in self.features}
    if "targets_loss" in example:
      ex["targets_loss"] = np.asarray(example["targets_loss"],
                                      np.int32)[:self.length]
    out = []
    if self._group and any(self._used[k] + len(ex[k]) > self.length
                           for k in self.features):
      out.append(self._row())
    self._group.append(ex)
    for k in self.features:
      self._used[k] += len(ex[k])
    return out

  def flush(self):
    return [self._row()] if self._group else []

  def _row(self):
    row = {}
    for name in self.features:
      row.update(data_lib.pack_feature(self._group, name, self.length))
    weights = np.zeros(self.length, np.float32)
    at = 0
    for ex in self._group:
      n = len(ex["targets"])
      weights[at:at + n] = ex.get("targets_loss", 1)
      at += n
    row["targets_weights"] = weights
    self._group = []
    self._used = dict.fromkeys(self.features, 0)
    return row


__all__ = ["OBJECTIVES", "Objective", "Packer", "random_segmentation",
           "random_spans_noise_mask", "noise_span_to_unique_sentinel",
           "nonnoise_span_to_unique_sentinel", "span_corruption_lengths",
           "max_noise_spans"]
