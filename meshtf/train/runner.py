"""The binary's runner: one mode (train, eval, decode, export, plan, sweep)
run in-process on a resolved config.

`prepare` checks everything that must pass before a directory is created
or a device configured (the config, model_dir, prompts, the config and
checkpoint model_dir was trained with, workers, device count, memory);
`run` then locks model_dir for training, cleans what an interrupted run
left, and dispatches the mode. meshtf/train/main.py holds the flags, the
config resolution, the exit codes and the entry point, and calls `run`;
the sweep mode is handed `run` to train its entries.

Example:
  >>> from meshtf.train import runner
  >>> result = runner.run(config, "train", "/tmp/m")        # in-process
  >>> result["eval"]["accuracy"] > 0.9
  True
"""
import os
import sys

from meshtf.train import config as config_lib
from meshtf.train import errors
from meshtf.train import model_dir as model_dir_lib
from meshtf.train import preflight
from meshtf.train import session as session_lib
from meshtf.train import stopping
from meshtf.train import training_loop

EXPORT_DIR = "export"
MESH_TF_EXPORT_DIR = "mesh_tf"   # --config.export_format=mesh_tf
UsageError = errors.UsageError


# --- checks before writing anything -------------------------------------------
def check_checkpoint(config, model_dir, mode, found=None, graph=None):
  """Raises UsageError if model_dir's newest intact checkpoint (`found`,
  a checkpoint.IntactCheckpoint; read here if None) does not fit the
  config's model (`graph`: its symbolic training graph, built here if
  None), or, outside train, if there is none. Reads only; returns the
  IntactCheckpoint (None: train from scratch)."""
  from meshtf.train import checkpoint
  from meshtf.train import experiment
  if found is None:
    try:
      found = checkpoint.CheckpointManager(model_dir).read_newest_intact()
    except checkpoint.DamagedCheckpointError as e:
      raise UsageError("%s: move them out of the way (or delete them) to "
                       "start again, or use another --model_dir" % e) \
          from None
  if found is None:
    if mode != "train":
      raise UsageError("no checkpoint in %s to %s: run --mode=train with "
                       "this --model_dir first" % (model_dir, mode))
    return None
  latest, saved = found.path, found.meta["variables"]
  if graph is None:
    graph = experiment.Experiment(config, None).training_graph()[0]
  if mode == "train":
    problem = _optimizer_changed(config, model_dir, latest, saved, graph)
    if problem:
      raise UsageError(problem)
  needed = graph.all_variables if mode == "train" else \
      graph.trainable_variables
  for v in needed:
    if v.name not in saved:
      raise UsageError(
          "checkpoint %s has no variable %r that this config's model has: it "
          "was trained with another config: pass that --config, or use a "
          "new --model_dir for this one" % (latest, v.name))
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
                       "lacks (%s...): it was trained with another config: "
                       "pass that --config, or use a new --model_dir for "
                       "this one" % (latest, extra[0]))
  return found


def _starting_checkpoint(config, model_dir, mode, experiment):
  """model_dir's newest intact checkpoint (checked against the model), or,
  when model_dir has none and config.init_checkpoint is set, the
  init_checkpoint.RestorePlan of that checkpoint (the names of the
  experiment's model); with finetune_steps the run's last step
  (config.train_steps) becomes its step + finetune_steps."""
  from meshtf.train import checkpoint
  from meshtf.train import init_checkpoint
  graph = experiment.training_graph()[0]
  plan = None
  if config.init_checkpoint and not checkpoint.CheckpointManager(
      model_dir).checkpoints():
    found = plan = init_checkpoint.plan_restore(config, graph,
                                                experiment.model)
  else:
    found = check_checkpoint(config, model_dir, mode, graph=graph)
  if config.finetune_steps:
    config.train_steps = init_checkpoint.finetune_target(config, plan)
  elif plan is not None and mode == "train" and plan.step is not None and (
      plan.step >= config.train_steps):
    raise UsageError(
        "init_checkpoint is at step %d but train_steps is %d, so there is "
        "nothing to train (train_steps is the last step, not a count): set "
        "--config.finetune_steps=N to train N steps past it, or --train_steps"
        " above %d" % (plan.step, config.train_steps, plan.step))
  return found


def _is_slot(name):
  """An optimizer's state variable ('<variable>/slot_m', ...)."""
  return name.rsplit("/", 1)[-1].startswith("slot_")


def _optimizer_changed(config, model_dir, path, saved, graph):
  """One line when the checkpoint's variables and the model's differ only
  in optimizer slots (the optimizer changed), naming both optimizers and
  the fix; else None (another model is check_checkpoint's to say)."""
  mine = {v.name for v in graph.all_variables}
  theirs = set(saved)
  differ = mine ^ theirs
  if not differ or not all(_is_slot(n) for n in differ):
    return None
  try:
    trained = model_dir_lib.read_config(model_dir)
  except UsageError:
    trained = None
  before = "optimizer %r" % trained.optimizer if trained is not None and \
      trained.optimizer != config.optimizer else "another optimizer"
  slots = sorted({n.rsplit("/", 1)[-1] for n in theirs if _is_slot(n)})
  return ("checkpoint %s holds the state of %s (%s) but this run's optimizer"
          " is %r: the optimizer changed; to continue training from it, %s; "
          "else start a new --model_dir (eval, decode and export need no "
          "optimizer state)" % (
              path, before, ", ".join(slots) or "no slots", config.optimizer,
              "pass --config.optimizer=%s" % trained.optimizer
              if before != "another optimizer" else
              "use the optimizer it was trained with"))


def _check_config_matches(config, model_dir, source):
  """A config whose model differs from the one model_dir's checkpoints
  were trained with is refused, naming the fields."""
  from meshtf.train import checkpoint
  if not checkpoint.CheckpointManager(model_dir).checkpoints():
    return
  try:
    saved = model_dir_lib.read_config(model_dir)
  except UsageError:
    return   # broken: the checkpoint's variables are checked instead
  conflicts = [] if saved is None else model_dir_lib.config_conflicts(
      saved, config)
  if conflicts:
    raise UsageError(
        "%s does not match the model %s was trained with: %s: leave out "
        "--config to use the saved one, or use a new --model_dir" % (
            source, model_dir, "; ".join(conflicts)))


def _check_device_count(config, mesh_layout, workers):
  """A mesh the binary would run as more than preflight.MAX_VIRTUAL_CPUS
  virtual CPUs
  per process (a paper config on this machine) is refused."""
  per_process = mesh_layout.size // (workers.num_workers if workers else 1)
  if config.num_virtual_cpus or per_process <= preflight.MAX_VIRTUAL_CPUS:
    return
  # A planning mode (memory and step time without devices), where the
  # binary has one, is the place to look at such a config here.
  plan = ("; --mode=plan reports its memory and step time without devices"
          if "plan" in config_lib.MODES else "")
  raise config_lib.ConfigError([
      "mesh_shape %r needs %d devices, which this run would make as %d "
      "virtual CPUs on %d CPU cores (minutes per step; more than %d are "
      "not made unasked): run it where %d devices are (--worker_hosts), "
      "shrink it (--mesh_shape), or pass --num_virtual_cpus=%d to try; the "
      "config and its layout are valid (checked without devices)%s" % (
          str(config.mesh_shape), mesh_layout.size, per_process,
          os.cpu_count() or 1, preflight.MAX_VIRTUAL_CPUS, mesh_layout.size,
          mesh_layout.size, plan)])


def _jit_program_problem(config, mesh_layout, devices, mode):
  """jit_compile='program' on CPUs compiles only a program without
  collectives (TF 2.21's XLA has none for CPU devices): a mesh of several
  processors whose layout splits anything is refused here, before the
  trace would fail (meshtf/lowering/simd_collectives.xla_program_refusal
  says the same at trace time)."""
  if config.jit_compile != "program" or mode in ("plan", "sweep", "export"):
    return None
  on_gpus = devices is not None and all("GPU" in str(d) for d in devices)
  variable_rules = mesh_layout.variable_rules
  replicated = not (mesh_layout.layout_rules.pairs or config.activation_layout
                    or (variable_rules is not None and variable_rules.pairs))
  if on_gpus or mesh_layout.size == 1 or replicated:
    return None
  return ("jit_compile='program' compiles the whole step with XLA, but TF "
          "2.21's XLA does not compile collectives on CPU devices, and mesh "
          "%r (%d processors) with layout %r needs them: set "
          "--config.jit_compile=segments (XLA compiles the ops between the "
          "collectives), or train on one processor (--mesh_shape=all:1 "
          "--layout='')" % (str(config.mesh_shape), mesh_layout.size,
                            str(config.layout)))


def prepare(config, model_dir, mode, workers=None, devices=None,
            flag_names=None, source="the config", experiment=None):
  """Everything that must pass before a directory is created or a device
  configured: the config (ranges, layout and data files included),
  model_dir, the prompt file, a run already training there, the config
  model_dir was trained with, the newest intact checkpoint, the workers,
  the device count and the memory the step needs (the plan's estimate
  against this machine's memory). Returns (mesh_layout, IntactCheckpoint
  or None, prompts, the run's experiment.Experiment: its symbolic training
  graph and layouts built and checked here, once, for every later use).
  experiment: one built already for a config of these values (the finalist
  --layout=auto chose), reused with its graph and layouts; default (or
  for a config of other values) a new one.

  Example:
    >>> layout, found, prompts, exp = prepare(config, "/tmp/lm", "eval")
    >>> found.step
    225
  """
  from meshtf.train import decode as decode_lib
  from meshtf.train import workers as workers_lib
  mesh_layout = config_lib.validate(config, flag_names=flag_names,
                                    check_layout=False)
  # TensorFlow loads here (experiment), after the config checks above.
  from meshtf.train import experiment as experiment_lib
  if experiment is not None:
    experiment = experiment.adopt(config)
  if experiment is None:
    experiment = experiment_lib.Experiment(config, mesh_layout)
  # A reused experiment's MeshLayout is parsed from the same values
  # (config_lib.mesh_layout): the run's model and graph hold that object.
  mesh_layout = experiment.mesh_layout
  # The symbolic training graph, built once: its layouts are checked here,
  # the checkpoint's variables and the memory estimate below, the plan and
  # the header read the same (kept by the experiment).
  graph, graph_layout, problem = config_lib.checked_training_graph(
      config, mesh_layout, experiment)
  if problem:
    raise config_lib.ConfigError([problem])
  problem = _jit_program_problem(config, mesh_layout, devices, mode)
  if problem:
    raise config_lib.ConfigError([problem])
  writes = mode in ("train", "export", "plan", "sweep") or (
      mode == "decode" and config.decode_prompts_file and
      not config.decode_output_file)
  if writes:
    model_dir_lib.check_writable(model_dir)
  else:
    model_dir_lib.check_not_a_file(model_dir)
  prompt_set = (decode_lib.read_prompts(config, model_dir)
                if mode == "decode" else None)
  if mode == "train" and (workers is None or workers.is_chief):
    # The chief locks; other workers write nothing.
    model_dir_lib.check_not_in_use(model_dir)
  if mode in ("plan", "sweep"):   # no checkpoint: the config alone
    return mesh_layout, None, None, experiment
  _check_config_matches(config, model_dir, source)
  found = _starting_checkpoint(config, model_dir, mode, experiment)
  problems = workers_lib.problems(config, mesh_layout, workers, mode)
  if not problems and mode in ("train", "eval"):
    from meshtf.train import rendezvous
    problems = rendezvous.check_addresses(workers)
  if problems:
    raise config_lib.ConfigError(problems)
  if devices is None:
    _check_device_count(config, mesh_layout, workers)
  if devices is None or not any("GPU" in str(d) or "TPU" in str(d)
                                for d in devices):
    # Virtual CPUs share this machine's memory; what cannot fit it is
    # refused before TensorFlow allocates (GPUs' own memory is TF's).
    here = mesh_layout.size // (workers.num_workers if workers else 1)
    problem = preflight.memory_problem(config, mesh_layout, graph, mode,
                                       here, graph_layout=graph_layout)
    if problem:
      raise config_lib.ConfigError([problem])
  return mesh_layout, found, prompt_set, experiment


# --- modes --------------------------------------------------------------------
def run(config, mode, model_dir, devices=None, out=None, progress=None,
        workers=None, err=None, flag_names=None, source="the config",
        stops=None):
  """Runs one mode in-process; returns its results as a dict. Raises
  ConfigError / UsageError / DataError / PromptError / LayoutError on bad
  input (before writing) and DivergedError when training diverges.
  workers (meshtf.train.workers.Workers): this process is one worker of a
  multi-worker mesh; the cluster is joined here, before any TF work.
  Warnings (a damaged checkpoint skipped, a stale lock taken over) go to
  err (default sys.stderr) as one line each. stops: a
  stopping.StopRequests whose signals stop the run cleanly (the binary's;
  see meshtf/train/stopping.py)."""
  out = out or sys.stdout
  prefix = "" if workers is None or workers.is_chief else \
      "[worker %d] " % workers.index
  log = lambda *a: print(prefix + " ".join(  # noqa: E731
      str(x) for x in a), file=out, flush=True)

  def warn(message):
    stream = err or sys.stderr
    stream.write("meshtf.train: warning: %s%s\n" % (prefix, message))
    stream.flush()
  if mode not in config_lib.MODES:
    raise config_lib.ConfigError(["mode %r is unknown: use --mode=%s" % (
        mode, " | ".join(config_lib.MODES))])
  from meshtf.train import auto_layout
  stops = stops or stopping.NoStops()
  stops.phase = "checking the config"
  # --layout=auto: the layout is chosen from plans (no devices, no TF
  # work), and then everything is checked as for a layout given by hand.
  layout_choice, chosen = auto_layout.resolve(config, log)
  mesh_layout, found, prompt_set, experiment = prepare(
      config, model_dir, mode, workers, devices, flag_names, source,
      experiment=chosen)
  del chosen   # not adopted: its graph is freed now, not after the run
  if workers is not None and workers.num_workers > 1:
    # Before model_dir is written: all workers are up and run one config.
    stops.phase = "waiting for the other workers to start"
    _meet(config, mode, workers, log)
  hint_warning = communication_hint_warning(config, devices, mode)
  if hint_warning:
    warn(hint_warning)
  chief = workers is None or workers.is_chief
  lock = model_dir_lib.ModelDirLock(model_dir) \
      if mode == "train" and chief else None
  try:
    if lock is not None:
      took_over = lock.acquire()
      if took_over:
        warn(took_over)
    _report_damaged(found, lock is not None, warn)
    if lock is not None:
      from meshtf.train import checkpoint
      removed = model_dir_lib.clean_leftovers(
          model_dir, checkpoint.CheckpointManager(model_dir))
      if removed:
        log("model_dir: removed what an interrupted run left: %s" %
            ", ".join(removed))
    held = {}
    try:
      result = _run_mode(config, mode, model_dir, devices, log, progress,
                         workers, experiment, found, prompt_set,
                         layout_choice, stops, held)
    except Exception as e:  # pylint: disable=broad-except
      # A launcher or scheduler stopping the survivors meanwhile must not
      # cut the line short: a signal waits for it.
      with stops.deferred("naming the lost worker"):
        _raise_if_worker_lost(e, config, model_dir, workers, mesh_layout,
                              held.get("session"))
      raise
    if layout_choice is not None and isinstance(result, dict):
      result["layout_choice"] = layout_choice
    return result
  finally:
    if lock is not None:
      lock.release()


def _meet(config, mode, workers, log):
  """Meets the other workers before TensorFlow starts (rendezvous.py):
  ClusterError when one does not come in time, ConfigError when their
  configs differ."""
  from meshtf.train import rendezvous
  met = rendezvous.meet(workers, rendezvous.greeting(workers, config, mode),
                        config.worker_start_timeout_seconds, log)
  problems = rendezvous.differences(met, workers)
  if problems:
    raise config_lib.ConfigError(problems)


def _raise_if_worker_lost(error, config, model_dir, workers, mesh_layout,
                          session):
  """A collective that failed because a worker was lost, in a
  multi-worker run: raises the one-line ClusterError instead."""
  from meshtf.train import peers
  if workers is None or workers.num_workers == 1 or \
      not peers.is_peer_failure(error):
    return
  doing = session.doing if session is not None else \
      "the join of TensorFlow's cluster (after all workers met)"
  raise peers.lost_worker_error(
      workers, error, doing, model_dir, mesh_layout.size,
      config.peer_timeout_seconds) from None


def communication_hint_warning(config, devices, mode):
  """The warning line for communication_hint='nccl' on a mesh that is not
  all GPUs (the binary's virtual CPUs): NCCL serves GPUs only and
  TensorFlow runs its ring collectives instead, so the run is sound but the
  hint does nothing; None otherwise."""
  if config.communication_hint != "nccl" or mode in ("plan", "sweep",
                                                     "export"):
    return None
  if devices is not None and all("GPU" in str(d) for d in devices):
    return None
  return ("communication_hint='nccl' does nothing here: NCCL serves GPUs "
          "only, and this run's mesh is on CPUs, where TensorFlow runs its "
          "ring collectives instead; leave --config.communication_hint unset "
          "(chosen from the devices) or set it to ring")


def _report_damaged(found, may_move, warn):
  """One warning line per damaged checkpoint skipped; the lock holder
  moves each out of the way (kept as damaged-ckpt-<step>)."""
  from meshtf.train import checkpoint
  if not isinstance(found, checkpoint.IntactCheckpoint):
    return   # None, or an init_checkpoint's RestorePlan
  for path, why in found.damaged:
    moved = ""
    if may_move:
      manager = checkpoint.CheckpointManager(os.path.dirname(path))
      moved = "; moved to %s" % os.path.basename(manager.quarantine(path))
    warn("checkpoint %s is damaged (%s): using %s (step %d) instead%s" % (
        path, why, os.path.basename(found.path), found.step, moved))


def _run_mode(config, mode, model_dir, devices, log, progress, workers,
              experiment, found, prompt_set, layout_choice=None,
              stops=None, held=None):
  from meshtf.train import startup
  mesh_layout = experiment.mesh_layout
  stops = stops or stopping.NoStops()
  stops.phase = {"train": "starting TensorFlow and building the model",
                 "export": "exporting (the SavedModel is written under a "
                           "temporary name until complete)",
                 "eval": "evaluating", "decode": "decoding",
                 "plan": "planning", "sweep": "sweeping"}[mode]
  if mode == "export":
    return export(config, model_dir, log, found, experiment)
  if mode == "plan":
    from meshtf.train import plan_mode
    return plan_mode.run_plan(config, mesh_layout, model_dir, log,
                              layout_choice, experiment=experiment)
  if mode == "sweep":
    from meshtf.train import sweep_mode
    return sweep_mode.run_sweep(
        config, model_dir, log, devices=devices,
        train_entry=run if config.sweep_run else None,
        experiment=experiment)
  from meshtf.train import decode as decode_lib
  from meshtf.train import workers as workers_lib
  if workers is not None and devices is None:
    stops.phase = "joining the other workers' TensorFlow cluster"
    # All workers met just now: TensorFlow's own join (in C++, where no
    # signal handler runs) takes seconds; a worker that failed between is
    # named after a minute (or peer_timeout_seconds), not after
    # worker_start_timeout_seconds.
    devices = workers_lib.start(
        mesh_layout, workers, config.peer_timeout_seconds,
        register_timeout_seconds=max(60.0, config.peer_timeout_seconds))
    stops.reinstall()
    if startup.program_name() is not None:
      # TensorFlow's messages of a cluster (a lost worker's gRPC errors)
      # go to a file; this process's own lines stay on the terminal.
      from meshtf.train import peers
      startup.tensorflow_output_to(peers.log_path(model_dir, workers.index))
    startup.devices_ready()
  session = session_lib.Session(config, model_dir, mode, devices, log,
                                workers, mesh_layout, checkpoint=found,
                                experiment=experiment)
  if held is not None:
    held["session"] = session
  if mode == "train":
    return training_loop.train(session, progress, stops)
  step = session.restore()
  data = experiment.data(model_dir)
  if mode == "eval":
    result = session.evaluate(data)
    if workers is not None and workers.num_workers > 1:
      from meshtf.train import peers   # no worker leaves a gather early
      peers.wait_for_all("meshtf/evaluated", config.peer_timeout_seconds)
    log("eval at step %d: loss %.4f  accuracy %.4f  perplexity %.3f  "
        "(%d held-out tokens)" % (step, result["loss"], result["accuracy"],
                                  result["perplexity"], result["tokens"]))
    result["step"] = step
    return result
  return decode_lib.decode(session, data, step, log, prompt_set)


def export(config, model_dir, log, found=None, experiment=None):
  """See meshtf/train/export.py (export_format saved_model) and
  mesh_tf_checkpoint.export (mesh_tf: the variables of experiment's
  training graph, the run's; default a new one)."""
  if config.export_format == "mesh_tf":
    from meshtf.train import checkpoint
    from meshtf.train import init_checkpoint
    from meshtf.train import mesh_tf_checkpoint
    found = found or checkpoint.CheckpointManager(
        model_dir).read_newest_intact()
    values = (found.full_values()
              if isinstance(found, init_checkpoint.RestorePlan)
              else found.values)
    prefix = mesh_tf_checkpoint.export(
        config, os.path.join(model_dir, MESH_TF_EXPORT_DIR), found.step,
        values, experiment=experiment)
    log("exported a Mesh TF checkpoint: %s (%s weights; restore it with "
        "Mesh TF's tf.train.Saver or t5_mesh_transformer --model_dir=%s)" % (
            prefix, config.export_dtype, os.path.dirname(prefix)))
    return {"path": prefix}
  from meshtf.train import export as export_lib
  path = export_lib.export(config, model_dir, os.path.join(model_dir,
                                                           EXPORT_DIR),
                           checkpoint=found)
  log("exported SavedModel to %s (signatures: %s; see "
      "meshtf/train/export.py for how to call them)" % (
          path, ", ".join(export_lib.signature_names(path))))
  return {"path": path}


__all__ = ["run", "prepare", "check_checkpoint", "export", "EXPORT_DIR"]
