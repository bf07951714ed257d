"""bench/spmd_overhead.py runs as its docstring says: one JSON line per
(variant, config), the variants that keep their collectives agree on the
first loss and those without differ from it. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_spmd_overhead_prints_every_variant_with_its_loss():
  proc = subprocess.run(
      [sys.executable, "bench/spmd_overhead.py", "--sizes=16,8,32",
       "--configs=4/all:4/batch:all", "--rounds=1", "--steps=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [json.loads(l) for l in proc.stdout.splitlines()]
  assert [l["variant"] for l in lines] == [
      "simd", "simd_no_collective", "simd_tf_function", "placement",
      "placement_no_collective"]
  loss = {l["variant"]: l["first_loss"] for l in lines}
  for l in lines:
    assert (l["devices"], l["mesh"], l["layout"]) == (4, "all:4", "batch:all")
    assert l["wall_ms"] > 0 and l["cpu_ms"] > 0
  for v in ("simd_tf_function", "placement"):
    assert loss[v] == pytest.approx(loss["simd"], rel=1e-5)
  # Without the gradients' and the loss's sums: one shard's numbers.
  assert loss["simd_no_collective"] != pytest.approx(loss["simd"], rel=1e-3)
  assert loss["placement_no_collective"] == pytest.approx(
      loss["simd_no_collective"], rel=1e-5)


def test_spmd_overhead_refuses_a_bad_config_in_one_line():
  proc = subprocess.run(
      [sys.executable, "bench/spmd_overhead.py", "--configs=8:all:8"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
      "--configs: '8:all:8' is not DEVICES/MESH/LAYOUT (e.g. "
      "8/all:8/batch:all)")
