"""The binary's preflight (meshtf/train/preflight.py): every numeric config
field has a range, a value outside it is one line naming the field, the
range and the fix; a step that cannot fit this machine's memory is refused
with the plan's estimate and the limit. (Through the binary: the catalogue,
tests/train/test_catalogue.py.)"""
import math

import pytest

from meshtf.train import config as config_lib
from meshtf.train import experiment
from meshtf.train import preflight


def _numeric_keys(config, prefix=""):
  out = []
  for key in sorted(config.keys()):
    value = config[key]
    if hasattr(value, "keys"):
      out.extend(_numeric_keys(value, prefix + key + "."))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out.append(prefix + key)
  return out


def test_every_numeric_field_of_the_schema_has_a_range():
  """A numeric key added to default_config() needs its row in RANGES."""
  numeric = set(_numeric_keys(config_lib.default_config()))
  ranged = [key for key, _, _ in preflight.RANGES]
  assert len(ranged) == len(set(ranged))
  assert numeric == set(ranged), (sorted(numeric - set(ranged)),
                                  sorted(set(ranged) - numeric))


def test_the_defaults_are_in_range_and_one_step_outside_is_not():
  c = config_lib.default_config()
  assert preflight.range_problems(c) == []
  for key, allowed, fix in preflight.RANGES:
    value = preflight._get(c, key)
    assert allowed.allows(value), (key, value)
    assert "{flag}" in fix, key
    for bad in (float("nan"), float("inf"), "3", True):
      assert not allowed.allows(bad), (key, bad)
    if allowed.low is not None:
      assert not allowed.allows(allowed.low - 1), key


@pytest.mark.parametrize("key, value, line", [
    ("seed", -1, "seed=-1 must be an integer in [0, 2**63): set "
     "--config.seed=0, say"),
    ("eval_seed", -7, "eval_seed=-7 must be an integer in [-1, 2**63)"),
    ("momentum", -5.0, "momentum=-5.0 must be a number in [0, 1): set "
     "--config.momentum=0.9"),
    ("moe.capacity_factor_train", math.inf, "moe.capacity_factor_train=inf "
     "must be a finite number > 0: set --config.moe.capacity_factor_train="
     "1.0 (GShard trains with 1.0)"),
    ("collective_bucket_mb", math.inf, "collective_bucket_mb=inf must be a "
     "finite number >= 0"),
    ("eval_steps", 10 ** 7, "eval_steps=10000000 must be an integer in "
     "[1, 10000]: set --config.eval_steps=4, say"),
    ("learning_rate", 0.0, "learning_rate=0.0 must be a finite number > 0"),
    ("dropout_rate", 1.0, "dropout_rate=1.0 must be a number in [0, 1)"),
    ("train_steps", 0, "train_steps=0 must be a positive integer: set "
     "--config.train_steps to 1 or more"),
    ("decode_top_k", 17, "decode_top_k=17 is more than vocab_size=16, which "
     "bounds it: set --config.decode_top_k to at most 16"),
    ("weight_decay_rate", 1e6, "weight_decay_rate=1000000.0 with "
     "learning_rate=0.01 would take learning_rate * weight_decay_rate = "
     "1e+04 of every decayed weight away per step; the range is [0, 0.1 / "
     "learning_rate] = [0, 10]"),
])
def test_out_of_range_is_one_line_naming_field_range_and_fix(key, value,
                                                             line):
  c = config_lib.default_config()
  node = c
  for part in key.split(".")[:-1]:
    node = node[part]
  node[key.split(".")[-1]] = value
  problems = preflight.range_problems(c)
  assert len(problems) == 1 and line in problems[0], problems
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c, check_layout=False)
  assert line in e.value.problems[0]


def test_weight_decay_admits_what_runs_use():
  c = config_lib.default_config()
  for lr, wd in ((0.01, 0.1), (1e-3, 1.0), (6e-4, 0.1), (0.01, 10.0)):
    c.learning_rate, c.weight_decay_rate = lr, wd
    assert preflight.range_problems(c) == [], (lr, wd)


def test_the_flag_the_user_set_is_named():
  c = config_lib.default_config()
  c.seed = -1
  line, = preflight.range_problems(c, given=lambda k: "--" + k,
                                   flag=lambda k: "--" + k)
  assert line.startswith("--seed=-1 must be") and "set --seed=0" in line


def test_a_value_that_is_no_number_stops_before_other_checks():
  """A config file may set a field to a string (its own ConfigDict): one
  line for it, no TypeError from the checks that compare numbers."""
  import ml_collections
  values = config_lib.default_config().to_dict()
  values.update(d_model="32", length=None)
  c = ml_collections.ConfigDict(values)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert e.value.problems == [
      "d_model='32' must be a positive integer: set --config.d_model to 1 "
      "or more", "length=None must be a positive integer: set "
      "--config.length to 1 or more"]


def test_a_config_that_lacks_keys_is_one_line():
  import ml_collections
  line = config_lib.missing_keys_problem(
      ml_collections.ConfigDict({"d_model": 32}), "--config=x.py")
  lacking = config_lib.missing_keys(ml_collections.ConfigDict({"d_model": 32}))
  assert len(lacking) > 60 and lacking[:2] == ["activation", "activation_dtype"]
  assert line.startswith("--config=x.py lacks %d of the config's keys "
                         "(activation, activation_dtype, " % len(lacking))
  assert config_lib.missing_keys(config_lib.default_config()) == []


# --- memory -------------------------------------------------------------------
def _graph(config):
  layout = config_lib.mesh_layout(config)
  return layout, experiment.build_training_graph(config, layout)[0]


def test_the_default_job_fits_and_its_estimate_is_the_plans():
  import meshtf as mtf
  c = config_lib.default_config()
  layout, graph = _graph(c)
  assert preflight.memory_problem(c, layout, graph, "train", 8) is None
  mem = preflight.memory_estimate(graph, layout)
  report = mtf.plan.plan(graph, layout, "cpu", trace=False)
  assert mem == report.accounting.memory
  assert preflight.host_memory_bytes() > 2 ** 30


def test_a_step_that_cannot_fit_names_estimate_limit_and_fix():
  c = config_lib.default_config()
  layout, graph = _graph(c)
  mem = preflight.memory_estimate(graph, layout)
  line = preflight.memory_problem(c, layout, graph, "train", 8,
                                  limit=8 * mem["peak"] - 1)
  size = preflight._size   # the numbers are the plan's: the form is fixed
  assert line.startswith(
      "the training step needs an estimated %s per device (parameters 38 kB,"
      " optimizer state 76 kB, activations %s at their peak; meshtf/plan's "
      "estimate) x 8 virtual CPUs = %s, but this machine has %s of memory: "
      "lower --batch_size (64), --config.length (16), " % (
          size(mem["peak"]), size(mem["activations_peak"]),
          size(8 * mem["peak"]), size(8 * mem["peak"] - 1))), line
  assert 1e6 < mem["activations_peak"] < 4e6, mem   # ~1.7-2 MB in float32
  assert preflight.memory_problem(c, layout, graph, "train", 8,
                                  limit=8 * mem["peak"]) is None
  # eval, decode and export need the parameters at least
  line = preflight.memory_problem(c, layout, graph, "eval", 8,
                                  limit=8 * mem["parameters"] - 1)
  assert line.startswith("--mode=eval needs at least the parameters: an "
                         "estimated 38 kB per device"), line
  assert "lower --config.d_model (32)" in line
  assert preflight.memory_problem(c, layout, graph, "eval", 8,
                                  limit=8 * mem["peak"] - 1) is None


def test_rules_for_dims_the_config_switches_off_are_unused_not_refused():
  """The default layout names MoE dims (experts, group, expert_hidden):
  with MoE off they are reported in the header as unused (issue 41); a
  rule for a dim neither the model nor OPTIONAL_DIMS has is refused."""
  c = config_lib.default_config()
  c.moe.num_experts = 0
  graph = experiment.build_training_graph(c, config_lib.mesh_layout(c))[0]
  problem, unused = preflight.rule_dims(c, graph)
  assert problem is None
  assert [rule for _, rule, _ in unused] == [
      "group:data", "experts:data", "expert_hidden:model"]
  assert preflight.unused_rules_line(unused) == (
      "unused layout rules: --layout group:data, experts:data, "
      "expert_hidden:model (their dims are made by MoE layers "
      "(moe.num_experts > 0): not in this model's training graph)")
  c.variable_layout = "expert:data"   # a typo of experts: no MoE here
  problem, _ = preflight.rule_dims(c, graph)
  assert problem.startswith(
      "--config.variable_layout=expert:data: layout rule 'expert:data' "
      "names dim 'expert', which no tensor of the model has"), problem


def test_every_dim_the_models_make_is_known_to_the_rule_check():
  """OPTIONAL_DIMS keeps up with the models: every dim of a t2t config's
  training graph (MoE, pipeline, seq2seq, T5's relative position bias) is
  one of a dense lm's or in the table, and every dense-lm dim a variant
  lacks is in it: a rule a config variant switches off is never refused."""
  import os
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "t2t_configs")
  dense = config_lib.load_file(os.path.join(root, "lm_tiny.py"))
  known = preflight.graph_dim_names(experiment.build_training_graph(
      dense, config_lib.mesh_layout(dense))[0])
  for name, changes in (("moe_tiny.py", {}), ("translate_tiny.py", {}),
                        ("gspmd_pipeline.py", {}),
                        ("lm_tiny.py", {"positional_embedding": "none"}),
                        ("t5.py:t5.1.1_tiny", {})):
    c = config_lib.load_file(*os.path.join(root, name).split(":"))
    for key, value in changes.items():
      c[key] = value
    if c.pipeline_stages == 1:
      c.num_layers = 2
    graph = experiment.build_training_graph(c, config_lib.mesh_layout(c))[0]
    found = preflight.graph_dim_names(graph)
    extra = found - known - preflight.OPTIONAL_DIM_NAMES
    assert not extra, (name, sorted(extra))
    lost = known - found - preflight.OPTIONAL_DIM_NAMES
    assert not lost, (name, sorted(lost))   # switched off, not in the table
    assert preflight.rule_dims(c, graph)[0] is None
  # Every layer an MoE layer: no dense feed-forward, no d_ff.
  c = config_lib.load_file(os.path.join(root, "moe_tiny.py"))
  c.moe.layers = "all"
  graph = experiment.build_training_graph(c, config_lib.mesh_layout(c))[0]
  assert "d_ff" not in preflight.graph_dim_names(graph)
  assert [rule for _, rule, _ in preflight.rule_dims(c, graph)[1]] == [
      "d_ff:model"]
