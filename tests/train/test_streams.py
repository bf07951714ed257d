"""The streaming input pipeline (meshtf/train/streams.py, sources.py,
text_data.make_text_data): batches as a function of (seed, step, files),
the same rows on any worker count, resuming at step 1,000 of a 2-worker run
from the saved positions (one unit read per lane, the next batches equal
the uninterrupted run's), positions that do not fit, units of text and
gzip files, and a vocabulary trained on a bounded sample."""
import gzip
import random

import numpy as np
import pytest

from meshtf.train import config as config_lib
from meshtf.train import objectives
from meshtf.train import sources
from meshtf.train import streams
from meshtf.train import text_data
from meshtf.train import vocabulary

WORDS = ("the cat dog sat ran on a mat far away big small red blue green "
         "house tree road hill river").split()


def _corpus(path, lines, seed=0):
  rng = random.Random(seed)
  with open(path, "w") as f:
    for i in range(lines):
      f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 25)))
              + " %d\n" % i)
  return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("corpus")
  files = [_corpus(d / "a.txt", 2500, 1), _corpus(d / "b.txt", 1500, 2)]
  spec = sources.ReadSpec("text")
  units = sources.make_units(files, "text", 1 << 12)
  vocab = vocabulary.train_vocabulary(
      text_data.sample_texts(units, spec, 1 << 16), 48, extra_ids=8)
  return {"dir": d, "files": files, "units": units, "spec": spec,
          "vocab": vocab}


def _stream(corpus, objective="lm", batch_size=8, seed=3, length=32, **kw):
  vocab = corpus["vocab"]
  obj = objectives.Objective(objective, length, decoder_only=kw.pop(
      "decoder_only", True), first_sentinel=vocab.sentinel_id(0))
  return streams.Stream(corpus["units"], corpus["spec"], obj, batch_size,
                        seed, vocab, **kw)


def _equal(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_units_cover_every_line_once(corpus):
  units = corpus["units"]
  assert len(units) > 8 and {u.kind for u in units} == {"text"}
  lines = [doc[0] for u in units
           for doc in sources.read_unit(u, corpus["spec"])]
  expected = []
  for path in corpus["files"]:
    with open(path) as f:
      expected += f.read().splitlines()
  assert lines == expected
  # A gzip file is one unit, read whole.
  gz = corpus["dir"] / "c.txt.gz"
  with open(corpus["files"][1], "rb") as f, gzip.open(gz, "wb") as g:
    g.write(f.read())
  (unit,) = sources.make_units([str(gz)])
  assert unit.kind == "gzip"
  assert [d[0] for d in sources.read_unit(unit, corpus["spec"])] == \
      expected[2500:]


def test_batches_are_a_function_of_seed_step_and_files(corpus):
  a, b = _stream(corpus), _stream(corpus, reader_threads=1, prefetch=False)
  other_seed = _stream(corpus, seed=4)
  for step in range(4):
    _equal(a.batch(step), b.batch(step))
  assert not np.array_equal(a.batch(4)["targets"],
                            other_seed.batch(0)["targets"])
  # Rows are lanes: any split of the batch over workers reads the same rows.
  full = [_stream(corpus).batch(s) for s in range(3)]
  for shares in ([range(0, 4), range(4, 8)], [[0, 1], [2, 3], [4, 5], [6,
                                                                      7]]):
    for rows in shares:
      s = _stream(corpus)
      for step in range(3):
        part = s.batch(step, rows=rows)
        _equal(part, {k: v[list(rows)] for k, v in full[step].items()})
  b.batch(1)     # a step already served: read again from the start
  _equal(b.batch(2), full[2])
  for s in (a, b, other_seed):
    s.close()


def test_resume_at_step_1000_of_two_workers(corpus, tmp_path, monkeypatch):
  """Two workers (rows 0-3 and 4-7) train 1,000 steps and save; the chief
  gathers both workers' positions into its checkpoint's state. Resumed on
  two workers, or on one, the next batches equal the uninterrupted run's,
  and each lane reads one unit to get there."""
  shares = [range(0, 4), range(4, 8)]
  runs = [_stream(corpus) for _ in shares]
  for step in range(1000):
    for s, rows in zip(runs, shares):
      s.batch(step, rows=rows)
  model_dir = str(tmp_path)
  streams.write_positions(model_dir, 1000, 1, runs[1].state())
  state, missing = streams.gather_positions(model_dir, 1000, 2,
                                            runs[0].state(), timeout_s=1)
  assert missing == [] and sorted(map(int, state["lanes"])) == list(range(8))
  assert not list(tmp_path.iterdir())       # the worker's file is read once
  # ~130 rows per 4 KB unit: each lane is 7-8 units into the data.
  assert min(n for n, _ in state["lanes"].values()) >= 5
  expected = [[s.batch(step, rows=rows) for step in range(1000, 1004)]
              for s, rows in zip(runs, shares)]
  opened = []
  real = streams.Stream.unit_rows

  def counted(self, slot):
    opened.append(slot)
    return real(self, slot)
  monkeypatch.setattr(streams.Stream, "unit_rows", counted)
  for rows, want in zip(shares, expected):
    s = _stream(corpus)
    assert s.restore(state, 1000) is None
    del opened[:]
    got = [s.batch(step, rows=rows) for step in range(1000, 1004)]
    s.close()
    for g, w in zip(got, want):
      _equal(g, w)
    assert len(opened) <= 2 * len(rows), opened   # not 1,000 batches
  one = _stream(corpus)                     # one worker: all eight rows
  assert one.restore(state, 1000) is None
  _equal(one.batch(1000), {k: np.concatenate([expected[0][0][k],
                                              expected[1][0][k]])
                           for k in expected[0][0]})
  one.close()
  # Positions for other data are dropped with one line, not misused.
  other = _stream(corpus, batch_size=4)
  why = other.restore(state, 1000)
  assert "batch_size changed" in why and "starts again" in why, why
  other.batch(1000)
  assert streams.gather_positions(model_dir, 5, 2, {"lanes": {}},
                                  timeout_s=0.1)[1] == [1]
  for s in runs + [other]:
    s.close()


def test_seq2seq_span_corruption_and_prefix_lm_rows(corpus):
  s = _stream(corpus, "span_corruption", decoder_only=False)
  b = s.batch(0)
  assert set(b) == {"inputs", "inputs_segmentation", "inputs_position",
                    "targets", "targets_segmentation", "targets_position",
                    "targets_weights"}
  vocab = corpus["vocab"]
  assert (b["inputs"] == vocab.sentinel_id(0)).sum() >= 8   # each row
  assert ((b["targets_weights"] > 0) == (b["targets"] > 0)).all()
  lm = _stream(corpus, "prefix_lm")
  row = lm.batch(0)
  first = row["targets_segmentation"][0] == 1
  w = row["targets_weights"][0][first]
  assert w[0] == 0 and w[-1] == 1       # the loss on the suffix only
  for x in (s, lm):
    x.close()


def test_make_text_data_from_the_config(corpus, tmp_path):
  c = config_lib.default_config()
  c.task.data_files = str(corpus["dir"] / "*.txt")
  c.length, c.batch_size, c.vocab_size = 32, 4, 40
  c.task.vocab_sample_mb = 0.02
  text = text_data.make_text_data(c, str(tmp_path / "m"))
  assert text.vocab_is_new and not (tmp_path / "m").exists()
  assert len(text.train.units) == len(sources.make_units(
      corpus["files"], "text", sources.unit_bytes(32)))
  b = text.train.batch(0)
  assert b["targets"].shape == (4, 32)
  # The sample is bounded: a vocabulary from 20 KB of a 200 KB corpus.
  sample = text_data.sample_texts(text.train.units, text.train.spec,
                                  20 << 10)
  assert sum(map(len, sample)) < 24 << 10
  assert len({s.split()[-1] for s in sample}) > 100   # spread, not a prefix
  text.train.close()
  assert config_lib.DATA_FORMATS == sources.FORMATS
  assert config_lib.TASK_OBJECTIVES == ("",) + objectives.OBJECTIVES


def test_bad_lines_past_the_checked_head_are_one_line_when_read(tmp_path):
  """The preflight reads a file's first 64 KiB; a bad line after them is
  the same one line (file, line, fix) when a lane reads it."""
  good = "".join("input %d\ttarget %d\n" % (i, i) for i in range(6000))
  path = tmp_path / "pairs.tsv"
  path.write_text(good + "a line without its tab\n")
  assert sources.file_problem(str(path), pairs=True) is None
  spec = sources.ReadSpec("text", pairs=True)
  units = sources.make_units([str(path)], "text", 1 << 16)
  with pytest.raises(text_data.DataError) as e:
    for u in units:
      list(sources.read_unit(u, spec))
  assert str(e.value).startswith("data file %s line 6001 has no tab" % path)
  latin = tmp_path / "latin.txt"
  latin.write_bytes(good.encode() + b"caf\xe9\n")
  with pytest.raises(text_data.DataError) as e:
    for u in sources.make_units([str(latin)], "text", 1 << 16):
      list(sources.read_unit(u, sources.ReadSpec("text")))
  assert "latin.txt is not UTF-8 text: byte 0xe9 at line 6001" in str(e.value)
  # Through a stream's prefetch thread, as the training loop meets it.
  vocab = vocabulary.train_vocabulary(good.split("\n")[:500], 40)
  stream = streams.Stream(units, spec, objectives.Objective("seq2seq", 16),
                          2, vocab=vocab)
  with pytest.raises(text_data.DataError, match="line 6001 has no tab"):
    for step in range(5000):
      stream.batch(step)
  stream.close()
