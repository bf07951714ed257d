"""The training binary with a pipelined lm_tiny (config fields
pipeline_stages, num_microbatches, circular_repeats).

- a few training steps of lm_tiny with 2 pipeline stages (stage on one
  mesh axis, data parallel on the other) give the unpipelined run's losses
  step by step: the pipelined weights start as the unpipelined ones;
- the header reports the schedule and its analytic bubble fraction;
- bad pipeline settings are one line each naming the field, the sizes and
  the fix, found by config validation before any TensorFlow work.
(The full run to 99% accuracy is in the README; it takes ~50 s.)
"""
import io
import json
import os

import pytest

from meshtf.train import config as config_lib
from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _lm_tiny(**overrides):
  c = config_lib.load_file(os.path.join(ROOT, "t2t_configs", "lm_tiny.py"))
  c.mesh_shape = "pipe:2;data:2"
  c.batch_size = 16
  c.train_steps = 4
  c.eval_every = 0
  c.eval_steps = 1
  c.log_every = 1
  c.stop_at_target = False
  c.checkpoint_every = 100
  for key, value in overrides.items():
    if key.startswith("moe."):
      c.moe[key[len("moe."):]] = value
    else:
      c[key] = value
  return c


def _losses(model_dir):
  with open(os.path.join(model_dir, main.METRICS_FILE)) as f:
    return [json.loads(l)["loss"] for l in f]


def test_two_stage_lm_tiny_trains_with_the_unpipelined_losses(tmp_path):
  runs = {}
  for name, overrides in (
      ("plain", dict(layout="batch:data")),
      ("pipelined", dict(layout="stage:pipe;batch:data", pipeline_stages=2,
                         num_microbatches=4))):
    out = io.StringIO()
    main.run(_lm_tiny(**overrides), "train", str(tmp_path / name), out=out,
             progress=False)
    runs[name] = (_losses(str(tmp_path / name)), out.getvalue())
  plain, pipelined = runs["plain"][0], runs["pipelined"][0]
  assert len(plain) == len(pipelined) == 4
  assert pipelined == pytest.approx(plain, rel=1e-4, abs=1e-5)
  assert plain[-1] != plain[0]   # it trains (warm-up: not yet down)
  assert ("pipeline: 2 stages x 1 layers each, 4 microbatches of 4 rows, "
          "plain schedule: 5 iterations, bubble fraction 0.200 (analytic)"
          in runs["pipelined"][1])


def _problems(**overrides):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(_lm_tiny(**overrides), check_layout=False)
  return e.value.problems


def test_bad_pipeline_settings_are_one_line_each_with_the_fix():
  stage = dict(layout="stage:pipe;batch:data", pipeline_stages=2)
  assert _problems(num_layers=3, **stage) == [
      "num_layers=3 is not divisible by pipeline_stages * circular_repeats ="
      " 2 * 1 = 2: set --config.num_layers to a multiple of 2, or fewer "
      "stages / repeats"]
  assert _problems(num_microbatches=3, **stage) == [
      "batch_size=16 is not divisible by num_microbatches=3: set "
      "--batch_size to a multiple of 3 or --config.num_microbatches to a "
      "divisor of 16"]
  assert _problems(pipeline_stages=2, layout="batch:data") == [
      "pipeline_stages=2 but --layout 'batch:data' puts dim 'stage' on no "
      "mesh axis: add 'stage:<axis>' naming a mesh axis of size 2 (mesh "
      "'pipe:2;data:2')"]
  assert _problems(pipeline_stages=2, mesh_shape="pipe:4;data:2",
                   layout="stage:pipe;batch:data", num_virtual_cpus=8) == [
      "pipeline_stages=2 but --layout 'stage:pipe;batch:data' puts dim "
      "'stage' on mesh axis pipe of size 4 (mesh 'pipe:4;data:2'): use a "
      "mesh axis of size 2 for 'stage', or --config.pipeline_stages=4"]
  assert _problems(circular_repeats=0, layout="batch:data") == [
      "circular_repeats=0 must be a positive integer: set "
      "--config.circular_repeats=1 (1: no pipelining)"]
  assert _problems(activation_layout="batch:data", **stage) == [
      "pipeline_stages=2 but --config.activation_layout='batch:data' has no "
      "rule for dim 'stage', so its annotations would replicate the "
      "pipeline buffer: add 'stage:pipe' to it"]
  config_lib.validate(_lm_tiny(activation_layout="stage:pipe;batch:data",
                               **stage), check_layout=False)   # no error
  moe = _problems(**dict(stage, **{"moe.num_experts": 4}))
  assert moe == ["pipeline_stages=2: MoE layers (moe.num_experts=4) cannot "
                 "be pipelined: set --config.moe.num_experts=0 or "
                 "--config.pipeline_stages=1"]


def test_the_binary_refuses_a_bad_pipeline_in_one_line(tmp_path):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(
      ["meshtf.train", "--config=" + os.path.join(ROOT, "t2t_configs",
                                                   "lm_tiny.py"),
       "--config.pipeline_stages=2", "--model_dir=%s" % (tmp_path / "m")],
      out=out, err=err)
  assert code == 2
  lines = err.getvalue().strip().splitlines()
  assert len(lines) == 1 and "puts dim 'stage' on no mesh axis" in lines[0]
  assert not (tmp_path / "m").exists()
