"""bench/first_step.py: its cases are valid configs of the binary, its phase
accounting is exclusive, and a measurement of lm_tiny (in this process, its
patches undone afterwards) has every phase. No timing is asserted."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import first_step  # noqa: E402


def test_cases_are_valid_configs_of_the_binary():
  from meshtf.train import config as config_lib
  assert {"lm_tiny", "t5_small", "t5_small_dropout"} <= set(first_step.CASES)
  assert first_step.CASES["t5_small_dropout"]().dropout_rate == 0.1
  t5 = first_step.CASES["t5_small"]()
  assert (t5.model_type, t5.num_layers, t5.num_decoder_layers, t5.d_model,
          t5.num_heads, t5.d_kv, t5.d_ff) == ("bitransformer", 6, 6, 512, 8,
                                              64, 2048)
  for name, make in first_step.CASES.items():
    config_lib.validate(make())


def test_phases_are_exclusive_and_patches_are_undone():
  class Thing(object):
    def outer(self):
      time.sleep(0.02)
      return self.inner()

    def inner(self):
      time.sleep(0.05)
      return 7

  original = Thing.outer
  phases = first_step._Phases()
  phases.patch(Thing, "outer", "outer")
  phases.patch(Thing, "inner", "inner")
  assert Thing().outer() == 7
  assert 0.015 < phases.seconds["outer"] < 0.045
  assert phases.seconds["inner"] >= 0.045
  assert phases.calls == {"outer": 1, "inner": 1}
  phases.restore()
  assert Thing.outer is original


def test_unknown_case_is_one_line():
  proc = subprocess.run([sys.executable, "bench/first_step.py",
                         "--cases=nope"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2
  assert ("unknown case nope: the cases are lm_tiny, t5_small, "
          "t5_small_dropout") in proc.stderr


def test_a_measurement_has_every_phase():
  from meshtf.layouts import mesh_layout
  assign = mesh_layout.MeshLayout.__dict__["assign"]
  result = first_step.measure("lm_tiny")
  assert mesh_layout.MeshLayout.__dict__["assign"] is assign
  assert set(result["phases_s"]) == {
      "model_graph", "autodiff", "optimizer_graph", "layout_assignment",
      "variables", "lowering", "per_device_trace", "launch",
      "outer_trace_other", "first_run"}
  # traced once: the variables the first trace makes are not the
  # tf.function's (mesh_impl.NOT_LIFTED)
  assert result["phase_calls"]["model_graph"] == 1
  assert result["tf_ops_per_device_program"] > 0 and result["loss"] > 0
  assert result["peak_rss_mb"] > 0 and result["later_step_s"] > 0


def test_a_failed_child_says_why():
  """A child that fails reports its exit status and its own last line,
  not TensorFlow's log lines."""
  result = first_step._child(ROOT, "nope", 0, 300)
  assert result["exit"] == 1
  assert result["error"].startswith("exit 1: KeyError: 'nope'"), result
