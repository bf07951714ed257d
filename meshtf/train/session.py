"""One run of the training binary: its mesh, model, data, variables and the
checkpoint it starts from (see meshtf/train/main.py for the modes).

Example:
  >>> session = Session(config, "/tmp/m", "eval", checkpoint=found)
  >>> session.restore()                  # the step of `found`
  >>> session.evaluate(experiment.make_data(config, "/tmp/m"))["accuracy"]
"""
from meshtf.train import config as config_lib
from meshtf.train import startup


class Session(object):
  """The mesh, model, data and variables of one run of the binary.

  Args:
    config: the validated config.
    model_dir: where checkpoints are read and written.
    mode: train | eval | decode.
    devices: the mesh's devices (default: config.num_virtual_cpus virtual
      CPUs, or one per mesh processor).
    log: print-like function for progress lines.
    workers: meshtf.train.workers.Workers of a multi-worker mesh, or None.
    mesh_layout: the config's MeshLayout (parsed once by the caller).
    checkpoint: the verified checkpoint to start from (a
      checkpoint.IntactCheckpoint, or an init_checkpoint.RestorePlan of
      --config.init_checkpoint; default: the newest intact one in
      model_dir, read when restore() is called).
    experiment: the run's experiment.Experiment (its model, loss,
      optimizer, mesh impl, and the symbolic training graph the preflight
      built); default: a new one of config and mesh_layout.
  """

  def __init__(self, config, model_dir, mode, devices=None, log=print,
               workers=None, mesh_layout=None, checkpoint=None,
               experiment=None):
    import meshtf as mtf
    from meshtf.lowering import variables as variables_lib
    from meshtf.train import checkpoint as checkpoint_lib
    from meshtf.train import experiment as experiment_lib
    self.config = config
    self.model_dir = model_dir
    self.mode = mode
    self.log = log
    self.mtf = mtf
    if experiment is None:
      experiment = experiment_lib.Experiment(
          config, mesh_layout or config_lib.mesh_layout(config))
    self.experiment = experiment
    self.mesh_layout = experiment.mesh_layout
    mesh_size = self.mesh_layout.size
    if devices is None:
      devices = mtf.virtual_cpu_devices(config.num_virtual_cpus or mesh_size)
    startup.devices_ready()   # TensorFlow's start-up lines are over
    self.devices = list(devices)[:mesh_size]
    self.impl = experiment.mesh_impl(self.devices)
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
    self.manager = checkpoint_lib.CheckpointManager(
        model_dir, max_to_keep=config.keep_checkpoints)
    self.checkpoint = checkpoint
    self.restored_names = None   # the variables of the restored checkpoint
    self.from_init_checkpoint = False   # restore() took config.init_checkpoint
    self.restored_meta = None    # its meta.json (the input position)
    # What the run is doing ("step 16"): a lost worker's line names it.
    self.doing = "starting"
    self.sink = experiment.sink
    self.model = experiment.model
    self._eval_fn = None
    self._decoder = None

  # -- evaluation ----------------------------------------------------------
  def eval_fn(self):
    if self._eval_fn is None:
      loss_fn = self.experiment.loss_fn(mode="eval", **self.row_args())

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
    from meshtf.train import experiment as experiment_lib
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
            "perplexity": experiment_lib.perplexity(loss),
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
    """Restores the session's checkpoint (default: the newest intact one in
    model_dir) into the store (values are taken when the variables are
    created); returns its step or None."""
    from meshtf.train import init_checkpoint
    found = self.checkpoint
    if isinstance(found, init_checkpoint.RestorePlan):
      self.from_init_checkpoint = True
      found.restore_into(self.store)   # read slice by slice when created
      if self.mode != "train":          # train prints it in its header
        for line in found.lines():
          self.log(line)
      return found.step
    if found is None:
      found = self.manager.read_newest_intact()
    if found is None:
      return None
    self.store.restore_values(found.values)
    self.restored_names = set(found.values)
    self.restored_meta = found.meta
    return found.step


__all__ = ["Session"]
