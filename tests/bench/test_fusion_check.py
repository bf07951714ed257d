"""bench/fusion_check.py: its reading of XLA's optimized HLO (kernels and
the bytes they move), and one run on a 1-layer LM: the plan's matmul
traffic is XLA's own, and with remat the recomputation survives XLA's
optimizations (the optimization barrier the SPMD backend puts under
jit_compile="program"). No timing is asserted."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import fusion_check  # noqa: E402

HLO = """HloModule m

%fused_computation (p0: f32[4,8], p1: f32[8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %b = f32[4,8]{1,0} broadcast(%p1), dimensions={1}
  ROOT %add = f32[4,8]{1,0} add(%p0, %b)
}

ENTRY %main (a: f32[4,16], w: f32[16,8], bias: f32[8]) -> (f32[4,8], s32[]) {
  %a = f32[4,16]{1,0} parameter(0)
  %w = f32[16,8]{1,0} parameter(1)
  %bias = f32[8]{0} parameter(2)
  %dot.1 = f32[4,8]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %fusion.1 = f32[4,8]{1,0} fusion(%dot.1, %bias), kind=kLoop, calls=%fused_computation
  %c = s32[] constant(3)
  ROOT %t = (f32[4,8]{1,0}, s32[]) tuple(%fusion.1, %c)
}
"""


def test_array_sizes_of_arrays_and_tuples():
  assert fusion_check.array_sizes("f32[2,3]{1,0}") == [(6, 24)]
  assert fusion_check.array_sizes("(bf16[4]{0}, s32[])") == [(4, 8), (1, 4)]


def test_hlo_kernels_are_the_entry_instructions_that_move_data():
  kernels = fusion_check.hlo_kernels(HLO)
  assert [(k["name"], k["kind"]) for k in kernels] == [
      ("dot.1", "dot"), ("fusion.1", "other")]
  dot, fused = kernels
  assert dot["reads"] == [(64, 256), (128, 512)] and dot["writes"] == [
      (32, 128)]
  assert fused["reads"] == [(32, 128), (8, 32)]
  summary = fusion_check.summarize(kernels, attention_elements=32)
  assert summary["bytes_dot"] == 256 + 512 + 128
  assert summary["bytes_other"] == 128 + 32 + 128
  assert summary["attention_passes_other"] == 2


def test_gemm_custom_calls_and_gemm_fusions_count_as_matmuls():
  assert fusion_check._is_matmul_call(
      'custom_call_target="__cublas$lt$matmul"')
  assert fusion_check._is_matmul_call('custom_call_target="__cublas$gemm"')
  assert not fusion_check._is_matmul_call(
      'custom_call_target="__cudnn$norm"')
  gpu = HLO.replace(
      "dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
      'custom-call(%a, %w), custom_call_target="__cublas$gemm"')
  assert [k["kind"] for k in fusion_check.hlo_kernels(gpu)] == [
      "dot", "other"]


def _run(*flags):
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "bench", "fusion_check.py"),
       "--length=32", "--batch=2"] + list(flags),
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [json.loads(l) for l in out.stdout.splitlines()
          if l.startswith("{")]
  return {r["side"]: r for r in rows}


def test_the_plan_moves_xlas_matmul_bytes_and_remat_survives_xla():
  none = _run("--remat=none")
  full = _run("--remat=full")
  # float32: every einsum is one XLA dot reading and writing the same
  # tensors.
  assert none["plan"]["bytes_dot"] == none["xla_cpu"]["bytes_dot"]
  # The backward pass recomputes the block's matmuls under XLA too (before
  # the barrier XLA merged them with the forward's: the same bytes as
  # remat none).
  assert full["xla_cpu"]["bytes_dot"] > none["xla_cpu"]["bytes_dot"]
  assert full["plan"]["bytes_dot"] > none["plan"]["bytes_dot"]
