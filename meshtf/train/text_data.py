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


def load_or_train_vocab(paths, model_dir, vocab_size, seq2seq=False):
  """A sentencepiece processor: model_dir/vocab.model if it exists, else one
  trained on the text of `paths` and saved there (ids: 0 pad, 1 EOS, 2 unk).
  """
  import sentencepiece as spm
  path = os.path.join(model_dir, VOCAB_NAME)
  if not os.path.exists(path):
    sentences = []
    for line in _lines(paths):  # checks the files before writing anything
      sentences.extend(line.split("\t") if seq2seq else [line])
    os.makedirs(model_dir, exist_ok=True)
    tmp_prefix = os.path.join(model_dir, ".tmp-vocab-%d" % os.getpid())
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=tmp_prefix,
          vocab_size=vocab_size, pad_id=data.PAD, eos_id=data.EOS, unk_id=2,
          bos_id=-1, hard_vocab_limit=False, model_type="unigram",
          minloglevel=2)
    except RuntimeError as e:
      raise DataError("Could not train a sentencepiece vocabulary of size %d "
                      "on %s: %s. (sentencepiece says) -- set --config.vocab_size "
                      "text, or a different vocab_size" % (vocab_size, ", ".join(paths),
                                str(e).strip().splitlines()[-1]))
    os.replace(tmp_prefix + ".model", path)  # atomic: never a half file
    for leftover in (tmp_prefix + ".vocab",):
      if os.path.exists(leftover):
        os.remove(leftover)
  return spm.SentencePieceProcessor(model_file=path)


def _lines(paths):
  for p in paths:
    if not os.path.exists(p):
      raise DataError("Data file %s does not exist: pass existing text files "
                      "(--config.data_files)" % p)
  for p in paths:
    with open(p, encoding="utf-8") as f:
      for line in f:
        line = line.rstrip("\n")
        if line.strip():
          yield line


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
    self.vocab = load_or_train_vocab(paths, model_dir, vocab_size, seq2seq)
    self.vocab_size = self.vocab.get_piece_size()
    examples = []
    for line in _lines(paths):
      if seq2seq:
        if "\t" not in line:
          raise DataError("seq2seq data needs input<TAB>target lines; got %r"
                          % line[:60])
        x, y = line.split("\t", 1)
        examples.append({"inputs": self._ids(x), "targets": self._ids(y)})
      else:
        examples.append({"targets": self._ids(line)})
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
  """A TFDS dataset from a LOCAL data_dir (never downloads) as packed rows.

  text_keys: one feature (lm) or two (input, target: seq2seq).
  A missing package, dataset or local copy raises DataError at once.
  """
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
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
      raise DataError("TFDS dataset %s is not prepared in %s (offline: no "
                      "download); run tfds build there first" % (name,
                                                                 data_dir))
    ds = builder.as_dataset(split=split)
  except DataError:
    raise
  except Exception as e:  # tfds raises many kinds; report one line
    raise DataError("TFDS dataset %s in %s is unusable: %s" % (
        name, data_dir, str(e).strip().splitlines()[0]))
  texts = []
  for i, ex in enumerate(tfds.as_numpy(ds)):
    if i >= max_examples:
      break
    texts.append([ex[k].decode("utf-8") for k in text_keys])
  tmp = os.path.join(model_dir, ".tfds-text-%d.txt" % os.getpid())
  os.makedirs(model_dir, exist_ok=True)
  with open(tmp, "w", encoding="utf-8") as f:
    for t in texts:
      f.write("\t".join(s.replace("\t", " ").replace("\n", " ") for s in t)
              + "\n")
  try:
    return TextDataset([tmp], model_dir, length, vocab_size,
                       seq2seq=len(text_keys) == 2, seed=seed)
  finally:
    os.remove(tmp)
