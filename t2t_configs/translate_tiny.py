"""A tiny encoder-decoder (Bitransformer) on the synthetic seq2seq reverse
task ("inputs" -> reversed "targets"), data + model parallel on 8 virtual
CPUs.

  python -m meshtf.train --config=t2t_configs/translate_tiny.py
"""
from meshtf.layouts import presets
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.model_type = "bitransformer"
  c.moe.num_experts = 0
  c.task.problem = "reverse"
  c.length = 10
  c.mesh_shape = "data:2;model:4"
  c.layout = presets.STANDARD
  return c
