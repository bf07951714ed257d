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
decode  greedy decoding of held-out inputs, with exact-match accuracy:
        key/value caches in one mtf.while_loop (meshtf.models.decoding), or
        re-running the model on the growing prefix (config.decode_method).
export  a SavedModel (plain tf.Variables, full values) with signatures
        "score" (targets -> per-example loss) and "decode" (greedy), which
        TensorFlow loads without meshtf.

Bad input (config key, mesh shape, layout, device count, uneven split,
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

  def __init__(self, config, model_dir, mode, devices=None, log=print):
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
    mesh_size = mtf.convert_to_shape(str(config.mesh_shape)).size
    if devices is None:
      devices = mtf.virtual_cpu_devices(config.num_virtual_cpus or mesh_size)
    self.devices = list(devices)[:mesh_size]
    self.impl = experiment.make_mesh_impl(config, self.devices)
    self.store = variables_lib.VariableStore()
    self.manager = checkpoint.CheckpointManager(
        model_dir, max_to_keep=config.keep_checkpoints)
    self.sink = experiment.MoeMetrics()
    self.model = experiment.build_model(config, self.sink)
    self._eval_fn = None
    self._argmax_fn = None
    self._cached_fn = None

  # -- evaluation ----------------------------------------------------------
  def eval_fn(self):
    if self._eval_fn is None:
      loss_fn = self.experiment.loss_fn(self.model, self.sink, mode="eval")

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
      out = fn(data.eval_batch(i))
      n = float(out["num_tokens"])
      total_loss += float(out["token_loss"]) * n
      total_acc += float(out["accuracy"]) * n
      total_n += n
    loss = total_loss / max(total_n, 1.0)
    return {"loss": loss, "accuracy": total_acc / max(total_n, 1.0),
            "perplexity": self.experiment.perplexity(loss),
            "tokens": int(total_n)}

  # -- decoding --------------------------------------------------------------
  def argmax_fn(self):
    """MeshFunction: features -> argmax token ids [batch, length]."""
    if self._argmax_fn is None:
      model, mtf = self.model, self.mtf

      def build(mesh, features):
        from meshtf.models import transformer
        self.sink.clear()
        feats = transformer.import_features(mesh, features)
        logits, _, _ = transformer.compute_logits_loss_metrics(
            model, feats, "eval")
        self.sink.clear()
        return mtf.argmax(logits, logits.shape.dims[-1])
      self._argmax_fn = self.mtf.MeshFunction(build, self.impl,
                                              variable_store=self.store,
                                              seed=self.config.seed)
    return self._argmax_fn

  def cached_decode_fn(self):
    """MeshFunction: prompts (or inputs) -> greedily decoded ids, with
    key/value caches in one mtf.while_loop."""
    if self._cached_fn is None:
      model, experiment = self.model, self.experiment

      def build(mesh, features):
        from meshtf.models import transformer
        self.sink.clear()
        ids = experiment.decode_ids(
            model, transformer.import_features(mesh, features))
        self.sink.clear()
        return ids
      self._cached_fn = self.mtf.MeshFunction(build, self.impl,
                                              variable_store=self.store,
                                              seed=self.config.seed)
    return self._cached_fn

  def greedy_decode(self, batch, method=None):
    """Greedy decoding of a batch's prompts (LM) or inputs (seq2seq):
    returns the decoded targets [batch, length]. method "cached" uses
    key/value caches; "recompute" re-runs the model on the growing
    prefix."""
    method = method or self.experiment.decode_method(self.config)
    seq2seq = self.config.model_type == "bitransformer"
    if method == "recompute":
      fn = self.argmax_fn()
      out = greedy_decode(lambda f: np.asarray(fn(f)), batch, seq2seq)
    else:
      if seq2seq:
        features = {"inputs": batch["inputs"]}
      else:
        features = {"targets": prompts(batch)}
      out = np.asarray(self.cached_decode_fn()(features))
    self._check_restored()
    return out

  def _check_restored(self):
    """Decoding must use only trained weights: a variable the checkpoint
    lacks (e.g. a layer that made new variables in a second call) would
    silently start from its initializer."""
    latest = self.manager.latest()
    if latest is None:
      return
    with open(os.path.join(latest, "meta.json")) as f:
      saved = json.load(f)["variables"]
    fresh = [n for n in self.store.names() if n not in saved]
    if fresh:
      raise RuntimeError(
          "decoding created variables the checkpoint does not have (%s): a "
          "layer did not reuse its weights when called again" % fresh[:3])

  # -- checkpoints -------------------------------------------------------------
  def restore(self):
    """Restores the latest checkpoint into the store (values are taken when
    the variables are created); returns its step or None."""
    return self.manager.restore(self.store)


def decode_prompts(batch, seq2seq):
  """(prompt lengths [batch], reference outputs: list of token lists ending
  in EOS) of a batch of the synthetic task (or text data)."""
  from meshtf.train import data as data_lib
  targets = batch["targets"]
  weights = batch.get("targets_weights", (targets != 0).astype(np.float32))
  lengths, refs = [], []
  for row in range(targets.shape[0]):
    if seq2seq:
      p = 0
    else:
      nz = np.nonzero(weights[row] > 0)[0]
      p = int(nz[0]) if len(nz) else int(np.sum(targets[row] != 0))
    ref = [int(t) for t in targets[row, p:]]
    if data_lib.EOS in ref:
      ref = ref[:ref.index(data_lib.EOS) + 1]
    lengths.append(p)
    refs.append(ref)
  return np.array(lengths, np.int32), refs


def prompts(batch):
  """A language-model batch's targets with everything after each row's
  prompt set to 0 (what decoding starts from)."""
  targets = batch["targets"]
  prompt_len, _ = decode_prompts(batch, seq2seq=False)
  keep = np.arange(targets.shape[1])[None, :] < prompt_len[:, None]
  return np.where(keep, targets, 0).astype(np.int32)


def greedy_decode(predict, batch, seq2seq):
  """Greedy decoding with predict(features) -> argmax ids [batch, length]
  (numpy): position i gets the model's prediction given positions < i,
  for every row whose prompt ends before i, until EOS. Returns targets
  [batch, length] with the prompt and the decoded tokens.

  Example:
    >>> out = greedy_decode(lambda f: model_argmax(f), batch, seq2seq=False)
  """
  from meshtf.train import data as data_lib
  targets = batch["targets"]
  b, length = targets.shape
  prompt_len, _ = decode_prompts(batch, seq2seq)
  cur = np.where(np.arange(length)[None, :] < prompt_len[:, None], targets,
                 0).astype(np.int32)
  done = np.zeros([b], bool)
  features = {"targets_segmentation": np.ones([b, length], np.int32),
              "targets_position": np.tile(np.arange(length, dtype=np.int32),
                                          [b, 1])}
  if seq2seq:
    features["inputs"] = batch["inputs"]
    features["inputs_segmentation"] = (batch["inputs"] != 0).astype(np.int32)
    features["inputs_position"] = (
        features["inputs_segmentation"] * np.arange(length)).astype(np.int32)
  for i in range(int(prompt_len.min()), length):
    write = (i >= prompt_len) & ~done
    if not write.any():
      break
    preds = predict(dict(features, targets=cur))
    cur[write, i] = preds[write, i]
    done |= write & (preds[:, i] == data_lib.EOS)
  return cur


def decode_accuracy(decoded, batch, seq2seq):
  """(exact-match accuracy, token accuracy) of decoded targets against the
  batch's reference outputs (through EOS)."""
  from meshtf.train import data as data_lib
  prompt_len, refs = decode_prompts(batch, seq2seq)
  exact = tokens = total = 0
  for row, ref in enumerate(refs):
    out = [int(t) for t in decoded[row, prompt_len[row]:]]
    if data_lib.EOS in out:
      out = out[:out.index(data_lib.EOS) + 1]
    exact += out == ref
    tokens += sum(a == b for a, b in zip(out, ref))
    total += len(ref)
  return exact / float(len(refs)), tokens / float(max(total, 1))


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
  configured: the config (layout included) and the checkpoint."""
  config_lib.validate(config)
  check_checkpoint(config, model_dir, mode)


# --- modes --------------------------------------------------------------------
def run(config, mode, model_dir, devices=None, out=None, progress=None):
  """Runs one mode in-process; returns its results as a dict. Raises
  ConfigError / UsageError / DataError on bad input (before writing)."""
  out = out or sys.stdout
  log = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
  if mode not in config_lib.MODES:
    raise config_lib.ConfigError(["mode %r is unknown: use --mode=%s" % (
        mode, " | ".join(config_lib.MODES))])
  prepare(config, model_dir, mode)
  if mode == "export":
    return export(config, model_dir, log)
  session = Session(config, model_dir, mode, devices, log)
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
  return decode(session, data, step, log)


def train(session, progress=None):
  """The training loop (see the module docstring)."""
  import tensorflow as tf
  from meshtf.models import training
  from meshtf.train import experiment
  config, log = session.config, session.log
  model_dir = session.model_dir
  data = experiment.make_data(config, model_dir)
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, CONFIG_FILE), "w") as f:
    f.write(config.to_json(indent=1, sort_keys=True))
  start_step = session.restore() or 0
  _truncate_metrics(model_dir, start_step)
  step_fn = training.TrainStep(
      experiment.loss_fn(session.model, session.sink),
      session.impl, experiment.make_optimizer(config),
      variable_store=session.store, seed=config.seed,
      clip_gradient_norm=config.clip_gradient_norm or None)
  lr_fn = experiment.learning_rate_schedule(config)
  writer = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
  eval_writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))
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
  with open(metrics_path, "a") as metrics_file:
    while step < end:
      t0 = time.time()
      outputs = step_fn(data.train_batch(step))
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


def _print_summary(session, step_fn, start_step, first_step_s):
  from meshtf.train import experiment
  config, log = session.config, session.log
  graph = step_fn.graph
  counts = experiment.parameter_counts(graph, config)
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
      "layout: %s" % config.layout,
      "parameters: %s total, %s per device (+ %s optimizer state per "
      "device)" % (format(counts["total"], ","),
                   format(counts["per_device"], ","),
                   format(counts["optimizer_per_device"], ",")),
      "collectives per step:",
  ]
  lines += ["  " + l for l in lowering.collective_summary().splitlines()]
  lines += [
      "model_dir: %s (%s)" % (session.model_dir, "resumed from step %d" %
                              start_step if start_step else "new"),
      "first step (trace + lowering + run): %.1f s" % first_step_s,
      "=" * 72,
  ]
  for l in lines:
    log(l)


def decode(session, data, step, log):
  """Greedy decoding of config.decode_batches held-out batches."""
  config = session.config
  seq2seq = config.model_type == "bitransformer"
  exact = token = 0.0
  examples = []
  t0 = time.time()
  for i in range(config.decode_batches):
    batch = data.eval_batch(i)
    decoded = session.greedy_decode(batch)
    e, t = decode_accuracy(decoded, batch, seq2seq)
    exact += e
    token += t
    if i == 0:
      examples = _examples(batch, decoded, seq2seq)
      first = (batch, decoded)
  n = float(config.decode_batches)
  result = {"exact_match": exact / n, "token_accuracy": token / n,
            "step": step, "examples": examples,
            "seconds": time.time() - t0,
            "first_batch": first[0], "first_decoded": first[1]}
  for ex in examples[:3]:
    log("  input %s -> decoded %s (reference %s)" % (
        ex["input"], ex["decoded"], ex["reference"]))
  log("decode at step %d: exact match %.4f, token accuracy %.4f over %d "
      "held-out examples (greedy, %s, %.1f s)" % (
          step, result["exact_match"], result["token_accuracy"],
          config.decode_batches * config.batch_size,
          session.experiment.decode_method(config), result["seconds"]))
  return result


def _examples(batch, decoded, seq2seq):
  prompt_len, refs = decode_prompts(batch, seq2seq)
  out = []
  for row in range(min(3, len(refs))):
    source = batch["inputs"][row] if seq2seq else \
        batch["targets"][row, :prompt_len[row]]
    got = [int(t) for t in decoded[row, prompt_len[row]:]]
    out.append({"input": [int(t) for t in source if t],
                "decoded": got[:got.index(1) + 1] if 1 in got else got,
                "reference": refs[row]})
  return out


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
  from meshtf.train import text_data
  # TensorFlow's INFO lines (SavedModel writing, retracing notes) would
  # drown the summary and progress lines.
  tf.get_logger().setLevel(logging.ERROR)
  absl_logging.set_verbosity(absl_logging.WARNING)
  config = config_from_flags()
  model_dir = FLAGS.model_dir or default_model_dir(
      config_flags.get_config_filename(FLAGS["config"]))
  try:
    run(config, FLAGS.mode, model_dir)
  except (config_lib.ConfigError, UsageError, text_data.DataError,
          LayoutError) as e:
    for line in str(e).splitlines() or [type(e).__name__]:
      sys.stderr.write("meshtf.train: error: %s\n" % line)
    sys.stderr.flush()
    sys.exit(2)


def entry_point():
  define_flags()
  app.run(main, flags_parser=parse_flags)


__all__ = ["run", "Session", "greedy_decode", "decode_accuracy",
           "decode_prompts", "prompts", "check_checkpoint", "UsageError",
           "define_flags", "entry_point"]


if __name__ == "__main__":
  entry_point()
