"""From a config to the pieces the training binary runs: the model (with
GShard MoE layers where the config asks), its loss function and metrics,
the optimizer and learning-rate schedule, the data, the mesh
implementation, and the symbolic training graph used to check a layout
before any TensorFlow work.

Example:
  >>> from meshtf.train import config as config_lib, experiment
  >>> c = config_lib.default_config()
  >>> layout = config_lib.mesh_layout(c)   # mesh_shape + layout, parsed once
  >>> graph, loss = experiment.build_training_graph(c, layout)  # symbolic
  >>> experiment.parameter_counts(graph, layout)["total"] > 0
  True
"""
import math

import numpy as np
import tensorflow as tf

import meshtf as mtf
from meshtf.lowering import lowering as lowering_lib
from meshtf.lowering import program_options as program_options_lib
from meshtf.models import dtypes
from meshtf.models import layers
from meshtf.models import moe as moe_lib
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer
from meshtf.train import data as data_lib
from meshtf.train import preflight

# The scalar MoE metrics the binary logs (means over the MoE layers).
MOE_METRICS = ("moe_aux_loss", "moe_dropped", "moe_load_max",
               "moe_router_entropy")


# --- MoE ----------------------------------------------------------------------
class MoeMetrics(object):
  """Collects the metrics of every MoE layer of one model call; the loss
  function reads them after the call (a model call builds one graph)."""

  def __init__(self):
    self.layers = []

  def clear(self):
    self.layers = []

  def summary(self):
    """{name: scalar Tensor} averaged over the layers ({} without MoE):
    aux loss (summed: it is what the loss gets), dropped-token fraction,
    max/mean expert load (1.0 = balanced) and router entropy."""
    if not self.layers:
      return {}
    n = float(len(self.layers))
    load = mtf.add_n([m["expert_load"] for m in self.layers]) * (1.0 / n)
    return {
        "moe_aux_loss": mtf.add_n([m["aux_loss"] for m in self.layers]),
        "moe_dropped": mtf.add_n(
            [m["dropped_fraction"] for m in self.layers]) * (1.0 / n),
        "moe_load_max": mtf.reduce_max(load) / mtf.maximum(
            mtf.reduce_mean(load), 1e-9),
        "moe_router_entropy": mtf.add_n(
            [m["router_entropy"] for m in self.layers]) * (1.0 / n),
    }


def moe_params(config):
  """The config's moe.* settings as MoeParams."""
  m = config.moe
  return moe_lib.MoeParams(
      moe_num_experts=m.num_experts, moe_group_size=m.group_size,
      moe_num_groups=m.num_groups,
      moe_capacity_factor_train=m.capacity_factor_train,
      moe_capacity_factor_eval=m.capacity_factor_eval,
      moe_min_expert_capacity=m.min_expert_capacity,
      moe_hidden_size=m.hidden_size, moe_gating=m.gating,
      moe_second_policy_train=m.second_policy_train,
      moe_second_policy_eval=m.second_policy_eval,
      moe_loss_coef=m.loss_coef, moe_router_z_loss_coef=m.router_z_loss_coef)


def moe_feedforward_layer_fn(config, sink=None, mesh_layout=None):
  """make_layer_stack's feedforward_layer_fn: an MoE layer at the indices
  config.moe.layers names, the default dense layer elsewhere (None when
  the config has no experts). This one function is all the wiring MoE
  needs. mesh_layout (the config's MeshLayout) sets the automatic group
  count (moe.num_groups = 0); None counts one group axis processor.

  Example:
    >>> fn = moe_feedforward_layer_fn(config, MoeMetrics(), layout)
    >>> stack = transformer.make_layer_stack(4, feedforward_layer_fn=fn)
  """
  if not config.moe.num_experts:
    return None
  hparams = moe_params(config)

  def fn(i, num_layers):
    if i in preflight.moe_layer_indices(config, num_layers):
      return moe_lib.MoeFeedForward(hparams, sink, mesh_layout=mesh_layout)
    return None
  return fn


def moe_layer_period(config):
  """(period, None): the MoE layers' pattern repeats every `period` layers
  (no MoE, or MoE on all layers: 1; on odd or even layers: 2); or (None,
  why not, one line) for MoE layers at listed indices.

  Example:
    >>> c = config_lib.default_config(); c.moe.num_experts = 4
    >>> c.moe.layers = "1,3"; moe_layer_period(c)
    (None, "moe.layers='1,3' lists its MoE layers")
  """
  if not config.moe.num_experts:
    return 1, None
  spec = str(config.moe.layers).strip()
  if spec == "all":
    return 1, None
  if spec in ("odd", "even"):
    return 2, None
  return None, "moe.layers=%r lists its MoE layers" % spec


def layer_period(config):
  """(period, None): the model's layers are identical in structure and
  layout every `period` layers (MoE on every other layer: 2; a pipeline's
  stages times its circular repeats divide it), so a plan may count them
  (meshtf/plan/repeated.py); or (None, why not, one line): MoE layers at
  listed indices, or encoder and decoder stacks of different depths.
  (Layouts apply to every layer alike: no config field lays out one.)

  Example:
    >>> c = config_lib.default_config(); c.moe.layers = "odd"
    >>> layer_period(c)
    (2, None)
  """
  layers = config.num_layers
  decoder = config.num_decoder_layers or layers
  if config.model_type != "lm" and decoder != layers:
    return None, ("the encoder's %d and the decoder's %d layers differ"
                  % (layers, decoder))
  period, why = moe_layer_period(config)
  if period is None:
    return None, why
  chunks = config.pipeline_stages * config.circular_repeats
  return period * chunks // math.gcd(period, chunks), None


# --- model --------------------------------------------------------------------
def build_model(config, sink=None, mesh_layout=None):
  """The Unitransformer (lm) or Bitransformer the config describes (for
  mesh_layout, see moe_feedforward_layer_fn).

  Example:
    >>> model = build_model(config, MoeMetrics(), config_lib.mesh_layout(config))
  """
  ffn = moe_feedforward_layer_fn(config, sink, mesh_layout)
  t5 = t5_options(config)
  common = dict(
      d_model=config.d_model, num_heads=config.num_heads, d_kv=config.d_kv,
      d_ff=config.d_ff, max_length=config.length,
      dropout_rate=config.dropout_rate, gated=config.gated,
      activation=config.activation, norm_type=config.norm_type,
      label_smoothing=config.label_smoothing, z_loss=config.z_loss,
      vocab_divisor=config.vocab_divisor,
      positional_embedding=(False if config.positional_embedding == "none"
                            else config.positional_embedding),
      # Parsed once, with the mesh layout (config.mesh_layout).
      activation_layout=(mesh_layout.activation_rules if mesh_layout
                         is not None else config.activation_layout or None),
      remat=config.remat, **t5)
  if config.model_type == "lm":
    n = config.num_layers
    if ffn is not None:
      common["feedforward_layer_fn"] = lambda i: ffn(i, n)
    return transformer.make_unitransformer(
        config.vocab_size, num_layers=n,
        shared_embedding_and_softmax_weights=(
            config.shared_embedding_and_softmax_weights),
        pipeline_stages=config.pipeline_stages,
        num_microbatches=config.num_microbatches,
        circular_repeats=config.circular_repeats, **common)
  # Encoder and decoder stacks may differ in depth: build them here so each
  # gets MoE layers at its own indices.
  n_enc = config.num_layers
  n_dec = config.num_decoder_layers or config.num_layers
  stack = lambda n, encdec: transformer.make_layer_stack(  # noqa: E731
      n, config.num_heads, config.d_kv, config.d_ff, config.dropout_rate,
      encdec=encdec, gated=config.gated, activation=config.activation,
      norm_type=config.norm_type, remat=common["remat"],
      feedforward_layer_fn=(None if ffn is None else
                            (lambda i: ffn(i, n))),
      **{k: v for k, v in t5.items() if k != "loss_denominator"})
  kwargs = dict(label_smoothing=config.label_smoothing, z_loss=config.z_loss,
                vocab_divisor=config.vocab_divisor,
                positional_embedding=common["positional_embedding"],
                max_length=config.length,
                loss_denominator=t5["loss_denominator"])
  encoder = transformer.Unitransformer(
      stack(n_enc, False), config.d_model, config.vocab_size, None, False,
      name="encoder", **kwargs)
  decoder = transformer.Unitransformer(
      stack(n_dec, True), config.d_model, config.vocab_size,
      config.vocab_size, True, name="decoder",
      shared_embedding_and_softmax_weights=(
          config.shared_embedding_and_softmax_weights), **kwargs)
  return transformer.Bitransformer(encoder, decoder, shared_embedding=True)


def t5_options(config):
  """The model keywords of the config's T5 fields (relative position bias,
  padding masked before each layer, Mesh TF's loss denominator).

  Example:
    >>> t5_options(config)["relative_attention_type"]
    'bias_shared'
  """
  return dict(
      relative_attention_type=(None if config.relative_attention == "none"
                               else config.relative_attention),
      relative_attention_num_buckets=config.relative_attention_num_buckets,
      relative_attention_max_distance=config.relative_attention_max_distance,
      mask_padding=config.mask_padding,
      loss_denominator=(float(config.batch_size * config.length)
                        if config.loss_normalization == "batch_length"
                        else None))


def feature_names(config):
  """The features a batch of this config's data has."""
  names = ["targets", "targets_weights", "targets_segmentation",
           "targets_position"]
  if config.model_type == "bitransformer":
    names += ["inputs", "inputs_segmentation", "inputs_position"]
  return names


def variable_dtype(config):
  """The config's VariableDType: float32 variables, activations in
  config.activation_dtype.

  Example:
    >>> variable_dtype(config).activation_dtype.name
    'bfloat16'
  """
  return dtypes.VariableDType(tf.float32, tf.float32, tf.as_dtype(
      config.activation_dtype))


def loss_fn(model, sink, mode="train", rows=None, batch_size=None,
            variable_dtype=None):
  """TrainStep loss function: (mesh, tf features, step) -> (loss, metrics)
  with the MoE metrics added. With rows, the features hold only those rows
  of a batch of batch_size (a worker's share)."""
  def fn(mesh, features, step=None):
    sink.clear()
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        model, transformer.import_features(mesh, features, rows=rows,
                                           batch_size=batch_size),
        mode, step, variable_dtype)
    metrics = dict(metrics)
    metrics.update(sink.summary())
    sink.clear()
    return loss, metrics
  return fn


def make_optimizer(config):
  """The config's optimizer with its learning-rate schedule."""
  schedule = learning_rate_schedule(config)
  if config.optimizer == "adam":
    return optimize.AdamWeightDecayOptimizer(
        schedule, weight_decay_rate=config.weight_decay_rate,
        exclude_from_weight_decay=["norm", "bias"], bias_correction=True)
  if config.optimizer == "momentum":
    return optimize.MomentumOptimizer(schedule, config.momentum)
  if config.optimizer == "adafactor":
    together = [d.strip() for d in
                str(config.adafactor_factor_dims_together).split(",")
                if d.strip()]
    return optimize.make_optimizer(
        "adafactor", schedule,
        factor_dims_together=[tuple(together)] if together else (),
        min_dim_size_to_factor=config.adafactor_min_dim_size_to_factor)
  return optimize.make_optimizer(config.optimizer, schedule)


def learning_rate_schedule(config):
  """step -> learning rate (works on numbers and meshtf scalars)."""
  return optimize.warmup_then_decay(
      config.learning_rate, config.warmup_steps, config.schedule,
      total_steps=config.train_steps)


def _zeros_slice(np_dtype):
  return lambda begin, size: np.zeros(size, np_dtype)


def build_training_graph(config, mesh_layout=None):
  """The symbolic training graph (forward, gradients, clipping, optimizer
  update, step increment) as TrainStep builds it: no TensorFlow op runs.
  The features are imports, as in a run (arguments of the per-device
  program, so a traced plan sees inputs, not constants it could fold);
  their slices are zeros if the graph is ever lowered and run. Returns
  (graph, loss).

  Example:
    >>> graph, loss = build_training_graph(config, layout)
  """
  sink = MoeMetrics()
  model = build_model(config, sink, mesh_layout)
  return symbolic_training_graph(
      config, loss_fn(model, sink, variable_dtype=variable_dtype(config)),
      make_optimizer(config))


def symbolic_training_graph(config, model_loss_fn, optimizer):
  """build_training_graph with the loss function and optimizer given (an
  Experiment's): a new Graph, the features imported, and
  training.build_step -- the builder TrainStep traces -- on them."""
  graph = mtf.Graph(seed=config.seed)
  mesh = mtf.Mesh(graph, "mesh")
  shape = mtf.Shape([mtf.Dimension("batch", config.batch_size),
                     mtf.Dimension("length", config.length)])
  features = {}
  for name in feature_names(config):
    dtype = tf.float32 if name.endswith("_weights") else tf.int32
    features[name] = mtf.import_slices(
        mesh, shape, _zeros_slice(dtype.as_numpy_dtype), dtype,
        name="feature_" + name)
  outputs = training.build_step(mesh, features, model_loss_fn, optimizer,
                                config.clip_gradient_norm or None)
  return graph, outputs["loss"]


def check_layouts(graph, mesh_layout):
  """Computes every tensor's layout as the lowering would (annotations,
  variable layouts and ops' own checks included); raises LayoutError
  naming the first bad tensor. Returns the GraphLayout."""
  return mesh_layout.assign(lowering_lib.all_operations(graph.operations))


def parameter_counts(graph, mesh_layout, graph_layout=None):
  """{"total": parameters, "per_device": the largest share one processor
  holds (padded slices of uneven splits included; each variable in its
  stored layout), "optimizer_per_device": the same for non-trainable
  variables (optimizer slots, step)}. graph_layout: the graph's
  check_layouts, computed here if None."""
  if graph_layout is None:
    graph_layout = check_layouts(graph, mesh_layout)
  total = per_device = other = 0
  trainable = set(graph.trainable_variables)
  for v in graph.all_variables:
    share = graph_layout.tensor_mesh_layout(v.outputs[0]).slice_size(v.shape)
    if v in trainable:
      total += v.shape.size
      per_device += share
    else:
      other += share
  return {"total": total, "per_device": per_device,
          "optimizer_per_device": other}


# --- data ---------------------------------------------------------------------
class Data(object):
  """Train / held-out batches: .batch(step) -> dict of int32/float32 numpy
  arrays; for synthetic tasks also the task (for decoding), for text tasks
  the vocabulary and whether model_dir still lacks it (vocab_is_new).
  A streamed source's position is train_state() / restore_train()."""

  def __init__(self, train, held_out, batch_size, seed, eval_seed,
               synthetic=None, vocab=None, vocab_is_new=False):
    self.train_source = train
    self.eval_source = held_out
    self.batch_size = batch_size
    self.seed = seed
    self.eval_seed = eval_seed
    self.synthetic = synthetic
    self.vocab = vocab
    self.vocab_is_new = vocab_is_new

  def train_batch(self, step, rows=None):
    """The batch of a training step (only `rows` of it: a worker's share)."""
    return _complete(self.train_source.batch(step, self.batch_size,
                                             seed=self.seed, rows=rows))

  def eval_batch(self, i, rows=None):
    return _complete(self.eval_source.batch(i, self.batch_size,
                                            seed=self.eval_seed, rows=rows))

  def train_state(self):
    """The training stream's position (JSON-able), or None when batches
    are computed from the step alone (synthetic tasks)."""
    state = getattr(self.train_source, "state", None)
    return state() if state is not None else None

  def restore_train(self, state, step):
    """Continues the training stream at `step` from a train_state();
    returns None or a one-line warning (the position could not be used)."""
    restore = getattr(self.train_source, "restore", None)
    return restore(state, step) if restore is not None else None

  def close(self):
    for source in (self.train_source, self.eval_source):
      if hasattr(source, "close"):
        source.close()


def _complete(batch):
  out = dict(batch)
  for name in ("inputs", "targets"):
    if name in out:
      seg = (out[name] != data_lib.PAD).astype("int32")
      out.setdefault(name + "_segmentation", seg)
      out.setdefault(name + "_position",
                     (seg * np.arange(seg.shape[1])).astype("int32"))
  out.setdefault("targets_weights",
                 (out["targets"] != data_lib.PAD).astype("float32"))
  return out


def make_data(config, model_dir):
  """The config's data: a synthetic task (held-out = another seed), or
  streamed text (files or a local TFDS dataset; meshtf/train/text_data.py)
  with its vocabulary. Raises text_data.DataError on unusable data; writes
  nothing."""
  from meshtf.train import text_data
  eval_seed = config.seed + 1 if config.eval_seed < 0 else config.eval_seed
  seq2seq = config.model_type == "bitransformer"
  task = config.task
  if text_data.is_text_task(config):
    text = text_data.make_text_data(config, model_dir)
    return Data(text.train, text.held_out, config.batch_size, config.seed,
                eval_seed, vocab=text.vocab, vocab_is_new=text.vocab_is_new)
  synthetic = data_lib.SyntheticTask(task.problem, config.vocab_size,
                                     config.length, seq2seq=seq2seq)
  return Data(synthetic, synthetic, config.batch_size, config.seed,
              eval_seed, synthetic=synthetic)


# --- mesh ---------------------------------------------------------------------
def program_options(config):
  """The config's ProgramOptions (jit_compile, communication_hint; the
  SPMD backend's), checked once here; '' in the config is not given.

  Example:
    >>> program_options(config).jit_compile       # --config.jit_compile=''
    ''
  """
  return program_options_lib.ProgramOptions.checked(
      "the config", communication_hint=config.communication_hint or None,
      jit_compile=config.jit_compile or False)


def make_mesh_impl(config, mesh_layout, devices, options=None):
  """The config's MeshImpl (config.backend) for mesh_layout on devices;
  options: its ProgramOptions (default: program_options(config))."""
  if config.backend != "simd":
    return mtf.PlacementMeshImpl(mesh_layout, None, devices)
  return mtf.SimdMeshImpl(mesh_layout, None, devices,
                          options=options or program_options(config))


def per_example_loss(model, features, mode="eval"):
  """[batch] mean cross entropy per example over its weighted tokens, and
  the logits (meshtf Tensors)."""
  logits, _, _ = transformer.compute_logits_loss_metrics(
      model, features, mode)
  targets = features["targets"]
  decoder = model.decoder if isinstance(model, transformer.Bitransformer) \
      else model
  vocab = decoder.output_vocab_dim
  logits = mtf.cast(logits, tf.float32)
  per_token = layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, vocab, dtype=tf.float32), vocab)
  weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  if "targets_weights" in features:
    weights = weights * mtf.cast(features["targets_weights"], tf.float32)
  length = targets.shape.dims[-1]
  total = mtf.reduce_sum(per_token * weights, reduced_dim=length)
  count = mtf.reduce_sum(weights, reduced_dim=length)
  return total / mtf.maximum(count, 1.0), logits


def decode_method(config):
  """The greedy decoding method: config.decode_method ("cached": key/value
  caches in one while loop; "recompute": re-run the model on the growing
  prefix). MoE layers reuse their variables when called again, so cached
  decoding works for MoE models too."""
  return config.decode_method


def decode_options(config, strategy=None):
  """decode_ids keyword arguments for a strategy (default the config's):
  greedy, sample (temperature, top_k) or beam (beam size, alpha).

  Example:
    >>> decode_options(config, "beam")
    {'beam_size': 4, 'alpha': 0.6}
  """
  strategy = strategy or config.decode_strategy
  if strategy == "sample":
    return {"temperature": float(config.decode_temperature),
            "top_k": int(config.decode_top_k)}
  if strategy == "beam":
    return {"beam_size": int(config.decode_beam_size),
            "alpha": float(config.decode_alpha)}
  return {}


def decode_ids(model, features, temperature=0.0, top_k=0, beam_size=1,
               alpha=0.6):
  """Decoding with key/value caches (meshtf.models.decoding), as meshtf
  ops: a language model continues features["targets"] (its prompt: the
  prefix up to the first 0); a Bitransformer decodes features["inputs"].
  temperature 0.0 is greedy; top_k > 0 samples among the k most likely
  tokens; beam_size > 1 is beam search with length penalty alpha. Returns
  int32 [batch, length]: the prompt, the decoded tokens through EOS, then
  zeros.

  Example:
    >>> ids = decode_ids(lm, import_features(mesh, {"targets": prompts}),
    ...                  beam_size=4)
  """
  keep_top_k = int(top_k) if top_k else -1
  if isinstance(model, transformer.Bitransformer):
    inputs = features["inputs"]
    return model.decode(inputs, max_decode_length=inputs.shape.dims[-1].size,
                        beam_size=beam_size, alpha=alpha,
                        temperature=temperature,
                        sampling_keep_top_k=keep_top_k)
  targets = features["targets"]
  if beam_size > 1:
    batch_dim, length_dim = targets.shape.dims
    beams = mtf.zeros(targets.mesh, mtf.Shape(
        [batch_dim, mtf.Dimension("beam", beam_size), length_dim]),
                      dtype=tf.int32)
    return model.beam_search(beams, decode_length=length_dim.size,
                             alpha=alpha, prompts=targets)
  return model.sample_autoregressive(
      targets, stop_at_token=data_lib.EOS, temperature=temperature,
      sampling_keep_top_k=keep_top_k)


# --- the experiment -----------------------------------------------------------
# Experiment.plan's default compiler: from the config's jit_compile.
CONFIG_COMPILER = "the config's"


def plan_compiler(config):
  """The compiler a plan of config's step assumes: "xla" where the
  config's jit_compile is on (XLA compiles the program's kernels), else
  None (the hardware's own).

  Example:
    >>> plan_compiler(config_lib.default_config()) is None
    True
  """
  return "xla" if config.jit_compile else None


class Experiment(object):
  """One run's experiment, built once from the validated config and its
  MeshLayout: the model (and the sink of its MoE metrics), the loss, the
  optimizer and learning-rate schedule, the data, the mesh impl and the
  decode options. The symbolic training graph and its completed layouts
  are built on first use and kept: the preflight, the header, the
  checkpoint and memory checks and --mode=plan all read the one graph, and
  TrainStep traces the same builder (models/training.build_step).

  A derived run -- a --mode=sweep entry, a --layout=auto finalist, the
  export's one-processor model -- is an Experiment of its own config (its
  graph differs: another layout, another MoE group count); where a derived
  config has the values of one built already, that one is reused
  (same_config, adopt).

  mesh_layout None: the model as one processor without a layout runs it
  (the export's; MoE groups counted for one processor, the config's
  activation_layout as written); such an experiment has a training graph
  but no graph_layout or mesh_impl.

  Example:
    >>> exp = Experiment(config, config_lib.mesh_layout(config))
    >>> graph, loss = exp.training_graph()   # built here, then kept
    >>> exp.graph_layout() is exp.graph_layout()
    True
    >>> exp.plan().summary()["step_seconds"] > 0   # on the kept layouts
    True
  """

  def __init__(self, config, mesh_layout):
    self.config = config
    self.mesh_layout = mesh_layout
    self.sink = MoeMetrics()
    self.variable_dtype = variable_dtype(config)
    self.program_options = program_options(config)
    self._model = None
    self._training_graph = None
    self._graph_layout = None

  @property
  def model(self):
    """The Unitransformer / Bitransformer, built on first use (its layers
    hold no graph: every trace and the symbolic graph call the one model)."""
    if self._model is None:
      self._model = build_model(self.config, self.sink, self.mesh_layout)
    return self._model

  def loss_fn(self, mode="train", rows=None, batch_size=None):
    """The model's loss function (see loss_fn) in `mode`."""
    return loss_fn(self.model, self.sink, mode, rows, batch_size,
                   self.variable_dtype)

  def optimizer(self):
    """A new optimizer of the config (each graph gets its own: optimizers
    keep the update ops they built)."""
    return make_optimizer(self.config)

  def learning_rate_schedule(self):
    return learning_rate_schedule(self.config)

  def training_graph(self):
    """(graph, loss): the symbolic training graph, built once."""
    if self._training_graph is None:
      self._training_graph = symbolic_training_graph(
          self.config, self.loss_fn(), self.optimizer())
    return self._training_graph

  def graph_layout(self):
    """The training graph's GraphLayout (check_layouts), completed once;
    raises LayoutError naming the first bad tensor."""
    if self._graph_layout is None:
      self._graph_layout = check_layouts(self.training_graph()[0],
                                         self.mesh_layout)
    return self._graph_layout

  def parameter_counts(self):
    """parameter_counts of the training graph, on its kept layouts."""
    return parameter_counts(self.training_graph()[0], self.mesh_layout,
                            self.graph_layout())

  def plan(self, hardware=None, trace="auto", compiler=CONFIG_COMPILER):
    """The PlanReport (meshtf.plan.plan) of the training graph on its kept
    layouts, on hardware (default config.plan_hardware). trace "auto"
    (--mode=plan's, --mode=sweep's): traced only where TF's executor runs
    the program (its memory needs the traced program), estimated where XLA
    compiles it. compiler: CONFIG_COMPILER is "xla" where the config's
    jit_compile is on (XLA compiles the program's kernels), else the
    hardware's; None is the hardware's (--layout=auto's finalists).

    Example:
      >>> exp.plan("tpuv3").collectives_source
      'estimated'
    """
    from meshtf.plan import report as report_lib
    if compiler is CONFIG_COMPILER:
      compiler = plan_compiler(self.config)
    graph, _ = self.training_graph()
    return report_lib.plan(graph, self.mesh_layout,
                           hardware or self.config.plan_hardware,
                           compiler=compiler, trace=trace,
                           graph_layout=self.graph_layout())

  def same_config(self, config, ignore=()):
    """Whether config holds the values this experiment was built from
    (but the keys in ignore): then its model and graph are config's too.

    Example:
      >>> exp.same_config(copy.deepcopy(exp.config))
      True
    """
    mine, theirs = self.config.to_dict(), config.to_dict()
    for key in ignore:
      mine.pop(key, None)
      theirs.pop(key, None)
    return mine == theirs

  def adopt(self, config):
    """This experiment for config, a config of the same values (the run's
    own object, which the run may still change: finetune_steps sets
    train_steps, which the step's optimizer reads), or None when the
    values differ.

    Example:
      >>> finalist.adopt(config) is finalist    # --layout=auto's choice
      True
    """
    if not self.same_config(config):
      return None
    self.config = config
    return self

  def data(self, model_dir):
    return make_data(self.config, model_dir)

  def mesh_impl(self, devices):
    return make_mesh_impl(self.config, self.mesh_layout, devices,
                          self.program_options)

  def decode_options(self, strategy=None):
    return decode_options(self.config, strategy)


def perplexity(loss):
  return math.exp(min(loss, 50.0))


__all__ = ["Experiment", "MoeMetrics", "moe_params",
           "moe_feedforward_layer_fn", "build_model", "feature_names",
           "loss_fn", "make_optimizer", "learning_rate_schedule",
           "build_training_graph", "symbolic_training_graph", "moe_layer_period", "layer_period", "check_layouts", "parameter_counts",
           "Data", "make_data", "program_options", "make_mesh_impl", "per_example_loss",
           "decode_method", "decode_options", "decode_ids",
           "perplexity"]
