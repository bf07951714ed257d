"""A tiny dense decoder-only language model on the synthetic copy task,
data + model parallel on 8 virtual CPUs (the Mesh-TensorFlow paper's
layout, scaled down). Reaches 99% held-out token accuracy in ~100 steps.

  python -m meshtf.train --config=t2t_configs/lm_tiny.py
"""
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.moe.num_experts = 0
  c.task.problem = "copy"
  c.mesh_shape = "data:4;model:2"
  c.layout = "batch:data;heads:model;d_ff:model;vocab:model"
  return c
