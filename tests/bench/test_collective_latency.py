"""bench/collective_latency.py runs as its docstring says: one JSON line per
(backend, size) and a summary; both backends compute the same chain. No
timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_collective_latency_prints_runs_and_ratios_with_equal_results():
  proc = subprocess.run(
      [sys.executable, "bench/collective_latency.py", "--devices=4",
       "--sizes=3,5", "--chain=2", "--steps=1", "--rounds=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [json.loads(l) for l in proc.stdout.splitlines()]
  runs = [l for l in lines if l["kind"] == "run"]
  assert [(r["backend"], r["floats_per_device"]) for r in runs] == [
      ("simd", 3), ("placement", 3), ("simd", 5), ("placement", 5)]
  for r in runs:
    assert r["devices"] == 4 and r["ms_per_allreduce"] > 0
    assert r["cpu_ms_per_allreduce"] > 0
  assert runs[0]["first_value"] == pytest.approx(runs[1]["first_value"],
                                                 rel=1e-6)
  assert runs[2]["first_value"] == pytest.approx(runs[3]["first_value"],
                                                 rel=1e-6)
  for key in ("simd_over_placement", "simd_over_placement_cpu"):
    assert set(lines[-1][key]) == {"3", "5"}


def test_collective_latency_refuses_bad_device_counts():
  proc = subprocess.run(
      [sys.executable, "bench/collective_latency.py", "--devices=9"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip() == "--devices=9: use 2..8 (virtual CPU devices)"
