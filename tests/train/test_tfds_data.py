"""TFDS datasets read from a local data_dir (meshtf/train/text_data.py
tfds_dataset, experiment.make_data, the binary) -- with no network.

A tiny language-model dataset (a "text" feature and an int "id") and a
translation-like one (a nested Translation feature "translation/en" and
"translation/rev") are PREPARED in a tmp data_dir with
GeneratorBasedBuilder.download_and_prepare. Their builder classes are never
registered with TFDS (skip_registration), so every read below goes through
TFDS's read-only builder made from the prepared files, the way a dataset
prepared elsewhere (or by code that is not installed) is read:

- lm rows streamed from the prepared shards: shapes, one EOS per example,
  zero padding with zero weight, every sentence of a split decodes back
  exactly, a sliced split reads only its part of a shard, a vocabulary
  saved in model_dir is used again;
- seq2seq rows from two text_keys: inputs and targets of segment k are the
  same example's two texts; experiment.make_data builds them for a
  bitransformer, and rejects a text_keys count that does not fit the model
  or a bad held-out split before writing anything;
- installed dataset code whose version is not the prepared one falls back
  to the files;
- the binary `python -m meshtf.train` in a fresh process trains 2 steps on
  the prepared lm dataset given only its name and data_dir;
- errors are one line DataErrors naming dataset, dir and fix, raised fast,
  with no network attempt and nothing written: a name not prepared (unknown
  to TFDS, or a real TFDS dataset like lm1b), a missing data_dir, an unknown
  or empty split, a missing or non-text feature.
"""
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import data  # noqa: E402
from meshtf.train import experiment  # noqa: E402
from meshtf.train import text_data  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "hen"]
_PLACES = ["mat", "log", "hill", "barn", "tree", "road", "pond"]


def _sentences(n, offset):
  return ["the %s sat on the %s %d" % (_ANIMALS[i % 7], _PLACES[i * 3 % 7], i)
          for i in range(offset, offset + n)]


TRAIN = _sentences(50, 0)
VALID = _sentences(12, 50)
LM, PAIRS = "meshtf_tiny_lm", "meshtf_tiny_pairs"


def _reverse(text):
  return " ".join(text.split()[::-1])


class MeshtfTinyLm(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """One sentence per example in "text", its number in "id"; blank texts
  (skipped like blank lines) at the end of train and in split "blank"."""
  VERSION = tfds.core.Version("1.0.0")
  # Nothing is downloaded, so no URL checksums. (TFDS 4.9.10 would look for
  # them next to the code and import importlib_resources, which it does not
  # install on Python >= 3.9: tensorflow/datasets issue 11212.)
  url_infos = None

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=(
        tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "id": tfds.features.Scalar(dtype=np.int64)})))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(TRAIN + [" "]),
            "validation": self._generate_examples(VALID),
            "blank": self._generate_examples(["", " "])}

  def _generate_examples(self, sentences):
    for i, s in enumerate(sentences):
      yield i, {"text": s, "id": i}


class MeshtfTinyPairs(tfds.core.GeneratorBasedBuilder,
                      skip_registration=True):
  """Translation-like: "translation" holds "en" and "rev" (reversed)."""
  VERSION = tfds.core.Version("1.0.0")
  url_infos = None  # as above

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=(
        tfds.features.FeaturesDict({"translation": tfds.features.Translation(
            languages=("en", "rev"))})))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(TRAIN),
            "validation": self._generate_examples(VALID)}

  def _generate_examples(self, sentences):
    for i, s in enumerate(sentences):
      yield i, {"translation": {"en": s, "rev": _reverse(s)}}


class MeshtfTinyLmNewer(MeshtfTinyLm, skip_registration=True):
  """Installed code for meshtf_tiny_lm at a version never prepared."""
  name = LM
  VERSION = tfds.core.Version("2.0.0")


@contextlib.contextmanager
def _no_network():
  """Records (and refuses) every Python socket connection or DNS lookup."""
  attempts = []

  def refuse(*args, **kwargs):
    attempts.append(args)
    raise OSError("network disabled in this test")
  saved = (socket.socket.connect, socket.getaddrinfo,
           socket.create_connection)
  socket.socket.connect = lambda self, *a: refuse(self, *a)
  socket.getaddrinfo = refuse
  socket.create_connection = refuse
  try:
    yield attempts
  finally:
    (socket.socket.connect, socket.getaddrinfo,
     socket.create_connection) = saved


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tfds"))
  tfds.disable_progress_bar()
  with _no_network() as attempts:
    for cls in (MeshtfTinyLm, MeshtfTinyPairs):
      cls(data_dir=path).download_and_prepare(
          download_config=tfds.download.DownloadConfig(
              try_download_gcs=False))
  assert not attempts, attempts
  for name in (LM, PAIRS):   # not registered: read from files only
    with pytest.raises(tfds.core.registered.DatasetNotFoundError):
      tfds.builder_cls(name)
  return path


def _segments(row, feature):
  """The token lists of a packed row's examples, in order."""
  seg = row[feature + "_segmentation"]
  return [row[feature][seg == s].tolist() for s in range(1, seg.max() + 1)]


def _config(split="train", eval_split="validation", length=32,
            vocab_size=48, name=LM, data_dir=None, keys="text"):
  c = config_lib.default_config()
  c.length, c.vocab_size, c.vocab_divisor, c.batch_size = (
      length, vocab_size, 1, 4)
  c.task.tfds_name, c.task.tfds_data_dir = name, data_dir
  c.task.tfds_split, c.task.tfds_eval_split = split, eval_split
  c.task.text_keys = keys
  return c


def _all_examples(stream, feature):
  """Every example of every unit of a stream, once (epoch 0's slots)."""
  return [s for slot in range(len(stream.units))
          for row in stream.unit_rows(slot) for s in _segments(row, feature)]


# --- reading prepared datasets ------------------------------------------------
def test_lm_rows_from_a_prepared_dataset(data_dir, tmp_path):
  model_dir = tmp_path / "model"
  with _no_network() as attempts:
    text = text_data.make_text_data(_config(data_dir=data_dir),
                                    str(model_dir))
    b = text.train.batch(0)
  assert not attempts, attempts
  assert text.vocab_is_new and not model_dir.exists()   # nothing written
  assert set(b) == {"targets", "targets_segmentation", "targets_position",
                    "targets_weights"}
  for v in b.values():
    assert v.shape == (4, 32)
  vocab = text.vocab
  for k in range(4):
    row = {f: b[f][k] for f in b}
    pad = row["targets_segmentation"] == 0
    assert (row["targets"][pad] == data.PAD).all()
    assert (row["targets_weights"] == ~pad).all()
    for tokens in _segments(row, "targets"):
      assert tokens[-1] == data.EOS and tokens.count(data.EOS) == 1
      assert vocab.decode(tokens) in TRAIN
  # Every sentence comes back, once: nothing dropped or truncated (the
  # blank one is skipped).
  assert sorted(vocab.decode(t) for t in _all_examples(text.train,
                                                       "targets")) == \
      sorted(TRAIN)
  assert sorted(vocab.decode(t) for t in _all_examples(text.held_out,
                                                       "targets")) == \
      sorted(VALID)
  # A sliced split reads only its part of the shard.
  units = text_data.tfds_units(LM, data_dir, "validation[:3]")
  assert [(u.start, u.stop) for u in units] == [(0, 3)]
  # The vocabulary training saves is used again (not retrained).
  vocab.save(str(model_dir / text_data.VOCAB_NAME))
  again = text_data.make_text_data(_config(data_dir=data_dir, vocab_size=60),
                                   str(model_dir))
  assert not again.vocab_is_new and again.vocab.size == vocab.size
  assert again.vocab.model_proto == vocab.model_proto


def test_seq2seq_rows_from_two_text_keys(data_dir, tmp_path):
  c = _config(data_dir=data_dir, name=PAIRS, length=48,
              keys="translation/en, translation/rev")
  c.model_type = "bitransformer"
  text = text_data.make_text_data(c, str(tmp_path / "m"))
  b = text.held_out.batch(0)
  for f in ("inputs", "targets"):
    assert b[f].shape == (4, 48)
    assert b[f + "_segmentation"].shape == (4, 48)
  pairs = []
  for slot in range(len(text.held_out.units)):
    for row in text.held_out.unit_rows(slot):
      ins, outs = _segments(row, "inputs"), _segments(row, "targets")
      assert len(ins) == len(outs)
      pairs += [(text.vocab.decode(x), text.vocab.decode(y))
                for x, y in zip(ins, outs)]
  assert sorted(pairs) == sorted((s, _reverse(s)) for s in VALID)


def test_make_data_for_a_bitransformer_and_text_keys_checks(data_dir,
                                                           tmp_path):
  c = _config(data_dir=data_dir, name=PAIRS, vocab_size=64,
              keys="translation/en, translation/rev")
  c.model_type = "bitransformer"
  d = experiment.make_data(c, str(tmp_path / "m"))
  batch = d.eval_batch(0)
  assert batch["inputs"].shape == batch["targets"].shape == (4, 32)
  x = _segments({k: v[0] for k, v in batch.items()}, "inputs")[0]
  y = _segments({k: v[0] for k, v in batch.items()}, "targets")[0]
  assert d.vocab.decode(x) in VALID      # held-out = validation split
  assert d.vocab.decode(y) == _reverse(d.vocab.decode(x))
  c.task.text_keys = "translation/en"
  with pytest.raises(text_data.DataError, match="model_type=bitransformer "
                     "needs two .* set --config.task.text_keys="):
    experiment.make_data(c, str(tmp_path / "m2"))
  c.model_type = "lm"
  c.task.text_keys = "translation/en,translation/rev"
  with pytest.raises(text_data.DataError, match="model_type=lm needs one"):
    experiment.make_data(c, str(tmp_path / "m3"))
  # A bad held-out split is found before anything is read or written.
  c.task.text_keys = "translation/en"
  c.task.tfds_eval_split = "test"
  with pytest.raises(text_data.DataError, match="cannot read split 'test'"):
    experiment.make_data(c, str(tmp_path / "m4"))
  for m in ("m", "m2", "m3", "m4"):
    assert not (tmp_path / m).exists(), m


def test_installed_code_at_another_version_reads_the_prepared_files(
    data_dir, tmp_path, monkeypatch):
  newer = MeshtfTinyLmNewer(data_dir=data_dir)
  assert not newer.is_prepared()     # 2.0.0 code, 1.0.0 on disk
  monkeypatch.setattr(tfds, "builder", lambda name, **kw: newer)
  text = text_data.make_text_data(_config(data_dir=data_dir),
                                  str(tmp_path / "m"))
  assert sorted(text.vocab.decode(t) for t in _all_examples(
      text.held_out, "targets")) == sorted(VALID)


# --- the binary ---------------------------------------------------------------
def test_binary_trains_on_a_prepared_dataset_by_name(data_dir, tmp_path):
  """A fresh process that never saw the builder class: TFDS finds the
  dataset by name in data_dir from its files."""
  model_dir = tmp_path / "run"
  cmd = [sys.executable, "-m", "meshtf.train", "--model_dir=" + str(model_dir),
         "--config.task.tfds_name=" + LM,
         "--config.task.tfds_data_dir=" + data_dir,
         "--config.vocab_size=48", "--config.length=32",
         "--config.moe.num_experts=0", "--config.num_layers=1",
         "--config.eval_steps=1", "--mesh_shape=all:2", "--layout=batch:all",
         "--batch_size=4", "--train_steps=2"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "task: %s;" % LM in out.stdout, out.stdout
  with open(model_dir / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [0, 1]
  assert all(math.isfinite(r["loss"]) for r in records)
  assert (model_dir / text_data.VOCAB_NAME).is_file()


# --- errors -------------------------------------------------------------------
def _one_line_error(fn, *args, **kwargs):
  t0 = time.time()
  with pytest.raises(text_data.DataError) as e:
    fn(*args, **kwargs)
  assert time.time() - t0 < 20, "slow: a download or a retry?"
  message = str(e.value)
  assert "\n" not in message, message
  return message


def test_unprepared_names_and_bad_dirs_splits_features(data_dir, tmp_path):
  model_dir = tmp_path / "m"

  def read(name, where, split, keys=("text",)):
    c = _config(split=split, eval_split=split, name=name, data_dir=where,
                keys=",".join(keys))
    c.model_type = "bitransformer" if len(keys) == 2 else "lm"
    text = text_data.make_text_data(c, str(model_dir))
    text.train.batch(0)
  listing = sorted(os.listdir(data_dir))
  with _no_network() as attempts:
    # Unknown to TFDS, and a real TFDS dataset (code installed) not prepared.
    for name in ("meshtf_never_prepared", "lm1b"):
      msg = _one_line_error(read, name, data_dir, "train")
      assert ("TFDS dataset %s is not prepared in %s" % (name, data_dir)
              in msg), msg
      assert "never downloads" in msg and "tfds build %s" % name in msg, msg
      assert "--config.task.data_files" in msg, msg   # a key that exists
    msg = _one_line_error(read, LM, str(tmp_path / "nowhere"), "train")
    assert "nowhere" in msg and "does not exist" in msg and LM in msg, msg
    msg = _one_line_error(read, LM, data_dir, "test")
    assert "cannot read split 'test'" in msg, msg
    assert "--config.task.tfds_split / tfds_eval_split to one of blank, " \
        "train, validation" in msg, msg
    msg = _one_line_error(read, LM, data_dir, "blank")
    assert "split 'blank'" in msg and "has no text" in msg, msg
    msg = _one_line_error(read, LM, data_dir, "train", ("body",))
    assert "has no feature 'body' (its features: id, text)" in msg, msg
    msg = _one_line_error(read, PAIRS, data_dir, "train", ("en", "rev"))
    assert "its features: translation/en, translation/rev" in msg, msg
    msg = _one_line_error(read, LM, data_dir, "train", ("id",))
    assert "feature 'id' is not a text string" in msg, msg
  assert not attempts, attempts
  assert not model_dir.exists()       # nothing written on bad input
  assert sorted(os.listdir(data_dir)) == listing
