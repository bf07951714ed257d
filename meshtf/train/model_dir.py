"""The model directory as the training binary keeps it: checked before
anything is written, locked while a run trains in it, cleaned of what an
interrupted run left, and remembering the config it was trained with.

  train.lock    the training run that owns the directory: {"pid", "host",
                "started", "command"}. A second run is refused in one line;
                a lock whose process is gone (same host) is taken over with
                a warning line.
  config.json   the config of the last training run. Without --config, the
                binary reads it (eval, decode and export need no --config);
                a --config whose model differs is refused, naming the
                fields.

Only the lock holder deletes leftovers (`.tmp-ckpt-*` folders of a killed
save, half-written index, config or vocabulary files): a decode or export
running beside a training run never touches the trainer's files.

Example:
  >>> check_writable("/tmp/lm")                 # UsageError if it cannot be
  >>> with ModelDirLock("/tmp/lm") as lock:     # UsageError if in use
  ...   removed = clean_leftovers("/tmp/lm")
"""
import errno
import json
import os
import socket
import sys
import time

from meshtf.train import errors

LOCK_FILE = "train.lock"
CONFIG_FILE = "config.json"

# The config fields that define the model's variables and what its tokens
# mean: a checkpoint trained under one value cannot continue under another.
# (Layouts, meshes, optimizer settings, steps and decoding may change.)
MODEL_KEYS = (
    "model_type", "vocab_size", "vocab_divisor", "d_model", "num_layers",
    "num_decoder_layers", "num_heads", "d_kv", "d_ff", "length", "activation",
    "gated", "norm_type", "positional_embedding",
    "shared_embedding_and_softmax_weights", "moe.num_experts", "moe.layers",
    "moe.hidden_size", "task.problem", "task.seq2seq", "task.tfds_name",
    "task.text_keys")

# Keys every config.json meshtf.train has written holds.
CORE_MODEL_KEYS = ("model_type", "vocab_size", "d_model", "num_layers")


# --- checks before writing ----------------------------------------------------
def check_writable(model_dir):
  """Raises UsageError (one line, with the fix) if model_dir is a file or
  cannot be created or written. Writes nothing.

  Example:
    >>> check_writable("/etc/passwd")
    Traceback (most recent call last):
    UsageError: --model_dir=/etc/passwd is a file, not a directory: ...
  """
  check_not_a_file(model_dir)
  existing = os.path.abspath(model_dir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise errors.UsageError(
        "cannot create --model_dir=%s: %s is a file: pass a directory path "
        "(created if missing)" % (model_dir, existing))
  if not os.access(existing, os.W_OK | os.X_OK):
    raise errors.UsageError(
        "--model_dir=%s is not writable (%s: permission denied): pass a "
        "directory you can write, e.g. --model_dir=/tmp/%s" % (
            model_dir, existing, os.path.basename(os.path.normpath(
                model_dir)) or "model"))


def check_not_a_file(model_dir):
  """Raises UsageError if model_dir exists and is not a directory, or is
  (or lies under) a symlink that loops or points nowhere, or has a folder
  name too long for its file system."""
  check_name_lengths(model_dir)
  check_links(model_dir)
  if os.path.exists(model_dir) and not os.path.isdir(model_dir):
    raise errors.UsageError(
        "--model_dir=%s is a file, not a directory: pass a directory "
        "(created if missing)" % model_dir)


def check_name_lengths(model_dir):
  """Raises UsageError naming the folder name of model_dir's path that is
  longer than its file system allows (255 bytes on most: Errno 36).

  Example:
    >>> check_name_lengths("/tmp/" + "a" * 300)
    Traceback (most recent call last):
    UsageError: --model_dir=/tmp/aaa...: the folder name 'aaaaaaaaaaaa...'
    is 300 bytes, but the file system allows 255: ...
  """
  path = os.path.abspath(model_dir)
  existing = path
  while not os.path.isdir(existing):
    existing = os.path.dirname(existing)
  try:
    limit = os.pathconf(existing, "PC_NAME_MAX")
  except (OSError, ValueError, AttributeError):
    limit = 255
  for name in path.split(os.sep):
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > limit:
      raise errors.UsageError(
          "--model_dir=%s: the folder name %r is %d bytes, but the file "
          "system allows %d: pass a --model_dir with shorter names" % (
              model_dir, name[:12] + "...", size, limit))


def check_links(model_dir):
  """Raises UsageError if model_dir or a folder above it is a symlink loop
  (the OS gives up resolving it) or a symlink to nothing.

  Example:
    >>> check_links("/tmp/loop_a")       # loop_a -> loop_b -> loop_a
    Traceback (most recent call last):
    UsageError: --model_dir=/tmp/loop_a: /tmp/loop_a is a symlink loop ...
  """
  path = os.path.abspath(model_dir)
  parts = []
  while True:
    parts.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  for path in reversed(parts):   # the topmost bad link names the problem
    if not os.path.islink(path):
      continue
    try:
      os.stat(path)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise errors.UsageError(
            "--model_dir=%s: %s is a symlink loop (%s): point it at a "
            "directory, or pass another --model_dir" % (
                model_dir, path, " -> ".join(_link_chain(path))))
      if e.errno == errno.ENOENT:
        raise errors.UsageError(
            "--model_dir=%s: %s is a symlink to %s, which does not exist: "
            "create it, or pass another --model_dir" % (
                model_dir, path, os.readlink(path)))
      raise


def _link_chain(path, limit=4):
  """path, what it links to, ... until a name repeats (at most limit)."""
  chain, seen = [path], {path}
  while len(chain) <= limit and os.path.islink(chain[-1]):
    target = os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))
    target = os.path.normpath(target)
    chain.append(target)
    if target in seen:
      break
    seen.add(target)
  return chain


# --- the lock ---------------------------------------------------------------
class ModelDirLock(object):
  """An exclusive lock on model_dir for one training run: the file
  model_dir/train.lock names the owner's pid and host.

  acquire() creates it atomically (O_EXCL) and returns None, or a warning
  line when it took over a lock whose process is no longer running on this
  host; it raises UsageError when a live run holds it (or a run on another
  host, which cannot be checked). release() removes it, and the directory
  too if acquire created it and nothing else was written.

  Example:
    >>> lock = ModelDirLock("/tmp/lm")
    >>> lock.acquire()           # None, or "... took the lock over"
    >>> lock.release()
  """

  def __init__(self, model_dir):
    self.model_dir = model_dir
    self.path = os.path.join(model_dir, LOCK_FILE)
    self.held = False
    self._created_dir = False

  def acquire(self):
    """See the class docstring. A disk that is full (or any OS error) while
    the directory or the lock is made raises errors.DiskFullError / the
    OSError with nothing left behind: the folders made are removed."""
    made = []
    try:
      return self._acquire(made)
    except OSError as e:
      if self.held:
        self.release()
      for path in reversed(made):
        try:
          os.rmdir(path)
        except OSError:
          pass
      if errors.is_disk_full(e):
        raise errors.DiskFullError(
            "the disk of --model_dir=%s is full (%s creating %s): nothing "
            "was written; free space on it (or pass --model_dir on a disk "
            "with room) and train again" % (
                self.model_dir, e.strerror or "no space left",
                e.filename or self.model_dir)) from None
      raise

  def _acquire(self, made):
    if not os.path.isdir(self.model_dir):
      missing, path = [], os.path.abspath(self.model_dir)
      while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
      for path in reversed(missing):   # one by one: each is undone on error
        os.mkdir(path)
        made.append(path)
      self._created_dir = True
    warning = None
    for _ in range(5):   # another run may take a stale lock at the same time
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        text, owner = _read_lock(self.path)
        if text is None:
          continue   # released meanwhile: try again
        if owner is not None and _owner_alive(owner):
          raise errors.UsageError(_in_use_message(self.model_dir, self.path,
                                                  owner))
        if _remove_if_unchanged(self.path, text):
          warning = _stale_message(self.model_dir, owner)
        continue
      try:
        with os.fdopen(fd, "w") as f:
          json.dump(_this_owner(), f, sort_keys=True)
          f.flush()
          os.fsync(f.fileno())
      except BaseException:   # a full disk: no empty lock left behind
        os.remove(self.path)
        raise
      self.held = True
      return warning
    raise errors.UsageError(
        "cannot lock --model_dir=%s: %s keeps changing (several runs are "
        "starting in it): start one run per model_dir" % (self.model_dir,
                                                          self.path))

  def release(self):
    if not self.held:
      return
    self.held = False
    _, owner = _read_lock(self.path)
    if owner is not None and owner.get("pid") == os.getpid():
      os.remove(self.path)
    if self._created_dir:
      try:
        os.rmdir(self.model_dir)   # only if the run wrote nothing
      except OSError:
        pass

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *unused_exc):
    self.release()


def check_not_in_use(model_dir):
  """Raises UsageError when a live run holds model_dir's lock (reads only:
  a run fails on this before reading checkpoints; it takes the lock itself
  after every check).

  Example:
    >>> check_not_in_use("/tmp/lm")
    Traceback (most recent call last):
    UsageError: --model_dir=/tmp/lm is in use by another training run ...
  """
  path = os.path.join(model_dir, LOCK_FILE)
  text, owner = _read_lock(path)
  if text is not None and owner is not None and _owner_alive(owner):
    raise errors.UsageError(_in_use_message(model_dir, path, owner))


def _this_owner():
  return {"pid": os.getpid(), "host": socket.gethostname(),
          "process_start": _process_start(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join(sys.argv)[:300]}


def _read_lock(path):
  """(text, owner dict or None when unparsable); (None, None) if gone."""
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    return None, None
  try:
    owner = json.loads(text)
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
      owner = None
  except ValueError:
    owner = None   # e.g. a run killed while writing it
  return text, owner


def _owner_alive(owner):
  """True unless the owner is on this host and its process is gone (or
  its pid now belongs to a newer process)."""
  if owner.get("host") != socket.gethostname():
    return True   # cannot look at another host's processes
  pid = owner["pid"]
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass   # alive, another user's
  if _process_state(pid) == "Z":
    return False   # exited, not yet reaped
  start = owner.get("process_start")
  return start is None or _process_start(pid) in (None, start)


def _proc_stat(pid):
  """Fields of /proc/<pid>/stat after the command name (Linux), or None."""
  try:
    with open("/proc/%d/stat" % pid) as f:
      return f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None


def _process_state(pid):
  fields = _proc_stat(pid)
  return fields[0] if fields else None


def _process_start(pid):
  """The process's start time in clock ticks since boot (tells a reused
  pid apart), or None where /proc is not available."""
  fields = _proc_stat(pid)
  return int(fields[19]) if fields and len(fields) > 19 else None


def _remove_if_unchanged(path, text):
  """Removes the stale lock file if it still holds `text` (two runs that
  both found it stale must not remove the lock one of them just made)."""
  aside = "%s.stale-%d" % (path, os.getpid())
  try:
    os.rename(path, aside)   # atomic: one run wins
  except FileNotFoundError:
    return False
  with open(aside) as f:
    same = f.read() == text
  if same:
    os.remove(aside)
  elif not os.path.exists(path):
    os.rename(aside, path)   # a fresh lock of a live run: put it back
  return same


def _in_use_message(model_dir, path, owner):
  where = "pid %d on host %s" % (owner["pid"], owner.get("host", "?"))
  if owner.get("host") != socket.gethostname():
    fix = ("if that run has ended, delete %s; else wait for it or use "
           "another --model_dir" % path)
  else:
    fix = "wait for it to finish, stop it (kill %d), or use another " \
          "--model_dir" % owner["pid"]
  return "--model_dir=%s is in use by another training run (%s, since %s): "\
         "%s" % (model_dir, where, owner.get("started", "?"), fix)


def _stale_message(model_dir, owner):
  if owner is None:
    return ("--model_dir=%s had an unreadable %s (a run killed while taking "
            "it): took the lock over" % (model_dir, LOCK_FILE))
  return ("--model_dir=%s was locked by pid %d on host %s (since %s), which "
          "is no longer running: took the lock over" % (
              model_dir, owner["pid"], owner.get("host", "?"),
              owner.get("started", "?")))


# --- leftovers ----------------------------------------------------------------
def clean_leftovers(model_dir, manager):
  """Deletes what an interrupted run left in model_dir: temporary
  checkpoint folders and index files (manager.remove_temporary),
  half-written config, metrics or vocabulary files, and the input positions
  a worker left for a save that did not happen. Call it holding the
  lock. Returns the names removed.

  Example:
    >>> clean_leftovers("/tmp/lm", CheckpointManager("/tmp/lm"))
    ['.tmp-ckpt-200-x1y2z3', 'config.json.tmp-4242']
  """
  removed = manager.remove_temporary()
  if not os.path.isdir(model_dir):
    return removed
  for name in sorted(os.listdir(model_dir)):
    if name.startswith((CONFIG_FILE + ".tmp-", "metrics.jsonl.tmp",
                        ".tmp-vocab-", "vocab.model.tmp-",
                        ".input-positions-", LOCK_FILE + ".stale-")):
      path = os.path.join(model_dir, name)
      if os.path.isfile(path):
        os.remove(path)
        removed.append(name)
  return removed


# --- the remembered config --------------------------------------------------
def read_config(model_dir):
  """The config model_dir was trained with (config.json over the schema's
  defaults), or None when it has none. Raises UsageError naming the file
  when it is broken or has keys the schema lacks.

  Example:
    >>> read_config("/tmp/lm").task.problem
    'copy'
  """
  from meshtf.train import config as config_lib
  path = os.path.join(model_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
    if not isinstance(saved, dict):
      raise ValueError("not a JSON object")
  except (OSError, ValueError) as e:
    raise errors.UsageError(
        "%s is broken (%s): pass --config=<the config file it was trained "
        "with> (config.json is rewritten when training goes on)" % (
            path, str(e).splitlines()[0] if str(e) else type(e).__name__))
  config = config_lib.default_config()
  problems = []
  _merge(config, saved, "", problems)
  if problems:
    raise errors.UsageError(
        "%s has %s: it was written by another version of meshtf; pass "
        "--config=<a config file>" % (path, problems[0]))
  # A config.json without the model's size (an empty one, a fragment
  # written by hand) would give the default model, which the checkpoint
  # then contradicts with a message about shapes.
  lacking = [k for k in CORE_MODEL_KEYS if k not in saved]
  if lacking:
    raise errors.UsageError(
        "%s %s: it was not written by meshtf.train, which saves every key; "
        "pass --config=<the config file it was trained with> (training on "
        "rewrites config.json)" % (
            path, "is empty ({})" if not saved else
            "lacks the model's keys %s" % ", ".join(lacking)))
  return config


def _merge(config, saved, prefix, problems):
  for key, value in saved.items():
    name = prefix + key
    if key not in config:
      problems.append("unknown key %r" % name)
    elif isinstance(value, dict):
      if not hasattr(config[key], "keys"):
        problems.append("a group for the value %r" % name)
      else:
        _merge(config[key], value, name + ".", problems)
    else:
      try:
        config[key] = value
      except (TypeError, ValueError) as e:
        problems.append("%r = %r (%s)" % (name, value, e))


def write_config(model_dir, config):
  """Writes config.json atomically (a temporary file renamed over it)."""
  path = os.path.join(model_dir, CONFIG_FILE)
  tmp = "%s.tmp-%d" % (path, os.getpid())
  try:
    with open(tmp, "w") as f:
      f.write(config.to_json(indent=1, sort_keys=True))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:   # a full disk, a stop: no half-written file left
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def config_conflicts(saved, config):
  """The model fields (MODEL_KEYS) whose values differ, as
  "key X here vs Y in config.json" strings.

  Example:
    >>> config_conflicts(saved, config)
    ['d_model 64 here vs 32 in config.json']
  """
  out = []
  for key in MODEL_KEYS:
    mine, theirs = _get(config, key), _get(saved, key)
    if mine != theirs:
      out.append("%s %r here vs %r in %s" % (key, mine, theirs, CONFIG_FILE))
  return out


def _get(config, dotted):
  for part in dotted.split("."):
    config = config[part]
  return config


__all__ = ["LOCK_FILE", "CONFIG_FILE", "MODEL_KEYS", "CORE_MODEL_KEYS",
           "check_writable", "check_not_a_file", "check_name_lengths",
           "check_links", "check_not_in_use",
           "ModelDirLock", "clean_leftovers",
           "read_config", "write_config", "config_conflicts"]
