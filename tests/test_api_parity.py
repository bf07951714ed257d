"""Mesh TensorFlow's op, layer and optimizer names (the op-library issue's
list) exist in meshtf, so ported model code finds them. Their behaviour is
tested in the per-family test files.

Module by module: every public top-level function and class of Mesh TF
0.1.21's files exists in the meshtf module `mesh_tensorflow.<file>`
resolves to under meshtf.compat, or is named in docs/porting.md's
"Differences from Mesh TensorFlow" table. A fixed list of names checks this
without mesh-tensorflow installed; with it installed, the names are read
from its source, so a name the list forgot is caught too."""
import ast
import importlib
import os
import pathlib
import re

import pytest

import meshtf as mtf
from meshtf import compat

OPS = """
sin cos exp log sqrt rsqrt square tanh sigmoid relu squared_relu leaky_relu
gelu elu selu swish softplus sign abs negative reciprocal pow floordiv mod
minimum maximum where add_n logical_and logical_or logical_not equal
not_equal less less_equal greater greater_equal cast to_float to_bfloat16
to_int32 identity broadcast
reduce_sum reduce_mean reduce_max reduce_min reduce_all reduce_any
reduce_logsumexp softmax log_softmax reduce_first nth_largest_element
nth_smallest_element
reshape transpose rename_dimension replace_dimensions anonymize
combined_dimension
slice mtf_slice pad concat split stack unstack shift dynamic_shift
halo_exchange pool_tensor_1d stride_tensor_1d
one_hot gather top_k top_1 argmax cumsum range mtf_range
sample_with_temperature sort
random_uniform random_normal dropout
conv1d conv2d conv3d conv2d_transpose conv3d_transpose conv2d_with_blocks
conv3d_with_blocks conv2d_transpose_with_blocks conv3d_transpose_with_blocks
max_pool2d avg_pool2d max_pool3d avg_pool3d
while_loop custom_gradient recompute_grad depend Print serialize_training_step
assign assign_add assign_sub assign_slice assign_add_slice assign_sub_slice
read_variable get_variable
einsum matmul gradients import_tf_tensor import_fully_replicated constant
zeros ones zeros_like ones_like Lowering Graph Mesh Dimension Shape
convert_to_shape convert_to_dimension convert_to_layout_rules
""".split()

LAYERS = """
dense dense_relu_dense dense_product layer_norm rms_norm batch_norm embedding
multihead_attention dot_product_attention masked_local_attention_1d
attention_mask_autoregressive attention_mask_ignore_padding
attention_mask_same_segment softmax_cross_entropy_with_logits
conv1d conv2d conv3d conv2d_transpose conv3d_transpose conv2d_with_blocks
conv3d_with_blocks conv2d_transpose_with_blocks conv3d_transpose_with_blocks
""".split()

OPTIMIZERS = """
SgdOptimizer MomentumOptimizer AdamWeightDecayOptimizer AdafactorOptimizer
clip_by_global_norm get_global_step make_optimizer
""".split()

# Mesh TF 0.1.21's public top-level names, per file (all of them).
MESH_TF_MODULE_NAMES = {
    "optimize": """
make_optimizer Optimizer SgdOptimizer MomentumOptimizer
AdamWeightDecayOptimizer AdafactorOptimizer adafactor_decay_rate_adam
adafactor_decay_rate_pow adafactor_optimizer_from_hparams reduce_rms
product_learning_rate compute_lr_for_step AdafactorWithMultiLRSchedule
AdamWithMultiLRSchedule""",
    "beam_search": "compute_topk_scores_and_seq beam_search greedy_decode",
    "utils": """outside_all_rewrites BalancedVariablePlacer create_host_call
topology_rank remove_summaries""",
    "simd_mesh_impl": """SimdMeshImpl HierarchicalTiling
physical_shape_3d_from_topology_proto_4d auto_logical_to_physical_tpu""",
    "placement_mesh_impl": """PlacementMeshImpl allreduce_ring_single_shard
allreduce_ring allconcat_ring alltoall_pointtwise alltoall_ring""",
    "tpu_variables": "ReplicatedVariable",
    "test_utils": "NumpyConverter",
}
# Checked against Mesh TF's source when it is installed: what way 1's
# transformer modules lack is named in docs/porting.md's way-2 row.
MESH_TF_COMPLETE = sorted(MESH_TF_MODULE_NAMES) + [
    "ops", "layers", "transformer.moe", "transformer.transformer",
    "transformer.transformer_layers"]


@pytest.mark.parametrize("where,names", [(mtf, OPS), (mtf.layers, LAYERS),
                                         (mtf.optimize, OPTIMIZERS)],
                         ids=["ops", "layers", "optimize"])
def test_mesh_tensorflow_names_exist(where, names):
  missing = [n for n in names if not callable(getattr(where, n, None))]
  assert not missing, "missing from %s: %s" % (where.__name__, missing)


def _resolved(module):
  """The meshtf module `mesh_tensorflow.<module>` resolves to (way 1)."""
  # pylint: disable=protected-access
  target = {**compat._CORE, **compat._LIBRARY}[module]
  return importlib.import_module(target)


def _readme_difference_names():
  """Names in backquotes in the difference table of docs/porting.md
  (`a.b(...)` gives a.b and b)."""
  text = (pathlib.Path(__file__).resolve().parent.parent / "docs" /
          "porting.md").read_text()
  table = text.split("### Differences from Mesh TensorFlow", 1)[1].split(
      "\n## ", 1)[0]
  names = set()
  for quoted in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)", table):
    names.add(quoted)
    names.update(quoted.split("."))
  return names


def _missing(module, names):
  where = _resolved(module)
  listed = _readme_difference_names()
  return [n for n in names if not hasattr(where, n) and n not in listed]


@pytest.mark.parametrize("module", sorted(MESH_TF_MODULE_NAMES))
def test_mesh_tf_module_names_exist(module):
  missing = _missing(module, MESH_TF_MODULE_NAMES[module].split())
  assert not missing, ("mesh_tensorflow.%s: %s missing from %s and not in "
                       "the difference table of docs/porting.md" % (
                           module, missing, _resolved(module).__name__))


@pytest.mark.parametrize("module", MESH_TF_COMPLETE)
def test_mesh_tf_source_names_exist(module):
  package = compat.installed_package_dir()
  if package is None:
    pytest.skip("mesh-tensorflow 0.1.21 is not installed")
  path = os.path.join(package, *module.split(".")) + ".py"
  with open(path) as f:
    tree = ast.parse(f.read())
  names = [n.name for n in tree.body
           if isinstance(n, (ast.FunctionDef, ast.ClassDef))
           and not n.name.startswith("_")]
  assert names, path
  if module in MESH_TF_MODULE_NAMES:
    assert set(names) == set(MESH_TF_MODULE_NAMES[module].split()), module
  missing = _missing(module, names)
  assert not missing, ("mesh_tensorflow.%s: %s missing from %s and not in "
                       "the difference table of docs/porting.md" % (
                           module, missing, _resolved(module).__name__))
