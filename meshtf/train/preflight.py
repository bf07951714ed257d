"""The binary's preflight: what is checked before TensorFlow starts, kept as
data.

RANGES is a table of (key, allowed range, fix): every numeric config field
with the values it may take (an integer or a finite number, its sign,
bounds). A value outside its range is one line naming the field as the user
set it, the value, the range and the fix:

  --seed=-1 must be an integer in [0, 2**63): set --seed=0, say
  moe.capacity_factor_train=inf must be a finite number > 0: ...

`memory_problem` then asks the plan's accounting (meshtf/plan/accounting.py,
the estimate path: no tracing) what the training step needs per device, and
refuses a config that cannot fit this machine's memory, in one line with the
estimate, the limit and the fix.

Example:
  >>> c = config_lib.default_config(); c.momentum = -5.0
  >>> range_problems(c)
  ['momentum=-5.0 must be a number in [0, 1): ... --config.momentum=0.9']
"""
import math
import os

from meshtf.train.errors import ConfigError

# Held-out batches one eval (eval_steps) or one decode (decode_batches) may
# read. Each is a forward step of the whole model; 10,000 is 640,000
# examples of the default experiment, more than any eval here needs, and an
# eval of 10**7 batches would run for days between two training steps.
MAX_EVAL_BATCHES = 10000
# Layers per stack. The deepest published Transformers have about 1,000
# (DeepNet); the symbolic graph the preflight builds grows with the depth.
MAX_LAYERS = 10000
MAX_SEED = 2 ** 63   # the seed is mixed into 64-bit random keys
# Each step multiplies a decayed weight by 1 - learning_rate *
# weight_decay_rate. AdamW runs use weight_decay_rate 0.01-0.1 (BERT, T5,
# GPT-3), up to 1 (grokking) with learning rates <= 1e-2: a product of at
# most 1e-2. 0.1 leaves ten times that room; more shrinks every weight by
# more than a tenth per step.
MAX_DECAY_PER_STEP = 0.1
# Beyond this many virtual CPUs in one process a step takes minutes on a
# CPU host: a larger mesh is refused unless --num_virtual_cpus asks for it.
MAX_VIRTUAL_CPUS = 64


class Allowed(object):
  """The values one config field may take: `integer` (else a finite
  number), bounded below by `low` and above by `high` (None: unbounded;
  `low_open` / `high_open`: the bound itself is excluded).

  Example:
    >>> Allowed(integer=True, low=1).text()
    'a positive integer'
    >>> Allowed(low=0, high=1, high_open=True).allows(1.0)
    False
  """

  def __init__(self, integer=False, low=None, high=None, low_open=False,
               high_open=False, high_text=None):
    self.integer = integer
    self.low, self.high = low, high
    self.low_open, self.high_open = low_open, high_open
    self.high_text = high_text

  def allows(self, value):
    if isinstance(value, bool):
      return False
    if self.integer:
      if not isinstance(value, int):
        return False
    elif not isinstance(value, (int, float)) or not math.isfinite(value):
      return False
    if self.low is not None and (value < self.low or (
        self.low_open and value == self.low)):
      return False
    if self.high is not None and (value > self.high or (
        self.high_open and value == self.high)):
      return False
    return True

  def _show(self, value, is_high):
    if is_high and self.high_text:
      return self.high_text
    if self.integer or float(value).is_integer():
      return "%d" % value
    return "%g" % value

  def text(self):
    """The range in words: 'a positive integer', 'a number in [0, 1)'."""
    if self.integer and self.low == 1 and self.high is None:
      return "a positive integer"
    kind = "an integer" if self.integer else "a finite number"
    low = None if self.low is None else self._show(self.low, False)
    high = None if self.high is None else self._show(self.high, True)
    if low is not None and high is not None:
      return "%s in %s%s, %s%s" % (
          "an integer" if self.integer else "a number",
          "(" if self.low_open else "[", low, high,
          ")" if self.high_open else "]")
    if low is not None:
      return "%s %s %s" % (kind, ">" if self.low_open else ">=", low)
    if high is not None:
      return "%s %s %s" % (kind, "<" if self.high_open else "<=", high)
    return kind


POSITIVE = Allowed(integer=True, low=1)
COUNT = Allowed(integer=True, low=0)
FINITE = Allowed()
NON_NEGATIVE = Allowed(low=0)
POSITIVE_NUMBER = Allowed(low=0, low_open=True)
FRACTION = Allowed(low=0, high=1, high_open=True)
PROBABILITY = Allowed(low=0, high=1)

# (key, allowed, fix): the fix is what to set, "{flag}" standing for the
# flag the user set the key with (--config.<key> or e.g. --train_steps).
RANGES = (
    # model
    ("vocab_size", POSITIVE, "set {flag} to 1 or more"),
    ("vocab_divisor", POSITIVE, "set {flag} to 1 or more"),
    ("d_model", POSITIVE, "set {flag} to 1 or more"),
    ("num_layers", Allowed(integer=True, low=1, high=MAX_LAYERS),
     "set {flag} to 1 or more (the deepest published Transformers have "
     "~1,000 layers)"),
    ("num_decoder_layers", Allowed(integer=True, low=0, high=MAX_LAYERS),
     "set {flag}=0 (as many as num_layers) or a depth"),
    ("num_heads", POSITIVE, "set {flag} to 1 or more"),
    ("d_kv", POSITIVE, "set {flag} to 1 or more"),
    ("d_ff", POSITIVE, "set {flag} to 1 or more"),
    ("length", POSITIVE, "set {flag} to 1 or more"),
    ("dropout_rate", FRACTION, "set {flag}=0.1, say"),
    ("label_smoothing", FRACTION, "set {flag}=0.1, say (0: none)"),
    ("z_loss", NON_NEGATIVE, "set {flag}=1e-4, say (0: none)"),
    # data
    ("task.noise_density", Allowed(low=0, high=1, low_open=True,
                                   high_open=True),
     "set {flag}=0.15 (T5's)"),
    ("task.mean_noise_span_length", Allowed(low=1),
     "set {flag}=3.0 (T5's)"),
    ("task.extra_ids", COUNT, "set {flag}=0 (none) or 100 (T5's)"),
    ("task.vocab_sample_mb", POSITIVE_NUMBER, "set {flag}=4, say"),
    ("task.reader_threads", Allowed(integer=True, low=1, high=64),
     "set {flag}=2, say"),
    ("pipeline_stages", POSITIVE, "set {flag}=1 (1: no pipelining)"),
    ("num_microbatches", POSITIVE, "set {flag}=1 (1: no pipelining)"),
    ("circular_repeats", POSITIVE, "set {flag}=1 (1: no pipelining)"),
    ("relative_attention_num_buckets", Allowed(integer=True, low=2),
     "set {flag}=32 (T5's)"),
    ("relative_attention_max_distance", Allowed(integer=True, low=2),
     "set {flag}=128 (T5's)"),
    # Mixture of Experts
    ("moe.num_experts", COUNT, "set {flag}=0 (no MoE) or a number of "
     "experts"),
    ("moe.hidden_size", POSITIVE, "set {flag} to 1 or more"),
    ("moe.group_size", POSITIVE, "set {flag} to 1 or more"),
    ("moe.num_groups", COUNT, "set {flag}=0 (from group_size) or a number "
     "of groups"),
    ("moe.capacity_factor_train", POSITIVE_NUMBER, "set {flag}=1.0 (GShard "
     "trains with 1.0)"),
    ("moe.capacity_factor_eval", POSITIVE_NUMBER, "set {flag}=2.0, say"),
    ("moe.min_expert_capacity", POSITIVE, "set {flag}=4, say"),
    ("moe.loss_coef", NON_NEGATIVE, "set {flag}=1e-2 (GShard's l_aux "
     "coefficient)"),
    ("moe.router_z_loss_coef", NON_NEGATIVE, "set {flag}=0 (off) or 1e-3"),
    # mesh
    ("num_virtual_cpus", COUNT, "set {flag}=0 (one device per mesh "
     "processor) or to the mesh's size"),
    # training
    ("train_steps", POSITIVE, "set {flag} to 1 or more"),
    ("batch_size", POSITIVE, "set {flag} to 1 or more"),
    ("seed", Allowed(integer=True, low=0, high=MAX_SEED, high_open=True,
                     high_text="2**63"), "set {flag}=0, say"),
    ("eval_seed", Allowed(integer=True, low=-1, high=MAX_SEED,
                          high_open=True, high_text="2**63"),
     "set {flag}=-1 (seed + 1) or a seed >= 0"),
    ("learning_rate", POSITIVE_NUMBER, "set {flag}=0.01, say"),
    ("warmup_steps", COUNT, "set {flag}=0 (no warmup) or a number of steps"),
    ("weight_decay_rate", NON_NEGATIVE, "set {flag}=0.01, say (0: none)"),
    ("momentum", FRACTION, "set {flag}=0.9 (momentum 1 or more never "
     "forgets a gradient and diverges)"),
    ("clip_gradient_norm", NON_NEGATIVE, "set {flag}=1.0, or 0 (no "
     "clipping)"),
    ("collective_bucket_mb", NON_NEGATIVE,
     "set {flag}=1.0 (MiB per fused gradient allreduce; 0: one per "
     "gradient)"),
    ("adafactor_min_dim_size_to_factor", POSITIVE, "set {flag}=128 (Mesh "
     "TF's)"),
    ("finetune_steps", COUNT, "set {flag}=0 (train to train_steps) or the "
     "steps to train past init_checkpoint's step"),
    ("checkpoint_every", POSITIVE, "set {flag} to 1 or more"),
    ("keep_checkpoints", POSITIVE, "set {flag} to 1 or more"),
    ("worker_start_timeout_seconds", POSITIVE_NUMBER, "set {flag}=300, "
     "say (seconds a worker waits for the others to start)"),
    ("peer_timeout_seconds", POSITIVE_NUMBER, "set {flag}=30, say (seconds "
     "without a heartbeat before a worker counts as lost)"),
    ("eval_steps", Allowed(integer=True, low=1, high=MAX_EVAL_BATCHES),
     "set {flag}=4, say: each held-out batch is a forward step, and more "
     "than %d would keep an eval running for hours" % MAX_EVAL_BATCHES),
    ("eval_every", COUNT, "set {flag}=0 (eval at the end only) or a number "
     "of steps"),
    ("log_every", POSITIVE, "set {flag} to 1 or more"),
    ("target_accuracy", PROBABILITY, "set {flag}=0.99, say"),
    ("decode_batches", Allowed(integer=True, low=1, high=MAX_EVAL_BATCHES),
     "set {flag}=2, say (or decode a prompt file: "
     "--config.decode_prompts_file)"),
    ("decode_temperature", NON_NEGATIVE, "set {flag}=1.0 (0: greedy)"),
    ("decode_top_k", COUNT, "set {flag}=0 (sample among all tokens) or k"),
    ("decode_beam_size", POSITIVE, "set {flag}=4, say"),
    ("decode_alpha", NON_NEGATIVE, "set {flag}=0.6 (GNMT's length "
     "penalty)"),
    ("auto_memory_gb", FINITE, "set {flag}=0 (plan_hardware's memory) or "
     "-1 (no cap)"),
    ("sweep_steps", POSITIVE, "set {flag}=6, say"),
    ("export_batch_size", COUNT, "set {flag}=0 (batch_size) or a batch"),
)


def _get(config, dotted):
  for part in dotted.split("."):
    config = config[part]
  return config


def all_numbers(config):
  """True when every field of RANGES the config has is a number (an int
  or float, not a bool): the other checks may then compare them.

  Example:
    >>> c = config_lib.default_config(); all_numbers(c)
    True
  """
  for key, _, _ in RANGES:
    try:
      value = _get(config, key)
    except (KeyError, AttributeError):
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
  return True


def range_problems(config, given=None, flag=None):
  """One line per numeric field of config outside its range (RANGES), plus
  the ranges that tie two fields (decode_top_k and decode_beam_size at
  most vocab_size; learning_rate * weight_decay_rate). given(key) is the
  key as the user wrote it (e.g. "--train_steps"), flag(key) the flag that
  sets it (the fix); both default to the config key.

  Example:
    >>> c = config_lib.default_config(); c.seed = -1
    >>> range_problems(c, flag=lambda k: "--" + k)
    ['seed=-1 must be an integer in [0, 2**63): set --seed=0, say']
  """
  given = given or (lambda key: key)
  flag = flag or (lambda key: "--config." + key)
  out = []
  bad = set()
  for key, allowed, fix in RANGES:
    try:
      value = _get(config, key)
    except (KeyError, AttributeError):
      continue   # a key the config lacks is reported where it is read
    if not allowed.allows(value):
      bad.add(key)
      out.append("%s=%r must be %s: %s" % (given(key), value, allowed.text(),
                                          fix.format(flag=flag(key))))
  if not bad & {"vocab_size", "decode_top_k", "decode_beam_size"}:
    for key in ("decode_top_k", "decode_beam_size"):
      if _get(config, key) > config.vocab_size:
        out.append("%s=%r is more than vocab_size=%d, which bounds it: set "
                   "%s to at most %d" % (given(key), _get(config, key),
                                         config.vocab_size, flag(key),
                                         config.vocab_size))
  if not bad & {"learning_rate", "weight_decay_rate"}:
    decay = config.learning_rate * config.weight_decay_rate
    if decay > MAX_DECAY_PER_STEP:
      out.append(
          "%s=%r with learning_rate=%g would take learning_rate * "
          "weight_decay_rate = %.3g of every decayed weight away per step; "
          "the range is [0, %g / learning_rate] = [0, %g] (AdamW runs use "
          "0.01-0.1): set %s=0.01, say" % (
              given("weight_decay_rate"), config.weight_decay_rate,
              config.learning_rate, decay, MAX_DECAY_PER_STEP,
              MAX_DECAY_PER_STEP / config.learning_rate,
              flag("weight_decay_rate")))
  return out


# --- MoE layers ---------------------------------------------------------------
def moe_layer_indices(config, num_layers):
  """Indices of the feed-forward layers that are MoE layers in a stack of
  num_layers (empty without experts): config.moe.layers parsed and checked.
  The config's validation checks the field with it before TensorFlow
  starts, and the model's wiring (experiment.moe_feedforward_layer_fn)
  places the MoE layers with it. Raises ConfigError naming the fix.

  Example:
    >>> c = config_lib.default_config(); c.moe.layers = "odd"
    >>> moe_layer_indices(c, 4)
    [1, 3]
  """
  if not config.moe.num_experts:
    return []
  spec = str(config.moe.layers).strip()
  if spec == "all":
    return list(range(num_layers))
  if spec == "odd":
    return list(range(1, num_layers, 2))
  if spec == "even":
    return list(range(0, num_layers, 2))
  try:
    indices = sorted({int(s) for s in spec.split(",") if s.strip()})
  except ValueError:
    raise ConfigError(["moe.layers=%r is not 'odd', 'even', 'all' or comma-"
                       "separated layer indices: set --config.moe.layers=odd"
                       % spec])
  bad = [i for i in indices if not 0 <= i < num_layers]
  if bad:
    raise ConfigError(["moe.layers=%r names layers %s, but the stack has "
                       "layers 0..%d: set --config.moe.layers to indices below"
                       " %d" % (spec, bad, num_layers - 1, num_layers)])
  return indices


# --- layout rules that name no dim of the model ------------------------------
# Dims meshtf's models make only under some settings, with what makes them.
# A rule for one that this config's model lacks (experts:data with MoE off,
# beam:data in training) is reported in the header as unused, not refused:
# one config file serves variants that switch these on and off. A rule for
# a dim outside this table and the model is a typo, refused.
OPTIONAL_DIMS = (
    ("MoE layers (moe.num_experts > 0)",
     ("experts", "expert_hidden", "expert_capacity", "expert_unsplit",
      "group", "group_size", "group_unsplit")),
    ("dense feed-forward layers (moe.layers other than 'all')", ("d_ff",)),
    ("learned positions (positional_embedding=learned)", ("max_length",)),
    ("T5's relative position bias (relative_attention other than none)",
     ("buckets",)),
    ("pipelining (pipeline_stages > 1)", ("stage", "microbatches")),
    ("circular pipelining (circular_repeats > 1)", ("stage_repeat",)),
    ("beam-search decoding (decode_strategy=beam)",
     ("beam", "beam_candidates", "beam_top", "double_beam", "old_beam",
      "triple_beam")),
)
OPTIONAL_DIM_NAMES = frozenset(d for _, dims in OPTIONAL_DIMS for d in dims)

# The config keys holding layout rules, as the user sets them.
RULE_KEYS = (("layout", "--layout"),
             ("variable_layout", "--config.variable_layout"),
             ("activation_layout", "--config.activation_layout"))


def graph_dim_names(graph):
  """Every dim name of every tensor of a symbolic graph (inner operations
  of loops included)."""
  from meshtf import graph as graph_lib
  names = set()
  for op in graph_lib.all_operations(graph.operations):
    for t in list(op.outputs) + list(op.inputs):
      names.update(t.shape.dimension_names)
  return names


def rule_dims(config, graph, flag_names=None):
  """(problem, unused) of the config's layout rules against its model's
  training graph: problem is the one line refusing the first rule that
  names a dim neither the model nor OPTIONAL_DIMS has (the closest name,
  the model's dims, the fix), else None; unused lists the rules naming an
  optional dim this model lacks, as (flag, rule text, what makes the dim).

  Example:
    >>> c.layout = "Batch:data;heads:model"
    >>> rule_dims(c, graph)[0]
    "--layout='Batch:data;heads:model': layout rule 'Batch:data' names dim
    'Batch', which no tensor of the model has, so it would split nothing:
    did you mean 'batch'? (the model's dims: batch, d_ff, ...): set
    --layout='batch:data;heads:model'"
  """
  from meshtf.layouts import layout_rules as rules_lib
  dims = graph_dim_names(graph)
  maker = {d: what for what, names in OPTIONAL_DIMS for d in names}
  unused = []
  for key, default_flag in RULE_KEYS:
    flag = (flag_names or {}).get(key, default_flag)
    rules = rules_lib.convert_to_layout_rules(str(config[key]))
    for dim, text in rules_lib.unknown_rule_dims(rules, dims):
      rule = "%s:%s" % (dim, text)
      if dim in maker:
        unused.append((flag, rule, maker[dim]))
        continue

      def fix(near, key=key, flag=flag, rules=rules, dim=dim):
        kept = [(d, t) for d, t in rules.pairs if d != dim]
        if near:
          kept = [(near if d == dim else d, t) for d, t in rules.pairs]
        value = ";".join("%s:%s" % p for p in kept)
        return "set %s=%s" % (flag, _quoted(value)) if value else \
            "drop %s" % flag
      return ("%s=%s: %s" % (flag, _quoted(str(config[key])),
                             rules_lib.unknown_dim_message(
                                 rule, dim, dims, "model", fix)), unused)
  return None, unused


def _quoted(value):
  """A flag value as a shell takes it ('a:b;c:d' quoted: ';' ends a
  command)."""
  return "'%s'" % value if any(c in value for c in "; ") else value


def unused_rules_line(unused):
  """The header's line for rule_dims' unused rules (grouped by what makes
  their dims), or None.

  Example:
    >>> unused_rules_line([("--layout", "experts:data", "MoE layers"),
    ...                    ("--layout", "group:data", "MoE layers")])
    'unused layout rules: --layout experts:data, group:data (their dims are
    made by MoE layers: not in this model's training graph)'
  """
  if not unused:
    return None
  groups = {}
  for flag, rule, what in unused:
    groups.setdefault(what, {}).setdefault(flag, []).append(rule)
  return "unused layout rules: %s" % "; ".join(
      "%s (%s made by %s: not in this model's training graph)" % (
          ", ".join("%s %s" % (flag, ", ".join(rules))
                    for flag, rules in by_flag.items()),
          "their dims are" if sum(map(len, by_flag.values())) > 1
          else "its dim is", what)
      for what, by_flag in groups.items())


# --- memory -------------------------------------------------------------------
def host_memory_bytes():
  """This machine's memory as a process may use it: the physical memory,
  or the container's (cgroup) limit when that is lower; None if unknown.

  Example:
    >>> host_memory_bytes() > 2 ** 30
    True
  """
  limits = []
  try:
    limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    pass
  for path in ("/sys/fs/cgroup/memory.max",
               "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(path) as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit():
      limits.append(int(text))
  limits = [l for l in limits if l > 0]
  return min(limits) if limits else None


def _size(nbytes):
  """Bytes in words, 3 significant digits: '23,000 GB', '37.5 kB'."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if nbytes >= scale:
      return "%s %s" % (format(float("%.3g" % (nbytes / scale)), ",g"), unit)
  return "%d bytes" % nbytes


def memory_estimate(graph, mesh_layout, graph_layout=None):
  """The plan's per-device memory of the symbolic training graph (bytes):
  {"parameters", "optimizer_state", "activations_peak", "peak", ...}, from
  meshtf/plan/accounting.py's estimate path (graph order, no tracing).

  Example:
    >>> memory_estimate(graph, layout)["peak"]
    2093712
  """
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.plan import accounting
  operations = list(graph.operations)
  if graph_layout is None:
    graph_layout = mesh_layout.assign(lowering_lib.all_operations(
        operations))
  return accounting.account(operations, graph_layout,
                            graph.backward_start).memory


def memory_problem(config, mesh_layout, graph, mode, devices_here,
                   limit=None, graph_layout=None):
  """One line if what `mode` needs cannot fit this machine's memory, else
  None. The devices of this process are virtual CPUs sharing `limit`
  bytes (default host_memory_bytes()); training needs the plan's peak
  per device (parameters, optimizer state, the activation peak), eval,
  decode and export at least the parameters (graph_layout: the graph's
  MeshLayout.assign, computed here if None). The estimate follows the
  graph order one op at a time, so it is a floor: what it refuses cannot
  fit.

  Example:
    >>> memory_problem(config, layout, graph, "train", 8)   # d_model 1e9
    'the training step needs an estimated 23,000 GB per device ...'
  """
  limit = host_memory_bytes() if limit is None else limit
  if not limit:
    return None
  mem = memory_estimate(graph, mesh_layout, graph_layout)
  if mode == "train":
    per_device = mem["peak"]
    what = "the training step needs"
    parts = "parameters %s, optimizer state %s, activations %s at their " \
            "peak" % (_size(mem["parameters"]),
                      _size(mem["optimizer_state"]),
                      _size(mem["activations_peak"]))
  else:
    per_device = mem["parameters"]
    what = "--mode=%s needs at least the parameters:" % mode
    parts = "the parameters alone"
  need = per_device * devices_here
  if need <= limit:
    return None
  if mode == "train" and mem["activations_peak"] >= mem["parameters"] + \
      mem["optimizer_state"]:
    fix = ("lower --batch_size (%d), --config.length (%d), d_model (%d) "
           "or d_ff (%d), which the activations grow with, or split them "
           "over more processors (--mesh_shape, --layout)" % (
               config.batch_size, config.length, config.d_model,
               config.d_ff))
  else:
    fix = ("lower --config.d_model (%d), d_ff (%d), num_layers (%d) or "
           "vocab_size (%d), or split the weights over more processors "
           "(--mesh_shape, --layout, --config.variable_layout)" % (
               config.d_model, config.d_ff, config.num_layers,
               config.vocab_size))
  return ("%s an estimated %s per device (%s; meshtf/plan's estimate) x %d "
          "virtual CPU%s = %s, but this machine has %s of memory: %s; "
          "--mode=plan prints the breakdown" % (
              what, _size(per_device), parts, devices_here,
              "s" if devices_here != 1 else "", _size(need), _size(limit),
              fix))


__all__ = ["RANGES", "Allowed", "range_problems", "all_numbers",
           "moe_layer_indices", "OPTIONAL_DIMS", "OPTIONAL_DIM_NAMES",
           "graph_dim_names", "rule_dims", "unused_rules_line",
           "host_memory_bytes", "memory_estimate", "memory_problem",
           "MAX_EVAL_BATCHES", "MAX_LAYERS", "MAX_DECAY_PER_STEP"]
