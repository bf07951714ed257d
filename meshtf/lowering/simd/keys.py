"""Collective keys of the SPMD backend: TensorFlow's collective ops name a
group of devices by a group key and one collective within it by an instance
key. Keys are allocated process-wide: a group key names one set of devices for
the whole process (the same partition of devices, from any mesh, reuses its
keys), and instance keys never repeat.

Example:
  >>> from meshtf.lowering.simd import keys
  >>> keys.device_rank_key("/job:localhost/replica:0/task:0/device:CPU:3")
  ('localhost', 0, 0, 'CPU', 3)
  >>> keys.next_instance_key() < keys.next_instance_key()
  True
"""
import itertools
import re
import threading

import tensorflow as tf

# Process-wide key allocation: a group key names one set of devices for the
# whole process, and instance keys must not repeat within a group.
_KEY_LOCK = threading.Lock()
_GROUP_KEY_BASES = {}
_NEXT_GROUP_KEY = [1000]
_INSTANCE_KEYS = itertools.count(1)


def next_instance_key():
  with _KEY_LOCK:
    return next(_INSTANCE_KEYS)


def group_key_base(devices, groups):
  """First of len(groups) consecutive group keys for this exact partition
  of devices into groups (the same partition, from any mesh, reuses its
  keys; TensorFlow requires a key to always mean one group)."""
  key = (tuple(devices), groups.tobytes(), groups.shape)
  with _KEY_LOCK:
    if key not in _GROUP_KEY_BASES:
      _GROUP_KEY_BASES[key] = _NEXT_GROUP_KEY[0]
      _NEXT_GROUP_KEY[0] += len(groups)
    return _GROUP_KEY_BASES[key]


_DEVICE_NAME = re.compile(r"^/job:([^/]+)/replica:(\d+)/task:(\d+)"
                          r"/device:([^:]+):(\d+)$")


def device_rank_key(name):
  """How TensorFlow orders the members of a collective group: by job,
  replica, task, device type and numeric device index."""
  m = _DEVICE_NAME.match(name)
  if m:  # the common full name, without DeviceSpec's slower parser
    return (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4),
            int(m.group(5)))
  spec = tf.DeviceSpec.from_string(name)
  return (spec.job or "", spec.replica or 0, spec.task or 0,
          spec.device_type or "", spec.device_index or 0)

