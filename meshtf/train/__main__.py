"""`python -m meshtf.train`: the training binary (see meshtf/train/main.py).

Example:
  $ python -m meshtf.train --config=t2t_configs/lm_tiny.py --model_dir=/tmp/m
"""
from absl import flags

from meshtf.train import main

if __name__ == "__main__":
  main.define_flags_or_exit()
  flags.adopt_module_key_flags(main)  # so --helpshort lists them
  main.entry_point()
