"""Test setup: 8 virtual CPU devices, configured before TensorFlow starts."""
import importlib.util
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import meshtf as mtf  # noqa: E402

DEVICES = mtf.virtual_cpu_devices(8)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_file(path, name):
  """The Python file at path (absolute, or relative to the repository root)
  run as a fresh module called name: bench scripts, config files and test
  files, which are not importable packages.

  Example:
    >>> load_file("bench/gpu_step.py", "gpu_step").peak_flops_for("H200")
    989000000000000.0
  """
  spec = importlib.util.spec_from_file_location(name,
                                                os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def free_ports(n):
  """n TCP ports free on 127.0.0.1 now (for multi-worker tests): the
  launcher's own picker."""
  from meshtf.train import launch
  return launch.free_ports(n)
