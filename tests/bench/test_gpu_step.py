"""bench/gpu_step.py, exercised on CPU (no GPU here): --cpu_smoke runs the
data-parallel and model-parallel layouts end to end, a mode TF cannot
compile becomes a "skip" line, every run line carries its config, and
flops / MFU / tokens/s follow the printed formula. Without a GPU (and
without --cpu_smoke) it says so in one line. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

from conftest import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _bench_module():
  return load_file("bench/gpu_step.py", "gpu_step")


def test_cpu_smoke_prints_runs_whose_mfu_follows_the_formula():
  proc = subprocess.run(
      [sys.executable, "bench/gpu_step.py", "--cpu_smoke", "--steps=1",
       "--rounds=1", "--warmup=0", "--layouts=data,model",
       "--jit_compile=off,program"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [json.loads(l) for l in proc.stdout.splitlines()]
  assert [l["kind"] for l in lines] == ["skip", "skip", "run", "run",
                                        "summary"]
  # The whole-program XLA mode cannot compile collectives on CPU.
  assert {l["run"] for l in lines[:2]} == {"data/program", "model/program"}
  assert all("jit_compile='segments'" in l["reason"] for l in lines[:2])
  runs = lines[2:4]
  assert [(r["run"], r["mesh_shape"], r["layout"]) for r in runs] == [
      ("data/off", "all:2", "batch:all"),
      ("model/off", "data:1;model:2",
       "batch:data;heads:model;d_ff:model;vocab:model")]
  s = runs[0]["sizes"]
  # Per layer q, k, v, o and two feed-forward kernels; the logits kernel.
  matmul = (s["num_layers"] * (4 * s["d_model"] * s["num_heads"] * s["d_kv"]
                               + 2 * s["d_model"] * s["d_ff"])
            + s["d_model"] * s["vocab"])
  for r in runs:
    assert r["devices"] == 2 and r["activation_dtype"] == "bfloat16"
    assert r["communication_hint"] == "auto" and r["jit_compile"] == "off"
    tokens = r["batch"] * s["length"]
    assert r["batch"] == 2 * s["batch"] and r["tokens_per_step"] == tokens
    assert r["params_matmul"] == matmul
    # The rest: input and position embeddings, the rms norms' scales (two
    # per layer and the final one).
    assert r["params_total"] == matmul + s["d_model"] * (
        s["vocab"] + s["length"] + 2 * s["num_layers"] + 1)
    flops = 6 * matmul * tokens + 12 * s["num_layers"] * s["num_heads"] * \
        s["d_kv"] * s["length"] * tokens
    assert r["flops_per_step"] == flops
    assert r["flops_formula"].startswith("6 * params_matmul * tokens")
    assert r["mfu"] == pytest.approx(
        flops / r["step_s"] / (r["peak_flops_per_device"] * r["devices"]))
    assert r["tokens_per_s"] == pytest.approx(tokens / r["step_s"])
    assert r["min_s"] <= r["step_s"] <= r["max_s"] and len(r["all_s"]) == 1
  # The same tokens on both layouts: the same first loss, within bfloat16.
  assert runs[1]["first_loss"] == pytest.approx(runs[0]["first_loss"],
                                                rel=2e-2)
  assert set(lines[-1]["mfu"]) == {"data/off", "model/off"}


def test_without_a_gpu_it_says_so_in_one_line():
  proc = subprocess.run([sys.executable, "bench/gpu_step.py"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, env=ENV)
  assert proc.returncode == 1 and proc.stdout == ""
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "bench/gpu_step.py: no GPU visible to TensorFlow")
  assert "--cpu_smoke" in proc.stderr


def test_bad_flags_are_refused_in_one_line():
  proc = subprocess.run(
      [sys.executable, "bench/gpu_step.py", "--jit_compile=program,fast"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
  assert proc.returncode == 1
  assert proc.stderr.strip() == ("--jit_compile=program,fast: 'fast' is not "
                                 "one of program, segments, off "
                                 "(comma-separated)")


def test_peak_flops_by_gpu_name():
  bench = _bench_module()
  assert bench.peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
  assert bench.peak_flops_for("NVIDIA H200") == 989e12
  assert bench.peak_flops_for("NVIDIA H100 PCIe") == 756e12
  assert bench.peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
  assert bench.peak_flops_for("Tesla T4") is None   # needs --peak_tflops
