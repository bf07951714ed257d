"""`python -m meshtf.train`: the training binary (see meshtf/train/main.py).

Example:
  $ python -m meshtf.train --config=t2t_configs/lm_tiny.py --model_dir=/tmp/m
"""
# Quiet TensorFlow's start-up lines from before it loads (main imports it).
from meshtf.train import startup
startup.quiet_if_command_line()

from absl import flags  # noqa: E402

from meshtf.train import main  # noqa: E402

if __name__ == "__main__":
  main.define_flags_or_exit()
  flags.adopt_module_key_flags(main)  # so --helpshort lists them
  main.entry_point()
