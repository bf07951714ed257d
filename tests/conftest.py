"""Test setup: 8 virtual CPU devices, configured before TensorFlow starts."""
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import meshtf as mtf  # noqa: E402

DEVICES = mtf.virtual_cpu_devices(8)


def free_ports(n):
  """n TCP ports free on 127.0.0.1 now (for multi-worker tests)."""
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports
