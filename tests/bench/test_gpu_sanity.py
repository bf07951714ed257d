"""bench/gpu_sanity.py, exercised on CPU (no GPU here): its loss comparison
gives the same losses on one device and on data / data+model meshes of
virtual CPUs (what it checks on logical GPUs), the relative error it
reports is the norm ratio, and without a GPU it says so and exits 2."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import DEVICES
from conftest import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _sanity_module():
  return load_file("bench/gpu_sanity.py", "gpu_sanity")


def test_losses_agree_across_meshes_of_the_same_model():
  sanity = _sanity_module()
  ids = np.random.RandomState(0).randint(
      1, sanity.SIZES["vocab_size"],
      size=[4, sanity.SIZES["max_length"]]).astype(np.int32)
  one = sanity.losses_on(DEVICES[:1], "all:1", "", 2, ids)
  assert one[1] < one[0]          # it trains
  # (The float32 mesh runs are the harness's layout-invariance, elsewhere.)
  bf16 = sanity.losses_on(
      DEVICES[:2], "data:1;model:2",
      sanity.MODEL_LAYOUT, 2, ids, hint="ring",
      activation_dtype="bfloat16")
  assert bf16 == pytest.approx(one, rel=sanity.BF16_LOSS_LIMIT)
  assert bf16 != one


def test_relative_error_is_the_norm_ratio():
  sanity = _sanity_module()
  ref = np.array([[3.0, 4.0]])
  assert sanity.relative_error(ref, ref) == 0.0
  assert sanity.relative_error([[3.0, 4.5]], ref) == pytest.approx(0.1)


def test_without_a_gpu_it_says_so_and_exits_2():
  proc = subprocess.run(
      [sys.executable, "bench/gpu_sanity.py"], cwd=ROOT, capture_output=True,
      text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 2
  assert '"kind": "env"' in proc.stdout and '"gpus": []' in proc.stdout
  assert proc.stderr.strip().splitlines()[-1] == (
      "bench/gpu_sanity.py: TensorFlow sees no GPU")


def test_compare_losses_lines(capsys):
  sanity = _sanity_module()
  line = sanity.compare_losses("data:2", "all:2", "batch:all", 1e-4, "cpu",
                               lambda: ([2.0, 1.0], [2.0, 1.00005]))
  assert line["ok"] and line["cpu"] == [2.0, 1.0]
  assert line["max_rel_diff"] == pytest.approx(5e-5)
  assert not sanity.compare_losses("m", "all:2", "", 1e-4, "cpu",
                                   lambda: ([1.0], [1.001]))["ok"]

  def broken():
    raise ValueError("no kernel\nmore")
  line = sanity.compare_losses("m", "all:2", "", 1e-4, "cpu", broken)
  assert line == {"kind": "losses", "run": "m", "ok": False,
                  "error": "no kernel"}
  assert capsys.readouterr().out.count('"kind": "losses"') == 3
