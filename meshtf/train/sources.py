"""Where training documents come from: text files (plain, TSV, gzip),
TFRecord files of tf.train.Examples and prepared TFDS datasets, given as
file lists and globs, cut into UNITS that a reader opens on their own.

A unit is what the stream (meshtf/train/streams.py) reads as one piece:
  text      the lines that START in a byte range of an uncompressed text
            file (unit_bytes(length) each: 64 KiB for rows of <= 512
            tokens), found by seeking, so a unit is read without the
            file's earlier bytes
  gzip      a gzip-compressed text file, whole (gzip cannot seek)
  tfrecord  records [start, stop) of a TFRecord file (stop None: to its
            end): a whole file, or a TFDS shard's part of a split

Everything but the reading of units is plain Python and reads only a
file's first HEAD_BYTES, so the checks run before TensorFlow starts and
cost the same on 17 MB as on 1.7 GB: `file_problem` says in one line why a
file cannot be read as its format -- it does not exist, is a folder or
empty, is binary ("not a text file", naming a PNG, a zip, a TFRecord...),
is not UTF-8 (line and byte named), lacks a TSV line's tab, or is a
TFRecord without the named feature.

Example:
  >>> files, problems = expand(split_patterns("data/*.txt,extra.txt.gz"))
  >>> units = make_units(files, "text", unit_bytes(128))
  >>> next(read_unit(units[0], ReadSpec("text")))
  ('the first line of data/a.txt',)
"""
import collections
import glob
import gzip
import os
import struct
import zlib

from meshtf.train import errors

HEAD_BYTES = 1 << 16
FORMATS = ("auto", "text", "tfrecord")
_GZIP_MAGIC = b"\x1f\x8b"
# The binary files someone may pass as text by mistake, by their first bytes.
_MAGICS = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"), (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a zip archive"), (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"\x7fELF", "an executable"), (b"SQLite format 3\x00", "a database"))

Unit = collections.namedtuple("Unit", ["kind", "path", "start", "stop"])


def unit_bytes(length):
  """Bytes of text per unit for rows of `length` tokens: 64 KiB, or about
  32 rows' worth when rows are longer (a unit's last row is part-filled).

  Example:
    >>> unit_bytes(128), unit_bytes(2048)
    (65536, 262144)
  """
  return max(1 << 16, 128 * int(length))


# --- file lists -------------------------------------------------------------------
def split_patterns(value):
  """The comma-separated file names / globs of a config field; "\\," is a
  comma inside a name.

  Example:
    >>> split_patterns(r"a.txt, notes\\,2024.txt,data/*.gz")
    ['a.txt', 'notes,2024.txt', 'data/*.gz']
  """
  out, current, i, text = [], [], 0, str(value or "")
  while i < len(text):
    if text.startswith("\\,", i):
      current.append(",")
      i += 2
      continue
    if text[i] == ",":
      out.append("".join(current))
      current = []
    else:
      current.append(text[i])
    i += 1
  out.append("".join(current))
  return [p.strip() for p in out if p.strip()]


def is_glob(pattern):
  return any(c in pattern for c in "*?[")


def expand(patterns, key="task.data_files"):
  """(sorted files, problems): each glob's matches (a glob matching
  nothing is a problem), other names as given (checked by file_problem).

  Example:
    >>> expand(["corpus/*.txt"])
    (['corpus/a.txt', 'corpus/b.txt'], [])
  """
  files, problems = [], []
  for pattern in patterns:
    if not is_glob(pattern):
      files.append(pattern)
      continue
    found = sorted(p for p in glob.glob(os.path.expanduser(pattern),
                                        recursive=True)
                   if not os.path.isdir(p))
    if not found:
      problems.append("%s pattern %r matches no file: pass existing files "
                      "or a glob that matches some, e.g. --config.%s="
                      "'corpus/*.txt'" % (key, pattern, key))
    files.extend(found)
  seen = set()
  unique = [f for f in files if not (f in seen or seen.add(f))]
  return unique, problems


def comma_hint(pattern, patterns):
  """When names split at a comma exist joined (notes,2024.txt): the fix.

  Example:
    >>> comma_hint("notes", ["notes", "2024.txt"])
    ' (a comma separates files: notes,2024.txt exists; write it as notes\\\\,2024.txt)'
  """
  i = patterns.index(pattern) if pattern in patterns else -1
  for a, b in ((i - 1, i + 1), (i, i + 2)):
    if a < 0 or b > len(patterns):
      continue
    joined = ",".join(patterns[a:b])
    if os.path.isfile(joined):
      return (" (a comma separates files: %s exists; write it as %s)" % (
          joined, joined.replace(",", "\\,")))
  return ""


def file_format(path, data_format="auto"):
  """"tfrecord" for data_format tfrecord or (auto) a name with .tfrecord /
  .tfrec in it; else "text"."""
  if data_format != "auto":
    return data_format
  name = os.path.basename(path).lower()
  return "tfrecord" if ".tfrec" in name else "text"


def is_gzip(path):
  try:
    with open(path, "rb") as f:
      return f.read(2) == _GZIP_MAGIC
  except OSError:
    return False


# --- checks before TensorFlow starts ----------------------------------------------
def file_problem(path, what="data file", fix="--config.task.data_files",
                 fmt="text", pairs=False, text_keys=("text",),
                 head_bytes=HEAD_BYTES):
  """One line saying why `path` cannot be read as `fmt`, or None. Reads at
  most head_bytes of it (None: all of it; for small files like prompts).

  Example:
    >>> file_problem("photo.png")
    'data file photo.png is not a text file (it is a PNG image): ...'
  """
  try:
    is_folder, is_file = os.path.isdir(path), os.path.isfile(path)
  except ValueError:   # e.g. a NUL character in the path
    is_folder = is_file = False
  if is_folder:
    return "%s %s is a folder, not a %s file: pass files, e.g. %s" % (
        what, path, "TFRecord" if fmt == "tfrecord" else "text", fix)
  if not is_file:
    return "%s %s does not exist: pass existing %s files, e.g. %s" % (
        what, path, "TFRecord" if fmt == "tfrecord" else "text", fix)
  try:
    if fmt == "tfrecord":
      return tfrecord_problem(path, text_keys, what, fix)[0]
    return _text_problem(path, what, fix, pairs, head_bytes)
  except OSError as e:
    return "%s %s cannot be read (%s): %s" % (what, path, e.strerror, fix)


def _text_problem(path, what, fix, pairs, head_bytes):
  compressed = is_gzip(path)
  opener = gzip.open if compressed else open
  try:
    with opener(path, "rb") as f:
      head = f.read(head_bytes) if head_bytes else f.read()
      more = bool(f.read(1)) if head_bytes else False
  except (OSError, EOFError, zlib.error) as e:
    if not compressed:
      raise
    return ("%s %s is gzip-compressed but does not decompress (%s): pass an "
            "intact .gz file or the text itself" % (what, path, e))
  binary = _binary_kind(head)
  if binary:
    return ("%s %s is not a text file (%s %s): %s" % (
        what, path, "it is gzip-compressed and holds" if compressed else
        "it is", binary, _binary_fix(binary, fix)))
  text, bad = _decode_head(head, more)
  if bad is not None:
    offset = bad
    line = head.count(b"\n", 0, offset) + 1
    start = head.rfind(b"\n", 0, offset) + 1
    if compressed:
      return ("%s %s is gzip-compressed, and what it holds is not UTF-8 text:"
              " byte 0x%02x at line %d (byte offset %d of the decompressed "
              "text): pass UTF-8 text" % (what, path, head[offset], line,
                                          offset))
    if offset - start >= 4096:   # no line breaks: not text at all
      return ("%s %s is not a text file (byte 0x%02x at byte offset %d is "
              "not UTF-8, in a line of more than 4,096 bytes): pass text "
              "files, e.g. %s" % (what, path, head[offset], offset, fix))
    return ("%s %s is not UTF-8 text: byte 0x%02x at line %d (byte offset "
            "%d): convert it (e.g. iconv -f latin1 -t utf-8 %s > fixed.txt) "
            "and pass the new file, e.g. %s" % (
                what, path, head[offset], line, offset, path, fix))
  if not text.strip() and not (more and _has_text_after(path, opener,
                                                        len(head))):
    return ("%s %s is empty (no non-blank line): pass files with text, e.g. "
            "%s" % (what, path, fix))
  if pairs:
    lines = text.split("\n")
    if more:
      lines = lines[:-1]   # the head's last line may be cut
    for number, line in enumerate(lines, 1):
      if line.strip() and "\t" not in line:
        return ("%s %s line %d has no tab: seq2seq data (--config.task."
                "seq2seq=True) is one input<TAB>target pair per line; got "
                "%r" % (what, path, number, line[:60]))
  return None


def _decode_head(head, more):
  """(text, None) or (None, the offset of the first byte that is not
  UTF-8); a character cut at the end of a partial head is not an error."""
  try:
    return head.decode("utf-8"), None
  except UnicodeDecodeError as e:
    if more and e.start >= len(head) - 3 and e.reason == \
        "unexpected end of data":
      return head[:e.start].decode("utf-8"), None
    return None, e.start


def _binary_kind(head):
  """What a file's first bytes say it is (None: it may be text)."""
  for magic, kind in _MAGICS:
    if head.startswith(magic):
      return kind
  if head.startswith(_GZIP_MAGIC):
    return "gzip-compressed data (compressed twice)"
  if _is_tfrecord_header(head):
    return "a TFRecord file"
  if b"\x00" in head:
    return "binary data (it has NUL bytes)"
  return None


def _binary_fix(kind, fix):
  if kind == "a TFRecord file":
    return ("read it as TFRecord: set --config.task.data_format=tfrecord and "
            "--config.task.text_keys to its text feature")
  return "pass text files (UTF-8, or gzip-compressed UTF-8), e.g. %s" % fix


def _has_text_after(path, opener, offset):
  with opener(path, "rb") as f:
    f.seek(offset)
    while True:
      chunk = f.read(1 << 20)
      if not chunk:
        return False
      if chunk.strip():
        return True


# --- TFRecord files -------------------------------------------------------------
def _crc32c_table():
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_CRC_TABLE = _crc32c_table()


def _masked_crc32c(data):
  crc = 0xFFFFFFFF
  for b in data:
    crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _is_tfrecord_header(head):
  if len(head) < 12:
    return False
  crc, = struct.unpack("<I", head[8:12])
  return _masked_crc32c(head[:8]) == crc


def first_record(path):
  """The first record of a TFRecord file (gzip-compressed or not) read in
  plain Python, or None for an empty file; ValueError if the file does not
  start with a record header.

  Example:
    >>> parse_example(first_record("train.tfrecord"))["text"]
    ('bytes', [b'the first document'])
  """
  opener = gzip.open if is_gzip(path) else open
  with opener(path, "rb") as f:
    header = f.read(12)
    if not header:
      return None
    if not _is_tfrecord_header(header):
      raise ValueError("its first 12 bytes are not a TFRecord header")
    length, = struct.unpack("<Q", header[:8])
    data = f.read(length)
    if len(data) != length:
      raise ValueError("its first record is cut short")
    return data


def _varint(buf, i):
  result = shift = 0
  while True:
    b = buf[i]
    i += 1
    result |= (b & 0x7F) << shift
    if b < 0x80:
      return result, i
    shift += 7


def _fields(buf):
  """(field number, wire type, value) of a protobuf message's fields."""
  i, n = 0, len(buf)
  while i < n:
    key, i = _varint(buf, i)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, i = _varint(buf, i)
    elif wire == 2:
      size, i = _varint(buf, i)
      value = buf[i:i + size]
      i += size
    elif wire == 1:
      value, i = buf[i:i + 8], i + 8
    elif wire == 5:
      value, i = buf[i:i + 4], i + 4
    else:
      raise ValueError("protobuf wire type %d" % wire)
    yield number, wire, value


def parse_example(record, keys=None):
  """{feature name: (kind, values)} of a serialized tf.train.Example, kind
  "bytes" (a list of bytes), "int64" (a list of ints) or "float" (a count):
  its wire format read in plain Python (no TensorFlow). keys: only these.

  Example:
    >>> parse_example(record, ["text"])
    {'text': ('bytes', [b'a document'])}
  """
  out = {}
  for number, wire, features in _fields(record):
    if number != 1 or wire != 2:
      continue
    for n, w, entry in _fields(features):
      if n != 1 or w != 2:
        continue
      name, feature = None, b""
      for en, ew, ev in _fields(entry):
        if en == 1:
          name = bytes(ev).decode("utf-8", "replace")
        elif en == 2:
          feature = ev
      if name is None or (keys is not None and name not in keys):
        continue
      out[name] = _feature_value(feature)
  return out


def _feature_value(feature):
  for kind_number, _, values in _fields(feature):
    if kind_number == 1:
      return "bytes", [bytes(v) for n, _, v in _fields(values) if n == 1]
    if kind_number == 3:
      ids = []
      for n, w, v in _fields(values):
        if n != 1:
          continue
        if w == 0:
          ids.append(v)
        else:   # packed
          i = 0
          while i < len(v):
            x, i = _varint(v, i)
            ids.append(x)
      return "int64", ids
    if kind_number == 2:
      return "float", None
  return "empty", []


def tfrecord_problem(path, text_keys, what="data file",
                     fix="--config.task.data_files"):
  """(one line or None, {key: "bytes" | "int64"}) for a TFRecord file
  whose first record must have the text_keys as bytes (text) or int64
  (token ids) features.

  Example:
    >>> tfrecord_problem("train.tfrecord", ["text"])
    (None, {'text': 'bytes'})
  """
  try:
    record = first_record(path)
  except (ValueError, EOFError, zlib.error, OSError) as e:
    return ("%s %s is not a TFRecord file (%s): pass TFRecord files of "
            "tf.train.Examples, or set --config.task.data_format=text" % (
                what, path, e), {})
  if record is None:
    return "%s %s is empty (no record): pass files with records, e.g. %s" % (
        what, path, fix), {}
  try:
    features = parse_example(record)
  except (ValueError, IndexError) as e:
    return ("%s %s holds records that are not tf.train.Examples (%s): pass "
            "TFRecord files of tf.train.Examples" % (what, path, e), {})
  kinds = {}
  for key in text_keys:
    if key not in features:
      return ("%s %s has no feature %r in its first record (its features: "
              "%s): set --config.task.text_keys to the feature with the "
              "text" % (what, path, key, ", ".join(sorted(features)) or
                        "none"), {})
    kind = features[key][0]
    if kind not in ("bytes", "int64"):
      return ("%s %s feature %r is a %s list: text_keys name bytes (text) or "
              "int64 (token ids) features: set --config.task.text_keys" % (
                  what, path, key, kind), {})
    kinds[key] = kind
  return None, kinds


# --- units ------------------------------------------------------------------------
def make_units(files, fmt="text", text_unit_bytes=1 << 16):
  """The units of files (in order): byte ranges of uncompressed text
  files, whole gzip and TFRecord files.

  Example:
    >>> make_units(["a.txt"], "text", 65536)     # a 150 KB file
    [Unit('text', 'a.txt', 0, 65536), Unit('text', 'a.txt', 65536, 131072),
     Unit('text', 'a.txt', 131072, 153600)]
  """
  units = []
  for path in files:
    kind = file_format(path, fmt)
    if kind == "tfrecord":
      units.append(Unit("tfrecord", path, 0, None))
    elif is_gzip(path):
      units.append(Unit("gzip", path, 0, None))
    else:
      size = os.path.getsize(path)
      for start in range(0, max(size, 1), text_unit_bytes):
        units.append(Unit("text", path, start, min(start + text_unit_bytes,
                                                   size)))
  return units


class ReadSpec(collections.namedtuple("ReadSpec", [
    "format", "pairs", "keys", "kinds"])):
  """How to read documents: format text (pairs: input<TAB>target lines) or
  tfrecord (keys: the features, kinds: "bytes" or "int64" each)."""

  def __new__(cls, format, pairs=False, keys=("text",), kinds=None):  # noqa: A002
    return super().__new__(cls, format, pairs, tuple(keys), kinds or {})


def read_unit(unit, spec):
  """A unit's documents, in order: tuples of one text (or two: a pair), or
  for int64 features, numpy arrays of token ids. Blank ones are skipped.
  Raises DataError naming file and line for a line that is not UTF-8 or a
  pair without a tab."""
  if unit.kind == "tfrecord":
    return _tfrecord_documents(unit, spec)
  return _text_documents(unit, spec)


def _text_documents(unit, spec):
  if unit.kind == "gzip":
    f = gzip.open(unit.path, "rb")
    offset, stop = 0, None
  else:
    f = open(unit.path, "rb")
    offset, stop = unit.start, unit.stop
    if offset > 0:
      # A line belongs to the unit it starts in: skip the rest of the line
      # the byte before the range is in (nothing when it ends there).
      f.seek(offset - 1)
      offset += len(f.readline()) - 1
  with f:
    while stop is None or offset < stop:
      raw = f.readline()
      if not raw:
        break
      at, offset = offset, offset + len(raw)
      try:
        line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
      except UnicodeDecodeError as e:
        raise errors.DataError(
            "data file %s is not UTF-8 text: byte 0x%02x at line %d (byte "
            "offset %d%s): convert it and pass the new file (--config.task."
            "data_files)" % (unit.path, raw[e.start], _line_number(
                unit, at), at + e.start, " of the decompressed text"
                if unit.kind == "gzip" else "")) from None
      if not line.strip():
        continue
      if not spec.pairs:
        yield (line,)
      elif "\t" not in line:
        raise errors.DataError(
            "data file %s line %d has no tab: seq2seq data (--config.task."
            "seq2seq=True) is one input<TAB>target pair per line; got %r" % (
                unit.path, _line_number(unit, at), line[:60]))
      else:
        yield tuple(line.split("\t", 1))


def _line_number(unit, offset):
  """The line number of a byte offset (counted only for an error)."""
  opener = gzip.open if unit.kind == "gzip" else open
  count, at = 0, 0
  with opener(unit.path, "rb") as f:
    while at < offset:
      chunk = f.read(min(1 << 20, offset - at))
      if not chunk:
        break
      count += chunk.count(b"\n")
      at += len(chunk)
  return count + 1


def _tfrecord_documents(unit, spec):
  import tensorflow as tf
  ds = tf.data.TFRecordDataset(unit.path, compression_type=(
      "GZIP" if is_gzip(unit.path) else ""))
  if unit.start:
    ds = ds.skip(unit.start)
  if unit.stop is not None:
    ds = ds.take(unit.stop - unit.start)
  keys = set(spec.keys)
  number = unit.start
  for records in ds.batch(256).as_numpy_iterator():
    for record in records:
      number += 1
      try:
        features = parse_example(record, keys)
      except (ValueError, IndexError) as e:
        raise errors.DataError(
            "data file %s record %d is not a tf.train.Example (%s): pass "
            "TFRecord files of tf.train.Examples" % (unit.path, number, e)
        ) from None
      doc = []
      for key in spec.keys:
        kind, values = features.get(key, ("empty", []))
        if kind == "int64":
          doc.append(_ids(values))
        elif kind == "bytes":
          doc.append(b"".join(values).decode("utf-8", "replace"))
        elif kind == "empty":
          doc.append("")
        else:
          raise errors.DataError(
              "data file %s record %d: feature %r is a %s list, not text or "
              "token ids: set --config.task.text_keys" % (
                  unit.path, number, key, kind))
      if all(len(d) if not isinstance(d, str) else d.strip() for d in doc):
        yield tuple(doc)


def _ids(values):
  import numpy as np
  return np.asarray(values, np.int64).astype(np.int32)


__all__ = ["Unit", "ReadSpec", "FORMATS", "HEAD_BYTES", "unit_bytes",
           "split_patterns", "expand", "comma_hint", "file_format",
           "is_gzip", "file_problem", "tfrecord_problem", "first_record",
           "parse_example", "make_units", "read_unit"]
