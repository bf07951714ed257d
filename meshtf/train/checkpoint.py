"""Layout-free, atomic checkpoints of a VariableStore.

A checkpoint holds every variable's FULL value (the slices assembled), in
TensorFlow's tensor-bundle format (readable with tf.train.load_checkpoint),
plus a small JSON file with the step and the variables' shapes and dtypes.
So a checkpoint saved on one mesh and layout restores bit for bit on any
other, including a single device; optimizer state is saved because the
optimizer's slots are variables of the same store.

Saving is atomic: everything is written into a temporary directory that is
renamed to `ckpt-<step>` only when complete, then the index file is replaced
in one step. A crash at any point leaves the previous checkpoint intact and
listed. The last `max_to_keep` checkpoints are kept.

Example:
  >>> manager = CheckpointManager("/tmp/model", max_to_keep=3)
  >>> manager.save(store, step=100)          # '/tmp/model/ckpt-100'
  >>> manager.restore(new_store)             # 100 (the step)
"""
import json
import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from meshtf.lowering import cluster

_CKPT_DIR = re.compile(r"^ckpt-(\d+)$")
_INDEX = "checkpoint.json"
_BUNDLE = "variables"
_META = "meta.json"
FORMAT_VERSION = 1


def is_chief():
  """True in a single process and on task 0 of a multi-worker cluster (the
  process that writes files)."""
  job_task = cluster.local_job_and_task()
  return job_task is None or job_task[1] == 0


class CheckpointManager(object):
  """Saves and restores VariableStores under one directory.

  Args:
    directory: the model directory (created on the first save).
    max_to_keep: how many checkpoints to keep (older ones are deleted after
      a newer one is complete).
  """

  def __init__(self, directory, max_to_keep=3):
    if max_to_keep < 1:
      raise ValueError("CheckpointManager max_to_keep must be >= 1, got %d"
                       % max_to_keep)
    self.directory = directory
    self.max_to_keep = max_to_keep

  # --- listing -----------------------------------------------------------
  def checkpoints(self):
    """Complete checkpoints, oldest first, as (step, path)."""
    if not os.path.isdir(self.directory):
      return []
    found = []
    for name in os.listdir(self.directory):
      m = _CKPT_DIR.match(name)
      path = os.path.join(self.directory, name)
      if m and os.path.exists(os.path.join(path, _META)):
        found.append((int(m.group(1)), path))
    return sorted(found)

  def latest(self):
    """Path of the newest complete checkpoint, or None."""
    index = os.path.join(self.directory, _INDEX)
    if os.path.exists(index):
      with open(index) as f:
        path = os.path.join(self.directory, json.load(f)["latest"])
      if os.path.exists(os.path.join(path, _META)):
        return path
    found = self.checkpoints()  # index missing or stale: scan
    return found[-1][1] if found else None

  # --- saving --------------------------------------------------------------
  def save(self, variable_store, step, extra=None):
    """Writes a checkpoint of every variable of the store; returns its path.

    In a multi-worker mesh every worker must call save (gathering a
    variable's slices is a collective); only the chief writes.
    """
    step = int(step)
    values = {}
    for entry in variable_store.entries():
      with tf.init_scope():
        values[entry.name] = entry.full_value()
    if not is_chief():
      return os.path.join(self.directory, "ckpt-%d" % step)
    os.makedirs(self.directory, exist_ok=True)
    final = os.path.join(self.directory, "ckpt-%d" % step)
    tmp = tempfile.mkdtemp(prefix=".tmp-ckpt-%d-" % step, dir=self.directory)
    try:
      names = sorted(values)
      if names:
        tf.raw_ops.SaveV2(prefix=os.path.join(tmp, _BUNDLE),
                          tensor_names=names,
                          shape_and_slices=[""] * len(names),
                          tensors=[values[n] for n in names])
      meta = {"format": FORMAT_VERSION, "step": step,
              "variables": {n: {"shape": values[n].shape.as_list(),
                                "dtype": values[n].dtype.name}
                            for n in names},
              "extra": extra or {}}
      _write_json(os.path.join(tmp, _META), meta)
      if os.path.exists(final):  # re-saving a step: replace it whole
        shutil.rmtree(final)
      os.rename(tmp, final)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    _write_json(os.path.join(self.directory, _INDEX),
                {"latest": os.path.basename(final)})
    for _, old in self.checkpoints()[:-self.max_to_keep]:
      shutil.rmtree(old, ignore_errors=True)
    return final

  # --- restoring -----------------------------------------------------------
  def read(self, path=None):
    """(step, {name: numpy value}, meta) of a checkpoint (default: latest)."""
    path = path or self.latest()
    if path is None:
      raise FileNotFoundError("No checkpoint in %s" % self.directory)
    with open(os.path.join(path, _META)) as f:
      meta = json.load(f)
    values = {}
    if meta["variables"]:
      reader = tf.train.load_checkpoint(os.path.join(path, _BUNDLE))
      for name in meta["variables"]:
        values[name] = np.asarray(reader.get_tensor(name))
    return meta["step"], values, meta

  def restore(self, variable_store, path=None):
    """Restores a checkpoint (default: the latest) into variable_store,
    whatever mesh and layout it uses; returns the step, or None when there
    is no checkpoint."""
    if path is None and self.latest() is None:
      return None
    step, values, _ = self.read(path)
    variable_store.restore_values(values)
    return step


def _write_json(path, obj):
  """Atomically replaces path with obj as JSON."""
  tmp = path + ".tmp-%d" % os.getpid()
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
