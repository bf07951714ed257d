r"""T5 reference data made by Mesh TensorFlow 0.1.21's OWN code.

A tiny T5-shaped Bitransformer built by the installed `mesh-tensorflow`
package (its ops.py, placement lowering, layers.py, optimize.py and
transformer/{transformer,transformer_layers,attention}.py, configured with
gin as T5 configures it), run in TF1 graph mode (tf.compat.v1 Graph +
Session, resource variables) in a child process in which `import meshtf`
fails (mesh_tf_imports.block_meshtf) and meshtf.compat is never installed.
The import stand-ins it needs on TF 2.21 are in mesh_tf_imports.py.
tests/compat/README.md has the exact variable lists, the loss definitions
and what Mesh TF's code does that a re-implementation may not expect.

Modes of the child (`python -I tests/compat/mesh_tf_t5.py MODE ...`):
  make   builds the model, initializes it (graph seed `seed`), puts the
         global step at step - warmup_steps and runs `warmup_steps` Adafactor
         steps (so the slots at `step` are not zero), saves model.ckpt-STEP,
         restores it in a fresh Session with Mesh TF's Saver (+ the
         master -> slice copy its MtfRestoreHook does), writes the reference
         outputs of that restored model on the fixed batch, takes ONE
         Adafactor step (dropout 0) and saves model.ckpt-(STEP+1).
  score  restores ANY Mesh TF-format checkpoint prefix into the same model
         with Mesh TF's own Saver and writes the same reference outputs for
         a given batch (.npz with int32 `inputs` [batch, inputs_length] and
         `targets` [batch, targets_length]).
From pytest use make_fixture() / score_checkpoint() (below); they run the
child with a clean environment and raise with the child's stderr tail if it
fails. make_fixture caches by arguments (and this code's digest) on disk, in
default_workdir() unless told otherwise, so every test process of a machine
shares one make per config.

Variants (override any field of DEFAULTS with make_fixture(..., f=value)):
  "t5.1.1": DenseReluDense activation ["gelu", "linear"] -> wi_0 (gelu) *
            wi_1 (linear), untied decoder/logits/kernel, dropout 0, d_kv 8
            (heads*d_kv 16), d_ff 48.
  "t5.1.0": ReLU (wi, wo), tied embedding (logits = (h * d_model**-0.5) .
            shared/embedding), dropout_rate 0.1 in the gin config (train mode
            only; the fixture's steps rebind it to 0 so that they are
            deterministic), d_kv 16 (heads*d_kv = d_model = 32: equal dims, as
            in T5.1.0 base, so Adafactor's tie order matters), d_ff 64.
  Both: d_model 32, 2 heads, 2 + 2 blocks, vocab 120 padded to 128, RMS norm
  without bias, no dense biases, no positional embedding, "bias_shared"
  relative attention (32 buckets, max_distance 128), shared embedding;
  norm_names "rms_norm" (LayerStack sublayers) or "layer_norm" (LayerStack's
  legacy mode: layer_norm / final_layer_norm); master_dtype "bfloat16" or
  "float32" (slices float32); relative_attention "bias_shared" or "bias".

Checkpoint names (NNN = block; D = d_model, H = heads * d_kv, V = 128,
F = d_ff; master dtype unless said):
  shared/embedding                                        [V, D]
  {encoder,decoder}/block_NNN/layer_000/SelfAttention/{q,k,v} [D, H], o [H, D]
  {encoder,decoder}/block_000/layer_000/SelfAttention/relative_attention_bias
                                                          [heads, 32]
  decoder/block_NNN/layer_001/EncDecAttention/{q,k,v} [D, H], o [H, D]
  .../DenseReluDense/wi/kernel (t5.1.0) or wi_0, wi_1 (t5.1.1) [D, F],
  .../DenseReluDense/wo/kernel [F, D]  (encoder layer_001, decoder layer_002)
  .../block_NNN/layer_LLL/rms_norm/scale and {encoder,decoder}/rms_norm/scale
  [D] (layer_norm names: layer_LLL/layer_norm/scale, final_layer_norm/scale)
  decoder/logits/kernel [D, V] (t5.1.1); global_step [] int64
  Adafactor slots (float32): W_slot_vr / W_slot_vc (W without its largest /
  second-largest dim; ties in declaration order) when W has >= 2 dims and the
  second-largest is >= min_dim_size_to_factor (8 here, 128 in T5), else
  W_slot_v; no _slot_m (beta1 0).

Files: model.ckpt-{STEP,STEP+1}.{index,meta,data-0000{0,1}-of-00002},
checkpoint, operative_config.gin, batch.npz (inputs [4, 16], targets
[4, 20]), reference.npz (logits, loss_eval, loss_train, cross_entropy,
log_z, scores, decode, decode_clean, grad/<weight>), step.npz (before/<name>,
after/<name> for weights and slots), manifest.json.

Example:
  >>> fx = make_fixture(None, "t5.1.1", "rms_norm", "bfloat16")  # doctest: +SKIP
  >>> ref = np.load(fx["files"]["reference"])                    # doctest: +SKIP
  >>> ref["logits"].shape                                        # doctest: +SKIP
  (4, 20, 128)
  >>> out = score_checkpoint(tmp_path, fx["checkpoint"],        # doctest: +SKIP
  ...                        fx["files"]["batch"], **fx["config"])
"""
import argparse
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = {
    "t5.1.1": dict(activation=["gelu", "linear"], tied_logits=False,
                   dropout_rate=0.0, d_kv=8, d_ff=48),
    "t5.1.0": dict(activation="relu", tied_logits=True,
                   dropout_rate=0.1, d_kv=16, d_ff=64),
}
NORM_NAMES = ("rms_norm", "layer_norm")
MASTER_DTYPES = ("bfloat16", "float32")
RELATIVE_ATTENTION = ("bias_shared", "bias")

# Every field of a fixture's config; None = the variant's value.
DEFAULTS = dict(
    variant="t5.1.1", norm_names="rms_norm", master_dtype="bfloat16",
    relative_attention="bias_shared", activation_dtype="float32",
    activation=None, tied_logits=None, dropout_rate=None, d_kv=None,
    d_ff=None, d_model=32, num_heads=2, num_layers=2,
    relative_attention_num_buckets=32, vocab_size=120, vocab_divisor=128,
    inputs_length=16, targets_length=20, batch_size=4,
    z_loss=1e-4, label_smoothing=0.0, loss_denominator=None,
    step=1000, warmup_steps=20, learning_rate=None,
    min_dim_size_to_factor=8, beta1=0.0, clipping_threshold=1.0,
    multiply_by_parameter_scale=True, decay_exponent=0.8,
    max_decode_length=None, seed=1)

_CACHE = {}


def resolve_config(variant="t5.1.1", norm_names="rms_norm",
                   master_dtype="bfloat16", **overrides):
  """The full config of a fixture: DEFAULTS, the variant's values, then the
  overrides. Unknown fields and bad values raise ValueError naming them.

  Example:
    >>> resolve_config("t5.1.0", "layer_norm", "float32")["d_kv"]
    16
  """
  unknown = sorted(set(overrides) - set(DEFAULTS))
  if unknown:
    raise ValueError("mesh_tf_t5: unknown config field(s) %s; known: %s"
                     % (unknown, ", ".join(sorted(DEFAULTS))))
  config = dict(DEFAULTS, variant=variant, norm_names=norm_names,
                master_dtype=master_dtype)
  config.update(overrides)
  for field, allowed in (("variant", VARIANTS), ("norm_names", NORM_NAMES),
                         ("master_dtype", MASTER_DTYPES),
                         ("relative_attention", RELATIVE_ATTENTION)):
    if config[field] not in allowed:
      raise ValueError("mesh_tf_t5: %s=%r; choose one of %s"
                       % (field, config[field], list(allowed)))
  for field, value in VARIANTS[config["variant"]].items():
    if config[field] is None:
      config[field] = value
  if config["warmup_steps"] > config["step"]:
    raise ValueError("mesh_tf_t5: warmup_steps=%d > step=%d (the warm-up "
                     "steps end at step)" % (config["warmup_steps"],
                                             config["step"]))
  return config


def mesh_tf_installed():
  """True if the mesh-tensorflow package is installed (found, not imported).

  Example:
    >>> isinstance(mesh_tf_installed(), bool)
    True
  """
  return importlib.util.find_spec("mesh_tensorflow") is not None


def _skip_unless_installed():
  if not mesh_tf_installed():
    import pytest  # pylint: disable=g-import-not-at-top
    pytest.skip("mesh-tensorflow 0.1.21 is not installed (pip install -e "
                "'.[test]' installs it)")


def _child_env():
  """The child's environment: no PYTHONPATH (and `python -I` ignores it
  anyway), CPU only, quiet TF."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("PYTHON") and k != "TF_CONFIG"}
  env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
             TF_ENABLE_ONEDNN_OPTS="0")
  return env


def _run_child(args, timeout):
  cmd = [sys.executable, "-I", os.path.abspath(__file__)] + args
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, env=_child_env(), cwd=HERE)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError("mesh_tf_t5 child timed out after %d s: %s\n%s"
                       % (timeout, " ".join(args),
                          (e.stderr or b"")[-3000:])) from None
  if proc.returncode != 0:
    raise RuntimeError("mesh_tf_t5 child exited %d: %s\n--- stderr tail ---\n"
                       "%s" % (proc.returncode, " ".join(args),
                               proc.stderr[-4000:]))
  return proc


def default_workdir():
  """Where make_fixture(None, ...) keeps fixtures: one directory per user
  under the system's temp directory, shared by test processes (xdist
  workers, test files) so that each fixture is made once per machine.

  Example:
    >>> os.path.basename(default_workdir()).startswith("mesh_tf_t5-")
    True
  """
  return os.path.join(tempfile.gettempdir(), "mesh_tf_t5-%d" % os.getuid())


def _code_digest():
  """What a fixture depends on besides its config: this file, the
  stand-ins and the versions of Mesh TF, TF, gin and Python."""
  digest = hashlib.sha1(sys.version.encode())
  for name in ("mesh_tf_t5.py", "mesh_tf_imports.py"):
    with open(os.path.join(HERE, name), "rb") as f:
      digest.update(f.read())
  for dist in ("mesh-tensorflow", "tensorflow", "gin-config", "numpy"):
    try:
      digest.update(("%s=%s" % (dist, importlib.metadata.version(dist))
                     ).encode())
    except importlib.metadata.PackageNotFoundError:
      digest.update(dist.encode())
  return digest.hexdigest()


# A fixture directory's name: <variant>-<config digest>-<code digest>
# (before the code digest was in the name: <variant>-<digest of both>).
_FIXTURE_DIR = re.compile(r"^(t5\.1\.[01])-([0-9a-f]{12})(?:-([0-9a-f]{8}))?$")


def prune_stale(workdir, code):
  """Removes the fixtures in workdir made by other code (a code digest
  other than `code`: an edited fixture file or stand-in, another TF or Mesh
  TF), which nothing can reuse, so that a machine's temp directory keeps
  one set. A fixture whose lock another process holds is left alone; so is
  anything not named like a fixture. Returns the names removed.

  Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name in ("t5.1.1-%s-%s" % ("a" * 12, "0" * 8),
    ...              "t5.1.1-%s-%s" % ("b" * 12, "1" * 8), "notes"):
    ...   os.makedirs(os.path.join(d, name))
    >>> prune_stale(d, "1" * 8)
    ['t5.1.1-aaaaaaaaaaaa-00000000']
    >>> sorted(os.listdir(d))
    ['notes', 't5.1.1-bbbbbbbbbbbb-11111111']
  """
  removed = []
  for name in sorted(os.listdir(workdir)):
    match = _FIXTURE_DIR.match(name)
    if not match or match.group(3) == code:
      continue
    path = os.path.join(workdir, name)
    with open(path + ".lock", "w") as lock:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        continue                      # being made or read right now
      shutil.rmtree(path, ignore_errors=True)
    os.remove(path + ".lock")
    removed.append(name)
  return removed


def make_fixture(workdir=None, variant="t5.1.1", norm_names="rms_norm",
                 master_dtype="bfloat16", timeout=300, **overrides):
  """Makes (or returns the already made) fixture for these arguments.

  Args:
    workdir: a directory, or None for default_workdir(); the fixture goes
      to workdir/<variant>-<config hash>-<_code_digest()>/ and is
      reused from there when complete (its manifest.json is written last;
      a file lock keeps concurrent test processes from making it twice).
    variant: "t5.1.1" or "t5.1.0".
    norm_names: "rms_norm" or "layer_norm" (legacy names).
    master_dtype: "bfloat16" or "float32" (the checkpoint's weights).
    timeout: seconds for the child.
    **overrides: any other field of DEFAULTS (relative_attention="bias",
      loss_denominator=..., learning_rate=0.001, step=..., ...).

  Returns:
    the manifest (dict): "config", "dir", "checkpoint" (prefix of
    model.ckpt-STEP), "checkpoint_after" (model.ckpt-(STEP+1)), "files"
    (batch / reference / step / operative_config / manifest paths),
    "checkpoint_variables" {prefix: {name: [shape, dtype]}}, "optimizer"
    (learning_rate, decay_rate, ...), "losses", "seconds".

  Example:
    >>> fx = make_fixture(None, "t5.1.0", "layer_norm")  # doctest: +SKIP
    >>> fx["checkpoint_variables"][fx["checkpoint"]]["global_step"]  # doctest: +SKIP
    [[], 'int64']
  """
  _skip_unless_installed()
  config = resolve_config(variant, norm_names, master_dtype, **overrides)
  key = json.dumps(config, sort_keys=True)
  workdir = os.path.abspath(os.fspath(workdir or default_workdir()))
  code = _code_digest()[:8]
  digest = hashlib.sha1(key.encode()).hexdigest()[:12]
  out = os.path.join(workdir, "%s-%s-%s" % (variant, digest, code))
  if out in _CACHE:
    return _CACHE[out]
  os.makedirs(workdir, exist_ok=True)
  manifest_path = os.path.join(out, "manifest.json")
  with open(out + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
    if not os.path.exists(manifest_path):
      shutil.rmtree(out, ignore_errors=True)   # an interrupted make's rest
      _run_child(["make", "--config", key, "--out", out], timeout)
      prune_stale(workdir, code)
    with open(manifest_path) as f:
      manifest = json.load(f)
  _CACHE[out] = manifest
  return manifest


def score_checkpoint(workdir, checkpoint, batch, variant="t5.1.1",
                     norm_names="rms_norm", master_dtype="bfloat16",
                     timeout=300, **overrides):
  """Restores a Mesh TF-format checkpoint into Mesh TF's own model (built
  from these arguments, as make_fixture would) and scores a batch.

  Args:
    workdir: a directory for the outputs (workdir/score-<hash>/).
    checkpoint: a checkpoint prefix (e.g. ".../model.ckpt-1000").
    batch: path of an .npz with int32 "inputs" and "targets".
    variant, norm_names, master_dtype, **overrides: as make_fixture (the
      graph's names / dtypes must match the checkpoint's: Mesh TF's Saver
      restores every weight and global_step of the graph, ignores extra
      entries such as slots, and otherwise the child fails with the Saver's
      error and one line per variable the checkpoint lacks or holds with
      another shape or dtype). A fixture's manifest["config"] can be passed
      as **config.
    timeout: seconds for the child.

  Returns:
    dict: "manifest" (as make's, for this score) and "outputs" (the arrays
    of reference.npz, see the module docstring).

  Example:
    >>> s = score_checkpoint(tmp_path, prefix, fx["files"]["batch"],  # doctest: +SKIP
    ...                      **fx["config"])
    >>> s["outputs"]["logits"].shape                                  # doctest: +SKIP
    (4, 20, 128)
  """
  _skip_unless_installed()
  config = resolve_config(variant, norm_names, master_dtype, **overrides)
  key = json.dumps(config, sort_keys=True)
  digest = hashlib.sha1(("%s|%s|%s" % (key, os.path.abspath(checkpoint),
                                       os.path.abspath(batch))).encode())
  out = os.path.join(os.fspath(workdir), "score-%s" % digest.hexdigest()[:10])
  os.makedirs(out, exist_ok=True)
  _run_child(["score", "--config", key, "--out", out,
              "--checkpoint", os.path.abspath(checkpoint),
              "--batch", os.path.abspath(batch)], timeout)
  with open(os.path.join(out, "manifest.json")) as f:
    manifest = json.load(f)
  with np.load(os.path.join(out, "reference.npz")) as z:
    outputs = {k: z[k] for k in z.files}
  return {"manifest": manifest, "outputs": outputs}


def fixed_batch(config):
  """The fixture's batch: int32 inputs [B, Li] and targets [B, Lt], each
  row len_i tokens in [2, vocab_size) then EOS 1 at len_i - 1, then 0s;
  row 0 fills its length (no padding).

  Example:
    >>> b = fixed_batch(resolve_config())
    >>> b["inputs"].shape, b["targets"].shape, int(b["inputs"][0, -1])
    ((4, 16), (4, 20), 1)
  """
  rng = np.random.RandomState(config["seed"])
  out = {}
  for key in ("inputs", "targets"):
    n, length = config["batch_size"], config[key + "_length"]
    lengths = [length] + [max(2, length * (n - i) // (n + 1))
                          for i in range(1, n)]
    ids = np.zeros((n, length), np.int32)
    for row, k in enumerate(lengths):
      ids[row, :k - 1] = rng.randint(2, config["vocab_size"], size=k - 1)
      ids[row, k - 1] = 1
    out[key] = ids
  return out


def clean_decodes(ids, eos_id=1, pad_id=0):
  """Mesh TF's utils.clean_decodes in numpy: everything after the first EOS
  becomes PAD (the EOS is kept).

  Example:
    >>> clean_decodes(np.array([[5, 1, 7, 1]])).tolist()
    [[5, 1, 0, 0]]
  """
  after_eos = np.cumsum(ids == eos_id, axis=-1) - (ids == eos_id)
  return np.where(after_eos == 0, ids, pad_id).astype(ids.dtype)


# ---------------------------------------------------------------- the child


def _load_imports_module():
  spec = importlib.util.spec_from_file_location(
      "mesh_tf_imports", os.path.join(HERE, "mesh_tf_imports.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def gin_config(config):
  """The gin config the child parses (T5's way of configuring Mesh TF).

  Example:
    >>> "SelfAttention.relative_attention_type = 'bias_shared'" in gin_config(
    ...     resolve_config())
    True
  """
  c = config
  tl = "@mesh_tensorflow.transformer.transformer_layers."
  lines = [
      "import mesh_tensorflow.optimize",
      "import mesh_tensorflow.transformer.transformer",
      "import mesh_tensorflow.transformer.transformer_layers",
      "dropout_rate = %r" % c["dropout_rate"],
      "encoder/make_layer_stack.layers = [%sSelfAttention, %sDenseReluDense]"
      % (tl, tl),
      "decoder/make_layer_stack.layers = [%sSelfAttention, "
      "%sEncDecAttention, %sDenseReluDense]" % (tl, tl, tl),
      "make_layer_stack.num_layers = %d" % c["num_layers"],
      "make_bitransformer.input_vocab_size = %d" % c["vocab_size"],
      "make_bitransformer.output_vocab_size = %d" % c["vocab_size"],
      "Bitransformer.shared_embedding = True",
      "Unitransformer.d_model = %d" % c["d_model"],
      "Unitransformer.max_length = 512",
      "Unitransformer.positional_embedding = False",
      "Unitransformer.shared_embedding_and_softmax_weights = %r"
      % c["tied_logits"],
      "Unitransformer.z_loss = %r" % c["z_loss"],
      "Unitransformer.label_smoothing = %r" % c["label_smoothing"],
      "Unitransformer.loss_denominator = %r" % c["loss_denominator"],
      "Unitransformer.vocab_divisor = %d" % c["vocab_divisor"],
      "SelfAttention.num_heads = %d" % c["num_heads"],
      "SelfAttention.key_value_size = %d" % c["d_kv"],
      "SelfAttention.relative_attention_type = %r" % c["relative_attention"],
      "SelfAttention.relative_attention_num_buckets = %d"
      % c["relative_attention_num_buckets"],
      "SelfAttention.dropout_rate = %dropout_rate",
      "DenseReluDense.hidden_size = %d" % c["d_ff"],
      "DenseReluDense.activation = %r" % (c["activation"],),
      "DenseReluDense.use_bias = False",
      "DenseReluDense.dropout_rate = %dropout_rate",
      "Bitransformer.decode.beam_size = 1",
      "Bitransformer.decode.temperature = 0.0",
      "Bitransformer.decode.max_decode_length = %r" % c["max_decode_length"],
      "AdafactorOptimizer.multiply_by_parameter_scale = %r"
      % c["multiply_by_parameter_scale"],
      "AdafactorOptimizer.learning_rate = %r" % c["learning_rate"],
      "AdafactorOptimizer.beta1 = %r" % c["beta1"],
      "AdafactorOptimizer.clipping_threshold = %r" % c["clipping_threshold"],
      "AdafactorOptimizer.min_dim_size_to_factor = %d"
      % c["min_dim_size_to_factor"],
      "adafactor_decay_rate_pow.exponent = %r" % c["decay_exponent"],
  ]
  if c["norm_names"] == "layer_norm":
    # LayerStack's legacy mode: sublayer_legacy_rms_norm ("layer_norm") per
    # layer, sublayer_legacy_final_rms_norm ("final_layer_norm") at the end.
    lines += ["LayerStack.dropout_rate = %dropout_rate",
              "LayerStack.norm_epsilon = 1e-06"]
  else:
    lines += [
        "LayerStack.dropout_rate = None",
        "LayerStack.norm_epsilon = None",
        "LayerStack.sublayers_initial = [@transformer.sublayer_dropout]",
        "LayerStack.sublayers_per_layer = [@transformer.sublayer_rms_norm, "
        "@transformer.sublayer_call_layer, @transformer.sublayer_dropout, "
        "@transformer.sublayer_residual]",
        "LayerStack.sublayers_final = [@transformer.sublayer_rms_norm, "
        "@transformer.sublayer_dropout]",
        "transformer.sublayer_dropout.dropout_rate = %dropout_rate",
        "transformer.sublayer_rms_norm.epsilon = 1e-06"]
  return "\n".join(lines) + "\n"


def _no_dropout_bindings(config):
  """The gin parameters the fixture's (deterministic) steps rebind to 0."""
  names = ["SelfAttention.dropout_rate", "DenseReluDense.dropout_rate"]
  names.append("LayerStack.dropout_rate" if config["norm_names"] ==
               "layer_norm" else "transformer.sublayer_dropout.dropout_rate")
  return names


def _utils_block(config, batch):
  """The settings utils.run would carry, in gin syntax (utils.py is not
  imported by the fixture, so gin does not record them)."""
  c = config
  return "\n".join([
      "",
      "# Written by tests/compat/mesh_tf_t5.py, not by gin: Mesh TF's",
      "# transformer/utils.py is not imported; these are the values used.",
      "get_variable_dtype.master_dtype = %r" % c["master_dtype"],
      "get_variable_dtype.slice_dtype = 'float32'",
      "get_variable_dtype.activation_dtype = %r" % c["activation_dtype"],
      "run.batch_size = ('batch_size', %d)" % batch["inputs"].shape[0],
      "run.sequence_length = {'inputs': %d, 'targets': %d}"
      % (batch["inputs"].shape[1], batch["targets"].shape[1]),
      "run.optimizer = @optimize.AdafactorOptimizer",
      "run.autostack = False",
      "# The fixture's Adafactor steps rebind these to 0.0 (deterministic):",
      "# " + ", ".join(_no_dropout_bindings(c)),
      ""])


class _Model(object):
  """Mesh TF's graph for one config and batch shape: eval logits / losses,
  decode, the train-mode loss (dropout 0), its gradients and (make mode)
  Adafactor's update, lowered onto one device."""

  def __init__(self, config, batch_shapes, mtf, transformer, optimize, tf,
               gin, with_optimizer):
    c = self.config = config
    self.tf = tf
    gin.clear_config()
    gin.parse_config(gin_config(c))
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(c["seed"])
      self.global_step = tf.train.get_or_create_global_step()
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "my_mesh")
      self.inputs_ph = tf.placeholder(tf.int32, batch_shapes["inputs"],
                                      "inputs")
      self.targets_ph = tf.placeholder(tf.int32, batch_shapes["targets"],
                                       "targets")
      batch_dim = mtf.Dimension("batch", batch_shapes["inputs"][0])

      def feature(ph, name):   # as utils.py imports features
        shape = mtf.Shape([batch_dim, mtf.Dimension(
            "length", batch_shapes[name][1])])
        return mtf.import_fully_replicated(mesh, ph, shape, name=name)
      inputs = feature(self.inputs_ph, "inputs")
      targets = feature(self.targets_ph, "targets")
      vdtype = mtf.VariableDType(tf.as_dtype(c["master_dtype"]), tf.float32,
                                 tf.as_dtype(c["activation_dtype"]))
      model = transformer.make_bitransformer()
      logits, loss_eval = model.call_simple(
          inputs=inputs, targets=targets, compute_loss=True, mode="eval",
          variable_dtype=vdtype)
      decode = model.decode(inputs, variable_dtype=vdtype)
      logits32 = mtf.cast(logits, tf.float32)
      vocab_dim = logits32.shape.dims[-1]
      length_dim = logits32.shape.dims[-2]
      cross_entropy = mtf.layers.softmax_cross_entropy_with_logits(
          logits32, targets, vocab_dim)
      cross_entropy *= mtf.cast(mtf.greater(targets, 0), tf.float32)
      log_z = mtf.reduce_logsumexp(logits32, vocab_dim)
      scores = -mtf.reduce_sum(cross_entropy, reduced_dim=length_dim)
      optimizer = optimize.AdafactorOptimizer()
      self.operative_config = gin.operative_config_str()
      for name in _no_dropout_bindings(c):
        gin.bind_parameter(name, 0.0)
      step_model = transformer.make_bitransformer()
      _, loss_train = step_model.call_simple(
          inputs=inputs, targets=targets, compute_loss=True, mode="train",
          variable_dtype=vdtype)
      self.weights = list(mtf_graph.trainable_variables)
      grads = mtf.gradients([loss_train], [v.outputs[0] for v in self.weights])
      update_ops = (optimizer.apply_grads(grads, self.weights)
                    if with_optimizer else [])
      self.variables = list(mtf_graph.all_variables)
      mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
          mtf.convert_to_shape([]), mtf.convert_to_layout_rules([]), [""])
      lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl}, autostack=False)
      self.lowering = lowering
      export = lambda x: tf.cast(lowering.export_to_tf_tensor(x), tf.float32)  # noqa: E731
      self.outputs = {
          "logits": export(logits32), "loss_eval": export(loss_eval),
          "loss_train": export(loss_train),
          "cross_entropy": export(cross_entropy), "log_z": export(log_z),
          "scores": export(scores),
          "decode": lowering.export_to_tf_tensor(decode)}
      for v, g in zip(self.weights, grads):
        self.outputs["grad/" + v.name] = export(g)
      self.slices = {v.name: tf.cast(
          lowering.variables[v].laid_out_tensor.all_slices[0], tf.float32)
                     for v in self.variables}
      self.train_op = tf.group([lowering.lowered_operation(op)
                                for op in update_ops])
      # Read inside the step's Session.run: Adafactor's own tensors.
      self.learning_rate = tf.cast(optimizer._learning_rate, tf.float32)  # pylint: disable=protected-access
      self.decay_rate = tf.cast(optimizer._decay_rate, tf.float32)  # pylint: disable=protected-access
      # Mesh TF's utils.py groups this with the update ops without a
      # control dependency between them; here it runs after the update, so
      # the step's learning and decay rates are always those of step N.
      with tf.control_dependencies([self.train_op]):
        self.train_step = tf.assign_add(self.global_step, 1)
      self.copy_masters_to_slices = lowering.copy_masters_to_slices()
      self.copy_slices_to_masters = lowering.copy_slices_to_masters()
      self.init = tf.global_variables_initializer()
      # As Mesh TF's utils.py builds its Saver.
      self.saver = tf.train.Saver(
          tf.global_variables(), sharded=True, max_to_keep=10,
          keep_checkpoint_every_n_hours=2, defer_build=False,
          save_relative_paths=True)
      self.global_variable_names = sorted(
          v.op.name for v in tf.global_variables())

  def session(self):
    tf = self.tf
    return tf.Session(graph=self.graph, config=tf.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2))

  def feed(self, batch):
    return {self.inputs_ph: batch["inputs"], self.targets_ph: batch["targets"]}

  def restore(self, sess, prefix):
    """Mesh TF's restore: the Saver, then MtfRestoreHook's copy."""
    self.saver.restore(sess, prefix)
    sess.run(self.copy_masters_to_slices)

  def save(self, sess, prefix, step):
    """Mesh TF's save: MtfCheckpointSaverListener's copy, then the Saver."""
    sess.run(self.copy_slices_to_masters)
    return self.saver.save(sess, prefix, global_step=step)


def _restore_failure(tf, model, checkpoint, error):
  """One paragraph on why Mesh TF's Saver could not restore a checkpoint:
  the graph's variables it lacks or holds with another shape / dtype."""
  lines = ["mesh_tf_t5: Mesh TF's Saver could not restore %s into the %s "
           "model (%s)" % (checkpoint, model.config["variant"],
                           str(error.message).splitlines()[0][:300])]
  try:
    table = _checkpoint_table(tf, checkpoint)
  except tf.errors.OpError:
    return "\n".join(lines + ["  not a readable checkpoint prefix"])
  with model.graph.as_default():
    for v in tf.global_variables():
      name, shape = v.op.name, v.shape.as_list()
      dtype = v.dtype.base_dtype.name
      if name not in table:
        lines.append("  missing: %s %s %s" % (name, shape, dtype))
      elif table[name] != [shape, dtype]:
        lines.append("  differs: %s graph %s %s, checkpoint %s %s"
                     % (name, shape, dtype, table[name][0], table[name][1]))
  return "\n".join(lines[:40])


def _checkpoint_table(tf, prefix):
  reader = tf.train.NewCheckpointReader(prefix)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  return {n: [list(shapes[n]), dtypes[n].name] for n in sorted(shapes)}


def _write_npz(path, arrays):
  np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})


def _read_batch(path):
  """int32 inputs [B, Li] and targets [B, Lt] from an .npz; a missing or
  misshaped array exits with one line naming the file and the array."""
  with np.load(path) as z:
    missing = [k for k in ("inputs", "targets") if k not in z.files]
    if missing:
      sys.exit("mesh_tf_t5: batch file %s lacks %s (it has %s); it needs "
               "int32 'inputs' [batch, inputs_length] and 'targets' [batch, "
               "targets_length]" % (path, missing, z.files))
    batch = {k: z[k] for k in ("inputs", "targets")}
  for k, v in batch.items():
    if v.ndim != 2 or v.shape[0] != batch["inputs"].shape[0]:
      sys.exit("mesh_tf_t5: batch file %s: %s has shape %s; inputs and "
               "targets need shape [batch, length] with the same batch"
               % (path, k, list(v.shape)))
  return {k: v.astype(np.int32) for k, v in batch.items()}


def _child_main(argv):
  start = time.time()
  parser = argparse.ArgumentParser()
  parser.add_argument("mode", choices=["make", "score"])
  parser.add_argument("--config", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--checkpoint")
  parser.add_argument("--batch")
  args = parser.parse_args(argv)
  config = json.loads(args.config)
  out = args.out
  os.makedirs(out, exist_ok=True)
  files = {k: os.path.join(out, v) for k, v in (
      ("batch", "batch.npz"), ("reference", "reference.npz"),
      ("step", "step.npz"), ("operative_config", "operative_config.gin"),
      ("manifest", "manifest.json"))}
  if args.mode == "make":
    batch = fixed_batch(config)
    _write_npz(files["batch"], batch)
  else:   # read before TF starts: a bad batch file fails in a second
    batch = _read_batch(args.batch)
    files["batch"] = args.batch
    del files["step"]
  imports = _load_imports_module()
  imports.block_meshtf()
  import gin  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.disable_v2_behavior()
  # Resource variables (as TPU / XLA execution and TF 2 have). With TF1's
  # ref variables a Mesh TF step on CPU is racy: an Assign overwrites a
  # weight's buffer in place while backward ops of the same Session.run
  # still read it (measured here: every gradient ~1% off when fetched with
  # the update, none when fetched alone). Names, dtypes and checkpoints are
  # the same either way.
  tf.enable_resource_variables()
  tf.logging.set_verbosity(tf.logging.ERROR)
  mtf, transformer, _, optimize = imports.import_mesh_tf()
  imported = time.time()
  shapes = {k: list(v.shape) for k, v in batch.items()}
  model = _Model(config, shapes, mtf, transformer, optimize, tf, gin,
                 with_optimizer=(args.mode == "make"))
  built = time.time()
  with open(files["operative_config"], "w") as f:
    f.write(model.operative_config + _utils_block(config, batch))
  manifest = {
      "mode": args.mode, "config": config, "dir": out, "files": files,
      "batch_shapes": shapes,
      "mesh_tensorflow_file": mtf.__file__,
      "tensorflow_version": tf.__version__,
      "meshtf_blocked": sys.modules.get("meshtf", "absent") is None,
      "global_variables": model.global_variable_names,
      "no_dropout_bindings": _no_dropout_bindings(config)}
  feed = model.feed(batch)
  step = config["step"]
  if args.mode == "make":
    prefix = os.path.join(out, "model.ckpt")
    with model.session() as sess:
      sess.run(model.init)
      sess.run(model.copy_masters_to_slices)
      sess.run(model.global_step.assign(step - config["warmup_steps"]))
      for _ in range(config["warmup_steps"]):
        sess.run(model.train_step, feed)
      checkpoint = model.save(sess, prefix, step)
  else:
    checkpoint = args.checkpoint
  with model.session() as sess:   # a fresh Session: what a user restores
    try:
      model.restore(sess, checkpoint)
    except tf.errors.OpError as e:
      sys.exit(_restore_failure(tf, model, checkpoint, e))
    restored_step = int(sess.run(model.global_step))
    outputs = sess.run(model.outputs, feed)
    outputs["decode_clean"] = clean_decodes(outputs["decode"])
    _write_npz(files["reference"], outputs)
    top2 = np.sort(outputs["logits"], axis=-1)[..., -2:]
    manifest.update(
        # How far float rounding is from flipping an argmax of these logits.
        logits_top2_margin_min=float(np.min(
            (top2[..., 1] - top2[..., 0])[batch["targets"] > 0])),
        checkpoint=checkpoint, restored_step=restored_step,
        losses={k: float(outputs[k]) for k in ("loss_eval", "loss_train")},
        checkpoint_variables={checkpoint: _checkpoint_table(tf, checkpoint)})
    if args.mode == "make":
      before = sess.run(model.slices)
      _, lr, decay, loss = sess.run(
          [model.train_step, model.learning_rate, model.decay_rate,
           model.outputs["loss_train"]], feed)
      after = sess.run(model.slices)
      checkpoint_after = model.save(sess, prefix, step + 1)
      arrays = {"before/" + k: v for k, v in before.items()}
      arrays.update({"after/" + k: v for k, v in after.items()})
      _write_npz(files["step"], arrays)
      manifest["checkpoint_after"] = checkpoint_after
      manifest["checkpoint_variables"][checkpoint_after] = _checkpoint_table(
          tf, checkpoint_after)
      manifest["optimizer"] = {
          "name": "mesh_tensorflow.optimize.AdafactorOptimizer",
          "step": step, "learning_rate": float(lr), "decay_rate": float(decay),
          "loss_at_step": float(loss),
          "learning_rate_rule": ("min(rsqrt(step + 1), 0.01) (Adafactor's "
                                 "default)" if config["learning_rate"] is None
                                 else "constant"),
          "decay_rate_rule": "1 - (step + 1) ** -%r" % config["decay_exponent"],
          "epsilon1": 1e-30, "epsilon2": 1e-3,
          "slots": sorted(v.name for v in model.variables
                          if "_slot_" in v.name)}
  manifest["seconds"] = {"import": round(imported - start, 2),
                         "build": round(built - imported, 2),
                         "total": round(time.time() - start, 2)}
  with open(files["manifest"], "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  print(json.dumps({"ok": True, "seconds": manifest["seconds"]}))


if __name__ == "__main__":
  _child_main(sys.argv[1:])
