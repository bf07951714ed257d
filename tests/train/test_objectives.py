"""T5's objectives as stream preprocessors (meshtf/train/objectives.py):
the span-corruption noise measured over 10,000 examples against T5's
definition, the structure of every corrupted example, prefix LM, next-token
LM and the packer."""
import math

import numpy as np
import pytest

from meshtf.train import objectives


def _spans(mask):
  """Lengths of the runs of True in a bool mask."""
  out, run = [], 0
  for m in mask:
    if m:
      run += 1
    elif run:
      out.append(run)
      run = 0
  return out + ([run] if run else [])


def test_span_corruption_lengths_are_t5s():
  # T5's span_corruption at inputs_length 512: 568 raw tokens, 114 targets.
  assert objectives.span_corruption_lengths(512) == (568, 114)
  # 141 tokens: 21 noise in 7 spans; inputs 120 + 7 + EOS = 128.
  assert objectives.span_corruption_lengths(128) == (141, 29)
  assert objectives.max_noise_spans(568) == 28
  obj = objectives.Objective("span_corruption", 512, first_sentinel=32099)
  assert (obj.tokens_length, obj.targets_length) == (568, 114)
  tokens = np.arange(10, 10 + 568)
  ex = next(obj.examples([tokens], np.random.default_rng(0)))
  assert len(ex["inputs"]) == 512 and len(ex["targets"]) == 114


def test_noise_over_10000_examples_is_t5s_definition():
  """Noise fraction and span lengths within 2% of noise_density 0.15 and
  mean span length 3, at T5's length and at random document lengths; the
  span-length distribution is the random partition's (P(len = 1) =
  (S - 1) / (N - 1) for N noise tokens in S spans)."""
  rng = np.random.default_rng(2024)
  fractions, lengths, ones = [], [], []
  for i in range(10000):
    n = 568 if i < 5000 else int(rng.integers(30, 600))
    mask = objectives.random_spans_noise_mask(n, 0.15, 3.0, rng)
    spans = _spans(mask)
    noise = int(mask.sum())
    # The definition: round(n * 0.15) noise tokens in round(noise / 3)
    # spans, starting with a non-noise span.
    assert noise == round(n * 0.15)
    assert len(spans) == max(round(noise / 3.0), 1) and min(spans) >= 1
    assert not mask[0]
    fractions.append(noise / n)
    lengths.extend(spans)
    if n == 568:
      ones.append(sum(s == 1 for s in spans) / len(spans))
  assert abs(np.mean(fractions) - 0.15) / 0.15 < 0.02, np.mean(fractions)
  assert abs(np.mean(lengths) - 3.0) / 3.0 < 0.02, np.mean(lengths)
  expected_ones = (28 - 1) / (85 - 1)
  assert abs(np.mean(ones) - expected_ones) / expected_ones < 0.02


def test_corrupted_examples_restore_the_text_with_sentinels_counting_down():
  obj = objectives.Objective("span_corruption", 64, first_sentinel=999)
  rng = np.random.default_rng(5)
  docs = [list(range(3, 3 + int(n))) for n in rng.integers(5, 300, 40)]
  joined = np.concatenate(docs)
  restored = []
  for ex in obj.examples(docs, np.random.default_rng(1)):
    x, y = list(ex["inputs"]), list(ex["targets"])
    assert x[-1] == y[-1] == objectives.EOS and len(x) <= 64
    sentinels = [t for t in x if t > 900]
    assert sentinels == list(range(999, 999 - len(sentinels), -1))
    assert [t for t in y if t > 900] == sentinels
    spans, current = {}, None
    for t in y[:-1]:
      if t > 900:
        current = t
        spans[current] = []
      else:
        spans[current].append(t)
    for t in x[:-1]:
      restored.extend(spans[t] if t > 900 else [t])
  # Every token of the documents, in order (segments of 70 raw tokens).
  assert obj.tokens_length == 70
  assert restored == joined.tolist()


def test_prefix_lm_and_lm():
  rng = np.random.default_rng(0)
  doc = list(range(3, 40))
  seq2seq = objectives.Objective("prefix_lm", 16)
  cuts = set()
  got = []
  for _ in range(50):
    for ex in seq2seq.examples([doc], rng):
      x, y = ex["inputs"].tolist(), ex["targets"].tolist()
      assert x[-1] == y[-1] == objectives.EOS
      assert len(x) <= 16 and len(y) <= 16 and len(x) >= 2 and len(y) >= 2
      got.append(x[:-1] + y[:-1])
      cuts.add(len(x) - 1)
  assert all(g in (doc[:15], doc[15:30], doc[30:]) for g in got)
  assert len(cuts) > 5   # uniform split points, not one
  decoder_only = objectives.Objective("prefix_lm", 16, decoder_only=True)
  ex = next(decoder_only.examples([doc], rng))
  assert len(ex["targets"]) == 16 and ex["targets"][-1] == objectives.EOS
  loss = ex["targets_loss"].tolist()
  assert loss[0] == 0 and loss[-1] == 1 and loss == sorted(loss)
  lm = list(objectives.Objective("lm", 16).examples([doc], rng))
  assert [len(e["targets"]) for e in lm] == [16, 16, 6]  # 37 + EOS, all kept
  assert np.concatenate([e["targets"] for e in lm]).tolist() == doc + [1]


def test_packer_weights_and_segments():
  packer = objectives.Packer(("targets",), 8)
  rows = packer.add({"targets": [5, 6, 1], "targets_loss": [0, 1, 1]})
  rows += packer.add({"targets": [7, 1]})
  rows += packer.add({"targets": [8, 9, 9, 1]})   # does not fit: new row
  rows += packer.flush()
  assert len(rows) == 2
  assert rows[0]["targets"].tolist() == [5, 6, 1, 7, 1, 0, 0, 0]
  assert rows[0]["targets_segmentation"].tolist() == [1, 1, 1, 2, 2, 0, 0, 0]
  assert rows[0]["targets_position"].tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
  assert rows[0]["targets_weights"].tolist() == [0, 1, 1, 1, 1, 0, 0, 0]
  assert rows[1]["targets_weights"].sum() == 4
  with pytest.raises(ValueError, match="objective 'mlm' is unknown"):
    objectives.Objective("mlm", 8)
  assert math.isclose(objectives.random_spans_noise_mask(
      10, 0.0, 3.0, np.random.default_rng()).sum(), 0)
