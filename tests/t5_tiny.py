"""A toy T5.1.1-shaped config for the tests of T5 support (checkpoints in
and out, init_checkpoint): t2t_configs/t5.py's settings at toy dims.

Example (in a test):
    >>> c = t5_tiny.config(init_optimizer=True)
    >>> c.relative_attention, c.d_model
    ('bias_shared', 16)
"""
import os

from meshtf.train import config as config_lib

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "t2t_configs", "t5.py")


def config(**overrides):
  """t5.py:t5.1.1_tiny at d_model 16, 2 heads of 4, d_ff 24, vocab 40,
  length 8, batch 4, on one processor, with overrides."""
  c = config_lib.load_file(CONFIG, "t5.1.1_tiny")
  c.update(dict(
      vocab_size=40, vocab_divisor=8, d_model=16, num_heads=2, d_kv=4,
      d_ff=24, length=8, batch_size=4, dropout_rate=0.0,
      adafactor_min_dim_size_to_factor=8, mesh_shape="all:1", layout=""))
  for k, v in overrides.items():
    c[k] = v
  return c
