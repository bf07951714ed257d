"""Training data (meshtf/train/data.py, text_data.py)."""
import numpy as np
import pytest

from meshtf.train import data
from meshtf.train import text_data


def _decode_digits(tokens):
  return int("".join(str(t - 3) for t in reversed(tokens)))


@pytest.mark.parametrize("problem", data.PROBLEMS)
def test_synthetic_lm_examples_are_correct(problem):
  task = data.SyntheticTask(problem, vocab_size=16, length=20)
  batch = task.batch(step=3, batch_size=16, seed=7)
  for row, w in zip(batch["targets"], batch["targets_weights"]):
    sep = list(row).index(data.SEP)
    eos = list(row).index(data.EOS)
    x, y = list(row[:sep]), list(row[sep + 1:eos])
    if problem == "copy":
      assert y == x
    elif problem == "reverse":
      assert y == x[::-1]
    else:
      plus = x.index(13)
      assert _decode_digits(y) == (_decode_digits(x[:plus]) +
                                   _decode_digits(x[plus + 1:]))
    # The loss counts the output and the EOS only.
    assert w.tolist() == [0.0] * (sep + 1) + [1.0] * (eos - sep) + \
        [0.0] * (len(row) - eos - 1)
    assert (row[eos + 1:] == data.PAD).all()


def test_batches_are_deterministic_and_rows_are_shares():
  task = data.SyntheticTask("copy", vocab_size=16, length=16)
  full = task.batch(step=5, batch_size=8, seed=1)
  again = task.batch(step=5, batch_size=8, seed=1)
  share = task.batch(step=5, batch_size=8, seed=1, rows=range(4, 8))
  other = task.batch(step=6, batch_size=8, seed=1)
  for k in full:
    np.testing.assert_array_equal(full[k], again[k])
    np.testing.assert_array_equal(full[k][4:], share[k])
  assert not np.array_equal(full["targets"], other["targets"])


def test_seq2seq_format():
  task = data.SyntheticTask("reverse", vocab_size=12, length=10, seq2seq=True)
  b = task.batch(0, 4, seed=2)
  for x, y in zip(b["inputs"], b["targets"]):
    n = list(x).index(data.EOS)
    assert list(y[:n]) == list(x[:n])[::-1] and y[n] == data.EOS
  assert (b["targets_weights"] == (b["targets"] != 0)).all()


def test_bad_synthetic_config_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown synthetic problem 'sort'"):
    data.SyntheticTask("sort", 16, 16)
  with pytest.raises(ValueError, match="needs vocab_size >= 14"):
    data.SyntheticTask("addition", 8, 16)


def test_pack_keeps_features_side_by_side():
  rows = data.pack([{"inputs": [5, 1], "targets": [6, 7, 1]},
                    {"inputs": [8, 9, 1], "targets": [4, 1]},
                    {"inputs": [3, 3, 3, 1], "targets": [1]}], length=6)
  assert len(rows) == 2
  assert rows[0]["inputs"].tolist() == [5, 1, 8, 9, 1, 0]
  assert rows[0]["targets"].tolist() == [6, 7, 1, 4, 1, 0]
  assert rows[0]["targets_segmentation"].tolist() == [1, 1, 1, 2, 2, 0]
  assert rows[0]["inputs_position"].tolist() == [0, 1, 0, 1, 2, 0]
  assert rows[1]["inputs"].tolist() == [3, 3, 3, 1, 0, 0]


TEXT = ["the quick brown fox jumps over the lazy dog %d" % i for i in range(40)]


def test_text_lm_trains_vocab_once_and_packs(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("\n".join(TEXT) + "\n")
  model_dir = str(tmp_path / "model")
  ds = text_data.TextDataset([str(path)], model_dir, length=128, vocab_size=40)
  assert (tmp_path / "model" / "vocab.model").exists()
  b = ds.batch(0, 4)
  assert b["targets"].shape == (4, 128)
  assert b["targets_segmentation"].max() >= 2  # several lines per row
  first = b["targets"][0][b["targets_segmentation"][0] == 1]
  assert ds.decode(first) in TEXT
  # A second run reuses the saved vocabulary (same ids).
  ds2 = text_data.TextDataset([str(path)], model_dir, length=128, vocab_size=99)
  np.testing.assert_array_equal(ds2.batch(3, 4)["targets"],
                                ds.batch(3, 4)["targets"])


def test_text_seq2seq_and_errors(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("\n".join("%s\t%s" % (t, t.upper()) for t in TEXT) + "\n")
  ds = text_data.TextDataset([str(path)], str(tmp_path / "m"), length=48,
                             vocab_size=90, seq2seq=True)
  b = ds.batch(0, 2)
  assert set(b) >= {"inputs", "targets", "inputs_segmentation"}
  with pytest.raises(text_data.DataError, match="missing.txt does not exist"):
    text_data.TextDataset([str(tmp_path / "missing.txt")],
                          str(tmp_path / "m2"), 16)
  assert not (tmp_path / "m2").exists()  # nothing written on bad input
  with pytest.raises(text_data.DataError, match="never downloads"):
    text_data.tfds_dataset("lm1b", str(tmp_path / "no_tfds"), "train", 16,
                           str(tmp_path / "m3"))
