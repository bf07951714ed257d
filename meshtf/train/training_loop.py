"""--mode=train: the training loop of the binary, guarded against
divergence.

Before the first step it prints the header (model, task, mesh, layout,
parameters per device, model_dir) and "tracing and lowering ...", so
something is on the screen while the step is traced; after the first step
it prints how long that took and the collectives per step. Then a progress
bar (loss, accuracy, tokens/s, learning rate, MoE load), TensorBoard
scalars, per-step metrics (metrics.jsonl), checkpoints every
checkpoint_every steps and at the end, held-out evals, and whether the
accuracy target was reached.

A loss or gradient norm that is not finite stops training at once with
DivergedError (one line naming the step and the likely causes); a variable
that is not finite is never saved (CheckpointManager.save refuses it), so
model_dir keeps its last good checkpoint.

Example:
  >>> result = train(session, progress=False)
  >>> result["reached"], result["step"]
  (True, 175)
"""
import contextlib
import json
import math
import os
import sys
import time

import numpy as np

from meshtf.train import config as config_lib
from meshtf.train import errors
from meshtf.train import model_dir as model_dir_lib
from meshtf.train import preflight
from meshtf.train import stopping

METRICS_FILE = "metrics.jsonl"


def train(session, progress=None, stops=None):
  """The training loop (see the module docstring); see _train. A disk
  that fills while it writes is errors.DiskFullError: one line naming
  what was being written and the checkpoint that stays intact."""
  try:
    return _train(session, progress, stops)
  except Exception as e:  # pylint: disable=broad-except
    if not errors.is_disk_full(e):
      raise
    latest = session.manager.latest()
    raise errors.DiskFullError(
        "the disk of --model_dir=%s is full (%s): %s; free space on it (or "
        "pass --model_dir on a disk with room) and train again to continue "
        "from there" % (
            session.model_dir, _disk_full_reason(e, session.model_dir),
            "%s is intact" % latest if latest else
            "no checkpoint was saved")) from None


def _disk_full_reason(error, model_dir):
  """'No space left on device writing <file under model_dir>'."""
  if isinstance(error, OSError):
    path, reason = error.filename, error.strerror
  else:   # TF: "{{function_node ...}} <path>; No space left on device ..."
    line = (str(error).strip().splitlines() or [""])[0]
    path, _, reason = line.split("}} ", 1)[-1].partition("; ")
    reason = reason.split(" [Op:", 1)[0]
  if not path:
    return reason or type(error).__name__
  rel = os.path.relpath(str(path), model_dir)
  return "%s writing %s" % (reason, str(path) if rel.startswith("..")
                            else rel)


def _train(session, progress=None, stops=None):
  """The training loop (see the module docstring); returns {"history",
  "eval", "evals", "reached", "start_step", "step", "wall_s",
  "collective_stats"}. Raises errors.DivergedError; with stops (a
  stopping.StopRequests), a SIGINT / SIGTERM after the first step saves a
  checkpoint at the step reached and raises stopping.Stopped, and one
  before it (or a second one) stops at once (stopping.Interrupted)."""
  import tensorflow as tf
  from meshtf.models import training
  stops = stops or stopping.NoStops()
  config, log = session.config, session.log
  model_dir = session.model_dir
  exp = session.experiment
  data = exp.data(model_dir)
  chief = session.is_chief
  start_step = session.restore() or 0
  first_batch = None
  if start_step < config.train_steps:
    # The stream continues where the checkpoint's position says; its first
    # batch is read before anything is written, so bad data (found when it
    # is read) leaves model_dir as it was.
    if start_step and session.from_init_checkpoint:
      # A fine-tune reads its data from the beginning, at the released
      # checkpoint's step (another model's run: no position to continue).
      data.restore_train(None, start_step)
    elif start_step:
      meta = session.restored_meta or {}
      why = data.restore_train(meta.get("extra", {}).get("input"),
                               start_step)
      if why:
        log("input: %s" % why)
    first_batch = data.train_batch(start_step, rows=session.rows)
  step_fn = training.TrainStep(
      exp.loss_fn(**session.row_args()), session.impl, exp.optimizer(),
      variable_store=session.store, seed=config.seed,
      clip_gradient_norm=config.clip_gradient_norm or None,
      bucket_bytes=int(config.collective_bucket_mb * (1 << 20)))
  lr_fn = exp.learning_rate_schedule()
  # Several workers stop together: each step boundary agrees on the stop
  # requests of all of them (meshtf/train/peers.py).
  agree = _stop_agreement(session)
  tokens_per_step = config.batch_size * config.length * (
      2 if config.model_type == "bitransformer" else 1)
  metrics_path = os.path.join(model_dir, METRICS_FILE)
  history = []
  evals = []
  step = start_step
  end = config.train_steps
  if start_step >= config.train_steps:
    log("model_dir %s is already trained to step %d (train_steps %d): "
        "nothing to train, nothing written; pass --train_steps=%d or more "
        "to train on" % (model_dir, start_step, config.train_steps,
                         start_step + 1))
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
  # A run that trains nothing writes nothing: config.json keeps the
  # train_steps the model was trained to, no empty event files appear.
  # Other workers of a multi-worker run write nothing at all.
  writes = chief and step < end
  if writes:
    os.makedirs(model_dir, exist_ok=True)
    model_dir_lib.write_config(model_dir, config)
    if data.vocab_is_new:
      from meshtf.train import text_data
      data.vocab.save(os.path.join(model_dir, text_data.VOCAB_NAME))
    _truncate_metrics(model_dir, start_step)
    writer = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
    eval_writer = tf.summary.create_file_writer(os.path.join(model_dir,
                                                             "eval"))
  else:
    writer = eval_writer = tf.summary.create_noop_writer()
  # Until the first step has run there is nothing new to save: a signal
  # stops at once. From then on the first one is a request, answered
  # after the step in flight (deferral entered below).
  stops.phase = "tracing and lowering the training step"
  if step < end:
    print_header(session, start_step, data)
    log("tracing and lowering the training step ...")
  saved_step = start_step if session.restored_names is not None else None
  stopped_by = None   # the task told to stop, when another worker was
  agreed = False      # several workers: all agreed to stop
  bar = None
  t_start = time.time()
  t_window, window_steps = time.time(), 0
  deferral = contextlib.ExitStack()

  def close_bar():   # also when a signal stops the run at once
    if bar is not None:
      bar.close()
  deferral.callback(close_bar)
  if agree is not None:
    # One worker stopping at once would fail the others' collectives: the
    # first signal waits for the first step's boundary, where all agree.
    deferral.enter_context(stops.deferred(
        "tracing and lowering the training step"))

  def stop_requested():
    nonlocal stopped_by, agreed
    if agree is None:
      return stops.requested
    session.doing = "the stop agreement after step %d" % step
    # Only what all agreed on counts: a signal that arrives after this
    # worker's request went out is agreed at the next boundary.
    own = stops.signum
    signum, task = agree(own)
    if signum is None:
      return False
    if own is None:
      stops.signum, stopped_by = signum, task   # another worker's signal
    agreed = True
    return True
  with deferral, (open(metrics_path, "a") if writes else
                  open(os.devnull, "w")) as metrics_file:
    while step < end and not stop_requested():
      t0 = time.time()
      session.doing = "step %d" % (step + 1)   # counted as the log does
      batch = first_batch if step == start_step else data.train_batch(
          step, rows=session.rows)
      outputs = step_fn(batch)
      record = {k: float(np.asarray(v)) for k, v in outputs.items()}
      if int(record["step"]) != step:
        raise RuntimeError("global step %d != loop step %d" % (
            record["step"], step))
      check_finite(record, step, config, saved_step)
      dt = time.time() - t0
      if step == start_step:
        if agree is None:
          deferral.enter_context(stops.deferred("training"))
        else:
          stops.phase = "training"
        print_first_step(session, step_fn, dt)
        bar = _progress_bar(config, start_step, progress)
        t_window, window_steps = time.time(), 0
      else:
        window_steps += 1
      step += 1
      record["step"] = step - 1
      record["learning_rate"] = float(lr_fn(float(step - 1)))
      record["step_seconds"] = dt
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
        session.doing = "the save of ckpt-%d" % step
        _save(session, step, config, saved_step, data)
        saved_step = step
      if config.eval_every and step % config.eval_every == 0 and step < end:
        session.doing = "the eval at step %d" % step
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
    close_bar()
    wall = time.time() - t_start
    if step > start_step and saved_step != step:
      stops.phase = "saving ckpt-%d" % step
      session.doing = "the save of ckpt-%d" % step
      _save(session, step, config, saved_step, data)
      saved_step = step
    if agree is not None and not agreed and step > start_step:
      stop_requested()   # a signal during the last step or the final save
  if (agreed if agree is not None else stops.requested):
    writer.flush()
    eval_writer.flush()
    _all_done(session, "meshtf/stopped")
    # In a multi-worker run the chief may still be writing it: its name.
    path = (os.path.join(model_dir, "ckpt-%d" % saved_step)
            if saved_step is not None else session.manager.latest())
    raise stopping.Stopped(stops.signum, stopped_message(
        stops.signum, step, path, model_dir,
        None if stopped_by is None or stopped_by == session.workers.index
        else session.workers.describe(stopped_by)))
  if not (evals and evals[-1]["step"] == step):
    session.doing = "the final eval at step %d" % step
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
  data.close()
  _all_done(session, "meshtf/trained")
  return {"history": history, "eval": final, "evals": evals,
          "reached": reached, "start_step": start_step, "step": step,
          "wall_s": wall, "collective_stats":
          step_fn.mesh_function.collective_stats() if history else None}


def stopped_message(signum, step, path, model_dir, other=None):
  """The one line of a training run stopped by a signal after saving;
  other: the worker that got the signal, when it was not this one.

  Example:
    >>> stopped_message(signal.SIGTERM, 37, "/tmp/m/ckpt-37", "/tmp/m")
    'stopped by SIGTERM after step 37: saved /tmp/m/ckpt-37; train again
    with --model_dir=/tmp/m to continue from step 37'
  """
  by = stopping.signal_name(signum)
  if other is not None:
    by = "%s to worker %s (all workers stop together)" % (by, other)
  if path is None:
    return ("stopped by %s before the first step: nothing to save; train "
            "again with --model_dir=%s to start" % (by, model_dir))
  return ("stopped by %s after step %d: saved %s; train again with "
          "--model_dir=%s to continue from step %d" % (
              by, step, path, model_dir, step))


def _stop_agreement(session):
  """A peers.StopAgreement for a multi-worker session, else None."""
  workers = session.workers
  if workers is None or workers.num_workers == 1:
    return None
  from meshtf.train import peers
  return peers.StopAgreement(session.impl, workers)


def _all_done(session, name):
  """In a multi-worker run, waits (bounded) until every worker got here:
  one that exits at once could fail the others' last collective."""
  workers = session.workers
  if workers is not None and workers.num_workers > 1:
    from meshtf.train import peers
    session.doing = "the final barrier"
    peers.wait_for_all(name, session.config.peer_timeout_seconds)


# --- the divergence guard -----------------------------------------------------
def check_finite(record, step, config, saved_step):
  """Raises DivergedError if the step's loss or gradient norm is NaN or
  Inf (the update of this step already ran: nothing is saved after it).

  Example:
    >>> check_finite({"loss": float("nan")}, 37, config, 25)
    Traceback (most recent call last):
    DivergedError: training diverged at step 37: the loss is nan; ...
  """
  bad = [(k, record[k]) for k in ("loss", "gradient_norm")
         if k in record and not math.isfinite(record[k])]
  if bad:
    what = " and ".join("the %s is %s" % (k.replace("_", " "), v)
                        for k, v in bad)
    raise errors.DivergedError(diverged_message(step, what, config,
                                                saved_step))


def diverged_message(step, what, config, saved_step):
  """One line: the step, what is not finite, the likely causes in this
  config and their fixes, and what model_dir still holds.

  Example:
    >>> diverged_message(37, "the loss is nan", config, 25)
    'training diverged at step 37: the loss is nan; likely causes: ...'
  """
  causes = ["learning_rate %g is too high" % config.learning_rate]
  fixes = ["lower --config.learning_rate"]
  if not config.clip_gradient_norm:
    causes.append("gradients are not clipped (clip_gradient_norm 0)")
    fixes.append("set --config.clip_gradient_norm=1.0")
  if not config.warmup_steps:
    causes.append("there is no warmup")
    fixes.append("set --config.warmup_steps=20")
  kept = ("model_dir keeps ckpt-%d, nothing was saved after it" % saved_step
          if saved_step else "no checkpoint was saved")
  return "training diverged at step %d: %s; likely causes: %s, or bad data:"\
         " %s; %s" % (step, what, ", ".join(causes), ", ".join(fixes), kept)


def _save(session, step, config, saved_step, data=None):
  """Saves a checkpoint, with the input stream's position (every worker's
  lanes: a non-chief worker leaves its own for the chief, which saves them
  all in meta.json); a variable that is not finite is a divergence (the
  loss of the step that made it was still finite)."""
  from meshtf.train import checkpoint as checkpoint_lib
  extra = None
  state = data.train_state() if data is not None else None
  if state is not None:
    extra = {"input": state}
    workers = session.workers
    if workers is not None and workers.num_workers > 1:
      from meshtf.train import streams
      if not workers.is_chief:
        streams.write_positions(session.model_dir, step, workers.index,
                                state)
      else:
        def extra():
          merged, missing = streams.gather_positions(
              session.model_dir, step, workers.num_workers, state)
          if missing:
            session.log("input: the positions of worker%s %s did not come "
                        "for ckpt-%d: resuming from it reads their rows' "
                        "data again from its beginning" % ("s" if len(missing) > 1 else "",
                                        ", ".join(map(str, missing)), step))
          return {"input": merged}
  try:
    session.manager.save(session.store, step, extra=extra)
  except checkpoint_lib.NonFiniteError as e:
    raise errors.DivergedError(diverged_message(
        step, "variable %r is not finite after the update" % e.name, config,
        saved_step)) from None


# --- what is printed ----------------------------------------------------------
def print_header(session, start_step, data=None):
  """The run's header, before tracing: model, task, mesh, layout,
  parameters per device (from the symbolic graph), the streamed data
  (units, objective, vocabulary), workers, model_dir.

  Example:
    >>> print_header(session, start_step=0)   # "model_dir: /tmp/m (new)"
  """
  config, log = session.config, session.log
  # The preflight's symbolic graph and layouts (kept by the experiment).
  graph, _ = session.experiment.training_graph()
  counts = session.experiment.parameter_counts()
  moe = ""
  if config.moe.num_experts:
    moe = ", MoE %d experts (%s) on feed-forward layers %s" % (
        config.moe.num_experts, config.moe.gating,
        config_lib.moe_layer_indices(config, config.num_layers))
  task = config.task.data_files or config.task.tfds_name or \
      "synthetic %s" % config.task.problem
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
  ]
  unused = preflight.unused_rules_line(preflight.rule_dims(config, graph)[1])
  if unused:
    lines.append(unused)
  stream = getattr(data, "train_source", None)
  if hasattr(stream, "units"):
    vocab = data.vocab
    lines.append("data: %d units of %d files, objective %s; %s" % (
        len(stream.units), len({u.path for u in stream.units}),
        stream.objective.name, "vocabulary %d ids%s: %s" % (
            vocab.size, " (%d extra ids)" % vocab.extra_ids
            if vocab.extra_ids else "", vocab.source)
        if vocab is not None else "token ids (no vocabulary)"))
  if max(config.pipeline_stages, config.num_microbatches,
         config.circular_repeats) > 1:
    lines.append(pipeline_line(config))
  if config.remat != "none":
    lines.append(REMAT_LINES[config.remat])
  if session.rows is not None:
    w = session.workers
    lines.append("workers: %d%s (this is task %d%s); it reads batch rows %s "
                 "of %d" % (w.num_workers, " from TF_CONFIG in the "
                            "environment" if w.from_environment else "",
                            w.index, ", the chief" if w.is_chief else "",
                            _ranges(session.rows), config.batch_size))
  from meshtf.train import init_checkpoint
  plan = session.checkpoint
  if isinstance(plan, init_checkpoint.RestorePlan):
    lines.extend(plan.lines())
    state = "new; from init_checkpoint at step %d, to step %d" % (
        start_step, config.train_steps)
  else:
    state = "resumed from step %d" % start_step if start_step else "new"
  lines.append("model_dir: %s (%s)" % (session.model_dir, state))
  for l in lines:
    log(l)


# The header's line for config.remat (meshtf/models/remat.py).
REMAT_LINES = {
    "full": "remat: full (each layer keeps its input; the backward pass "
            "recomputes the layer)",
    "einsum_outputs": "remat: einsum_outputs (each layer keeps its input "
                      "and einsums' outputs; the backward pass recomputes "
                      "the rest)",
    "weight_einsum_outputs": "remat: weight_einsum_outputs (each layer "
                             "keeps its input and the outputs of its "
                             "einsums with a weight; the backward pass "
                             "recomputes the rest, attention scores and "
                             "MoE dispatch/combine included)"}


def pipeline_line(config):
  """The header's pipeline line: stages, schedule, bubble fraction.

  Example:
    >>> pipeline_line(config)   # pipeline_stages=2, num_microbatches=4
    'pipeline: 2 stages x 1 layers each, 4 microbatches of 16 rows, plain
    schedule: 5 iterations, bubble fraction 0.200 (analytic)'
  """
  from meshtf.models import pipeline
  schedule = pipeline.Schedule(config.pipeline_stages,
                               config.num_microbatches,
                               config.circular_repeats)
  per_stage = config.num_layers // config.pipeline_stages
  return ("pipeline: %d stages x %d layers each, %d microbatches of %d rows, "
          "%s schedule: %d iterations, bubble fraction %.3f (analytic)" % (
              config.pipeline_stages, per_stage, config.num_microbatches,
              config.batch_size // config.num_microbatches,
              "circular (%d repeats)" % config.circular_repeats
              if config.circular_repeats > 1 else "plain",
              schedule.num_iterations, schedule.bubble_fraction))


def print_first_step(session, step_fn, first_step_s):
  """After the first step: its time and the collectives per step.

  Example:
    >>> print_first_step(session, step_fn, 8.8)
    # first step (trace + lowering + run): 8.8 s, then the table
  """
  log = session.log
  log("first step (trace + lowering + run): %.1f s" % first_step_s)
  log("collectives per step:")
  for l in step_fn.mesh_function.lowering.collective_summary().splitlines():
    log("  " + l)
  log("=" * 72)


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


__all__ = ["train", "check_finite", "diverged_message", "print_header",
           "print_first_step", "METRICS_FILE"]
