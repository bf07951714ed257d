"""The meshtf training binary: train, eval, decode and export a Transformer
(optionally with GShard MoE layers) on a mesh, driven by a config file.

  python -m meshtf.train                                  # default experiment
  python -m meshtf.train --config=t2t_configs/lm_tiny.py --config.layout=...
  python -m meshtf.train --mode=eval --model_dir=/tmp/m   # also decode, export

The default experiment is a tiny MoE language model learning to reverse
random sequences on 8 virtual CPUs with a data + model + expert parallel
layout (see meshtf/train/config.py).

train   restores the newest intact checkpoint in --model_dir if there is
        one (the data and the step continue exactly where it stopped) and
        trains on (meshtf/train/training_loop.py); the run locks
        model_dir and first removes what an interrupted run left there
        (meshtf/train/model_dir.py).
eval    loss, accuracy and perplexity on held-out data.
decode  greedy, sampling or beam-search decoding of held-out inputs or of
        a prompt file, with exact-match accuracy where answers are known
        (meshtf/train/decode.py).
export  a SavedModel (plain tf.Variables, full values) with signatures
        "score" (targets -> per-example loss) and "decode" (greedy), and
        for text tasks "decode_text" (strings -> strings, SentencePiece in
        the graph), which TensorFlow loads without meshtf.

Without --config, a model_dir that has been trained in supplies its
config.json (so eval, decode and export need only --model_dir); a --config
whose model differs from it is refused, naming the fields.

Bad input (flags, config and its ranges, mesh shape, layout, device count,
memory, data and prompt files, model_dir, checkpoints) is reported as one
line on stderr before anything is written, with exit code 2
(meshtf/train/preflight.py, run by meshtf/train/runner.py, which also
dispatches the modes; this module holds the flags, the config resolution,
the exit codes and the entry point); a diverged training run stops with one line
and exit code 1 (meshtf/train/errors.py); SIGINT / SIGTERM save where
training stopped and exit 130 / 143 (meshtf/train/stopping.py); a
multi-worker run that loses a worker is one line naming it and exit code 3
(meshtf/train/peers.py; docs/backends.md). TensorFlow's C++
start-up lines are not shown (meshtf/train/startup.py; --verbosity=0 shows
them).

Example:
  >>> from meshtf.train import main
  >>> result = main.run(config, "train", "/tmp/m")        # in-process
  >>> result["eval"]["accuracy"] > 0.9
  True
  >>> main.run_command(["meshtf.train", "--mode=eval", "--model_dir=/tmp/m"])
  0
"""
import ast
import errno
import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from meshtf.train import config as config_lib
from meshtf.train import errors
from meshtf.train import model_dir as model_dir_lib
from meshtf.train import preflight
from meshtf.train import session as session_lib
from meshtf.train import stopping
from meshtf.train import training_loop
# The runner's names are the binary's too (main.run(config, mode, dir)).
from meshtf.train.runner import EXPORT_DIR
from meshtf.train.runner import check_checkpoint
from meshtf.train.runner import export
from meshtf.train.runner import prepare
from meshtf.train.runner import run

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "config.py")
METRICS_FILE = training_loop.METRICS_FILE
CONFIG_FILE = model_dir_lib.CONFIG_FILE
MAX_VIRTUAL_CPUS = preflight.MAX_VIRTUAL_CPUS

FLAGS = flags.FLAGS
UsageError = errors.UsageError
Session = session_lib.Session
train = training_loop.train

# Flags that override the config key of the same name.
_OVERRIDES = ("mesh_shape", "layout", "backend", "num_virtual_cpus",
              "train_steps", "batch_size", "seed", "sweep_run")


# --- flags --------------------------------------------------------------------
def define_flags(flag_values=FLAGS, argv=None):
  """Defines the binary's flags in flag_values (on first call; importing
  this module defines none, so it can be used as a library). argv (default
  sys.argv) is where ml_collections finds the --config.<key> overrides.
  Raises UsageError (one line) for a config file without get_config() or an
  unknown --config.<key>.

  Example:
    >>> flag_values = flags.FlagValues()
    >>> define_flags(flag_values, ["meshtf.train", "--mode=eval"])
  """
  if "config" in flag_values:
    return
  argv = sys.argv if argv is None else argv
  _check_config_file(argv)
  try:
    with _config_file_warnings_dropped():
      config_flags.DEFINE_config_file(
          "config", _DEFAULT_CONFIG,
          "Config file (a Python file with get_config(); 'file.py:arg' "
          "passes arg to it); override keys with --config.<key>=value. "
          "Default: the model_dir's config.json, else the embedded tiny MoE "
          "experiment.", flag_values=flag_values, lock_config=True,
          sys_argv=argv)
  except (AttributeError, KeyError) as e:
    raise _unknown_override(e, argv) from None
  define = dict(flag_values=flag_values)
  flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, metrics "
                      "and exports (default: a directory under the temp dir "
                      "named after the config file).", **define)
  flags.DEFINE_enum("mode", "train", list(config_lib.MODES), "What to do.",
                    **define)
  flags.DEFINE_string("mesh_shape", None, "Overrides config.mesh_shape, "
                      "e.g. 'data:4;model:2'.", **define)
  flags.DEFINE_string("layout", None, "Overrides config.layout, e.g. "
                      "'batch:data;heads:model'.", **define)
  flags.DEFINE_enum("backend", None, list(config_lib.BACKENDS),
                    "Overrides config.backend.", **define)
  flags.DEFINE_integer("num_virtual_cpus", None,
                       "Overrides config.num_virtual_cpus.", **define)
  flags.DEFINE_integer("train_steps", None, "Overrides config.train_steps.",
                       **define)
  flags.DEFINE_integer("batch_size", None, "Overrides config.batch_size.",
                       **define)
  flags.DEFINE_integer("seed", None, "Overrides config.seed.", **define)
  flags.DEFINE_boolean("sweep_run", None, "--mode=sweep: also train a few "
                       "steps of each entry this process has the devices "
                       "for (config.sweep_run).", **define)
  flags.DEFINE_string("worker_hosts", None, "Multi-worker: every worker's "
                      "host:port, comma-separated (the same on each worker);"
                      " default TF_CONFIG if set. See meshtf/train/"
                      "workers.py.", **define)
  flags.DEFINE_integer("task_index", None, "Multi-worker: this worker's "
                       "index in --worker_hosts (0 is the chief).", **define)


def _config_arg(argv):
  """The value of --config=... (or --config ...) in argv, or None."""
  for i, arg in enumerate(argv):
    if arg.startswith(("--config=", "-config=")):
      return arg.split("=", 1)[1]
    if arg in ("--config", "-config") and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _check_config_file(argv):
  """A --config file that does not exist, is not Python or defines no
  get_config() is one line (ml_collections would say it another way)."""
  value = _config_arg(argv)
  if value is None:
    return
  path = value.split(":", 1)[0]
  if not os.path.isfile(path):
    raise UsageError("--config=%s: %s %s: pass a config file such as "
                     "--config=t2t_configs/lm_tiny.py" % (
                         value, path, "is a directory" if os.path.isdir(path)
                         else "does not exist"))
  json_problem = _json_config_problem(value, path)
  if json_problem:
    raise UsageError(json_problem)
  try:
    with open(path, "rb") as f:
      tree = ast.parse(f.read(), filename=path)
  except (SyntaxError, ValueError) as e:
    raise UsageError("--config=%s is not a Python file (%s%s): a config "
                     "file defines get_config(), e.g. t2t_configs/lm_tiny.py"
                     % (value, getattr(e, "msg", None) or e, " at line %d" %
                        e.lineno if getattr(e, "lineno", None) else ""))
  if not any(isinstance(node, ast.FunctionDef) and node.name == "get_config"
             for node in tree.body):
    raise UsageError("--config=%s defines no get_config(): a config file is "
                     "a Python file whose get_config() returns the config, "
                     "e.g. t2t_configs/lm_tiny.py" % value)


def _json_config_problem(value, path):
  """One line when --config names a JSON file (a model_dir's config.json
  is JSON, and a JSON object is a Python expression too: it would be
  called a Python file without get_config()); else None."""
  import json
  try:
    with open(path, encoding="utf-8") as f:
      parsed = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(parsed, dict):
    return None
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.basename(path) == CONFIG_FILE:
    return ("--config=%s is the config a training run saved in its "
            "model_dir (JSON), not a config file: pass --model_dir=%s and "
            "no --config (eval, decode, export and training on read it), or "
            "a Python config file such as t2t_configs/lm_tiny.py" % (
                value, folder))
  return ("--config=%s is a JSON file, not a config file: a config file is "
          "a Python file whose get_config() returns the config, e.g. "
          "t2t_configs/lm_tiny.py" % value)


class _DropConfigFileWarnings(object):
  """A logging filter: ml_collections warns "get_config() returned None"
  on stderr; the binary says it in its one error line instead."""

  def filter(self, record):
    return "get_config() returned" not in str(record.msg)


class _config_file_warnings_dropped(object):
  """While ml_collections loads a config file, its warnings are dropped."""

  def __enter__(self):
    self._filter = _DropConfigFileWarnings()
    absl_logging.get_absl_logger().addFilter(self._filter)

  def __exit__(self, *unused):
    absl_logging.get_absl_logger().removeFilter(self._filter)


def _returned_problem(value, path):
  """One line if a config file's get_config() returned something other
  than an ml_collections.ConfigDict (a dict, None, ...), else None."""
  import ml_collections
  if isinstance(value, ml_collections.ConfigDict) or path is None:
    return None
  what = ("None (no return statement?)" if value is None else
          "a %s, not an ml_collections.ConfigDict" % type(value).__name__)
  return ("--config=%s: get_config() returned %s: return meshtf.train."
          "config.default_config() with your changes, as "
          "t2t_configs/lm_tiny.py does" % (path, what))


def _loaded_config_problem(argv):
  """One line if the --config file on argv returns no ConfigDict or one
  that lacks keys (an override then fails on it), else None. Loads the
  file again: ml_collections keeps nothing of a parse that failed."""
  value = _config_arg(argv)
  if value is None:
    return None
  path, _, arg = value.partition(":")
  try:
    with _config_file_warnings_dropped():
      loaded = config_lib.load_file(path, arg or None)
  except Exception:  # pylint: disable=broad-except
    return None   # the override's own error says more
  return _returned_problem(loaded, value) or (
      config_lib.missing_keys_problem(loaded, "--config=%s" % value))


def _unknown_override(error, argv):
  """ml_collections rejects --config.<unknown key> while parsing the config
  flag: name the key (from the command line) and the nearest known ones.
  (A config file whose get_config() returned no ConfigDict fails the same
  way on any override: that is said instead.)"""
  problem = _loaded_config_problem(argv)
  if problem:
    return UsageError(problem)
  known = config_lib._flat_keys(config_lib.default_config())
  for arg in argv[1:]:
    if arg.startswith("--config."):
      key = arg[len("--config."):].split("=", 1)[0]
      if key not in known:
        return _unknown_key(key)
  return UsageError("bad --config override: %s" % _one_line(error))


def _unknown_key(key):
  near = config_lib._near(key, config_lib._flat_keys(
      config_lib.default_config()))
  return UsageError("unknown config key %r (--config.%s): %s" % (key, key, (
      "did you mean %s?" % " or ".join(repr(n) for n in near)) if near
      else "see meshtf/train/config.py for the keys"))


def parse_flags(argv, flag_values=FLAGS):
  """Parses argv into flag_values; returns the arguments left. A bad flag
  or config file raises UsageError with one line (absl's own parser prints
  two and a usage hint).

  Example:
    >>> parse_flags(["meshtf.train", "--mode=eval"], flag_values)
    ['meshtf.train']
  """
  try:
    with _config_file_warnings_dropped():
      return flag_values(argv)
  except flags.UnrecognizedFlagError as e:
    name = getattr(e, "flagname", "") or ""
    if name.startswith("config."):
      raise _unknown_key(name[len("config."):]) from None
    raise UsageError("unknown flag --%s: see python -m meshtf.train "
                     "--helpshort" % name) from None
  except flags.Error as e:
    raise UsageError(_group_override_problem(argv) or
                     "%s: see python -m meshtf.train --helpshort"
                     % _one_line(e)) from None
  except (AttributeError, KeyError) as e:  # --config.<unknown key>
    raise _unknown_override(e, argv) from None
  except Exception as e:  # a config file that does not load
    raise UsageError("cannot load the config: %s: %s" % (
        type(e).__name__, _one_line(e))) from None


def _group_override_problem(argv):
  """One line for --config.<group>=value (task, moe: groups of keys, which
  ml_collections would parse as a ConfigDict literal), naming the keys and
  the one the value most likely meant; None if argv has no such flag.

  Example:
    >>> _group_override_problem(["meshtf.train", "--config.task=copy"])
    '--config.task=copy: task is a group of keys (data_files, ...): set
    one of them: --config.task.problem=copy'
  """
  import ml_collections
  schema = config_lib.default_config()
  for arg in argv[1:]:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    key, value = arg[len("--config."):].split("=", 1)
    if key not in schema or not isinstance(schema[key],
                                           ml_collections.ConfigDict):
      continue
    keys = sorted(schema[key].keys())
    meant = _key_meant(key, value)
    return ("--config.%s=%s: %s is a group of keys (%s%s): set one of "
            "them: --config.%s.%s=%s" % (
                key, value, key, ", ".join(keys[:8]),
                ", ..." if len(keys) > 8 else "", key, meant or "<key>",
                value))
  return None


def _key_meant(group, value):
  """The key of a config group a bare value most likely meant, or None."""
  from meshtf.train import data as data_lib
  if group == "task":
    if value in data_lib.PROBLEMS:
      return "problem"
    return "data_files" if any(c in value for c in "./") else "tfds_name"
  if group == "moe":
    if value.strip().lstrip("-").isdigit():
      return "num_experts"
    return "gating" if value in config_lib.GATINGS else None
  return None


def _one_line(e):
  """The first line of an error, or for one that embeds a traceback (a
  config file that raised) its first line and the exception's line."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  if any(l.startswith("Traceback") for l in lines):
    return "%s %s" % (lines[0], lines[-1])
  return lines[0]


# --- the config: a file, the model_dir's config.json, or the default --------
def resolve_config(flag_values=FLAGS):
  """(config, model_dir, source, flag_names) from parsed flags: --config
  with its overrides; else model_dir's config.json with the overrides on
  top; else the default experiment. `source` says which (for messages);
  `flag_names` maps the config keys set on the command line to the flag
  that set them.

  Example:
    >>> config, model_dir, source, names = resolve_config(flag_values)
    >>> source, names      # for --mode=eval --model_dir=/tmp/lm --seed=3
    ('the config of /tmp/lm (config.json)', {'seed': '--seed'})
  """
  config_flag = flag_values["config"]
  given = config_flag.present
  path = config_flags.get_config_filename(config_flag)
  model_dir = _model_dir_flag(flag_values) or default_model_dir(
      path if given else None)
  overrides = dict(config_flags.get_override_values(config_flag))
  flag_names = {key: "--config." + key for key in overrides}
  saved = None
  if not given:
    model_dir_lib.check_not_a_file(model_dir)
    saved = model_dir_lib.read_config(model_dir)
  if saved is not None:
    config, source = saved, "the config of %s (%s)" % (model_dir,
                                                        CONFIG_FILE)
    config.update_from_flattened_dict(overrides)
  else:
    problem = _returned_problem(flag_values.config, path if given else None)
    if problem:
      raise UsageError(problem)
    try:
      config = flag_values.config.copy_and_resolve_references()
    except (IOError, OSError) as e:  # the file failed to load
      raise UsageError("cannot load --config=%s: %s" % (path, _one_line(
          str(e).splitlines()[-1] if str(e) else e))) from None
    source = "--config=%s" % path if given else "the default config"
    problem = config_lib.missing_keys_problem(config, "--config=%s" % path)
    if problem:
      raise UsageError(problem)
  config.unlock()
  for name in _OVERRIDES:
    value = getattr(flag_values, name)
    if value is not None and name in config:
      config[name] = value
      flag_names[name] = "--" + name
  config.lock()
  return config, model_dir, source, flag_names


def _model_dir_flag(flag_values):
  """--model_dir as meant: '~' expanded (a shell leaves '--model_dir=~/x'
  as it is, and a folder named '~' would appear); None when not given.
  Raises UsageError for an empty one (it would train into the default
  folder that other runs share)."""
  value = flag_values.model_dir
  if value is None:
    return None
  if not value.strip():
    raise UsageError(
        "--model_dir=%r is empty: pass a directory, e.g. --model_dir=/tmp/lm"
        " (leave the flag out for the default one, %s)" % (
            value, default_model_dir(config_flags.get_config_filename(
                flag_values["config"]) if flag_values["config"].present
                                     else None)))
  return os.path.expanduser(value)


def default_model_dir(config_path):
  stem = os.path.splitext(os.path.basename(config_path or "config"))[0]
  return os.path.join(tempfile.gettempdir(), "meshtf_train",
                      "default" if stem == "config" else stem)


















# --- entry points -------------------------------------------------------------
# What the binary reports in one line, and its exit code.
def _expected_errors():
  from meshtf.layouts import LayoutError
  from meshtf.train import checkpoint
  from meshtf.train import decode as decode_lib
  from meshtf.train import text_data
  return ((errors.DivergedError, errors.EXIT_DIVERGED),
          (errors.ClusterError, errors.EXIT_CLUSTER),
          ((config_lib.ConfigError, UsageError, text_data.DataError,
            decode_lib.PromptError, LayoutError,
            checkpoint.DamagedCheckpointError,
            checkpoint.MisnamedCheckpointError), errors.EXIT_USAGE))

# OS errors that mean "this path cannot be used", not a bug.
_PATH_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                errno.EDQUOT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                errno.ENAMETOOLONG, errno.ELOOP)


def run_with_flags(flag_values=FLAGS, argv=(), out=None, err=None,
                   progress=None):
  """Runs the parsed command line; returns the exit code (0, 1 diverged,
  2 bad input), every expected error printed as one line to err.

  Example:
    >>> run_with_flags(FLAGS, ["meshtf.train"])   # after parse_flags
    0
  """
  err = err or sys.stderr
  model_dir = None
  try:
    with stopping.StopRequests() as stops:
      if len(argv) > 1:
        raise UsageError("unexpected arguments %s: flags only (--config, "
                         "--mode, ...)" % " ".join(argv[1:]))
      from meshtf.train import workers as workers_lib
      config, model_dir, source, flag_names = resolve_config(flag_values)
      workers = workers_lib.from_flags(flag_values.worker_hosts,
                                       flag_values.task_index)
      run(config, flag_values.mode, model_dir, workers=workers, out=out,
          err=err, progress=progress, flag_names=flag_names, source=source,
          stops=stops)
    return 0
  except stopping.Stopped as e:   # after saving: where, and how to go on
    err.write("meshtf.train: %s\n" % e)
    err.flush()
    return e.exit_code
  except stopping.Interrupted as e:
    err.write("meshtf.train: %s\n" % _interrupted_message(
        e, model_dir, flag_values.mode))
    err.flush()
    return e.exit_code
  except Exception as e:  # pylint: disable=broad-except
    code = _exit_code(e)
    if code is None:
      raise
    for line in str(e).splitlines() or [type(e).__name__]:
      err.write("meshtf.train: error: %s\n" % line)
    err.flush()
    return code


def _interrupted_message(error, model_dir, mode="train"):
  """The one line of a run stopped at once by a signal: what was running
  and what model_dir keeps (everything it holds was written atomically).

  Example:
    >>> _interrupted_message(stopping.Interrupted(signal.SIGINT, "tracing"
    ...                      " and lowering the training step"), "/tmp/m")
    'stopped by SIGINT while tracing and lowering the training step: ...'
  """
  from meshtf.train import checkpoint
  latest = None
  if model_dir is not None:
    try:
      latest = checkpoint.CheckpointManager(model_dir).latest()
    except OSError:
      pass
  if model_dir is None:
    kept = "nothing was written"
  elif latest is None:
    kept = "%s holds no checkpoint" % model_dir
  elif mode == "train":
    kept = "%s keeps %s (train again with this --model_dir to continue " \
           "from there)" % (model_dir, os.path.basename(latest))
  else:
    kept = "nothing was written; %s keeps %s" % (model_dir,
                                                  os.path.basename(latest))
  return "stopped %sby %s while %s: %s" % (
      "at once " if error.second else "", ("a second " if error.second
                                           else "") +
      stopping.signal_name(error.signum), error.phase, kept)


def _exit_code(error):
  for kinds, code in _expected_errors():
    if isinstance(error, kinds):
      return code
  if isinstance(error, OSError) and error.errno in _PATH_ERRNOS:
    return errors.EXIT_USAGE
  return None


def run_command(argv, out=None, err=None, progress=False):
  """Runs the binary in this process on a command line (argv[0] is the
  program) with flags of its own (absl's global FLAGS are untouched);
  returns the exit code. What the binary prints goes to out / err.

  Example:
    >>> run_command(["meshtf.train", "--mesh_shape=data:0;model:2"])
    2         # err: "meshtf.train: error: mesh_shape 'data:0;model:2' ..."
  """
  err = err or sys.stderr
  flag_values = flags.FlagValues()
  try:
    define_flags(flag_values, list(argv))
    rest = parse_flags(list(argv), flag_values)
  except UsageError as e:
    err.write("meshtf.train: error: %s\n" % e)
    err.flush()
    return errors.EXIT_USAGE
  return run_with_flags(flag_values, rest, out, err, progress)


def _parse_or_exit(argv):
  try:
    return parse_flags(argv)
  except UsageError as e:
    _exit_with(e)


def _exit_with(error):
  sys.stderr.write("meshtf.train: error: %s\n" % error)
  sys.stderr.flush()
  sys.exit(errors.EXIT_USAGE)


def main(argv):
  import logging
  import tensorflow as tf
  # TensorFlow's INFO lines (SavedModel writing, retracing notes) would
  # drown the summary and progress lines.
  tf.get_logger().setLevel(logging.ERROR)
  if not FLAGS["verbosity"].present:
    absl_logging.set_verbosity(absl_logging.WARNING)
  code = run_with_flags(FLAGS, argv)
  if code == errors.EXIT_CLUSTER or code in (stopping.exit_code(s)
                                             for s in stopping.SIGNALS):
    # Stopped by a signal (everything is saved) or a lost worker:
    # TensorFlow's threads may still wait on a collective that was cut
    # short, which would hold up the interpreter's exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def define_flags_or_exit():
  """define_flags for the real binary: a bad config file or override is
  one line and exit code 2."""
  try:
    define_flags()
  except UsageError as e:
    _exit_with(e)


def entry_point():
  define_flags_or_exit()
  app.run(main, flags_parser=_parse_or_exit)


__all__ = ["run", "run_command", "run_with_flags", "Session",
           "check_checkpoint", "UsageError", "define_flags", "parse_flags",
           "resolve_config", "prepare", "entry_point", "MAX_VIRTUAL_CPUS",
           "export", "EXPORT_DIR"]


if __name__ == "__main__":
  entry_point()
