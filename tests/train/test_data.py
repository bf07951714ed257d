"""Synthetic training data and packing (meshtf/train/data.py); streamed
text is tests/train/test_streams.py."""
import numpy as np
import pytest

from meshtf.train import data


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
