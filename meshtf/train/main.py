"""The meshtf training binary: train, eval, decode and export a Transformer
(optionally with GShard MoE layers) on a mesh, driven by a config file.

  python -m meshtf.train                                  # default experiment
  python -m meshtf.train --config=t2t_configs/lm_tiny.py --config.layout=...
  python -m meshtf.train --mode=eval --model_dir=/tmp/m   # also decode, export

The default experiment is a tiny MoE language model learning to reverse
random sequences on 8 virtual CPUs with a data + model + expert parallel
layout (see meshtf/train/config.py).

train   restores the latest checkpoint in --model_dir if there is one (the
        data and the step continue exactly where it stopped), prints a
        summary (mesh, layout, parameters per device, collectives per
        step), shows a progress bar (loss, accuracy, tokens/s, learning
        rate, MoE load), writes TensorBoard summaries and per-step metrics
        (metrics.jsonl), checkpoints every checkpoint_every steps and at the
        end, evaluates on held-out data and says whether the accuracy
        target was reached.
eval    loss, accuracy and perplexity on held-out data.
decode  greedy, sampling or beam-search decoding of held-out inputs or of
        a prompt file, with exact-match accuracy where answers are known
        (meshtf/train/decode.py).
export  a SavedModel (plain tf.Variables, full values) with signatures
        "score" (targets -> per-example loss) and "decode" (greedy), which
        TensorFlow loads without meshtf.

Bad input (config key, mesh shape, layout, device count, two dims on one axis,
data files) is reported as one line on stderr before anything is written;
the exit code is 2.

Example:
  >>> from meshtf.train import main
  >>> result = main.run(config, "train", "/tmp/m")   # in-process
  >>> result["eval"]["accuracy"] > 0.9
  True
"""
import json
import os
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags
import numpy as np

from meshtf.train import config as config_lib

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "config.py")
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
EXPORT_DIR = "export"

FLAGS = flags.FLAGS


def define_flags():
  """Defines the binary's flags (on first call; importing this module
  defines none, so it can be used as a library). ml_collections reads the
  --config.<key> overrides here: an unknown key is reported in one line."""
  if "config" in FLAGS:
    return
  try:
    config_flags.DEFINE_config_file(
        "config", _DEFAULT_CONFIG,
        "Config file (a Python file with get_config(); 'file.py:arg' passes "
        "arg to it); override keys with --config.<key>=value. Default: the "
        "embedded tiny MoE experiment.", lock_config=True)
  except (AttributeError, KeyError) as e:
    _fail_unknown_override(e)
  flags.DEFINE_string("model_dir", None, "Checkpoints, summaries, metrics "
                      "and exports (default: a directory under the temp dir "
                      "named after the config file).")
  flags.DEFINE_enum("mode", "train", list(config_lib.MODES), "What to do.")
  flags.DEFINE_string("mesh_shape", None, "Overrides config.mesh_shape, "
                      "e.g. 'data:4;model:2'.")
  flags.DEFINE_string("layout", None, "Overrides config.layout, e.g. "
                      "'batch:data;heads:model'.")
  flags.DEFINE_enum("backend", None, list(config_lib.BACKENDS),
                    "Overrides config.backend.")
  flags.DEFINE_integer("num_virtual_cpus", None,
                       "Overrides config.num_virtual_cpus.")
  flags.DEFINE_integer("train_steps", None, "Overrides config.train_steps.")
  flags.DEFINE_integer("batch_size", None, "Overrides config.batch_size.")
  flags.DEFINE_integer("seed", None, "Overrides config.seed.")
  flags.DEFINE_string("worker_hosts", None, "Multi-worker: every worker's "
                      "host:port, comma-separated (the same on each worker);"
                      " default TF_CONFIG if set. See meshtf/train/"
                      "workers.py.")
  flags.DEFINE_integer("task_index", None, "Multi-worker: this worker's "
                       "index in --worker_hosts (0 is the chief).")


def _fail_unknown_override(error):
  """ml_collections rejects --config.<unknown key> while defining the flag;
  name the key (from the command line) and the nearest known ones."""
  known = config_lib._flat_keys(config_lib.default_config())
  for arg in sys.argv[1:]:
    if arg.startswith("--config."):
      key = arg[len("--config."):].split("=", 1)[0]
      if key not in known:
        _fail_unknown_key(key)
  _fail("bad --config override: %s" % _one_line(error))


def _fail_unknown_key(key):
  near = config_lib._near(key, config_lib._flat_keys(
      config_lib.default_config()))
  _fail("unknown config key %r (--config.%s): %s" % (key, key, (
      "did you mean %s?" % " or ".join(repr(n) for n in near)) if near
      else "see meshtf/train/config.py for the keys"))


_OVERRIDES = ("mesh_shape", "layout", "backend", "num_virtual_cpus",
              "train_steps", "batch_size", "seed")


class UsageError(Exception):
  """Bad input found at run time (data, checkpoint): printed as one line."""


# --- flags --------------------------------------------------------------------
def parse_flags(argv):
  """absl flags parser that reports a bad flag or config file in one line
  (absl's own parser prints two and a usage hint)."""
  try:
    return FLAGS(argv)
  except flags.UnrecognizedFlagError as e:
    name = getattr(e, "flagname", "") or ""
    if name.startswith("config."):
      _fail_unknown_key(name[len("config."):])
    _fail("unknown flag --%s: see python -m meshtf.train --helpshort" % name)
  except flags.Error as e:
    _fail("%s: see python -m meshtf.train --helpshort" % _one_line(e))
  except (AttributeError, KeyError) as e:  # --config.<unknown key>
    _fail_unknown_override(e)
  except Exception as e:  # a config file that does not load
    _fail("cannot load the config: %s: %s" % (type(e).__name__,
                                               _one_line(e)))


def _one_line(e):
  """The first line of an error, or for one that embeds a traceback (a
  config file that raised) its first line and the exception's line."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  if any(l.startswith("Traceback") for l in lines):
    return "%s %s" % (lines[0], lines[-1])
  return lines[0]


def _fail(message, code=2):
  sys.stderr.write("meshtf.train: error: %s\n" % message)
  sys.stderr.flush()
  sys.exit(code)


def config_from_flags():
  """FLAGS.config (a copy) with the command-line overrides applied."""
  try:
    config = FLAGS.config.copy_and_resolve_references()
  except (IOError, OSError) as e:  # the file failed to load
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    _fail("cannot load --config=%s: %s" % (
        config_flags.get_config_filename(FLAGS["config"]),
        lines[-1] if lines else type(e).__name__))
  config.unlock()
  for name in _OVERRIDES:
    value = getattr(FLAGS, name)
    if value is not None and name in config:
      config[name] = value
  config.lock()
  return config


def default_model_dir(config_path):
  stem = os.path.splitext(os.path.basename(config_path or "config"))[0]
  return os.path.join(tempfile.gettempdir(), "meshtf_train",
                      "default" if stem == "config" else stem)


# --- shared setup -------------------------------------------------------------
class Session(object):
  """The mesh, model, data and variables of one run of the binary."""

  def __init__(self, config, model_dir, mode, devices=None, log=print,
               workers=None, mesh_layout=None):
    import meshtf as mtf
    from meshtf.lowering import variables as variables_lib
    from meshtf.train import checkpoint
    from meshtf.train import experiment
    self.config = config
    self.model_dir = model_dir
    self.mode = mode
    self.log = log
    self.mtf = mtf
    self.experiment = experiment
    self.mesh_layout = mesh_layout or config_lib.mesh_layout(config)
    mesh_size = self.mesh_layout.size
    if devices is None:
      devices = mtf.virtual_cpu_devices(config.num_virtual_cpus or mesh_size)
    self.devices = list(devices)[:mesh_size]
    self.impl = experiment.make_mesh_impl(config, self.mesh_layout,
                                          self.devices)
    self.workers = workers
    # The chief writes; in a multi-worker run every worker reads only the
    # batch rows its processors hold.
    self.is_chief = workers is None or workers.is_chief
    self.rows = None
    if workers is not None and workers.num_workers > 1:
      self.rows = mtf.host_rows(self.impl, mtf.Shape([
          mtf.Dimension("batch", config.batch_size),
          mtf.Dimension("length", config.length)]))
    self.store = variables_lib.VariableStore()
    self.manager = checkpoint.CheckpointManager(
        model_dir, max_to_keep=config.keep_checkpoints)
    self.sink = experiment.MoeMetrics()
    self.model = experiment.build_model(config, self.sink, self.mesh_layout)
    self._eval_fn = None
    self._decoder = None

  # -- evaluation ----------------------------------------------------------
  def eval_fn(self):
    if self._eval_fn is None:
      loss_fn = self.experiment.loss_fn(self.model, self.sink, mode="eval",
                                        **self.row_args())

      def build(mesh, features):
        _, metrics = loss_fn(mesh, features)
        return {k: v for k, v in metrics.items()
                if k in ("token_loss", "accuracy", "num_tokens")}
      self._eval_fn = self.mtf.MeshFunction(build, self.impl,
                                            variable_store=self.store,
                                            seed=self.config.seed)
    return self._eval_fn

  def evaluate(self, data):
    """{"loss", "accuracy", "perplexity", "tokens"} over eval_steps held-out
    batches (token-weighted means)."""
    fn = self.eval_fn()
    total_loss = total_acc = total_n = 0.0
    for i in range(self.config.eval_steps):
      out = fn(data.eval_batch(i, rows=self.rows))
      n = float(out["num_tokens"])
      total_loss += float(out["token_loss"]) * n
      total_acc += float(out["accuracy"]) * n
      total_n += n
    loss = total_loss / max(total_n, 1.0)
    return {"loss": loss, "accuracy": total_acc / max(total_n, 1.0),
            "perplexity": self.experiment.perplexity(loss),
            "tokens": int(total_n)}

  def row_args(self):
    """loss_fn / import_features arguments for this worker's rows."""
    if self.rows is None:
      return {}
    return {"rows": self.rows, "batch_size": self.config.batch_size}

  # -- decoding --------------------------------------------------------------
  def decoder(self):
    """The session's decode.Decoder (its MeshFunctions built once)."""
    if self._decoder is None:
      from meshtf.train import decode as decode_lib
      self._decoder = decode_lib.Decoder(self)
    return self._decoder

  # -- checkpoints -------------------------------------------------------------
  def restore(self):
    """Restores the latest checkpoint into the store (values are taken when
    the variables are created); returns its step or None."""
    return self.manager.restore(self.store)


# --- checks before writing anything -------------------------------------------
def check_checkpoint(config, model_dir, mode):
  """Raises UsageError if model_dir's latest checkpoint does not fit the
  config's model (or, outside train, if there is none). Reads only."""
  from meshtf.train import checkpoint
  from meshtf.train import experiment
  manager = checkpoint.CheckpointManager(model_dir)
  latest = manager.latest()
  if latest is None:
    if mode != "train":
      raise UsageError("no checkpoint in %s to %s: run --mode=train with "
                       "this --model_dir first" % (model_dir, mode))
    return None
  with open(os.path.join(latest, "meta.json")) as f:
    meta = json.load(f)
  saved = meta["variables"]
  graph = experiment.build_training_graph(config)[0]
  needed = graph.all_variables if mode == "train" else \
      graph.trainable_variables
  for v in needed:
    if v.name not in saved:
      raise UsageError(
          "checkpoint %s has no variable %r that this config's model has: it "
          "was trained with another config; use a new --model_dir" % (
              latest, v.name))
    if list(saved[v.name]["shape"]) != v.shape.to_integer_list:
      raise UsageError(
          "checkpoint %s has variable %r with shape %s but this config's "
          "model needs %s: restore with the config that trained it, or use "
          "a new --model_dir" % (latest, v.name, saved[v.name]["shape"],
                                 v.shape.to_integer_list))
  if mode == "train":
    extra = sorted(set(saved) - {v.name for v in graph.all_variables})
    if extra:
      raise UsageError("checkpoint %s has variables this config's model "
                       "lacks (%s...): it was trained with another config; "
                       "use a new --model_dir" % (latest, extra[0]))
  return meta["step"]


def prepare(config, model_dir, mode):
  """Everything that must pass before a directory is created or a device
  configured: the config (layout included) and the checkpoint. Returns the
  config's MeshLayout (parsed here, once)."""
  mesh_layout = config_lib.validate(config)
  check_checkpoint(config, model_dir, mode)
  return mesh_layout


# --- modes --------------------------------------------------------------------
def run(config, mode, model_dir, devices=None, out=None, progress=None,
        workers=None):
  """Runs one mode in-process; returns its results as a dict. Raises
  ConfigError / UsageError / DataError on bad input (before writing).
  workers (meshtf.train.workers.Workers): this process is one worker of a
  multi-worker mesh; the cluster is joined here, before any TF work."""
  out = out or sys.stdout
  prefix = "" if workers is None or workers.is_chief else \
      "[worker %d] " % workers.index
  log = lambda *a: print(prefix + " ".join(  # noqa: E731
      str(x) for x in a), file=out, flush=True)
  if mode not in config_lib.MODES:
    raise config_lib.ConfigError(["mode %r is unknown: use --mode=%s" % (
        mode, " | ".join(config_lib.MODES))])
  mesh_layout = prepare(config, model_dir, mode)
  from meshtf.train import workers as workers_lib
  problems = workers_lib.problems(config, mesh_layout, workers, mode)
  if problems:
    raise config_lib.ConfigError(problems)
  if mode == "export":
    return export(config, model_dir, log)
  from meshtf.train import decode as decode_lib
  prompt_set = (decode_lib.read_prompts(config, model_dir)
                if mode == "decode" else None)
  if workers is not None and devices is None:
    devices = workers_lib.start(mesh_layout, workers)
  session = Session(config, model_dir, mode, devices, log, workers,
                    mesh_layout)
  if mode == "train":
    return train(session, progress)
  step = session.restore()
  from meshtf.train import experiment
  data = experiment.make_data(config, model_dir)
  if mode == "eval":
    result = session.evaluate(data)
    log("eval at step %d: loss %.4f  accuracy %.4f  perplexity %.3f  "
        "(%d held-out tokens)" % (step, result["loss"], result["accuracy"],
                                  result["perplexity"], result["tokens"]))
    result["step"] = step
    return result
  return decode_lib.decode(session, data, step, log, prompt_set)


def train(session, progress=None):
  """The training loop (see the module docstring)."""
  import tensorflow as tf
  from meshtf.models import training
  from meshtf.train import experiment
  config, log = session.config, session.log
  model_dir = session.model_dir
  data = experiment.make_data(config, model_dir)
  chief = session.is_chief
  if chief:  # other workers of a multi-worker run write nothing
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, CONFIG_FILE), "w") as f:
      f.write(config.to_json(indent=1, sort_keys=True))
  start_step = session.restore() or 0
  if chief:
    _truncate_metrics(model_dir, start_step)
  step_fn = training.TrainStep(
      experiment.loss_fn(session.model, session.sink, **session.row_args()),
      session.impl, experiment.make_optimizer(config),
      variable_store=session.store, seed=config.seed,
      clip_gradient_norm=config.clip_gradient_norm or None)
  lr_fn = experiment.learning_rate_schedule(config)
  if chief:
    writer = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
    eval_writer = tf.summary.create_file_writer(os.path.join(model_dir,
                                                             "eval"))
  else:
    writer = eval_writer = tf.summary.create_noop_writer()
  tokens_per_step = config.batch_size * config.length * (
      2 if config.model_type == "bitransformer" else 1)
  metrics_path = os.path.join(model_dir, METRICS_FILE)
  history = []
  evals = []
  step = start_step
  end = config.train_steps
  if start_step >= config.train_steps:
    log("model_dir %s is already trained to step %d (train_steps %d)" % (
        model_dir, start_step, config.train_steps))
  elif start_step and config.stop_at_target and config.eval_every:
    # A run that stopped at the target would otherwise train on to the
    # next eval: check first.
    result = session.evaluate(data)
    if result["accuracy"] >= config.target_accuracy:
      log("model_dir %s already reached the target at step %d (eval "
          "accuracy %.4f >= %.4f); nothing to train" % (
              model_dir, start_step, result["accuracy"],
              config.target_accuracy))
      evals.append(dict(result, step=start_step))
      end = start_step
  bar = None
  t_start = time.time()
  t_window, window_steps = time.time(), 0
  with (open(metrics_path, "a") if chief else open(os.devnull, "w")
        ) as metrics_file:
    while step < end:
      t0 = time.time()
      outputs = step_fn(data.train_batch(step, rows=session.rows))
      record = {k: float(np.asarray(v)) for k, v in outputs.items()}
      if int(record["step"]) != step:
        raise RuntimeError("global step %d != loop step %d" % (
            record["step"], step))
      dt = time.time() - t0
      if step == start_step:
        _print_summary(session, step_fn, start_step, dt)
        bar = _progress_bar(config, start_step, progress)
        t_window, window_steps = time.time(), 0
      else:
        window_steps += 1
      step += 1
      record["step"] = step - 1
      record["learning_rate"] = float(lr_fn(float(step - 1)))
      elapsed = time.time() - t_window
      record["tokens_per_sec"] = (tokens_per_step * window_steps / elapsed
                                  if window_steps and elapsed > 0 else 0.0)
      metrics_file.write(json.dumps(record, sort_keys=True) + "\n")
      metrics_file.flush()
      history.append(record)
      if bar is not None:
        bar.update(1)
        bar.set_postfix_str(_postfix(record), refresh=False)
      if step % config.log_every == 0 or step == end:
        _write_scalars(writer, record, step)
        if bar is None:
          log("step %d  %s" % (step, _postfix(record)))
      if step % config.checkpoint_every == 0 and step < end:
        session.manager.save(session.store, step)
      if config.eval_every and step % config.eval_every == 0 and step < end:
        result = session.evaluate(data)
        evals.append(dict(result, step=step))
        _write_eval(eval_writer, result, step)
        if bar is not None:
          bar.write("eval at step %d: accuracy %.4f loss %.4f" % (
              step, result["accuracy"], result["loss"]))
        else:
          log("eval at step %d: accuracy %.4f  loss %.4f" % (
              step, result["accuracy"], result["loss"]))
        if config.stop_at_target and result["accuracy"] >= \
            config.target_accuracy:
          break
  if bar is not None:
    bar.close()
  wall = time.time() - t_start
  if step > start_step:
    session.manager.save(session.store, step)
  if not (evals and evals[-1]["step"] == step):
    result = session.evaluate(data)
    evals.append(dict(result, step=step))
    _write_eval(eval_writer, result, step)
  final = evals[-1]
  reached = final["accuracy"] >= config.target_accuracy
  steps_run = step - start_step
  tok_s = [r["tokens_per_sec"] for r in history if r["tokens_per_sec"]]
  log("done: step %d, %d steps in %.1f s (%.0f tokens/s)" % (
      step, steps_run, wall, tok_s[-1] if tok_s else 0.0))
  log("final eval accuracy %.4f (loss %.4f, perplexity %.3f): target %.4f "
      "%s" % (final["accuracy"], final["loss"], final["perplexity"],
              config.target_accuracy,
              "REACHED" if reached else "NOT reached"))
  writer.flush()
  eval_writer.flush()
  return {"history": history, "eval": final, "evals": evals,
          "reached": reached, "start_step": start_step, "step": step,
          "wall_s": wall, "collective_stats":
          step_fn.mesh_function.collective_stats() if history else None}


def _write_eval(writer, result, step):
  _write_scalars(writer, {k: result[k] for k in ("loss", "accuracy",
                                                "perplexity")}, step)


def _write_scalars(writer, values, step):
  """TensorBoard scalars via tf.summary.write with the scalars plugin's
  metadata: tf.summary.scalar would need the tensorboard package."""
  import tensorflow as tf
  from tensorflow.core.framework import summary_pb2
  metadata = summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(
          plugin_name="scalars"),
      data_class=summary_pb2.DATA_CLASS_SCALAR)
  with writer.as_default(step=step):
    for k, v in sorted(values.items()):
      if k != "step":
        tf.summary.write(k, tf.constant(float(v), tf.float32),
                         metadata=metadata)


def _postfix(record):
  parts = ["loss %.4f" % record["loss"], "acc %.3f" % record["accuracy"],
           "%.0f tok/s" % record["tokens_per_sec"],
           "lr %.2g" % record["learning_rate"]]
  if "moe_load_max" in record:
    parts.append("moe max/mean load %.2f dropped %.3f" % (
        record["moe_load_max"], record["moe_dropped"]))
  return "  ".join(parts)


def _progress_bar(config, start_step, progress):
  """A tqdm bar on an interactive stderr (progress=None), forced on or off
  with progress=True/False; None when off (log lines instead)."""
  if progress is None:
    progress = sys.stderr.isatty()
  if not progress:
    return None
  import shutil
  from tqdm import tqdm
  # Some pseudo-terminals report 0 columns, which makes tqdm print nothing.
  columns = shutil.get_terminal_size((120, 24)).columns or 120
  return tqdm(total=config.train_steps, initial=start_step, unit="step",
              ncols=max(columns, 60), mininterval=0.5)


def _truncate_metrics(model_dir, start_step):
  """Drops metrics of steps >= start_step (a killed run may have logged
  steps after its last checkpoint; they are run again) and a torn line."""
  path = os.path.join(model_dir, METRICS_FILE)
  if not os.path.exists(path):
    return
  kept = []
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if record.get("step", 0) < start_step:
        kept.append(line if line.endswith("\n") else line + "\n")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
  os.replace(tmp, path)


def _ranges(rows):
  """[0, 1, 2, 5, 6] -> '0..2, 5..6'."""
  out, start = [], None
  for i, r in enumerate(rows):
    if start is None:
      start = r
    if i + 1 == len(rows) or rows[i + 1] != r + 1:
      out.append("%d..%d" % (start, r) if r != start else str(r))
      start = None
  return ", ".join(out)


def _print_summary(session, step_fn, start_step, first_step_s):
  from meshtf.train import experiment
  config, log = session.config, session.log
  graph = step_fn.graph
  counts = experiment.parameter_counts(graph, session.mesh_layout)
  moe = ""
  if config.moe.num_experts:
    moe = ", MoE %d experts (%s) on feed-forward layers %s" % (
        config.moe.num_experts, config.moe.gating,
        config_lib.moe_layer_indices(config, config.num_layers))
  task = config.task.data_files or config.task.tfds_name or \
      "synthetic %s" % config.task.problem
  lowering = step_fn.mesh_function.lowering
  lines = [
      "=" * 72,
      "meshtf.train: %s, %d layers, d_model %d, %d heads, d_ff %d%s" % (
          config.model_type, config.num_layers, config.d_model,
          config.num_heads, config.d_ff, moe),
      "task: %s; batch %d x length %d; %d steps; optimizer %s lr %g (%s)" % (
          task, config.batch_size, config.length, config.train_steps,
          config.optimizer, config.learning_rate, config.schedule),
      "mesh: %s = %d processors, %s backend on %s" % (
          config.mesh_shape, session.impl.size, config.backend,
          session.devices[0].split("/")[-1] + (
              ".." + session.devices[-1].split(":")[-1]
              if len(session.devices) > 1 else "")),
      "layout: %s%s%s" % (
          config.layout,
          "; activations: %s" % config.activation_layout
          if config.activation_layout else "",
          "; variables: %s" % config.variable_layout
          if config.variable_layout else ""),
      "parameters: %s total, %s per device (+ %s optimizer state per "
      "device)" % (format(counts["total"], ","),
                   format(counts["per_device"], ","),
                   format(counts["optimizer_per_device"], ",")),
      "collectives per step:",
  ]
  lines += ["  " + l for l in lowering.collective_summary().splitlines()]
  if session.rows is not None:
    w = session.workers
    lines.append("workers: %d (this is task %d%s); it reads batch rows %s of "
                 "%d" % (w.num_workers, w.index,
                         ", the chief" if w.is_chief else "",
                         _ranges(session.rows), config.batch_size))
  lines += [
      "model_dir: %s (%s)" % (session.model_dir, "resumed from step %d" %
                              start_step if start_step else "new"),
      "first step (trace + lowering + run): %.1f s" % first_step_s,
      "=" * 72,
  ]
  for l in lines:
    log(l)


def export(config, model_dir, log):
  """See meshtf/train/export.py."""
  from meshtf.train import export as export_lib
  path = export_lib.export(config, model_dir, os.path.join(model_dir,
                                                           EXPORT_DIR))
  log("exported SavedModel to %s (signatures: score, decode)" % path)
  return {"path": path}


# --- entry point --------------------------------------------------------------
def main(argv):
  if len(argv) > 1:
    _fail("unexpected arguments %s: flags only (--config, --mode, ...)"
          % " ".join(argv[1:]))
  import logging
  import tensorflow as tf
  from meshtf.layouts import LayoutError
  from meshtf.train import decode as decode_lib
  from meshtf.train import text_data
  from meshtf.train import workers as workers_lib
  # TensorFlow's INFO lines (SavedModel writing, retracing notes) would
  # drown the summary and progress lines.
  tf.get_logger().setLevel(logging.ERROR)
  absl_logging.set_verbosity(absl_logging.WARNING)
  config = config_from_flags()
  model_dir = FLAGS.model_dir or default_model_dir(
      config_flags.get_config_filename(FLAGS["config"]))
  try:
    workers = workers_lib.from_flags(FLAGS.worker_hosts, FLAGS.task_index)
    run(config, FLAGS.mode, model_dir, workers=workers)
  except (config_lib.ConfigError, UsageError, text_data.DataError,
          decode_lib.PromptError, LayoutError) as e:
    for line in str(e).splitlines() or [type(e).__name__]:
      sys.stderr.write("meshtf.train: error: %s\n" % line)
    sys.stderr.flush()
    sys.exit(2)


def entry_point():
  define_flags()
  app.run(main, flags_parser=parse_flags)


__all__ = ["run", "Session", "check_checkpoint", "UsageError",
           "define_flags", "entry_point"]


if __name__ == "__main__":
  entry_point()
