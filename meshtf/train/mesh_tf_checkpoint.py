"""Mesh TensorFlow checkpoints (T5's released ones): names, shapes and
slices in, and a checkpoint Mesh TF restores, out.

A Mesh TF checkpoint is a TF1 name-based tensor bundle
(`model.ckpt-STEP.index` + `.data-*-of-*`, written by tf.train.Saver) of
full, unsliced tensors, beside a `checkpoint` file naming the newest. Its
names follow Mesh TF's scopes, which meshtf's own differ from in three
ways, all mapped here once, both directions:
  * blocks: meshtf numbers a stack's layers one by one
    ("encoder/layer_003/SelfAttention"); Mesh TF numbers blocks and their
    layers ("encoder/block_001/layer_000/SelfAttention"). A block starts at
    each self-attention layer, as T5's stacks do.
  * norms: meshtf's ".../SelfAttention/norm/rms_norm_scale" and
    "encoder/final_norm/rms_norm_scale" are Mesh TF's
    ".../layer_000/rms_norm/scale" and "encoder/rms_norm/scale", or the
    legacy ".../layer_norm/scale" and "encoder/final_layer_norm/scale" of
    older released checkpoints (both read; either written);
    GatedDenseReluDense is Mesh TF's DenseReluDense (wi_0 / wi_1).
  * combined dims: meshtf keeps heads and d_kv apart ([d_model, heads,
    d_kv]); Mesh TF combines them into one dim of heads * d_kv, heads
    major. It is a reshape here, never a layout constraint.
Optimizer slots: Adafactor's "<var>/slot_vr" is Mesh TF's "<var>_slot_vr"
(also _slot_vc, _slot_v, _slot_m), Adam's "<var>/slot_m" its "<var>/adam_m";
the step is "global_step" (int64).

Each processor reads only its slice: SliceSource asks TensorFlow's bundle
reader (RestoreV2's shape_and_slices) for the rows and columns of the
checkpoint entry that the processor's slice covers, then casts to the
variable's dtype (a bfloat16 checkpoint into float32 training).

Example:
  >>> prefix = resolve("/ckpts/t5_small")          # ".../model.ckpt-1000000"
  >>> entries = read_entries(prefix)                # name -> (shape, dtype)
  >>> names = NameMap(model, optimizer="adafactor")
  >>> names.to_mesh_tf("encoder/layer_000/SelfAttention/q")
  'encoder/block_000/layer_000/SelfAttention/q'
"""
import os
import re
import shutil

import numpy as np
import tensorflow as tf

from meshtf.models import transformer

STEP = "global_step"
COMBINED = ("heads", "d_kv")   # meshtf dims Mesh TF holds as one
_CKPT = re.compile(r"^model\.ckpt-(\d+)\.index$")
# meshtf slot suffix -> Mesh TF's, per optimizer.
SLOT_SUFFIXES = {
    "adafactor": {"/slot_vr": "_slot_vr", "/slot_vc": "_slot_vc",
                  "/slot_v": "_slot_v", "/slot_m": "_slot_m"},
    "adam": {"/slot_m": "/adam_m", "/slot_v": "/adam_v"},
    "momentum": {"/slot_velocity": "_momentum_v"},
    "sgd": {},
}
NORM_NAMES = ("rms_norm", "layer_norm")   # current, legacy


def resolve(path):
  """The checkpoint prefix at path (a prefix, or a folder whose
  `checkpoint` file or newest model.ckpt-N it names), or None when path
  holds no Mesh TF-format checkpoint.

  Example:
    >>> resolve("/ckpts/t5_small")
    '/ckpts/t5_small/model.ckpt-1000000'
  """
  path = os.path.expanduser(path)
  if os.path.isfile(path + ".index"):
    return path
  if not os.path.isdir(path):
    return None
  state = os.path.join(path, "checkpoint")
  if os.path.isfile(state):
    with open(state, encoding="utf-8", errors="replace") as f:
      m = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', f.read(), re.M)
    if m:
      named = m.group(1)
      named = named if os.path.isabs(named) else os.path.join(path, named)
      if os.path.isfile(named + ".index"):
        return named
  steps = [(int(m.group(1)), n) for n in os.listdir(path)
           for m in [_CKPT.match(n)] if m]
  if steps:
    return os.path.join(path, max(steps)[1][:-len(".index")])
  return None


def read_entries(prefix):
  """{name: (shape list, tf.DType)} of the bundle at prefix (its index
  only; no tensor is read).

  Example:
    >>> read_entries(prefix)["shared/embedding"]
    ([32128, 512], tf.bfloat16)
  """
  reader = tf.train.load_checkpoint(prefix)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  return {n: (list(shapes[n]), tf.as_dtype(dtypes[n])) for n in shapes}


def read_step(prefix, entries=None):
  """The checkpoint's global_step, or None if it has none."""
  entries = read_entries(prefix) if entries is None else entries
  if STEP not in entries:
    return None
  return int(tf.train.load_checkpoint(prefix).get_tensor(STEP))


# --- shapes -------------------------------------------------------------------
def combined_axis(dim_names):
  """The axis where heads, d_kv stand next to each other (Mesh TF's one
  combined dim), or None."""
  for i in range(len(dim_names) - 1):
    if tuple(dim_names[i:i + 2]) == COMBINED:
      return i
  return None


def mesh_tf_shape(dims):
  """Mesh TF's shape of a meshtf shape [(name, size), ...]: heads and d_kv
  combined.

  Example:
    >>> mesh_tf_shape([("d_model", 512), ("heads", 8), ("d_kv", 64)])
    [512, 512]
  """
  sizes = [s for _, s in dims]
  axis = combined_axis([n for n, _ in dims])
  if axis is None:
    return sizes
  return sizes[:axis] + [sizes[axis] * sizes[axis + 1]] + sizes[axis + 2:]


# --- names --------------------------------------------------------------------
class NameMap(object):
  """meshtf variable names <-> Mesh TF checkpoint names for one model.

  model: a transformer.Unitransformer or Bitransformer (its layer stacks
  give the blocks); optimizer: the config's optimizer name (its slots'
  suffixes); norm_name: "rms_norm" or the legacy "layer_norm" when
  writing (reading tries both).

  Example:
    >>> names = NameMap(model, "adafactor")
    >>> names.candidates("decoder/layer_002/GatedDenseReluDense/wi_0/kernel")
    ['decoder/block_000/layer_002/DenseReluDense/wi_0/kernel']
  """

  def __init__(self, model, optimizer="adafactor", norm_name="rms_norm"):
    self.slots = SLOT_SUFFIXES.get(optimizer, {})
    if norm_name not in NORM_NAMES:
      raise ValueError("NameMap: norm_name %r is not one of %s" % (
          norm_name, NORM_NAMES))
    self.norm_name = norm_name
    self._prefixes = []   # (meshtf prefix, Mesh TF prefix, is a layer)
    for stack_name, stack in _stacks(model):
      block, sub = -1, 0
      for i, layer in enumerate(stack.layers):
        if layer.name == "SelfAttention" or block < 0:
          block, sub = block + 1, 0
        cls = "DenseReluDense" if layer.name == "GatedDenseReluDense" \
            else layer.name
        self._prefixes.append((
            "%s/layer_%03d/%s" % (stack_name, i, layer.name),
            "%s/block_%03d/layer_%03d" % (stack_name, block, sub), cls))
        sub += 1
      self._prefixes.append(("%s/final_norm" % stack_name, stack_name, None))

  def _split_slot(self, name):
    for ours, theirs in sorted(self.slots.items(), key=lambda kv: -len(kv[0])):
      if name.endswith(ours):
        return name[:-len(ours)], theirs
    return name, ""

  def candidates(self, name, norm_names=NORM_NAMES):
    """The Mesh TF names meshtf variable `name` may have (the current norm
    name first, then the legacy one)."""
    if name == "global_step":
      return [STEP]
    base, slot = self._split_slot(name)
    out = []
    for ours, theirs, cls in self._prefixes:
      if not base.startswith(ours + "/"):
        continue
      rest = base[len(ours) + 1:]
      if cls is None:    # the stack's final norm
        legacy = {"rms_norm": "rms_norm", "layer_norm": "final_layer_norm"}
        if rest == "rms_norm_scale":
          out = ["%s/%s/scale" % (theirs, legacy[n]) for n in norm_names]
      elif rest == "norm/rms_norm_scale":
        out = ["%s/%s/scale" % (theirs, n) for n in norm_names]
      else:
        out = ["%s/%s/%s" % (theirs, cls, rest)]
      break
    out = out or [base]
    return [n + slot for n in out]

  def to_mesh_tf(self, name):
    """The Mesh TF name meshtf variable `name` is written under."""
    return self.candidates(name, (self.norm_name,))[0]


def _stacks(model):
  """(scope name, LayerStack) of each stack of a transformer model."""
  if isinstance(model, transformer.Bitransformer):
    return [("encoder", model.encoder.layer_stack),
            ("decoder", model.decoder.layer_stack)]
  return [(model.name, model.layer_stack)]


# --- slices in ----------------------------------------------------------------
class SliceSource(object):
  """Reads the slice a processor holds of one variable from a checkpoint
  entry: (begin, sizes) in the meshtf variable's shape -> numpy array of
  `sizes` in its dtype (zero where an uneven split's slice reaches past
  the end). Only the checkpoint rows and columns the slice covers are
  read; across the combined heads * d_kv dim, whole heads.

  Example:
    >>> src = SliceSource(prefix, "encoder/block_000/layer_000/SelfAttention/q",
    ...                   [512, 512], tf.bfloat16,
    ...                   [("d_model", 512), ("heads", 8), ("d_kv", 64)],
    ...                   tf.float32)
    >>> src([0, 4, 0], [512, 4, 64]).shape        # heads 4..7
    (512, 4, 64)
  """

  def __init__(self, prefix, entry, entry_shape, entry_dtype, dims, dtype):
    self.prefix, self.entry = prefix, entry
    self.entry_shape, self.entry_dtype = list(entry_shape), entry_dtype
    self.dims = [(n, int(s)) for n, s in dims]
    self.dtype = tf.as_dtype(dtype)
    self.axis = (combined_axis([n for n, _ in self.dims])
                 if len(self.entry_shape) < len(self.dims) else None)
    self.traced = True   # eager reads: no tf.function around them

  def __call__(self, begin, sizes):
    begin = [int(b) for b in np.asarray(begin)]
    sizes = [int(n) for n in sizes]
    full = [s for _, s in self.dims]
    valid = [max(0, min(n, f - b)) for b, n, f in zip(begin, sizes, full)]
    out = np.zeros(sizes, self.dtype.as_numpy_dtype)
    if 0 in valid:
      return out
    part = self._read(begin, valid, full)
    out[tuple(slice(0, n) for n in valid)] = part
    return out

  def _read(self, begin, valid, full):
    if self.axis is None:
      ckpt_begin, ckpt_size = begin, valid
    else:
      a, per_head = self.axis, full[self.axis + 1]
      ckpt_begin = begin[:a] + [begin[a] * per_head] + begin[a + 2:]
      ckpt_size = valid[:a] + [valid[a] * per_head] + valid[a + 2:]
    spec = "" if not self.entry_shape else "%s %s" % (
        " ".join(str(s) for s in self.entry_shape),
        ":".join("%d,%d" % (b, n) for b, n in zip(ckpt_begin, ckpt_size)))
    with tf.init_scope():
      t = tf.raw_ops.RestoreV2(prefix=self.prefix, tensor_names=[self.entry],
                               shape_and_slices=[spec],
                               dtypes=[self.entry_dtype])[0]
      t = tf.cast(t, self.dtype).numpy()
    if self.axis is not None:
      a = self.axis
      t = t.reshape(valid[:a] + [valid[a], full[a + 1]] + valid[a + 2:])
      index = [slice(None)] * t.ndim
      index[a + 1] = slice(begin[a + 1], begin[a + 1] + valid[a + 1])
      t = t[tuple(index)]
    return t


# --- a checkpoint out ---------------------------------------------------------
def to_mesh_tf_tensors(values, shapes, names, trainable,
                       weight_dtype=tf.bfloat16):
  """{Mesh TF name: tf.Tensor} of meshtf variable values {name: numpy}
  whose shapes {name: [(dim name, size), ...]} say where heads and d_kv
  combine; names: a NameMap. The weights (the names in trainable) are cast
  to weight_dtype (Mesh TF's master dtype, bfloat16 by default); slots
  stay float32, the step int64.

  Example:
    >>> out = to_mesh_tf_tensors(values, shapes, NameMap(model), trainable)
    >>> out["encoder/block_000/layer_000/SelfAttention/q"].shape
    TensorShape([512, 512])
  """
  out = {}
  for name, value in sorted(values.items()):
    value = np.asarray(value).reshape(mesh_tf_shape(shapes[name]))
    t = tf.convert_to_tensor(value)
    if name == "global_step":
      t = tf.cast(t, tf.int64)
    elif name in trainable and t.dtype.is_floating:
      t = tf.cast(t, weight_dtype)
    out[names.to_mesh_tf(name)] = t
  return out


def write(directory, step, tensors):
  """Writes tensors {Mesh TF name: numpy array or tf.Tensor} (global_step
  added as int64) as `directory/model.ckpt-<step>` with a `checkpoint`
  file, as Mesh TF's Saver lays a model_dir out; atomically: written in a
  temporary folder beside it that replaces `directory` only when complete.
  Returns the prefix.

  Example:
    >>> write("/tmp/m/mesh_tf", 1000, {"shared/embedding": emb})
    '/tmp/m/mesh_tf/model.ckpt-1000'
  """
  directory = os.path.abspath(directory)
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, ".tmp-" + os.path.basename(directory))
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  tensors = dict(tensors)
  tensors[STEP] = tf.constant(step, tf.int64)
  names = sorted(tensors)
  name = "model.ckpt-%d" % step
  with tf.init_scope():
    tf.raw_ops.SaveV2(prefix=os.path.join(tmp, name), tensor_names=names,
                      shape_and_slices=[""] * len(names),
                      tensors=[tf.convert_to_tensor(tensors[n])
                               for n in names])
  with open(os.path.join(tmp, "checkpoint"), "w", encoding="utf-8") as f:
    f.write('model_checkpoint_path: "%s"\nall_model_checkpoint_paths: "%s"\n'
            % (name, name))
  if os.path.exists(directory):
    old = directory + ".old"
    os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old)
  else:
    os.replace(tmp, directory)
  return os.path.join(directory, name)


def export(config, directory, step, values, experiment=None):
  """Writes a meshtf checkpoint's values {name: full numpy value} (of the
  config's model) as a Mesh TF checkpoint `directory/model.ckpt-<step>`:
  Mesh TF's names and combined shapes, the weights in config.export_dtype,
  the optimizer's slots (Mesh TF's factored shapes, float32) and
  global_step. experiment: the run's experiment.Experiment, whose model
  and symbolic training graph name the variables and their shapes (any
  layout's: a layout changes neither); default a new one. Returns the
  prefix.

  Example:
    >>> export(config, "/tmp/ft/mesh_tf", 1001000, found.values)
    '/tmp/ft/mesh_tf/model.ckpt-1001000'
  """
  if experiment is None:
    from meshtf.train import experiment as experiment_lib
    experiment = experiment_lib.Experiment(config, None)
  graph, _ = experiment.training_graph()
  shapes = {v.name: [(d.name, d.size) for d in v.shape.dims]
            for v in graph.all_variables}
  names = NameMap(experiment.model, config.optimizer,
                  config.export_norm_names)
  tensors = to_mesh_tf_tensors(
      {n: v for n, v in values.items() if n in shapes}, shapes, names,
      {v.name for v in graph.trainable_variables},
      tf.as_dtype(config.export_dtype))
  tensors.pop(STEP, None)
  return write(directory, step, tensors)


__all__ = ["resolve", "read_entries", "read_step", "mesh_tf_shape",
           "combined_axis", "NameMap", "SliceSource", "to_mesh_tf_tensors",
           "write", "export", "STEP"]
