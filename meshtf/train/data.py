"""Training data: synthetic algorithmic problems, plain text files (with a
sentencepiece vocabulary trained on first use) and local TFDS datasets.

Every source yields batches as dicts of int32 numpy arrays with Mesh
TensorFlow's feature names:
  targets               [batch, length] token ids (0 = padding, 1 = EOS)
  targets_weights       [batch, length] 1.0 where the loss counts
  targets_segmentation  [batch, length] example id within a packed row
                        (0 = padding), targets_position: position in it
  inputs, inputs_segmentation, inputs_position   (seq2seq only)

Batches are deterministic functions of (seed, step, row): a restarted run
sees the same data from any step on, and each worker of a multi-worker mesh
makes or reads only its own rows (`rows=`).

Example:
  >>> task = SyntheticTask("copy", vocab_size=16, length=16)
  >>> batch = task.batch(step=0, batch_size=4, seed=1)
  >>> batch["targets"].shape
  (4, 16)
"""
import numpy as np

PAD, EOS, SEP = 0, 1, 2
_FIRST_SYMBOL = 3
PLUS = _FIRST_SYMBOL + 10   # addition: digits are 3..12, then "+"
PROBLEMS = ("copy", "reverse", "addition")


def _row_rng(seed, step, row, salt=0):
  # One generator per (seed, step, row): any row of any step is reproducible
  # on its own, whatever the batch split or restart point.
  return np.random.default_rng([int(seed), int(step), int(row), salt])


class SyntheticTask(object):
  """Tensor2Tensor-style algorithmic problems, generated on the fly.

  Args:
    problem: "copy" (output = input), "reverse" (output = reversed input) or
      "addition" (decimal a+b -> sum, digits least significant first).
    vocab_size: number of token ids (0 pad, 1 EOS, 2 separator, then
      symbols; addition needs at least 14: ten digits and '+').
    length: sequence length of `targets` (LM format: input, separator,
      output, EOS, padding) or of both `inputs` and `targets` (seq2seq).
    seq2seq: False for decoder-only LM examples (loss on the output part
      only), True for encoder-decoder examples.
  """

  def __init__(self, problem, vocab_size, length, seq2seq=False,
               min_symbols=2):
    if problem not in PROBLEMS:
      raise ValueError("Unknown synthetic problem %r: use one of %s"
                       % (problem, ", ".join(PROBLEMS)))
    need = 14 if problem == "addition" else _FIRST_SYMBOL + 2
    if vocab_size < need:
      raise ValueError("Synthetic problem %r needs vocab_size >= %d, got %d"
                       % (problem, need, vocab_size))
    self.problem = problem
    self.vocab_size = vocab_size
    self.length = length
    self.seq2seq = seq2seq
    # LM: n input + 1 separator + n output + 1 EOS <= length.
    self.max_symbols = (length - 1) if seq2seq else (length - 2) // 2
    if problem == "addition":
      # a + b: digits(a) + 1 + digits(b) symbols; sum has <= digits + 1.
      self.max_digits = max(1, (self.max_symbols - 2) // 2)
    self.min_symbols = min(min_symbols, self.max_symbols)
    if self.max_symbols < 1:
      raise ValueError("Synthetic problem length %d is too short" % length)

  def example(self, rng):
    """(input tokens, output tokens) of one random example."""
    if self.problem == "addition":
      na = rng.integers(1, self.max_digits + 1)
      nb = rng.integers(1, self.max_digits + 1)
      a = int("".join(str(d) for d in rng.integers(0, 10, na)))
      b = int("".join(str(d) for d in rng.integers(0, 10, nb)))
      x = _digits(a) + [PLUS] + _digits(b)
      return x, self.answer(x)
    n = rng.integers(self.min_symbols, self.max_symbols + 1)
    x = [int(t) for t in rng.integers(_FIRST_SYMBOL, self.vocab_size, n)]
    return x, self.answer(x)

  def answer(self, x):
    """The output tokens for input tokens x (a prompt of the task).

    Example:
      >>> SyntheticTask("reverse", 16, 16).answer([5, 6, 7])
      [7, 6, 5]
    """
    if self.problem != "addition":
      return list(x) if self.problem == "copy" else list(x)[::-1]
    x = list(x)
    if x.count(PLUS) != 1 or x[0] == PLUS or x[-1] == PLUS:
      raise ValueError("an addition prompt is digits (%d..%d, least "
                       "significant first), %d (+), digits; got %s" % (
                           _FIRST_SYMBOL, _FIRST_SYMBOL + 9, PLUS, x))
    i = x.index(PLUS)
    value = lambda ds: int("".join(str(d - _FIRST_SYMBOL)  # noqa: E731
                                   for d in reversed(ds)))
    return _digits(value(x[:i]) + value(x[i + 1:]))

  def check_prompt(self, x):
    """Raises ValueError (naming the limits) if x is not an input of this
    task: symbols only (ids _FIRST_SYMBOL..vocab_size-1) and short enough
    that input, output and EOS fit the length."""
    x = list(x)
    bad = [t for t in x if not _FIRST_SYMBOL <= t < self.vocab_size]
    if not x or bad:
      raise ValueError("%s prompts are token ids in %d..%d; got %s" % (
          self.problem, _FIRST_SYMBOL, self.vocab_size - 1, x or "nothing"))
    y = self.answer(x)
    need = len(x) + 1 + len(y) + 1 if not self.seq2seq else max(len(x),
                                                                len(y)) + 1
    if need > self.length:
      raise ValueError("the %d-token prompt and its %d-token answer need "
                       "length >= %d, the length is %d" % (
                           len(x), len(y), need, self.length))

  def batch(self, step, batch_size, seed=0, rows=None):
    """The batch of `step` (only `rows` of it, if given: a worker's share)."""
    rows = range(batch_size) if rows is None else rows
    return self.batch_of([self.example(_row_rng(seed, step, row))
                          for row in rows])

  def batch_of(self, examples):
    """A batch of (input tokens, output tokens) pairs in the task's format.

    Example:
      >>> task = SyntheticTask("reverse", 16, 8)
      >>> task.batch_of([([5, 6], [6, 5])])["targets"].tolist()
      [[5, 6, 2, 6, 5, 1, 0, 0]]
    """
    out = {}
    for x, y in examples:
      if self.seq2seq:
        feats = {"inputs": _padded(x + [EOS], self.length),
                 "targets": _padded(y + [EOS], self.length)}
        feats["targets_weights"] = (feats["targets"] != PAD).astype(np.float32)
      else:
        seq = x + [SEP] + y + [EOS]
        feats = {"targets": _padded(seq, self.length)}
        weights = np.zeros(self.length, np.float32)
        weights[len(x) + 1:len(seq)] = 1.0  # predict output and EOS only
        feats["targets_weights"] = weights
      for k, v in _segment_features(feats).items():
        out.setdefault(k, []).append(v)
    return {k: np.stack(v) for k, v in out.items()}


def _digits(value):
  """Decimal digits of value as symbols, least significant first."""
  return [_FIRST_SYMBOL + int(c) for c in reversed(str(value))]


def _padded(tokens, length):
  tokens = list(tokens)[:length]
  return np.array(tokens + [PAD] * (length - len(tokens)), np.int32)


def _segment_features(feats):
  """Adds <name>_segmentation (1 on tokens) and <name>_position."""
  out = dict(feats)
  for name in ("inputs", "targets"):
    if name in feats:
      seg = (feats[name] != PAD).astype(np.int32)
      out[name + "_segmentation"] = seg
      out[name + "_position"] = (np.arange(len(seg)) * seg).astype(np.int32)
  return out


def pack(examples, length):
  """Greedily packs examples (dicts {feature: 1-D token array}, each ending
  in EOS) into rows of `length`: an example joins the current row if every
  one of its features still fits. Returns rows as dicts with <feature>,
  <feature>_segmentation (example number in the row, 0 = padding) and
  <feature>_position.

  Example:
    >>> rows = pack([{"targets": np.array([5, 6, 1])},
    ...              {"targets": np.array([7, 1])}], length=6)
    >>> rows[0]["targets_segmentation"].tolist()
    [1, 1, 1, 2, 2, 0]
  """
  rows, current, used = [], [], {}
  for ex in examples:
    ex = {k: np.asarray(v, np.int32)[:length] for k, v in ex.items()}
    if current and any(used[k] + len(v) > length for k, v in ex.items()):
      rows.append(_pack_row(current, length))
      current, used = [], {}
    current.append(ex)
    for k, v in ex.items():
      used[k] = used.get(k, 0) + len(v)
  if current:
    rows.append(_pack_row(current, length))
  return rows


def pack_feature(group, name, length):
  """{name, name_segmentation, name_position}: feature `name` of the
  examples in group laid end to end in one row of length (segment ids 1,
  2, ..., positions from 0 in each; 0 after the last).

  Example:
    >>> pack_feature([{"t": [5, 1]}, {"t": [7, 1]}], "t", 5)["t_position"]
    array([0, 1, 0, 1, 0], dtype=int32)
  """
  tokens = np.zeros(length, np.int32)
  seg = np.zeros(length, np.int32)
  pos = np.zeros(length, np.int32)
  at = 0
  for i, ex in enumerate(group):
    v = ex[name]
    tokens[at:at + len(v)] = v
    seg[at:at + len(v)] = i + 1
    pos[at:at + len(v)] = np.arange(len(v))
    at += len(v)
  return {name: tokens, name + "_segmentation": seg,
          name + "_position": pos}


def _pack_row(group, length):
  row = {}
  for name in sorted(group[0]):
    row.update(pack_feature(group, name, length))
  return row
