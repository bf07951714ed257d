"""The run's experiment (meshtf/train/experiment.Experiment): built once
from the config, its symbolic training graph built once and its layouts
completed once per run. The builder (models/training.build_step, which
TrainStep traces too) and the completion (layouts/assignment.assign_layouts)
are counted: --mode=plan builds and completes once, on a tiny config and on
the papers' GSPMD 64B and GShard 2048E configs; a tiny training run builds
the symbolic graph once and traces the step once (on main: plan built 2x
and completed 3x, training built 3x and completed 4x); an export, a
--layout=auto search and a --mode=sweep build each graph they need once."""
import collections
import io
import json
import os

import pytest

from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture
def calls(monkeypatch):
  """Counter of the training step builder's, the completion's and the
  model builder's calls."""
  from meshtf.layouts import assignment
  from meshtf.models import training
  from meshtf.train import experiment
  counter = collections.Counter()
  build, assign = training.build_step, assignment.assign_layouts
  model = experiment.build_model

  def counted_build(*args, **kwargs):
    counter["build_step"] += 1
    return build(*args, **kwargs)

  def counted_assign(*args, **kwargs):
    counter["assign_layouts"] += 1
    return assign(*args, **kwargs)

  def counted_model(*args, **kwargs):
    counter["build_model"] += 1
    return model(*args, **kwargs)
  monkeypatch.setattr(training, "build_step", counted_build)
  monkeypatch.setattr(experiment, "build_model", counted_model)
  monkeypatch.setattr(assignment, "assign_layouts", counted_assign)
  return counter


def _run(*args):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + list(args), out=out, err=err)
  assert code == 0, err.getvalue()
  return out.getvalue()


def test_plan_builds_and_completes_the_graph_once(tmp_path, calls):
  # The traced plan (the default): the Lowering on notional devices keeps
  # the preflight's layouts too.
  out = _run("--mode=plan", "--model_dir=%s" % tmp_path)
  assert "collectives per step" in out
  assert calls == {"build_step": 1, "assign_layouts": 1, "build_model": 1}


@pytest.mark.parametrize("config", ["gspmd_dense.py:64B_16x32",
                                    "gshard_moe.py:2048E_36L"])
def test_paper_plan_builds_and_completes_the_graph_once(tmp_path, calls,
                                                        monkeypatch, config):
  # The papers' configs planned on the estimate path (trace=False: the
  # traced per-device program of 512 / 2048 processors takes a minute
  # here; the default config above covers the trace).
  from meshtf.plan import report
  plan = report.plan
  monkeypatch.setattr(report, "plan", lambda *a, **k: plan(
      *a, **dict(k, trace=False)))
  out = _run("--config=" + os.path.join(ROOT, "t2t_configs", config),
             "--mode=plan", "--model_dir=%s" % tmp_path)
  assert "collectives per step" in out
  # The full graph once (the preflight's), and the small graphs the plan
  # tried to count the layers from (meshtf/plan/repeated.py), each once.
  with open(tmp_path / "plan.json") as f:
    planned = len(json.load(f)["depth"]["planned"])
  assert calls == {"build_step": 1 + planned, "assign_layouts": 1 + planned,
                   "build_model": 1 + planned}


def test_layer_period():
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  c = config_lib.default_config()
  c.moe.num_experts, c.moe.layers = 4, "odd"
  assert experiment.layer_period(c) == (2, None)
  c.moe.layers = "all"
  assert experiment.layer_period(c) == (1, None)
  c.moe.layers = "1,3"
  assert experiment.layer_period(c) == (
      None, "moe.layers='1,3' lists its MoE layers")
  c.moe.num_experts = 0
  c.pipeline_stages, c.circular_repeats = 2, 3
  assert experiment.layer_period(c) == (6, None)
  c.pipeline_stages = c.circular_repeats = 1
  c.model_type, c.num_layers, c.num_decoder_layers = "bitransformer", 4, 2
  assert experiment.layer_period(c) == (
      None, "the encoder's 4 and the decoder's 2 layers differ")
  c.num_decoder_layers = 0
  assert experiment.layer_period(c) == (1, None)


def test_training_and_export_build_the_symbolic_graph_once(tmp_path,
                                                          calls):
  # Preflight, checkpoint check, memory check and header share one
  # symbolic graph; TrainStep's trace is the builder's second call. The
  # completions: the symbolic graph's, the traced step's Lowering and the
  # final eval's (another graph, the eval loss).
  out = _run("--model_dir=%s" % tmp_path, "--train_steps=2",
             "--config.num_layers=1", "--config.length=8",
             "--config.eval_every=0", "--config.eval_steps=1",
             "--config.checkpoint_every=2", "--config.stop_at_target=False")
  assert "parameters" in out and "done: step 2" in out
  assert calls == {"build_step": 2, "assign_layouts": 3, "build_model": 1}
  # The SavedModel: the preflight's graph, and the model of the export's
  # one-processor mesh (MoE groups counted for it), whose score and decode
  # are each lowered twice (to create the variables, then in their
  # signatures): the other four completions.
  calls.clear()
  out = _run("--mode=export", "--model_dir=%s" % tmp_path)
  assert "exported SavedModel" in out
  assert calls == {"build_step": 1, "assign_layouts": 5, "build_model": 2}
  # A Mesh TF checkpoint names the preflight's model and graph (before
  # the Experiment served it: 3 models and 2 graphs).
  calls.clear()
  out = _run("--mode=export", "--model_dir=%s" % tmp_path,
             "--config.export_format=mesh_tf")
  assert "exported a Mesh TF checkpoint" in out
  assert calls == {"build_step": 1, "assign_layouts": 1, "build_model": 1}


def test_auto_layout_reuses_the_chosen_finalist(tmp_path, calls):
  # The search: one screened graph (the default model is shallow: planned
  # whole, on the group-over-every-axis layout), completed 18 times for the
  # 19 layouts it screens, then 8 finalists built and completed once each
  # (their MoE group counts follow their layouts); the chosen
  # finalist's graph and layouts are the preflight's and the plan's
  # (before: 10 graphs, 28 completions).
  out = _run("--layout=auto", "--config.auto_layout_dims=batch,d_ff,heads",
             "--mode=plan", "--model_dir=%s" % tmp_path)
  assert "using layout " in out and "collectives per step" in out
  assert calls == {"build_step": 9, "assign_layouts": 27, "build_model": 9}


def test_auto_layout_then_training_builds_the_chosen_graph_once(tmp_path,
                                                              calls):
  # The search's 9 graphs and 27 completions (above); the preflight, the
  # checks and the header read the chosen finalist's graph and layouts;
  # then TrainStep's trace and its Lowering, and the final eval's
  # completion (before: 11 graphs, 30 completions, 10 models).
  out = _run("--layout=auto", "--config.auto_layout_dims=batch,d_ff,heads",
             "--model_dir=%s" % tmp_path, "--train_steps=2",
             "--config.length=8", "--config.eval_every=0",
             "--config.eval_steps=1", "--config.checkpoint_every=2",
             "--config.stop_at_target=False")
  assert "using layout " in out and "done: step 2" in out
  assert calls == {"build_step": 10, "assign_layouts": 29, "build_model": 9}


def test_sweep_builds_each_entry_once(tmp_path, calls):
  # One graph per entry, built and completed once (validate's layout check
  # and the plan read it); the entry of the run's own mesh and layout is
  # the preflight's graph (before: 7 graphs and 7 completions, each entry
  # built for validate's layout check and again for its plan).
  from meshtf.train import config as config_lib
  c = config_lib.default_config()
  sweep = " | ".join(["data:8 @ batch:data",
                      "data:4;model:2 @ batch:data;d_ff:model",
                      "%s @ %s" % (c.mesh_shape, c.layout)])
  out = _run("--mode=sweep", "--config.sweep=" + sweep,
             "--model_dir=%s" % tmp_path)
  assert "layout sweep: 3 entries planned on cpu (3 valid)" in out
  assert calls == {"build_step": 3, "assign_layouts": 3, "build_model": 3}


def test_the_experiment_keeps_what_it_built_from_the_config():
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  c = config_lib.default_config()
  c.num_layers, c.jit_compile = 1, "segments"
  c.activation_layout = "batch:data"
  layout = config_lib.mesh_layout(c)
  exp = experiment.Experiment(c, layout)
  # activation_layout: parsed once, with the mesh layout; the model keeps
  # that object.
  assert exp.model.activation_layout is layout.activation_rules
  assert exp.training_graph() is exp.training_graph()
  assert exp.graph_layout() is exp.graph_layout()
  assert exp.program_options.jit_compile == "segments"
  assert exp.program_options.communication_hint is None
  assert exp.parameter_counts() == experiment.parameter_counts(
      exp.training_graph()[0], layout)

  # A derived config of the same values reuses the experiment (the run's
  # config object adopted); another value does not.
  import copy
  same = copy.deepcopy(c)
  assert exp.adopt(same) is exp and exp.config is same
  other = copy.deepcopy(c)
  other.sweep = "x:8 @ batch:x"
  assert exp.same_config(other, ignore=("sweep",))
  assert exp.adopt(other) is None and exp.config is same
