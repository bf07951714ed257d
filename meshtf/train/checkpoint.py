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
listed (and a `.tmp-ckpt-*` folder that `remove_temporary` cleans). The last
`max_to_keep` checkpoints are kept. A value that is not finite (NaN, Inf) is
never saved: `save` raises NonFiniteError before writing anything.

A checkpoint is verified before it is trusted: its meta.json must parse and
list every variable, and every tensor of the bundle must read back with its
checksum, shape and dtype. `read_newest_intact` falls back from a damaged
checkpoint (truncated or overwritten data, a garbage or missing index, a
broken meta.json) to the newest intact one and says which it skipped.

A folder's name is its step, and its meta.json says the step too: a folder
whose two disagree (ckpt-10 copied in as ckpt-90) is refused by
`read_newest_intact` (MisnamedCheckpointError) rather than trusted either
way -- resuming from it would train again from the older step and overwrite
the checkpoints in between. Rotation after a save removes only checkpoints
older than the one saved, never a newer one.

Example:
  >>> manager = CheckpointManager("/tmp/model", max_to_keep=3)
  >>> manager.save(store, step=100)          # '/tmp/model/ckpt-100'
  >>> manager.restore(new_store)             # 100 (the step)
"""
import collections
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
_TMP_PREFIX = ".tmp-ckpt-"
DAMAGED_PREFIX = "damaged-"
FORMAT_VERSION = 1


class NonFiniteError(ValueError):
  """A variable holds NaN or Inf: the checkpoint was not written.

  Attributes:
    name: the first non-finite variable; step: the step being saved.
  """

  def __init__(self, name, step):
    self.name = name
    self.step = step
    super().__init__("variable %r is not finite (NaN or Inf) at step %d: "
                     "checkpoint not saved" % (name, step))


class DamagedCheckpointError(ValueError):
  """No checkpoint of a directory is intact (each is named with why)."""

  def __init__(self, directory, damaged):
    self.damaged = list(damaged)
    super().__init__(
        "no intact checkpoint in %s: %s" % (directory, "; ".join(
            "%s is damaged (%s)" % (os.path.basename(p), why)
            for p, why in self.damaged)))


class MisnamedCheckpointError(ValueError):
  """A checkpoint folder's name says another step than its meta.json.

  Attributes:
    path: the folder; name_step: the step its name says; meta_step: the
    step its meta.json says.
  """

  def __init__(self, path, name_step, meta_step, directory_steps):
    self.path, self.name_step, self.meta_step = path, name_step, meta_step
    directory = os.path.dirname(path)
    name = os.path.basename(path)
    right = "ckpt-%d" % meta_step
    if meta_step in directory_steps:
      fix = ("%s exists too: move %s out of %s (it is a copy of step %d)"
             % (right, name, directory, meta_step))
    else:
      fix = "rename it to %s (or move it out of %s)" % (
          os.path.join(directory, right), directory)
    newer = sorted(s for s in directory_steps if meta_step < s < name_step)
    risk = (": resuming from it would train again from step %d and "
            "overwrite %s" % (meta_step, ", ".join("ckpt-%d" % s
                                                   for s in newer))
            if newer else ": the rotation would remove it as an old one"
            if meta_step > name_step else "")
    super().__init__(
        "checkpoint folder %s holds step %d (its %s says so), not step %d: "
        "it was renamed or copied%s; %s" % (path, meta_step, _META,
                                             name_step, risk, fix))


# What read_newest_intact found: the checkpoint used and the newer ones it
# skipped as damaged ([(path, reason)], newest first).
IntactCheckpoint = collections.namedtuple(
    "IntactCheckpoint", ["path", "step", "values", "meta", "damaged"])


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
    """Checkpoint directories (ckpt-<step>), oldest first, as (step, path).
    A save renames only complete ones into place, so each is complete
    unless it was damaged afterwards (see verify)."""
    if not os.path.isdir(self.directory):
      return []
    found = []
    for name in os.listdir(self.directory):
      m = _CKPT_DIR.match(name)
      path = os.path.join(self.directory, name)
      if m and os.path.isdir(path):
        found.append((int(m.group(1)), path))
    return sorted(found)

  def latest(self):
    """Path of the newest checkpoint (by the index file, else by step), or
    None. Not verified: see read_newest_intact."""
    try:
      with open(os.path.join(self.directory, _INDEX)) as f:
        path = os.path.join(self.directory, str(json.load(f)["latest"]))
      if _CKPT_DIR.match(os.path.basename(path)) and os.path.isdir(path):
        return path
    except (OSError, ValueError, KeyError, TypeError):
      pass  # index missing, stale or broken: scan
    found = self.checkpoints()
    return found[-1][1] if found else None

  # --- verifying -----------------------------------------------------------
  def verify(self, path):
    """Reads a checkpoint in full and checks it; returns (step, {name: numpy
    value}, meta), or raises ValueError with a one-line reason (meta.json
    broken or incomplete, bundle index garbage or missing, data truncated
    or failing its checksum, a tensor whose shape or dtype is not meta's).

    Example:
      >>> step, values, meta = manager.verify("/tmp/model/ckpt-100")
    """
    try:
      with open(os.path.join(path, _META)) as f:
        meta = json.load(f)
      step = int(meta["step"])
      variables = dict(meta["variables"])
      wanted = {n: (list(v["shape"]), str(v["dtype"]))
                for n, v in variables.items()}
    except FileNotFoundError:
      raise ValueError("%s is missing" % _META) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError("%s is broken: %s" % (_META, _first_line(e))) from None
    values = {}
    if wanted:
      try:
        reader = tf.train.load_checkpoint(os.path.join(path, _BUNDLE))
        shapes = reader.get_variable_to_shape_map()
        for name in sorted(wanted):
          if name not in shapes:
            raise ValueError("variable %r is listed in %s but not in the "
                             "bundle" % (name, _META))
          # Reading checks the data's checksum and length.
          values[name] = np.asarray(reader.get_tensor(name))
      except ValueError:
        raise
      except Exception as e:  # TF raises OpError, IndexError, ... here
        raise ValueError("the variables bundle does not read: %s" %
                         _first_line(e)) from None
      for name, (shape, dtype) in sorted(wanted.items()):
        got = values[name]
        if list(got.shape) != shape or tf.as_dtype(got.dtype).name != dtype:
          raise ValueError("variable %r reads as %s %s but %s says %s %s" % (
              name, tf.as_dtype(got.dtype).name, list(got.shape), _META,
              dtype, shape))
    return step, values, meta

  def _check_name(self, name_step, path, meta_step, found):
    if meta_step != name_step:
      raise MisnamedCheckpointError(path, name_step, meta_step,
                                    {s for s, _ in found})

  def read_newest_intact(self):
    """The newest checkpoint that verifies, as an IntactCheckpoint whose
    `damaged` lists the newer ones skipped, with why; None when there is no
    checkpoint. Raises DamagedCheckpointError when none is intact, and
    MisnamedCheckpointError when the name and meta.json of that checkpoint
    or of an older one disagree. Reads only (no TensorFlow devices needed).

    Example:
      >>> found = manager.read_newest_intact()
      >>> found.step, [os.path.basename(p) for p, _ in found.damaged]
      (8, ['ckpt-12'])
    """
    found = self.checkpoints()
    if not found:
      return None
    damaged = []
    for i in range(len(found) - 1, -1, -1):
      name_step, path = found[i]
      try:
        step, values, meta = self.verify(path)
      except ValueError as e:
        damaged.append((path, str(e)))
        continue
      self._check_name(name_step, path, step, found)
      # The older ones are not read, but a misnamed one would be rotated
      # away as old while it holds a newer step: its meta.json is read.
      for older_step, older in found[:i]:
        try:
          with open(os.path.join(older, _META)) as f:
            older_meta = json.load(f)
          dict(older_meta["variables"])
          meta_step = int(older_meta["step"])
        except (OSError, ValueError, KeyError, TypeError):
          continue   # damaged: not this check's business
        self._check_name(older_step, older, meta_step, found)
      return IntactCheckpoint(path, step, values, meta, damaged)
    raise DamagedCheckpointError(self.directory, damaged)

  # --- repairing -------------------------------------------------------------
  def remove_temporary(self):
    """Deletes what an interrupted save leaves behind (`.tmp-ckpt-*` folders,
    a half-written index); returns their names. Only the process that
    trains in this directory (the lock holder) may call it: a running save
    of another process would lose its folder.

    Example:
      >>> manager.remove_temporary()
      ['.tmp-ckpt-200-x1y2z3']
    """
    if not os.path.isdir(self.directory):
      return []
    removed = []
    for name in sorted(os.listdir(self.directory)):
      path = os.path.join(self.directory, name)
      if name.startswith(_TMP_PREFIX) or name.startswith(_INDEX + ".tmp-"):
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        else:
          os.remove(path)
        removed.append(name)
    return removed

  def quarantine(self, path):
    """Renames a damaged checkpoint to damaged-ckpt-<step> (kept for a look,
    never listed, retried or counted as kept again); returns the new path.

    Example:
      >>> manager.quarantine("/tmp/model/ckpt-12")
      '/tmp/model/damaged-ckpt-12'
    """
    base = os.path.join(self.directory, DAMAGED_PREFIX + os.path.basename(
        path))
    target, n = base, 1
    while os.path.exists(target):
      n += 1
      target = "%s.%d" % (base, n)
    os.rename(path, target)
    return target

  # --- saving --------------------------------------------------------------
  def save(self, variable_store, step, extra=None):
    """Writes a checkpoint of every variable of the store; returns its path.
    Raises NonFiniteError, writing nothing, if a floating-point variable
    holds NaN or Inf.

    In a multi-worker mesh every worker must call save (gathering a
    variable's slices is a collective); only the chief writes. `extra`
    (a JSON-able dict, or a function returning one, called on the chief
    after the values are gathered) is saved in meta.json: written with
    the checkpoint, atomically.
    """
    step = int(step)
    values = variable_store.full_values()
    for name in sorted(values):
      value = values[name]
      if value.dtype.is_floating and not bool(
          tf.reduce_all(tf.math.is_finite(value))):
        raise NonFiniteError(name, step)
    if not is_chief():
      return os.path.join(self.directory, "ckpt-%d" % step)
    if callable(extra):
      extra = extra()
    os.makedirs(self.directory, exist_ok=True)
    final = os.path.join(self.directory, "ckpt-%d" % step)
    tmp = tempfile.mkdtemp(prefix="%s%d-" % (_TMP_PREFIX, step),
                           dir=self.directory)
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
    # The oldest go until max_to_keep are left, but only ones older than
    # this step: a checkpoint newer than the one just saved (a run resumed
    # from an older step) is never removed here.
    present = self.checkpoints()
    older = [path for s, path in present if s < step]
    for old in older[:max(0, len(present) - self.max_to_keep)]:
      shutil.rmtree(old, ignore_errors=True)
    return final

  # --- restoring -----------------------------------------------------------
  def read(self, path=None):
    """(step, {name: numpy value}, meta) of a checkpoint (default: the
    newest intact one), verified (see verify)."""
    if path is None:
      found = self.read_newest_intact()
      if found is None:
        raise FileNotFoundError("No checkpoint in %s" % self.directory)
      return found.step, found.values, found.meta
    return self.verify(path)

  def restore(self, variable_store, path=None):
    """Restores a checkpoint (default: the newest intact one) into
    variable_store, whatever mesh and layout it uses; returns the step, or
    None when there is no checkpoint."""
    if path is None and not self.checkpoints():
      return None
    step, values, _ = self.read(path)
    variable_store.restore_values(values)
    return step


def _first_line(e):
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  return lines[0] if lines else type(e).__name__


def _write_json(path, obj):
  """Atomically replaces path with obj as JSON."""
  tmp = path + ".tmp-%d" % os.getpid()
  try:
    with open(tmp, "w") as f:
      json.dump(obj, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:   # a full disk, a stop: no half-written file left
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
