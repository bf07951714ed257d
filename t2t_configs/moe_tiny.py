"""A tiny GShard Mixture-of-Experts language model on the synthetic reverse
task, on 8 virtual CPUs: data parallel over "data" (batch, routing groups),
expert parallel over the same axis (4 experts, one per data shard: the
dispatch and combine become alltoalls), model parallel over "model"
(heads, d_ff, vocab and each expert's hidden units). This is the binary's
default experiment.

  python -m meshtf.train --config=t2t_configs/moe_tiny.py
"""
from meshtf.layouts import presets
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.moe.num_experts = 4
  c.moe.layers = "odd"
  c.moe.gating = "top_2"
  c.task.problem = "reverse"
  c.mesh_shape = "data:4;model:2"
  c.layout = presets.MOE_STANDARD
  return c
