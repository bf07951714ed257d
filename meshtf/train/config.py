"""The training binary's config schema, its defaults and its validation.

`default_config()` is the schema: every key the binary knows, with the
defaults of the embedded default experiment (a tiny Mixture-of-Experts
language model learning the synthetic "reverse" task on 8 virtual CPUs with
a data + model + expert parallel layout). Config files (t2t_configs/*.py,
ml_collections `config_flags` style) start from it and change what they
need; `--config.<key>=value` flags override single keys.

`validate(config)` checks everything that can be checked before TensorFlow
starts, the layout included (the model's meshtf graph is built
symbolically and every tensor's layout is computed by meshtf's layout
code), and raises ConfigError with one line per problem, each naming what
is wrong and how to fix it.

This file is itself a config file: `get_config()` returns the default, so
`--config=meshtf/train/config.py` works and is the binary's default.

Example:
  >>> from meshtf.train import config as config_lib
  >>> c = config_lib.default_config()
  >>> c.layout = "batch:data;heads:model"
  >>> config_lib.validate(c)      # raises ConfigError on a problem
"""
import os

import ml_collections

from meshtf.layouts import presets
from meshtf.train import preflight
# Re-exported: users catch config_lib.ConfigError and read
# config_lib.moe_layer_indices. Both live below this module so that the
# model's wiring (experiment.py) reads them without importing the schema,
# and imports in train/ go one way: config -> experiment -> preflight.
from meshtf.train.errors import ConfigError
from meshtf.train.preflight import moe_layer_indices

MODEL_TYPES = ("lm", "bitransformer")
BACKENDS = ("placement", "simd")
ACTIVATION_DTYPES = ("float32", "bfloat16")
# meshtf/models/remat.py's POLICIES (named here: this module loads no TF).
REMAT_POLICIES = ("none", "full", "einsum_outputs", "weight_einsum_outputs")
JIT_COMPILE = ("", "segments", "program")
COMMUNICATION_HINTS = ("", "auto", "ring", "nccl")
OPTIMIZERS = ("adam", "adafactor", "sgd", "momentum")
SCHEDULES = ("constant", "rsqrt", "linear")
GATINGS = ("top_2", "switch")
MODES = ("train", "eval", "decode", "export", "plan", "sweep")
DECODE_METHODS = ("cached", "recompute")
DECODE_STRATEGIES = ("greedy", "sample", "beam")
# meshtf/train/sources.py's FORMATS and objectives.py's OBJECTIVES ("":
# lm, or seq2seq for pairs); tests/train/test_streams.py keeps them equal.
DATA_FORMATS = ("auto", "text", "tfrecord")
TASK_OBJECTIVES = ("", "lm", "seq2seq", "prefix_lm", "span_corruption")


def default_config():
  """The schema with its defaults (= the default experiment).

  Example:
    >>> c = default_config()
    >>> c.mesh_shape, c.moe.num_experts
    ('data:4;model:2', 4)
  """
  c = ml_collections.ConfigDict()
  # --- model ---------------------------------------------------------------
  c.model_type = "lm"          # "lm" (decoder-only) or "bitransformer"
  c.vocab_size = 16            # tokens in the vocabulary
  c.vocab_divisor = 8          # the vocab dim is rounded up to a multiple
  c.d_model = 32              # the model width (dim d_model)
  c.num_layers = 2             # per stack (encoder and decoder)
  c.num_decoder_layers = 0     # bitransformer: 0 = num_layers
  c.num_heads = 4             # attention heads (dim heads)
  c.d_kv = 8                  # per head, keys and values (dim d_kv)
  c.d_ff = 64                 # feed-forward hidden (dim d_ff)
  c.dropout_rate = 0.0        # in training only
  c.length = 16                # sequence length (inputs and targets)
  c.activation = "relu"       # the feed-forward's (relu, gelu, ...)
  c.gated = False              # gated (GLU-style) feed-forward
  c.norm_type = "rms_norm"    # rms_norm | layer_norm
  c.label_smoothing = 0.0     # 0: none
  c.z_loss = 1e-4             # log(Z)^2 coefficient of the softmax; 0: none
  c.positional_embedding = "learned"   # learned | sinusoidal | none
  c.shared_embedding_and_softmax_weights = False  # one vocab matrix for both
  # T5 (meshtf/models/relative_position.py; t2t_configs/t5.py):
  c.relative_attention = "none"  # T5's relative position bias: none |
  #                              bias_shared (one table per stack, as T5) |
  #                              bias (one per self-attention layer)
  c.relative_attention_num_buckets = 32    # T5's
  c.relative_attention_max_distance = 128  # T5's
  c.mask_padding = False       # zero padding positions before each layer
  #                              (Mesh TF's sublayer_mask_padding, T5)
  c.loss_normalization = "tokens"  # the summed loss over: tokens (the
  #                              weighted target tokens) | batch_length
  #                              (batch_size x length, Mesh TF's default)
  # Pipeline parallelism (GSPMD 3.3; meshtf/models/pipeline.py): the layer
  # stack split into pipeline_stages stages along a "stage" dim that the
  # layout puts on a mesh axis of that size ("stage:pipe"); 1 = off.
  c.pipeline_stages = 1        # 1: no pipelining
  c.num_microbatches = 1       # the batch splits into this many
  c.circular_repeats = 1       # layer chunks per stage (circular schedule)
  c.remat = "none"             # what each layer keeps for the backward pass
  #                              (meshtf/models/remat.py): none | full (its
  #                              input; recomputed in the backward pass) |
  #                              einsum_outputs (recompute the elementwise
  #                              ops and softmaxes only) |
  #                              weight_einsum_outputs (keep the einsums of
  #                              an activation with a weight; recompute
  #                              attention scores/context, MoE dispatch/
  #                              combine and the elementwise ops)

  # --- Mixture of Experts (GShard) ------------------------------------------
  c.moe = ml_collections.ConfigDict()
  c.moe.num_experts = 4        # 0: no MoE layer
  c.moe.layers = "odd"         # which feed-forward layers are MoE: "odd"
  #                              (GShard: every other), "even", "all", or
  #                              comma-separated indices "1,3"
  c.moe.hidden_size = 64       # d_ff of each expert
  c.moe.group_size = 64        # most tokens per routing group
  c.moe.num_groups = 0         # 0: the fewest groups of <= group_size tokens
  #                              that the group axis divides (so the routing
  #                              depends on that axis' size); G > 0: exactly
  #                              G groups on any mesh (checkpoints then
  #                              reshard with identical routing)
  c.moe.capacity_factor_train = 1.0  # GShard's: capacity = this x 2S/E
  c.moe.capacity_factor_eval = 2.0   # the same, in eval and decode
  c.moe.min_expert_capacity = 4     # tokens per expert and group, at least
  c.moe.gating = "top_2"       # top_2 (GShard) or switch
  c.moe.second_policy_train = "random"  # top_2's second expert: random
  #                              (GShard) | all | none | threshold
  c.moe.second_policy_eval = "random"   # the same, in eval and decode
  c.moe.loss_coef = 1e-2       # GShard's l_aux coefficient
  c.moe.router_z_loss_coef = 0.0   # the router's z-loss; 0: none

  # --- data -------------------------------------------------------------------
  c.task = ml_collections.ConfigDict()
  c.task.problem = "reverse"   # synthetic: copy | reverse | addition
  c.task.data_files = ""       # comma-separated text or TFRecord files
  #                              and globs ("corpus/*.txt.gz"; "\," is a
  #                              comma in a name), streamed (instead of a
  #                              synthetic problem)
  c.task.eval_data_files = ""  # held-out files (default: data_files)
  c.task.data_format = "auto"  # auto (".tfrecord" in a name: TFRecord,
  #                              else text; gzip by its bytes) | text |
  #                              tfrecord
  c.task.seq2seq = False       # text: input<TAB>target lines
  c.task.objective = ""        # "" (lm; seq2seq for pairs) | lm | seq2seq
  #                              | prefix_lm | span_corruption (T5's)
  c.task.noise_density = 0.15  # span_corruption: the noise fraction
  c.task.mean_noise_span_length = 3.0  # span_corruption: tokens per span
  c.task.vocab_file = ""       # an existing sentencepiece .model (e.g.
  #                              T5's); "": one trained on a sample of the
  #                              data (saved in model_dir as vocab.model)
  c.task.extra_ids = 0         # sentinels appended to the vocabulary
  #                              (T5: 100; <extra_id_0> is the last id)
  c.task.vocab_sample_mb = 4.0  # text a vocabulary is trained on, at most
  c.task.reader_threads = 2    # batch rows read in parallel
  c.task.tfds_name = ""        # a TFDS dataset read from tfds_data_dir
  c.task.tfds_data_dir = ""   # a local TFDS data_dir (never downloads)
  c.task.tfds_split = "train"  # the split trained on
  c.task.tfds_eval_split = "validation"  # the held-out split
  c.task.text_keys = "text"    # TFDS / TFRecord features (one: lm, two:
  #                              seq2seq)

  # --- mesh -------------------------------------------------------------------
  c.mesh_shape = "data:4;model:2"  # the processor mesh, named axes
  c.layout = presets.MOE_STANDARD
  #                              "auto": searched (--layout=auto, below)
  c.variable_layout = ""       # the variables' own rules (GSPMD weight-
  #                              update sharding, e.g. "d_model:data");
  #                              "": the layout's
  c.activation_layout = ""     # activation annotations (GSPMD 2D finalized:
  #                              "batch:x;d_model:y;d_ff:y;heads:y"); "": none
  c.backend = "simd"           # simd (one SPMD program) or placement
  c.activation_dtype = "float32"  # float32 | bfloat16: what the model
  #                              computes in; variables stay float32
  c.jit_compile = ""           # simd's XLA: "" (off) | segments (the ops
  #                              between collectives) | program (the whole
  #                              per-device program; 1 processor, or GPUs
  #                              with data parallelism only)
  c.communication_hint = ""    # simd's collectives: "" (nccl when the
  #                              devices are GPUs, else auto) | auto |
  #                              ring | nccl
  c.num_virtual_cpus = 0       # 0: as many as the mesh has processors

  # --- training ---------------------------------------------------------------
  c.train_steps = 500         # the last step (a resumed run goes on to it)
  c.batch_size = 64           # sequences per step, over the whole mesh
  c.seed = 0                   # initial values, dropout, data order
  c.eval_seed = -1             # held-out synthetic data; -1: seed + 1
  c.optimizer = "adam"        # adam | adafactor | sgd | momentum
  c.learning_rate = 0.01      # the peak, reached after warmup_steps
  c.schedule = "constant"      # after warmup: constant | rsqrt | linear
  c.warmup_steps = 20         # linear warmup from 0
  c.weight_decay_rate = 0.0    # adam
  c.momentum = 0.9             # momentum
  c.clip_gradient_norm = 1.0   # 0: no clipping
  c.adafactor_factor_dims_together = ""  # adafactor: comma-separated dims
  #                              factored as one ("heads,d_kv": Mesh TF's /
  #                              T5's combined attention dims, whose slots
  #                              init_checkpoint then restores)
  c.adafactor_min_dim_size_to_factor = 128  # adafactor: factor the
  #                              accumulator of a weight whose two largest
  #                              dims are at least this big (Mesh TF's)
  c.init_checkpoint = ""       # start from this checkpoint (a Mesh TF / T5
  #                              model.ckpt-N prefix or folder, or a meshtf
  #                              ckpt-N / model_dir) when model_dir has none;
  #                              what it restores is printed (docs/t5.md)
  c.init_optimizer = False     # init_checkpoint: also its optimizer slots
  c.finetune_steps = 0         # > 0: train to init_checkpoint's step + this
  #                              (train_steps ignored); 0: to train_steps
  c.collective_bucket_mb = 1.0   # fused gradient allreduces of at most this
  #                              many MiB per device (0: one per gradient)
  c.checkpoint_every = 100    # steps between checkpoints (and at the end)
  c.keep_checkpoints = 3      # the newest kept; older ones are removed
  c.worker_start_timeout_seconds = 300.0  # multi-worker: how long a worker
  #                              waits for all the others to start, then
  #                              one line naming those missing
  c.peer_timeout_seconds = 30.0  # multi-worker: a worker silent this long
  #                              (stopped, hung host, partition) ends the
  #                              run on the others with one line naming it
  #                              (one whose process ends: at once)
  c.eval_steps = 4             # held-out batches for eval
  c.eval_every = 25            # 0: eval only at the end of training
  c.log_every = 10            # steps between progress lines
  c.target_accuracy = 0.99     # reported at the end of training
  c.stop_at_target = True      # stop once an eval reaches target_accuracy
  c.decode_batches = 2         # held-out batches decoded by --mode=decode
  c.decode_strategy = "greedy"  # greedy | sample | beam
  c.decode_method = "cached"   # greedy: cached = key/value caches in one
  #                              mtf.while_loop (meshtf.models.decoding);
  #                              recompute = re-run the whole model on the
  #                              growing prefix (a check on the first)
  c.decode_temperature = 1.0   # sample: softmax temperature
  c.decode_top_k = 0           # sample: among the k likeliest (0: all)
  c.decode_beam_size = 4       # beam
  c.decode_alpha = 0.6         # beam: GNMT length penalty exponent
  c.plan_hardware = "cpu"      # --mode=plan's hardware model: cpu (this
  #                              machine), tpuv3 or h100_8x_node
  c.auto_memory_gb = 0.0       # --layout=auto's memory cap per device:
  #                              0: plan_hardware's memory; < 0: none
  c.auto_layout_dims = ""      # --layout=auto: dims to lay out, comma-
  #                              separated ("": every dim of the model)
  c.sweep = ""                 # --mode=sweep's candidates, "|"-separated:
  #                              "mesh_shape @ layout [@ variable_layout
  #                              [@ activation_layout]]"
  c.sweep_run = False          # --mode=sweep also trains each entry whose
  #                              devices this process has (--sweep_run)
  c.sweep_steps = 6            # steps per entry run (the first traces)
  c.decode_prompts_file = ""   # prompts, one per line (synthetic task: token
  #                              ids; text data: text); "": held-out data
  c.decode_output_file = ""    # decodes of the prompts file ("":
  #                              model_dir/decodes-<step>.txt)
  c.export_batch_size = 0      # largest batch of the exported signatures;
  #                              0: batch_size
  c.export_format = "saved_model"  # --mode=export writes: saved_model (a
  #                              TF SavedModel) | mesh_tf (a model.ckpt-N
  #                              Mesh TF / T5 restores; docs/t5.md)
  c.export_dtype = "bfloat16"  # mesh_tf: the weights' dtype (slots stay
  #                              float32): bfloat16 (Mesh TF's) | float32
  c.export_norm_names = "rms_norm"  # mesh_tf: rms_norm | layer_norm (the
  #                              legacy names of older T5 checkpoints)
  return c


def get_config():
  """config_flags entry point: the default experiment."""
  return default_config()


# --- validation ---------------------------------------------------------------
def unknown_keys(config, schema=None, prefix=""):
  """Dotted names of keys in config that the schema lacks.

  Example:
    >>> c = default_config(); c.unlock(); c.foo = 1
    >>> unknown_keys(c)
    ['foo']
  """
  schema = default_config() if schema is None else schema
  out = []
  for key in sorted(config.keys()):
    name = prefix + key
    if key not in schema:
      out.append(name)
    elif isinstance(config[key], ml_collections.ConfigDict):
      if isinstance(schema[key], ml_collections.ConfigDict):
        out.extend(unknown_keys(config[key], schema[key], name + "."))
  return out


def missing_keys(config, schema=None, prefix=""):
  """Dotted names of the schema's keys that config lacks (a config file
  that built its own ConfigDict instead of starting from default_config).

  Example:
    >>> c = ml_collections.ConfigDict({"d_model": 32})
    >>> missing_keys(c)[:2]
    ['activation', 'activation_dtype']
  """
  schema = default_config() if schema is None else schema
  out = []
  for key in sorted(schema.keys()):
    name = prefix + key
    if key not in config:
      out.append(name)
    elif isinstance(schema[key], ml_collections.ConfigDict):
      if isinstance(config[key], ml_collections.ConfigDict):
        out.extend(missing_keys(config[key], schema[key], name + "."))
      else:
        out.append(name)
  return out


def missing_keys_problem(config, source="the config"):
  """One line naming the keys config lacks and the fix, or None.

  Example:
    >>> missing_keys_problem(ml_collections.ConfigDict({"d_model": 32}))
    'the config lacks 58 of the schema's keys (activation, ...): ...'
  """
  missing = missing_keys(config)
  if not missing:
    return None
  return ("%s lacks %d of the config's keys (%s%s): start get_config() "
          "from meshtf.train.config.default_config() and change what you "
          "need, as t2t_configs/lm_tiny.py does" % (
              source, len(missing), ", ".join(missing[:4]),
              ", ..." if len(missing) > 4 else ""))


def _near(name, choices):
  """Known names that look like name (for 'did you mean')."""
  import difflib
  return difflib.get_close_matches(name, choices, n=2)


def _flat_keys(schema, prefix=""):
  out = []
  for key in sorted(schema.keys()):
    if isinstance(schema[key], ml_collections.ConfigDict):
      out.extend(_flat_keys(schema[key], prefix + key + "."))
    else:
      out.append(prefix + key)
  return out


def validate(config, check_layout=True, check_data=True, flag_names=None):
  """Raises ConfigError listing every problem (one line each) found before
  any TensorFlow work: unknown keys, bad values, malformed mesh_shape or
  layout, a mesh whose size is not the device count, data files that are
  missing, folders, empty or not UTF-8, and (check_layout) any tensor of
  the model whose dims the layout splits twice over one mesh axis. Returns
  the config's MeshLayout. flag_names maps keys to the flag that set them
  (e.g. {"train_steps": "--train_steps"}): a problem names the flag used.

  Example:
    >>> c = default_config(); c.num_virtual_cpus = 4
    >>> validate(c)
    Traceback (most recent call last):
    ConfigError: mesh_shape 'data:4;model:2' has 8 processors but ...
  """
  problems = []
  schema = default_config()
  known = _flat_keys(schema)
  for name in unknown_keys(config, schema):
    near = _near(name, known)
    problems.append("unknown config key %r: %s" % (name, (
        "did you mean %s?" % " or ".join(repr(n) for n in near)) if near
        else "see meshtf/train/config.py for the keys"))
  if problems:  # the rest would read keys that may be misspelt
    raise ConfigError(problems)
  problem = missing_keys_problem(config)
  if problem:
    raise ConfigError([problem])

  def need(ok, msg):
    if not ok:
      problems.append(msg)

  def flag(key):
    """How the user set `key`: its flag, else --config.<key> (the fix)."""
    return (flag_names or {}).get(key, "--config." + key)

  def given(key):
    """`key` as the user wrote it: --train_steps, or the config key."""
    return (flag_names or {}).get(key, key)

  need(config.model_type in MODEL_TYPES, "model_type=%r is unknown: use "
       "--config.model_type=lm or bitransformer" % config.model_type)
  # Every numeric field's range (preflight.RANGES): a value that is not a
  # number at all stops here, before the checks below compute with it.
  ranges = preflight.range_problems(config, given, flag)
  if ranges and not preflight.all_numbers(config):
    raise ConfigError(problems + ranges)
  problems.extend(ranges)
  need(config.backend in BACKENDS, "backend=%r is unknown: use --backend="
       "simd or --backend=placement" % config.backend)
  need(config.activation_dtype in ACTIVATION_DTYPES, "activation_dtype=%r "
       "is unknown: use --config.activation_dtype=float32 or bfloat16"
       % config.activation_dtype)
  need(config.jit_compile in JIT_COMPILE, "jit_compile=%r is unknown: use "
       "--config.jit_compile=segments, program or '' (off)"
       % config.jit_compile)
  need(config.communication_hint in COMMUNICATION_HINTS, "communication_hint"
       "=%r is unknown: use --config.communication_hint=nccl, ring, auto or "
       "'' (from the devices)" % config.communication_hint)
  need(config.backend == "simd" or not (config.jit_compile or
                                         config.communication_hint),
       "jit_compile / communication_hint need the SPMD backend: set "
       "--backend=simd, or leave them ''")
  need(config.optimizer in OPTIMIZERS, "optimizer=%r is unknown: use "
       "--config.optimizer=%s" % (config.optimizer, " | ".join(OPTIMIZERS)))
  need(config.schedule in SCHEDULES, "schedule=%r is unknown: use "
       "--config.schedule=%s" % (config.schedule, " | ".join(SCHEDULES)))
  need(config.decode_method in DECODE_METHODS, "decode_method=%r is "
       "unknown: use --config.decode_method=cached or recompute"
       % config.decode_method)
  from meshtf.plan import hardware as hardware_lib
  need(config.plan_hardware in hardware_lib.HARDWARE, "plan_hardware=%r is "
       "not a hardware model: use --config.plan_hardware=%s" % (
           config.plan_hardware, " | ".join(sorted(hardware_lib.HARDWARE))))
  need(config.decode_strategy in DECODE_STRATEGIES, "decode_strategy=%r is "
       "unknown: use --config.decode_strategy=%s" % (
           config.decode_strategy, " | ".join(DECODE_STRATEGIES)))
  need(config.decode_method == "cached" or config.decode_strategy ==
       "greedy", "decode_method=%r decodes greedily only, but "
       "decode_strategy is %r: set --config.decode_method=cached" % (
           config.decode_method, config.decode_strategy))
  need(config.positional_embedding in ("learned", "sinusoidal", "none"),
       "positional_embedding=%r: use learned, sinusoidal or none"
       % config.positional_embedding)
  need(config.norm_type in ("rms_norm", "layer_norm"), "norm_type=%r: use "
       "rms_norm or layer_norm" % config.norm_type)
  need(config.remat in REMAT_POLICIES, "remat=%r is unknown: use "
       "--config.remat=%s" % (config.remat, " | ".join(REMAT_POLICIES)))
  problems.extend(_t5_problems(config, flag))
  moe = config.moe
  if moe.num_experts >= 1:
    need(moe.gating in GATINGS, "moe.gating=%r is unknown: use --config.moe."
         "gating=top_2 or switch" % moe.gating)
    need(not (moe.gating == "top_2" and moe.num_experts < 2),
         "moe.num_experts=%d is too few for top_2 gating: use >= 2 experts "
         "or --config.moe.gating=switch" % moe.num_experts)
    try:
      moe_layer_indices(config, config.num_layers)
    except ConfigError as e:
      problems.extend(e.problems)

  problems.extend(_pipeline_problems(config))

  # Task: a synthetic problem, text files or a local TFDS dataset.
  if check_data:
    problems.extend(_task_problems(config))

  layout = _mesh_problems(config, problems)
  if layout is not None:
    problems.extend(_stage_axis_problems(config, layout))
  if problems:
    raise ConfigError(problems)
  if check_layout:
    problem = layout_problem(config, layout)
    if problem:
      raise ConfigError([problem])
  return layout


RELATIVE_ATTENTION = ("none", "bias_shared", "bias")
LOSS_NORMALIZATIONS = ("tokens", "batch_length")
EXPORT_FORMATS = ("saved_model", "mesh_tf")


def _t5_problems(config, flag):
  """The T5 / Mesh TF fields: choices, and what needs what."""
  out = []

  def choice(key, choices):
    if config[key] not in choices:
      out.append("%s=%r is unknown: use %s=%s" % (
          key, config[key], flag(key), " | ".join(choices)))
  choice("relative_attention", RELATIVE_ATTENTION)
  choice("loss_normalization", LOSS_NORMALIZATIONS)
  choice("export_format", EXPORT_FORMATS)
  choice("export_dtype", ("bfloat16", "float32"))
  choice("export_norm_names", ("rms_norm", "layer_norm"))
  together = [d.strip() for d in str(config.adafactor_factor_dims_together)
              .split(",") if d.strip()]
  if together and (config.optimizer != "adafactor" or len(together) < 2):
    out.append("adafactor_factor_dims_together=%r needs optimizer=adafactor "
               "and two or more dims (e.g. 'heads,d_kv'): set %s=adafactor "
               "or %s=''" % (str(config.adafactor_factor_dims_together),
                             flag("optimizer"),
                             flag("adafactor_factor_dims_together")))
  for key in ("init_optimizer", "finetune_steps"):
    if config[key] and not config.init_checkpoint:
      out.append("%s=%s needs an init_checkpoint to start from: set %s=PATH "
                 "or %s=%s" % (key, config[key], flag("init_checkpoint"),
                               flag(key), "False" if key == "init_optimizer"
                               else "0"))
  return out


def _pipeline_problems(config):
  """The pipeline fields divide what they split."""
  out = []
  keys = ("pipeline_stages", "num_microbatches", "circular_repeats")
  if not all(preflight.POSITIVE.allows(config[k]) for k in keys) or max(
      config[k] for k in keys) == 1:
    return out   # a bad value is a range problem (preflight.RANGES)
  stages, repeats = config.pipeline_stages, config.circular_repeats
  if config.model_type != "lm":
    out.append("pipeline_stages=%d: only model_type=lm can be pipelined: set "
               "--config.pipeline_stages=1" % stages)
  if config.moe.num_experts:
    out.append("pipeline_stages=%d: MoE layers (moe.num_experts=%d) cannot be"
               " pipelined: set --config.moe.num_experts=0 or "
               "--config.pipeline_stages=1" % (stages, config.moe.num_experts))
  if isinstance(config.num_layers, int) and config.num_layers % (
      stages * repeats):
    out.append("num_layers=%d is not divisible by pipeline_stages * "
               "circular_repeats = %d * %d = %d: set --config.num_layers to "
               "a multiple of %d, or fewer stages / repeats" % (
                   config.num_layers, stages, repeats, stages * repeats,
                   stages * repeats))
  if isinstance(config.batch_size, int) and config.batch_size % (
      config.num_microbatches):
    out.append("batch_size=%d is not divisible by num_microbatches=%d: set "
               "--batch_size to a multiple of %d or --config.num_microbatches"
               " to a divisor of %d" % (
                   config.batch_size, config.num_microbatches,
                   config.num_microbatches, config.batch_size))
  return out


def _stage_axis_problems(config, layout):
  """A pipeline's stage dim must be on a mesh axis of its size."""
  stages = config.pipeline_stages
  if not isinstance(stages, int) or stages <= 1:
    return []
  axes = layout.layout_rules.mesh_axis_names("stage")
  mesh = str(config.mesh_shape)
  if not axes:
    return ["pipeline_stages=%d but --layout %r puts dim 'stage' on no mesh "
            "axis: add 'stage:<axis>' naming a mesh axis of size %d (mesh "
            "%r)" % (stages, str(config.layout), stages, mesh)]
  from meshtf import shapes
  sizes = {d.name: d.size for d in layout.mesh_shape.dims}
  size = shapes.prod(sizes.get(a, 1) for a in axes)
  if size != stages:
    return ["pipeline_stages=%d but --layout %r puts dim 'stage' on mesh "
            "axis %s of size %d (mesh %r): use a mesh axis of size %d for "
            "'stage', or --config.pipeline_stages=%d" % (
                stages, str(config.layout), "+".join(axes), size, mesh,
                stages, size)]
  # Activation annotations name every dim they keep split; one without a
  # stage rule would replicate the pipeline's buffer over the stage axis.
  annotated = [d for d, _ in layout.activation_rules.pairs] \
      if layout.activation_rules is not None else []
  if annotated and "stage" not in annotated:
    return ["pipeline_stages=%d but --config.activation_layout=%r has no "
            "rule for dim 'stage', so its annotations would replicate the "
            "pipeline buffer: add 'stage:%s' to it" % (
                stages, str(config.activation_layout), "+".join(axes))]
  return []


def _task_problems(config):
  from meshtf.train import data
  task = config.task
  out = []
  from meshtf.train import text_data
  if str(task.data_files).strip() or str(task.eval_data_files).strip() or \
      task.tfds_name:
    return text_data.task_problems(config)
  if task.problem not in data.PROBLEMS:
    out.append("task.problem=%r is not a synthetic problem (%s): set "
               "--config.task.problem=reverse, or --config.task.data_files"
               % (task.problem, ", ".join(data.PROBLEMS)))
    return out
  try:
    data.SyntheticTask(task.problem, config.vocab_size, config.length,
                       seq2seq=config.model_type == "bitransformer")
  except ValueError as e:
    out.append("%s: set --config.vocab_size / --config.length" % e)
  return out


def load_file(path, arg=None):
  """The config a config file's get_config() returns (get_config(arg)
  when arg is given), read as a module without the binary's flags: what
  benchmarks and tests use to start from t2t_configs/.

  Example:
    >>> load_file("t2t_configs/gspmd_dense.py", "64B_16x32,attempt1").layout
    'd_model:x;d_ff:y;heads:y;vocab:y'
  """
  import importlib.util
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location("t2t_config_" + name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def mesh_layout(config):
  """The config's MeshLayout (mesh_shape and layout, parsed once: the
  binary, its preflight, the MoE layer and the multi-worker set-up all take
  this object). Raises ConfigError with one line per problem.

  Example:
    >>> mesh_layout(default_config()).mesh_shape
    Shape([data:4, model:2])
  """
  problems = []
  layout = _mesh_problems(config, problems)
  if problems:
    raise ConfigError(problems)
  return layout


def _mesh_problems(config, problems):
  """Parses mesh_shape and layout into a MeshLayout; appends problems;
  returns it (None if unparsable)."""
  from meshtf import shapes
  from meshtf import layouts
  mesh_shape = None
  try:
    mesh_shape = shapes.convert_to_shape(str(config.mesh_shape))
    if not mesh_shape.ndims:
      raise ValueError("it has no axes")
  except (ValueError, TypeError) as e:
    problems.append(
        "mesh_shape %r is malformed: %s (e.g. --mesh_shape=data:4;model:2)"
        % (config.mesh_shape, str(e).splitlines()[0]))
    mesh_shape = None
  empty = [d for d in mesh_shape or [] if d.size < 1]
  if empty:
    problems.append(
        "mesh_shape %r: axis %r has size 0; every mesh axis needs at least "
        "1 processor: e.g. --mesh_shape=%s" % (
            config.mesh_shape, empty[0].name, ";".join(
                "%s:%d" % (d.name, max(d.size, 1)) for d in mesh_shape)))
    mesh_shape = None
  parsed = {}
  for key in ("layout", "variable_layout", "activation_layout"):
    try:
      parsed[key] = layouts.convert_to_layout_rules(str(config[key]))
    except ValueError as e:
      problems.append("%s %r is malformed: %s" % (
          key, config[key], str(e).splitlines()[0]))
  if mesh_shape is None or len(parsed) < 3:
    return None
  try:
    # Each parsed once: the model reads its activation rules from here.
    layout = layouts.MeshLayout(
        mesh_shape, parsed["layout"],
        parsed["variable_layout"] if config.variable_layout else None,
        parsed["activation_layout"] if config.activation_layout else None)
  except ValueError as e:
    problems.append("--mesh_shape / --layout / --config.variable_layout / "
                    "--config.activation_layout: %s" % str(e).splitlines()[0])
    return None
  # Rules for dims the config switches off are the binary's to report
  # (preflight.rule_dims); the Lowering refuses rules for other dims no
  # tensor of its graph has.
  layout.expect_dims(preflight.OPTIONAL_DIM_NAMES)
  devices = config.num_virtual_cpus or layout.size
  if devices != layout.size and devices > 0:  # < 0 is a problem of its own
    problems.append(
        "mesh_shape %r has %d processors but num_virtual_cpus is %d: set "
        "--num_virtual_cpus=%d or a mesh_shape whose sizes multiply to %d"
        % (config.mesh_shape, layout.size, devices, layout.size, devices))
  return layout


def layout_problem(config, mesh_layout_=None):
  """One line describing the first tensor of the training graph (forward,
  gradients and optimizer) that the layout cannot place, or None.

  The graph is built symbolically (meshtf ops only, no TensorFlow op runs)
  and checked by MeshLayout.validate_operations, the check the Lowering
  makes, before any device exists.

  Example:
    >>> c = default_config(); c.layout = "heads:model;d_ff:model"
    >>> layout_problem(c)
    "--layout 'heads:model;d_ff:model' ... split both dimension 'heads' ..."
  """
  return checked_training_graph(config, mesh_layout_)[2]


def checked_training_graph(config, mesh_layout_=None, experiment_=None):
  """(graph, graph_layout, problem): the symbolic training graph, every
  tensor's layout (MeshLayout.assign) and None, or (None, None, the one
  line of layout_problem). The binary's preflight builds it once and
  checks the layout, the checkpoint and the memory on it. experiment_:
  the run's experiment.Experiment, whose kept graph and layouts these are
  (default: a new one of config and mesh_layout_).

  Example:
    >>> graph, graph_layout, problem = checked_training_graph(config)
  """
  from meshtf import layouts
  # Here, not at the top: experiment loads TensorFlow, and the schema and
  # validate(check_layout=False) run before TensorFlow starts. experiment
  # imports nothing of this module (its MoE layer indices come from
  # preflight), so the import goes one way.
  from meshtf.train import experiment
  if experiment_ is None:
    experiment_ = experiment.Experiment(config,
                                        mesh_layout_ or mesh_layout(config))
  layout = experiment_.mesh_layout
  try:
    graph = experiment_.training_graph()[0]
    # A rule naming a dim the model lacks would silently split nothing.
    problem, _ = preflight.rule_dims(config, graph)
    if problem:
      return None, None, problem
    # The eval and decode graphs lowered with this layout may lack some of
    # the training graph's dims: the rules naming them are checked here.
    layout.expect_dims(preflight.graph_dim_names(graph))
    graph_layout = experiment_.graph_layout()
  except layouts.LayoutError as e:
    return None, None, "--layout %r on mesh %r: %s" % (
        str(config.layout), str(config.mesh_shape), str(e).splitlines()[0])
  except ConfigError as e:
    return None, None, e.problems[0]
  except ValueError as e:  # model-building errors (sizes) name their fix
    return None, None, "the model cannot be built: %s" % (
        str(e).splitlines()[0])
  return graph, graph_layout, None


__all__ = ["ConfigError", "default_config", "get_config", "load_file",
           "validate",
           "mesh_layout", "layout_problem", "checked_training_graph",
           "unknown_keys", "missing_keys",
           "missing_keys_problem",
           "moe_layer_indices"]
