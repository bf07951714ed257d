"""Sentencepiece vocabularies in T5's convention, with its extra ids.

Ids: 0 pad, 1 EOS, 2 unknown (T5's sentencepiece models and the ones
trained here), then the model's pieces; `extra_ids` sentinel pieces are
appended after them, named in reverse so that <extra_id_0> is the LAST id
(T5 / seqio: span corruption's first sentinel is vocab_size - 1, the next
vocab_size - 2, ...). T5's vocabulary is 32,000 pieces + 100 extra ids =
32,100 ids, which the model pads to a multiple of 128: 32,128 rows of the
embedding.

The sentinels are added to the sentencepiece model itself (user-defined
pieces "▁<extra_id_N>"), so any sentencepiece reader -- the Python
processor, tensorflow-text's SentencepieceTokenizer in an exported graph --
encodes and decodes them from the same bytes (`Vocabulary.model_proto`).

Example:
  >>> vocab = load_vocabulary("sentencepiece.model", extra_ids=100,
  ...                         pad_to_multiple=128)
  >>> vocab.base_size, vocab.size, vocab.padded_size
  (32000, 32100, 32128)
  >>> vocab.sentinel_id(0), vocab.id_to_piece(vocab.sentinel_id(0))
  (32099, '▁<extra_id_0>')
"""
import io
import os
import re

from meshtf.train import errors

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
EXTRA_ID_PIECE = "\u2581<extra_id_%d>"
# sentencepiece skips training sentences longer than this many bytes (its
# max_sentence_length default); longer lines are cut before training.
MAX_SENTENCE_BYTES = 4192


class Vocabulary(object):
  """A sentencepiece model with `extra_ids` sentinels appended.

  Attributes:
    base_size: the pieces of the sentencepiece model (32,000 for T5's).
    extra_ids: the sentinels after them: those appended, or those a saved
      vocabulary already ends with (model_dir/vocab.model has them).
    size: base_size + extra_ids: the ids in use (T5's "vocab_size").
    padded_size: size rounded up to pad_to_multiple (the model's vocab
      dim; ids >= size are never produced by encode).
    model_proto: the serialized sentencepiece model, sentinels included.
  """

  def __init__(self, base_proto, extra_ids=0, pad_to_multiple=1,
               source="the vocabulary"):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    self.source = source
    try:
      proto = model_pb2.ModelProto.FromString(base_proto)
    except Exception as e:  # protobuf's DecodeError and friends
      raise errors.DataError("%s is not a sentencepiece model (%s): pass a "
                             ".model file written by sentencepiece" % (
                                 source, _first_line(e))) from None
    self.base_size = len(proto.pieces)
    if not self.base_size:
      raise errors.DataError("%s is not a sentencepiece model (it has no "
                             "pieces): pass a .model file written by "
                             "sentencepiece" % source)
    pieces = {p.piece for p in proto.pieces}
    if extra_ids and EXTRA_ID_PIECE % 0 in pieces:
      raise errors.DataError(
          "%s already has the piece %s (its extra ids are in it): set "
          "--config.task.extra_ids=0 to use them as they are" % (
              source, EXTRA_ID_PIECE % 0))
    # Named in reverse: <extra_id_0> is the last id (T5's first sentinel).
    for i in reversed(range(int(extra_ids))):
      proto.pieces.add(piece=EXTRA_ID_PIECE % i, score=0.0,
                       type=model_pb2.ModelProto.SentencePiece.USER_DEFINED)
    # The sentinels: those appended now, and those a saved model (training
    # saves the vocabulary with them) already ends with.
    names = [p.piece for p in proto.pieces]
    self.extra_ids = 0
    while self.extra_ids < len(names) and names[-1 - self.extra_ids] == \
        EXTRA_ID_PIECE % self.extra_ids:
      self.extra_ids += 1
    self.base_size = len(names) - self.extra_ids
    self.size = len(names)
    self.pad_to_multiple = max(1, int(pad_to_multiple))
    self.padded_size = -(-self.size // self.pad_to_multiple) * \
        self.pad_to_multiple
    self.model_proto = proto.SerializeToString()
    self.processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
    ids = (self.processor.pad_id(), self.processor.eos_id(),
           self.processor.unk_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID):
      raise errors.DataError(
          "%s has pad, EOS and unknown ids %s, but meshtf's data (and T5's) "
          "uses 0, 1, 2: train it with --pad_id=0 --eos_id=1 --unk_id=2 "
          "--bos_id=-1" % (source, ", ".join(map(str, ids))))

  def sentinel_id(self, i):
    """The id of <extra_id_i>: size - 1 - i (T5's convention).

    Example:
      >>> vocab.sentinel_id(0) == vocab.size - 1
      True
    """
    if not 0 <= i < self.extra_ids:
      raise ValueError("sentinel %d of %s: it has %d extra ids" % (
          i, self.source, self.extra_ids))
    return self.size - 1 - i

  def encode(self, text):
    """Token ids of one string (no EOS).

    Example:
      >>> vocab.encode("the cat")
      [8, 1712]
    """
    return self.processor.encode(text)

  def encode_batch(self, texts):
    """Token ids of each string of a list, in one sentencepiece call."""
    return self.processor.encode(list(texts))

  def decode(self, ids):
    """The text of token ids: up to the first EOS, padding dropped, ids
    beyond the vocabulary (the padded rows of the model) as unknown.

    Example:
      >>> vocab.decode(vocab.encode("the cat") + [EOS_ID, 5])
      'the cat'
    """
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID:
        out.append(i if i < self.size else UNK_ID)
    return self.processor.decode(out)

  def id_to_piece(self, i):
    return self.processor.id_to_piece(int(i))

  # The sentencepiece processor's names, for code that takes either.
  def get_piece_size(self):
    return self.size

  def unk_id(self):
    return UNK_ID

  def save(self, path):
    """Writes model_proto to path through a temporary file (never half a
    file); loading it again needs extra_ids=0 (the sentinels are in it)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
      with open(tmp, "wb") as f:
        f.write(self.model_proto)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise


def load_vocabulary(path, extra_ids=0, pad_to_multiple=1):
  """The sentencepiece model at `path` with `extra_ids` sentinels appended
  and its size padded to pad_to_multiple; raises DataError (one line) for
  a file that is missing or not a sentencepiece model, or whose pad / EOS /
  unknown ids are not 0 / 1 / 2. No TensorFlow.

  Example:
    >>> v = load_vocabulary("t5/sentencepiece.model", 100, 128)
    >>> v.size, v.padded_size, v.sentinel_id(0)
    (32100, 32128, 32099)
  """
  what = "vocabulary file %s" % path
  if os.path.isdir(path):
    raise errors.DataError("%s is a folder: pass a sentencepiece .model "
                           "file (--config.task.vocab_file)" % what)
  try:
    with open(path, "rb") as f:
      proto = f.read()
  except OSError as e:
    raise errors.DataError("%s cannot be read (%s): pass an existing "
                           "sentencepiece .model file "
                           "(--config.task.vocab_file)" % (
                               what, e.strerror)) from None
  return Vocabulary(proto, extra_ids, pad_to_multiple, source=what)


def train_vocabulary(sentences, vocab_size, extra_ids=0, pad_to_multiple=1,
                     source="the data"):
  """A unigram sentencepiece vocabulary of vocab_size ids in all (pieces +
  extra_ids) trained in memory on `sentences` (a bounded sample: the time
  grows with it); nothing is written. Raises DataError (one line, with the
  numbers and the fix) when sentencepiece cannot train it: fewer ids than
  the text's distinct characters need, or a vocab_size far above what the
  text yields (fewer than half the pieces asked for).

  Example:
    >>> v = train_vocabulary(["a cat sat", "a dog ran"] * 50, 24)
    >>> v.size <= 24
    True
  """
  import sentencepiece as spm
  pieces = int(vocab_size) - int(extra_ids)
  fix = "--config.vocab_size"
  if pieces < 4:
    raise errors.DataError(
        "vocab_size %d leaves %d pieces after %d extra_ids: set %s to at "
        "least %d" % (vocab_size, pieces, extra_ids, fix, extra_ids + 4))
  sentences = [s for s in _bounded_lines(sentences) if s.strip()]
  if not sentences:
    raise errors.DataError("%s has no text to train a vocabulary on (every "
                           "document is blank): pass data with text, or a "
                           "--config.task.vocab_file" % source)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model,
        vocab_size=pieces, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        bos_id=-1, hard_vocab_limit=False, model_type="unigram",
        # One thread: the same pieces on every machine and worker (the
        # result depends on the thread count).
        num_threads=1, minloglevel=2)
  except RuntimeError as e:
    raise errors.DataError(_training_problem(
        str(e), vocab_size, extra_ids, source)) from None
  vocab = Vocabulary(model.getvalue(), extra_ids, pad_to_multiple, source)
  if vocab.base_size * 2 < pieces:
    raise errors.DataError(
        "vocab_size %d is far above what %s yields: sentencepiece found "
        "only %d pieces in it, and a model %d ids wide would never see the "
        "rest: set %s=%d" % (vocab_size, source, vocab.base_size, vocab_size,
                             fix, vocab.size))
  return vocab


def _bounded_lines(sentences):
  """Lines cut at whitespace into pieces sentencepiece trains on (it skips
  a sentence over MAX_SENTENCE_BYTES, and with none left fails)."""
  limit = MAX_SENTENCE_BYTES // 4   # characters: up to 4 bytes each
  for s in sentences:
    while len(s) > limit:
      cut = s.rfind(" ", 0, limit)
      cut = cut if cut > 0 else limit
      yield s[:cut]
      s = s[cut:].lstrip(" ")
    yield s


def _training_problem(said, vocab_size, extra_ids, source):
  """sentencepiece's INTERNAL error as one line with the fix."""
  m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", said)
  if m:
    need = int(m.group(2)) + int(extra_ids)
    return ("vocab_size %d is too small for %s: its text has %d distinct "
            "characters, and with pad, EOS and unknown%s a vocabulary needs "
            "at least %d ids: set --config.vocab_size=%d or more" % (
                vocab_size, source, int(m.group(2)) - 3,
                " and %d extra_ids" % extra_ids if extra_ids else "", need,
                need))
  m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a "
                r"value <= (\d+)", said)
  if m:
    return ("vocab_size %d is far above what %s yields (sentencepiece: at "
            "most %s pieces): set --config.vocab_size=%d" % (
                vocab_size, source, m.group(2),
                int(m.group(2)) + int(extra_ids)))
  line = (said.strip().splitlines() or ["?"])[-1]
  return ("could not train a sentencepiece vocabulary of %d ids on %s "
          "(sentencepiece: %s): set another --config.vocab_size" % (
              vocab_size, source, line.split("] ", 1)[-1][:200]))


def _first_line(e):
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


__all__ = ["Vocabulary", "load_vocabulary", "train_vocabulary", "PAD_ID",
           "EOS_ID", "UNK_ID", "EXTRA_ID_PIECE"]
