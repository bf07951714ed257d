"""Training binaries and their parts: checkpoints, data, configs.

Example:
  >>> from meshtf.train import checkpoint
  >>> manager = checkpoint.CheckpointManager("/tmp/model_dir")
"""
