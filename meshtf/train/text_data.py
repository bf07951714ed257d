"""Real text for training: plain text files with a sentencepiece vocabulary
trained on first use, and TFDS datasets read from a local data_dir.

Text formats: "lm" (one document per line) and "seq2seq" (tab-separated
"input<TAB>target" lines). Examples are tokenized, end in EOS and are packed
into rows (meshtf.train.data.pack). Row order per epoch is a permutation
fixed by (seed, epoch), so batch `step` is the same on every restart, and
`rows=` gives a worker only its share.

Example:
  >>> ds = TextDataset(["train.txt"], model_dir="/tmp/m", length=64,
  ...                  vocab_size=1000)
  >>> batch = ds.batch(step=0, batch_size=8)
"""
import os

import numpy as np

from meshtf.train import data

VOCAB_NAME = "vocab.model"


class DataError(ValueError):
  """Missing or unusable training data (the binary prints it as one line)."""


def text_file_problem(path, what, fix):
  """One line saying why `path` cannot be read as text -- it does not
  exist, is a folder, is not UTF-8 (the line and byte named) or has no
  non-blank line -- or None. `what` names the file's role ("data file"),
  `fix` the flag that sets it. Reads the file once, a line at a time.

  Example:
    >>> text_file_problem("latin1.txt", "data file", "--config.task.data_files")
    "data file latin1.txt is not UTF-8 text: byte 0xe9 at line 3 ..."
  """
  try:
    is_folder, is_file = os.path.isdir(path), os.path.isfile(path)
  except ValueError:   # e.g. a NUL character in the path
    is_folder = is_file = False
  if is_folder:
    return "%s %s is a folder, not a text file: pass files, e.g. %s" % (
        what, path, fix)
  if not is_file:
    return "%s %s does not exist: pass existing text files, e.g. %s" % (
        what, path, fix)
  blank = True
  offset = 0
  try:
    with open(path, "rb") as f:
      for number, raw in enumerate(f, 1):
        try:
          text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          return ("%s %s is not UTF-8 text: byte 0x%02x at line %d (byte "
                  "offset %d): convert it (e.g. iconv -f latin1 -t utf-8 %s "
                  "> fixed.txt) and pass the new file, e.g. %s" % (
                      what, path, raw[e.start], number, offset + e.start,
                      path, fix))
        blank = blank and not text.strip()
        offset += len(raw)
  except OSError as e:
    return "%s %s cannot be read (%s): %s" % (what, path, e.strerror, fix)
  if blank:
    return ("%s %s is empty (no non-blank line): pass files with text, e.g. "
            "%s" % (what, path, fix))
  return None


def load_or_train_vocab(paths, model_dir, vocab_size, seq2seq=False):
  """A sentencepiece processor: model_dir/vocab.model if it exists, else one
  trained on the text of `paths` and saved there (ids: 0 pad, 1 EOS, 2 unk).

  Example:
    >>> sp = load_or_train_vocab(["train.txt"], "/tmp/m", vocab_size=1000)
  """
  return _load_or_train_vocab(lambda: _file_texts(paths, seq2seq),
                              ", ".join(paths), model_dir, vocab_size)


def _load_or_train_vocab(texts_fn, source, model_dir, vocab_size):
  """texts_fn() yields tuples of strings (one or two per example); it is
  only called (and model_dir only written) when no vocabulary exists."""
  import sentencepiece as spm
  path = os.path.join(model_dir, VOCAB_NAME)
  if not os.path.exists(path):
    # Read (and so check) all the text before writing anything.
    sentences = [s for texts in texts_fn() for s in texts]
    if not any(s.strip() for s in sentences):
      raise DataError("%s has no text to train a vocabulary on: pass files "
                      "with text (--config.task.data_files)" % source)
    os.makedirs(model_dir, exist_ok=True)
    tmp_prefix = os.path.join(model_dir, ".tmp-vocab-%d" % os.getpid())
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=tmp_prefix,
          vocab_size=vocab_size, pad_id=data.PAD, eos_id=data.EOS, unk_id=2,
          bos_id=-1, hard_vocab_limit=False, model_type="unigram",
          minloglevel=2)
    except RuntimeError as e:
      said = (str(e).strip().splitlines() or [type(e).__name__])[-1]
      raise DataError("Could not train a sentencepiece vocabulary of size %d "
                      "on %s (sentencepiece: %s): give it more text or set "
                      "another --config.vocab_size" % (vocab_size, source,
                                                        said))
    os.replace(tmp_prefix + ".model", path)  # atomic: never a half file
    for leftover in (tmp_prefix + ".vocab",):
      if os.path.exists(leftover):
        os.remove(leftover)
  return spm.SentencePieceProcessor(model_file=path)


def _lines(paths):
  for p in paths:
    problem = text_file_problem(p, "data file", "--config.task.data_files")
    if problem:
      raise DataError(problem)
  for p in paths:
    with open(p, encoding="utf-8") as f:
      for line in f:
        line = line.rstrip("\n")
        if line.strip():
          yield line


def _file_texts(paths, seq2seq):
  """(line,) per line, or (input, target) per input<TAB>target line."""
  for line in _lines(paths):
    if not seq2seq:
      yield (line,)
    elif "\t" not in line:
      raise DataError("seq2seq data needs input<TAB>target lines; got %r"
                      % line[:60])
    else:
      yield tuple(line.split("\t", 1))


class PackedRows(object):
  """Packed rows served as deterministic batches."""

  def __init__(self, rows, seed=0):
    if not rows:
      raise DataError("The data has no non-empty examples")
    self.rows = rows
    self.seed = seed

  def __len__(self):
    return len(self.rows)

  def batch(self, step, batch_size, seed=None, rows=None):
    """Global rows step*batch_size .. +batch_size of an endless stream that
    visits every row once per epoch in a (seed, epoch)-fixed order."""
    seed = self.seed if seed is None else seed
    rows = range(batch_size) if rows is None else rows
    n = len(self.rows)
    out = {}
    for r in rows:
      g = step * batch_size + r
      epoch, i = divmod(g, n)
      order = np.random.default_rng([int(seed), int(epoch)]).permutation(n)
      for k, v in self.rows[order[i]].items():
        out.setdefault(k, []).append(v)
    batch = {k: np.stack(v) for k, v in out.items()}
    batch["targets_weights"] = (batch["targets"] != data.PAD).astype(
        np.float32)
    return batch


class TextDataset(PackedRows):
  """Plain text files -> packed, tokenized rows.

  Args:
    paths: text files (lm: a document per line; seq2seq: input<TAB>target).
    model_dir: where the vocabulary is saved (and found on later runs).
    length: row length in tokens.
    vocab_size: sentencepiece vocabulary size (used when training one).
    seq2seq: tab-separated pairs -> "inputs" and "targets".
  """

  def __init__(self, paths, model_dir, length, vocab_size=1000, seq2seq=False,
               seed=0):
    self._build(lambda: _file_texts(paths, seq2seq), ", ".join(paths),
                model_dir, length, vocab_size, seed)

  @classmethod
  def from_texts(cls, texts, source, model_dir, length, vocab_size=1000,
                 seed=0):
    """Rows from in-memory examples: tuples of one string (lm) or two
    (input, target: seq2seq). `source` names them in error messages.

    Example:
      >>> ds = TextDataset.from_texts([("a cat",), ("a dog",)], "pets",
      ...                             "/tmp/m", length=16, vocab_size=20)
    """
    texts = [tuple(t) for t in texts]
    if not texts:
      raise DataError("%s has no examples" % source)
    sizes = sorted({len(t) for t in texts})
    if sizes not in ([1], [2]):
      raise DataError("%s: every example needs one text (lm) or every one "
                      "two (input, target); got %s texts per example" % (
                          source, " and ".join(map(str, sizes))))
    self = cls.__new__(cls)
    self._build(lambda: iter(texts), source, model_dir, length, vocab_size,
                seed)
    return self

  def _build(self, texts_fn, source, model_dir, length, vocab_size, seed):
    self.vocab = _load_or_train_vocab(texts_fn, source, model_dir,
                                      vocab_size)
    self.vocab_size = self.vocab.get_piece_size()
    examples = []
    for texts in texts_fn():
      if len(texts) == 2:
        examples.append({"inputs": self._ids(texts[0]),
                         "targets": self._ids(texts[1])})
      else:
        examples.append({"targets": self._ids(texts[0])})
    super().__init__(data.pack(examples, length), seed)

  def _ids(self, text):
    return self.vocab.encode(text) + [data.EOS]

  def decode(self, ids):
    ids = [int(i) for i in ids]
    if data.EOS in ids:
      ids = ids[:ids.index(data.EOS)]
    return self.vocab.decode([i for i in ids if i != data.PAD])


def tfds_dataset(name, data_dir, split, length, model_dir, vocab_size=1000,
                 text_keys=("text",), seed=0, max_examples=100000):
  """A TFDS dataset prepared in a LOCAL data_dir as packed rows (meshtf
  never downloads). The dataset's code need not be installed: TFDS reads a
  prepared dataset from its files (features.json, dataset_info.json).

  Args:
    name, data_dir, split, text_keys, max_examples: as for tfds_texts.
    length, model_dir, vocab_size, seed: as for TextDataset (a vocabulary
      is trained on this split's text if model_dir has none).

  A missing package, dataset, split or feature raises DataError before
  anything is written.

  Example:
    >>> ds = tfds_dataset("lm1b", "/data/tfds", "train", 64, "/tmp/m")
    >>> batch = ds.batch(step=0, batch_size=8)
  """
  texts = tfds_texts(name, data_dir, split, text_keys, max_examples)
  return TextDataset.from_texts(
      texts, "TFDS dataset %s in %s split %r" % (name, data_dir, split),
      model_dir, length, vocab_size, seed=seed)


def tfds_texts(name, data_dir, split, text_keys=("text",),
               max_examples=100000):
  """The text of a TFDS dataset prepared in a LOCAL data_dir: a list of
  tuples, one string per text key, for the non-blank examples of `split`.
  Reads only; writes nothing (check every split before training a vocab).

  Args:
    name: TFDS name, optionally with config and version ("wmt14/de-en:1.0.0").
    data_dir: the directory it was prepared in (`tfds build --data_dir`).
    split: a TFDS split ("train", "validation", "train[:10%]").
    text_keys: one scalar text feature (lm) or two (input, target:
      seq2seq); "a/b" names feature b nested in feature dict a.
    max_examples: read at most this many examples of the split.

  Example:
    >>> texts = tfds_texts("lm1b", "/data/tfds", "test", max_examples=2)
    >>> len(texts), len(texts[0])
    (2, 1)
  """
  text_keys = tuple(text_keys)
  if len(text_keys) not in (1, 2):
    raise DataError("TFDS text_keys %s must name one text feature (lm) or "
                    "two (input,target): set --config.task.text_keys"
                    % ",".join(text_keys))
  if not data_dir or not os.path.isdir(data_dir):
    raise DataError("TFDS data_dir %r does not exist; meshtf never downloads "
                    "datasets: prepare %s there first (tfds build) or use "
                    "--config.data_files" % (data_dir, name))
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError("tensorflow_datasets is not installed: pip install "
                    "tensorflow-datasets, or use --config.data_files"
                    ) from None
  builder = _tfds_builder(tfds, name, data_dir)
  where = "TFDS dataset %s in %s" % (name, data_dir)
  for key in text_keys:
    _check_text_feature(tfds, builder.info.features, key, where)
  texts = []
  try:
    ds = builder.as_dataset(split=split, shuffle_files=False)
    for ex in tfds.as_numpy(ds.take(max_examples)):
      t = tuple(_text_value(ex, k) for k in text_keys)
      if all(s.strip() for s in t):  # like blank lines of text files
        texts.append(t)
  except Exception as e:  # tfds / tf.data raise many kinds; report one line
    raise DataError("%s: cannot read split %r (tfds: %s): set "
                    "--config.task.tfds_split / tfds_eval_split to one of %s"
                    % (where, split, _first_line(e), ", ".join(sorted(
                        builder.info.splits.keys()))))
  if not texts:
    raise DataError("%s split %r has no non-blank examples of %s: set "
                    "--config.task.tfds_split / tfds_eval_split or "
                    "--config.task.text_keys" % (where, split,
                                                 ",".join(text_keys)))
  return texts


def _first_line(e):
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _tfds_builder(tfds, name, data_dir):
  """The prepared builder of `name` in data_dir: the installed dataset code
  when that version is prepared there, else whatever the files in data_dir
  hold (the code is not installed, or another TFDS release prepared it)."""
  from absl import logging as absl_logging
  # Looking up a dataset that is not there logs misleading warnings
  # ("Variant folder ... has no dataset_info.json"); our error says it all.
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    return _find_tfds_builder(tfds, name, data_dir)
  finally:
    absl_logging.set_verbosity(verbosity)


def _find_tfds_builder(tfds, name, data_dir):
  not_found = tfds.core.registered.DatasetNotFoundError
  problem = None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  except not_found:
    pass
  except Exception as e:  # e.g. the dataset code needs a missing package
    problem = e
  try:
    builder = tfds.core.read_only_builder.builder_from_files(
        name, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  except not_found:
    pass
  except Exception as e:  # e.g. a damaged dataset_info.json
    problem = e
  raise DataError(
      "TFDS dataset %s is not prepared in %s%s; meshtf never downloads: "
      "prepare it there first (tfds build %s --data_dir=%s) or use "
      "--config.data_files" % (
          name, data_dir,
          " (tfds: %s)" % _first_line(problem) if problem else "",
          name.split(":")[0], data_dir))


def _check_text_feature(tfds, features, key, where):
  """The scalar text feature `key` ("a/b": nested) of a FeaturesDict."""
  feature = features
  for part in key.split("/"):
    if not isinstance(feature, tfds.features.FeaturesDict) or \
        part not in feature.keys():
      raise DataError("%s has no feature %r (its features: %s): set "
                      "--config.task.text_keys" % (
                          where, key, ", ".join(sorted(_feature_names(
                              tfds, features)))))
    feature = feature[part]
  if getattr(feature, "np_dtype", None) not in (object, np.str_, np.bytes_) \
      or tuple(feature.shape) != ():
    raise DataError("%s feature %r is not a text string (%s): set "
                    "--config.task.text_keys to text features" % (
                        where, key, type(feature).__name__))


def _feature_names(tfds, features, prefix=""):
  out = []
  for k in features.keys():
    if isinstance(features[k], tfds.features.FeaturesDict):
      out += _feature_names(tfds, features[k], prefix + k + "/")
    else:
      out.append(prefix + k)
  return out


def _text_value(example, key):
  value = example
  for part in key.split("/"):
    value = value[part]
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)
