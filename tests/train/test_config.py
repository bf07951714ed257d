"""The training binary's config schema, validation and config files
(meshtf/train/config.py, t2t_configs/).

- The default config (the embedded MoE experiment) is valid and is data +
  model + expert parallel; every tiny config file validates.
- Each kind of bad input gives one line per problem that names the key,
  the sizes and the fix: unknown keys (with a suggestion), malformed
  mesh_shape / layout, a layout naming a missing mesh axis, a mesh whose
  size is not the device count, a layout splitting two dims of a tensor
  over one mesh axis (the tensor, dims, axis and sizes are named; checked
  on the symbolic graph before any TensorFlow work; uneven splits are
  valid), missing data files, bad MoE layer lists.
- The papers' configurations (Mesh-TensorFlow Tables 2 and 3, GShard
  Table 1, GSPMD's dense Transformer) load and build symbolically with
  gradients and optimizer; every tensor's layout is valid on their meshes,
  and their parameter counts match the papers'.
"""
import glob
import os

import pytest

import meshtf as mtf
from meshtf.models import transformer
from meshtf.train import config as config_lib
from meshtf.train import experiment

from conftest import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "t2t_configs")


def load(name):
  return load_file(os.path.join(CONFIGS, name + ".py"), "t2t_" + name)


def problems(config, **kwargs):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config, **kwargs)
  return e.value.problems


# --- the default and the tiny configs -----------------------------------------
def test_default_is_a_valid_data_model_expert_parallel_moe_experiment():
  c = config_lib.default_config()
  config_lib.validate(c)
  assert config_lib.get_config().to_dict() == c.to_dict()
  assert c.moe.num_experts > 1 and c.model_type == "lm"
  rules = mtf.convert_to_layout_rules(c.layout)
  axes = {d: rules.mesh_axis_name(d) for d in ("batch", "experts", "heads")}
  assert axes["batch"] == axes["experts"] != axes["heads"] is not None
  assert mtf.convert_to_shape(c.mesh_shape).size == 8
  # The MoE layer is in the graph, with its alltoall-capable reshapes.
  graph, _ = experiment.build_training_graph(c)
  names = [v.name for v in graph.trainable_variables]
  assert any("/MoE/wi/" in n for n in names), names


def test_tiny_config_files_validate():
  seen = []
  for name in ("lm_tiny", "moe_tiny", "translate_tiny"):
    c = load(name).get_config()
    config_lib.validate(c)
    seen.append((c.model_type, bool(c.moe.num_experts)))
  assert seen == [("lm", False), ("lm", True), ("bitransformer", False)]
  # A config file overridden like --config.layout=... is checked again.
  c = load("lm_tiny").get_config()
  c.layout = "batch:model;heads:data"
  config_lib.validate(c)


def test_every_config_file_defines_get_config():
  files = sorted(glob.glob(os.path.join(CONFIGS, "*.py")))
  assert len(files) >= 7
  for path in files:
    name = os.path.splitext(os.path.basename(path))[0]
    c = load(name).get_config()
    assert not config_lib.unknown_keys(c), name


# --- bad input: one clear line each -------------------------------------------
def test_unknown_keys_are_named_with_a_suggestion():
  c = config_lib.default_config()
  c.unlock()
  c.num_layer = 3
  c.moe.unlock()
  c.moe.gate = "switch"
  lines = problems(c)
  assert len(lines) == 2
  assert "'moe.gate'" in lines[0] and "moe.gating" in lines[0]
  assert "'num_layer'" in lines[1] and "'num_layers'" in lines[1]


@pytest.mark.parametrize("changes, expected", [
    ({"mesh_shape": "data:4;model"},
     ["mesh_shape 'data:4;model' is malformed", "--mesh_shape=data:4;model:2"]),
    ({"layout": "batch:data;heads"},
     ["layout 'batch:data;heads' is malformed", "dim:mesh_axis pairs"]),
    ({"layout": "batch:data;heads:rows"},
     ["names mesh axis 'rows'", "data:4;model:2"]),
    ({"num_virtual_cpus": 4},
     ["has 8 processors but num_virtual_cpus is 4", "--num_virtual_cpus=8"]),
    ({"task.data_files": "/no/such/file.txt"},
     ["/no/such/file.txt does not exist", "--config.task.data_files"]),
    ({"moe.layers": "1,7"}, ["names layers [7]", "layers 0..1"]),
    ({"backend": "gpu"}, ["backend='gpu'", "--backend=simd"]),
    ({"task.problem": "sort"}, ["task.problem='sort'", "copy, reverse"]),
    ({"activation_dtype": "float16"},
     ["activation_dtype='float16'", "float32 or bfloat16"]),
    ({"jit_compile": "yes"}, ["jit_compile='yes'", "segments, program"]),
    ({"communication_hint": "gloo"},
     ["communication_hint='gloo'", "--config.communication_hint=nccl"]),
    ({"backend": "placement", "jit_compile": "segments"},
     ["need the SPMD backend", "--backend=simd"]),
])
def test_bad_values_give_one_line_with_the_fix(changes, expected):
  c = config_lib.default_config()
  for key, value in changes.items():
    node = c
    for part in key.split(".")[:-1]:
      node = node[part]
    node[key.split(".")[-1]] = value
  lines = problems(c)
  assert len(lines) == 1, lines
  for text in expected:
    assert text in lines[0], lines[0]


def test_uneven_splits_validate_and_unplaceable_layouts_name_everything():
  c = config_lib.default_config()
  c.num_heads = 3            # heads:model with model = 2: padded to 4
  c.vocab_size = 250         # vocab is not split here; d_ff is
  c.d_ff = 100
  config_lib.validate(c)
  # Two dims of one tensor on one axis: caught before lowering.
  c = config_lib.default_config()
  c.layout = "batch:data;d_model:data"
  line, = problems(c)
  for text in ("'batch'", "'d_model'", "'data'", "(size 4)",
               "map one of 'batch', 'd_model' to another axis"):
    assert text in line, line
  # No device was needed: a 512-processor mesh is checked the same way, and
  # an uneven batch (100 rows over 16 mesh rows) is fine.
  c = load("mtf_lm_table2").get_config("4.9B")
  c.batch_size = 100
  config_lib.validate(c)
  c.layout += ";length:rows"
  line, = problems(c)
  assert "'batch'" in line and "'length'" in line and "'rows' (size 16)" in line


def test_several_problems_are_all_reported():
  c = config_lib.default_config()
  c.d_model = 0
  c.optimizer = "lamb"
  c.mesh_shape = "data:0"
  lines = problems(c)
  assert len(lines) == 3, lines
  assert any("d_model=0" in l for l in lines)
  assert any("optimizer='lamb'" in l for l in lines)


# --- the papers' configurations -----------------------------------------------
def _build(config):
  """Symbolic training graph (forward, gradients, optimizer); checks every
  tensor's layout; returns the parameter counts."""
  layout = config_lib.mesh_layout(config)
  graph, loss = experiment.build_training_graph(config, layout)
  experiment.check_layouts(graph, layout)
  assert loss.shape.ndims == 0
  return experiment.parameter_counts(graph, layout)


def test_mesh_tensorflow_table_3_translation_sizes():
  module = load("mtf_translate_table3")
  for row, expected in module.PAPER_PARAMETERS.items():
    c = module.get_config(row)
    assert c.mesh_shape == "rows:16;cols:32"
    counts = _build(c)
    assert abs(counts["total"] / expected - 1) < 0.05, (row, counts)
  # The largest row splits heads, d_ff and vocab 32 ways.
  assert counts["per_device"] < counts["total"] / 25


def test_mesh_tensorflow_table_2_language_models():
  module = load("mtf_lm_table2")
  for row, expected in module.PAPER_PARAMETERS.items():
    counts = _build(module.get_config(row))
    assert abs(counts["total"] / expected - 1) < 0.03, (row, counts)
  c = module.get_config()
  assert c.layout == "batch:rows;vocab:cols;d_ff:cols;heads:cols"
  assert (c.batch_size, c.length) == (256, 256)


def test_gshard_moe_family_builds_with_expert_parallelism():
  module = load("gshard_moe")
  for row in ("2048E_36L", "128E_12L"):
    c = module.get_config(row)
    counts = _build(c)
    # The paper rounds (12.5B for 13.3B: 768 experts of 16.8M weights alone
    # are 12.9B).
    assert abs(counts["total"] / module.PAPER_WEIGHTS[row] - 1) < 0.07, (
        row, counts)
    assert c.mesh_shape == "cores:%d" % c.moe.num_experts
    # Each core holds only its own experts (the dense part is replicated).
    assert counts["per_device"] < counts["total"] / 20


def test_gspmd_dense_transformer_2d_sharding():
  module = load("gspmd_dense")
  for arg in ("64B_16x32", "64B_16x32,attempt2", "64B_16x32,attempt1"):
    c = module.get_config(arg)
    counts = _build(c)
    per_layer = counts["total"] / c.num_layers
    assert 2.0e9 < per_layer < 2.2e9, per_layer    # "2 billion per layer"
    assert c.mesh_shape == "x:16;y:32"
    # Every weight is split over both axes (M on x, H and N on y).
    assert counts["per_device"] < counts["total"] / 400
  # The default is GSPMD's 2D finalized: activations annotated apart from
  # the weights' rules (batch on x, d_model on y).
  c = module.get_config()
  assert c.activation_layout == "batch:x;d_model:y;d_ff:y;heads:y"
  assert c.layout == "d_model:x;d_ff:y;heads:y;vocab:y"


def test_model_builder_matches_the_config():
  c = load("translate_tiny").get_config()
  model = experiment.build_model(c, experiment.MoeMetrics())
  assert isinstance(model, transformer.Bitransformer)
  assert model.encoder.layer_stack.num_layers == 2 * c.num_layers
  c = config_lib.default_config()
  c.num_layers = 4
  c.moe.layers = "odd"
  model = experiment.build_model(c, experiment.MoeMetrics())
  names = [l.name for l in model.layer_stack.layers]
  assert names == ["SelfAttention", "DenseReluDense", "SelfAttention", "MoE",
                   "SelfAttention", "DenseReluDense", "SelfAttention", "MoE"]


def test_gpu_path_fields_reach_the_mesh_impl_and_the_model_dtype():
  import tensorflow as tf
  c = config_lib.default_config()
  assert (c.activation_dtype, c.jit_compile, c.communication_hint) == (
      "float32", "", "")
  c.activation_dtype, c.jit_compile, c.communication_hint = (
      "bfloat16", "segments", "ring")
  config_lib.validate(c)
  vdt = experiment.variable_dtype(c)
  assert (vdt.slice_dtype, vdt.activation_dtype) == (tf.float32, tf.bfloat16)
  names = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i
           for i in range(8)]
  impl = experiment.make_mesh_impl(c, config_lib.mesh_layout(c), names)
  assert (impl.jit_compile, impl.communication_hint) == ("segments", "ring")
  c.jit_compile, c.communication_hint = "", ""
  impl = experiment.make_mesh_impl(c, config_lib.mesh_layout(c), names)
  assert (impl.jit_compile, impl.communication_hint) == ("", "auto")
  # The symbolic training graph (plan mode's) computes in bfloat16 too.
  graph, _ = experiment.build_training_graph(
      c, config_lib.mesh_layout(c))
  assert any(t.dtype == tf.bfloat16 for op in graph.operations
             for t in op.outputs)
