"""Counting identical layers (meshtf/plan/repeated.py): GSPMD's dense
Transformer (gspmd_dense.py:tiny, tpuv3's estimate path) counted at 8 and
64 layers gives every number the full plans give, from the same small
plans (the same operations built and estimated for both); a number not
affine in the depth, and a gradient bucket that would reach the cap, are
refused with the reason (the caller plans every layer)."""
import collections
import copy
import os
import sys

import pytest

from meshtf.plan import estimate
from meshtf.plan import repeated
from meshtf.plan import report as report_lib
from meshtf.train import config as config_lib
from meshtf.train import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plan_scaling  # noqa: E402  pylint: disable=g-import-not-at-top


def _config(row="tiny", layers=8):
  config = config_lib.load_file(
      os.path.join(ROOT, "t2t_configs", "gspmd_dense.py"), row)
  config.num_layers = layers
  return config


def _plan(config, layers, work=None):
  """The estimate-path plan on tpuv3 of config at `layers` layers; work
  counts the operations built and estimated."""
  c = copy.deepcopy(config)
  c.num_layers = layers
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  if work is None:
    return report_lib.plan(graph, layout, "tpuv3", trace=False)
  work["built"] += len(graph.operations)
  estimated = estimate._estimate_op  # pylint: disable=protected-access

  def counting(*args):
    work["estimated"] += 1
    return estimated(*args)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(estimate, "_estimate_op", counting)
    return report_lib.plan(graph, layout, "tpuv3", trace=False)


def _assert_same_numbers(counted, full, path=""):
  """Equal, floats to rounding (1e-9 relative)."""
  if isinstance(full, dict):
    assert list(counted) == list(full), path
    for k in full:
      _assert_same_numbers(counted[k], full[k], "%s/%s" % (path, k))
  elif isinstance(full, list):
    assert len(counted) == len(full), path
    for i, (a, b) in enumerate(zip(counted, full)):
      _assert_same_numbers(a, b, "%s[%d]" % (path, i))
  elif isinstance(full, float):
    assert counted == pytest.approx(full, rel=1e-9, abs=0), path
  else:
    assert counted == full, path


@pytest.mark.parametrize("layers", [8, 64])
def test_counted_layers_give_the_full_plans_numbers(layers):
  config = _config(layers=layers)
  counted = repeated.count_layers(lambda d: _plan(config, d), layers, 1)
  assert counted.depths == [2, 3, 4, 5]
  assert counted.how == "planned 2, 3, 4 and 5 layers and counted %d" % (
      layers)
  full = _plan(config, layers).summary()
  summary = counted.summary()
  for name in plan_scaling.NUMBERS:
    _assert_same_numbers(summary[name], full[name], name)
  assert summary["arithmetic_intensity"] == pytest.approx(
      full["arithmetic_intensity"], rel=1e-9)
  assert summary["depth"] == {"layers": layers, "planned": [2, 3, 4, 5],
                              "counted": True, "how": counted.how}
  # The report reads as a full plan's, saying how it was planned.
  text = counted.text()
  assert text.splitlines()[1] == ("depth: %s (meshtf/plan/repeated.py)"
                                  % counted.how)
  assert "step time estimate" in text
  # Its collectives' reasons counted too: the same top groups.
  top = lambda s: [(t["kind"], t["bytes_per_device"], t["count"])  # noqa: E731
                   for t in s["top_collectives"]]
  assert top(summary) == top(full)
  assert "collectives by bytes sent per device" in counted.explain(3)
  with pytest.raises(ValueError, match="no per-op times"):
    counted.op_seconds()


def test_8_and_64_layers_plan_the_same_small_graphs():
  work = {}
  for layers in (8, 64):
    work[layers] = collections.Counter()
    config = _config(layers=layers)
    repeated.count_layers(lambda d, c=config, w=work[layers]: _plan(c, d, w),
                          layers, 1)
  assert work[8]["built"] > 0 and work[8]["estimated"] > 0
  assert work[64] == work[8]


def test_a_number_not_affine_in_depth_is_not_counted():
  # Layers that widen with the depth are not identical: their parameters
  # (the first number asked) are not affine in it.
  config = _config(layers=16)

  def widening(depth):
    c = copy.deepcopy(config)
    c.d_ff = 16 * depth
    return _plan(c, depth)

  with pytest.raises(repeated.NotCounted,
                     match=r"^memory_bytes_per_device\[parameters\] is "
                           r"not affine in depth \(.* at 2, 3, 4, 5 "
                           r"layers\)$"):
    repeated.count_layers(widening, 16, 1)


def test_a_bucket_reaching_the_cap_is_not_counted():
  # GSPMD Table 2's 512B row: one allreduce bucket collects every layer's
  # small gradients and reaches the Bucketer's 1 MiB by 64 layers, where
  # it splits: seen after two small plans.
  config = _config("table2_512B_32x64", 64)
  depths = []

  def plan_at(depth):
    depths.append(depth)
    return _plan(config, depth)

  with pytest.raises(repeated.NotCounted,
                     match=r"grows by 4098 elements every 1 layer\(s\): a "
                           r"gradient bucket that reaches the 1048576-byte "
                           r"bucket cap by 64 layers"):
    repeated.count_layers(plan_at, 64, 1)
  assert depths == [2, 3]


def test_sample_depths():
  assert repeated.sample_depths(256, 1) == [2, 3, 4, 5]
  assert repeated.sample_depths(64, 2) == [4, 6, 8, 10]
  with pytest.raises(repeated.NotCounted, match="not more than the 5"):
    repeated.sample_depths(5, 1)
  with pytest.raises(repeated.NotCounted, match="whole periods of 2"):
    repeated.sample_depths(63, 2)


def test_a_peak_growing_slower_than_the_saved_activations_is_not_counted():
  # A peak that stays put while every layer keeps more for the backward
  # pass sits where the layers are not; a deeper model's layers would
  # overtake it, so it is not counted (here: the 3-layer plan's peak
  # reported at every depth).
  config = _config(layers=64)
  fixed = _plan(config, 3).summary()["memory_bytes_per_device"][
      "activations_peak"]

  def fixed_peak(depth):
    report = _plan(config, depth)
    summary = report.summary()
    summary["memory_bytes_per_device"]["activations_peak"] = fixed
    report.summary = lambda: summary
    return report

  with pytest.raises(repeated.NotCounted,
                     match=r"the activation peak grows by 0 bytes a period, "
                           r"less than the \d+ kept for the backward pass"):
    repeated.count_layers(fixed_peak, 64, 1)
