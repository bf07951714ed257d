"""bench/peers.py runs as its docstring says: one process per run and
round, JSON lines of kind run / summary (/ skip), the same first loss in
every framework and layout (the same math from the same numbers). No
timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_peers_prints_runs_and_ratios_with_equal_first_losses():
  proc = subprocess.run(
      [sys.executable, "bench/peers.py", "--sizes=16,8,32", "--devices=1,4",
       "--frameworks=tf,meshtf", "--rounds=1", "--steps=2", "--warmup=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [json.loads(l) for l in proc.stdout.splitlines()]
  runs = [l for l in lines if l["kind"] == "run"]
  assert [(r["framework"], r["devices"], r["layout_name"]) for r in runs] == [
      ("tf", 1, "1-device"), ("tf", 4, "data_parallel"),
      ("tf", 4, "data_parallel_nosync"), ("meshtf", 1, "1-device"),
      ("meshtf", 4, "data_parallel"), ("meshtf", 4, "2d")]
  for r in runs:
    assert r["sizes"] == {"batch": 16, "io": 8, "hidden": 32}
    assert len(r["all_s"]) == 1 and r["step_s"] > 0
    assert r["first_loss"] == pytest.approx(runs[0]["first_loss"], rel=1e-5)
  # After 1 + 1 + 2 steps: the hand-written data-parallel step and meshtf's
  # layouts follow the 1-device step; the floor without the sum does not.
  last = {(r["framework"], r["layout_name"]): r["last_loss"] for r in runs}
  for key in [("tf", "data_parallel"), ("meshtf", "1-device"),
              ("meshtf", "data_parallel"), ("meshtf", "2d")]:
    assert last[key] == pytest.approx(last[("tf", "1-device")], rel=1e-4)
  assert last[("tf", "data_parallel_nosync")] != pytest.approx(
      last[("tf", "1-device")], rel=1e-4)
  summary = lines[-1]
  assert summary["kind"] == "summary"
  assert set(summary["ratios"]) == {
      "meshtf/1/1-device/over_tf_1_device",
      "meshtf/4/data_parallel/over_tf_1_device",
      "meshtf/4/data_parallel/over_own_1_device",
      "meshtf/4/2d/over_tf_1_device", "meshtf/4/2d/over_own_1_device",
      "meshtf/4/data_parallel/meshtf_over_tf",
      "tf/4/data_parallel/over_tf_1_device",
      "tf/4/data_parallel/over_own_1_device",
      "tf/4/data_parallel_nosync/over_tf_1_device",
      "tf/4/data_parallel_nosync/over_own_1_device"}


def test_peers_refuses_bad_flags_in_one_line():
  proc = subprocess.run(
      [sys.executable, "bench/peers.py", "--devices=1,16"], cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
      "--devices=1,16: each count must be 1..8 (8 virtual CPU devices)")
