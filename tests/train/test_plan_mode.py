"""--mode=plan (meshtf/train/plan_mode.py): the binary's plan report of a
config without devices -- one screen, model_dir/plan.json and
model_dir/layouts.png -- for a tiny
config and a 512-processor paper config; a bad hardware model is one line;
a paper config's refusal to start 512 virtual CPUs points at --mode=plan."""
import io
import json
import os

import pytest

from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run(*args):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + list(args), out=out, err=err)
  return code, out.getvalue(), err.getvalue()


def test_plan_of_the_default_experiment(tmp_path):
  code, out, err = _run("--mode=plan", "--model_dir=%s" % tmp_path)
  assert code == 0, err
  for part in ("plan: mesh data:4;model:2", "memory per device",
               "collectives per step", "step time estimate",
               "collectives by bytes sent per device", "held:", "wanted:",
               "largest variable", "nothing run"):
    assert part in out, out
  report = json.load(open(tmp_path / "plan.json"))
  assert report["hardware"] == "cpu" and report["step_seconds"] > 0
  assert report["config"]["mesh_shape"] == "data:4;model:2"
  assert report["collective_bytes_per_device"] > 0
  # The top collectives, each with why it exists.
  assert report["top_collectives"][0]["reason"]["held"]
  # Every variable's layout as a PNG; no checkpoint, no lock.
  assert sorted(os.listdir(tmp_path)) == ["layouts.png", "plan.json"]
  assert "layout drawn in %s" % (tmp_path / "layouts.png") in out
  with open(tmp_path / "layouts.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plan_of_a_512_processor_paper_config(tmp_path):
  config = os.path.join(ROOT, "t2t_configs", "mtf_lm_table2.py")
  # Training it here is refused, pointing at the plan ...
  code, _, err = _run("--config=" + config, "--model_dir=%s" % tmp_path)
  assert code == 2 and "--mode=plan reports its memory" in err, err
  # ... which runs on its traced per-device program, in seconds.
  code, out, err = _run("--config=" + config, "--mode=plan",
                        "--config.plan_hardware=tpuv3",
                        "--model_dir=%s" % tmp_path)
  assert code == 0, err
  report = json.load(open(tmp_path / "plan.json"))
  assert report["mesh"] == "rows:16;cols:32" and report["hardware"] == "tpuv3"
  assert "rows=0" in out and "cols=31" in out


def test_unknown_hardware_model_is_one_line(tmp_path):
  code, out, err = _run("--mode=plan", "--config.plan_hardware=tpu9",
                        "--model_dir=%s" % tmp_path)
  assert code == 2 and not out
  line, = err.splitlines()
  assert "plan_hardware='tpu9' is not a hardware model" in line
  assert "cpu | h100_8x_node | tpuv2 | tpuv3 | tpuv4" in line
  assert not os.path.exists(tmp_path / "plan.json")


def test_identical_layers_are_counted_and_say_so(tmp_path):
  # GSPMD's 2-D model scaled down, 32 layers on tpuv3 (XLA: estimated):
  # planned at 2-5 layers and counted, the numbers the full plan gives.
  from meshtf.plan import report as report_lib
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  config = os.path.join(ROOT, "t2t_configs", "gspmd_dense.py")
  code, out, err = _run("--config=%s:tiny" % config, "--mode=plan",
                        "--config.plan_hardware=tpuv3",
                        "--config.num_layers=32", "--model_dir=%s" % tmp_path)
  assert code == 0, err
  how = "planned 2, 3, 4 and 5 layers and counted 32"
  assert out.splitlines()[0] == how, out
  assert "depth: %s" % how in out
  counted = json.load(open(tmp_path / "plan.json"))
  assert counted["depth"]["counted"] and counted["depth"]["planned"] == [
      2, 3, 4, 5]
  c = config_lib.load_file(config, "tiny")
  c.num_layers = 32
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  full = report_lib.plan(graph, layout, "tpuv3", trace=False).summary()
  assert counted["step_seconds"] == pytest.approx(full["step_seconds"],
                                                  rel=1e-9)
  assert counted["memory_bytes_per_device"] == full["memory_bytes_per_device"]
  assert counted["collective_bytes_per_device"] == full[
      "collective_bytes_per_device"]
  # Layers that are not identical are planned in full, saying why.
  code, out, err = _run("--config=%s:tiny" % config, "--mode=plan",
                        "--config.plan_hardware=tpuv3",
                        "--config.num_layers=4", "--config.moe.num_experts=2",
                        "--config.moe.layers=1,3",
                        "--model_dir=%s" % (tmp_path / "moe"))
  assert code == 0, err
  assert out.splitlines()[0] == (
      "planned all 4 layers: moe.layers='1,3' lists its MoE layers"), out
