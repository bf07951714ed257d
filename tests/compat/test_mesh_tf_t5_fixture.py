"""The T5 fixture (tests/compat/mesh_tf_t5.py) is what it claims, checked
without meshtf: Mesh TF 0.1.21's own code wrote checkpoints with T5's names,
combined heads*d_kv shapes, dtypes and Adafactor slot shapes (derived here
from tests/compat's reading of T5-MIGRATION.md, not from the fixture), its
losses follow the documented definition, its Adafactor step follows
Adafactor's rule (re-derived in numpy, which pins the factoring tie order),
and `score` restores a checkpoint into Mesh TF and reproduces the outputs.
Three Mesh TF child processes: two makes in parallel (none when the shared
cache has them) and one score, plus a child that fails in a second."""
import concurrent.futures
import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mesh_tf_t5  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.skipif(
    not mesh_tf_t5.mesh_tf_installed(),
    reason="mesh-tensorflow 0.1.21 is not installed (pip install -e "
           "'.[test]' installs it)")

SPECS = {"t5.1.1": ("t5.1.1", "rms_norm", "bfloat16"),
         "t5.1.0": ("t5.1.0", "layer_norm", "float32")}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
  work = tmp_path_factory.mktemp("mesh_tf_t5")   # for the scores
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    # The makes go to the shared default_workdir(): made once per machine,
    # reused by the meshtf-side tests.
    futures = {k: pool.submit(mesh_tf_t5.make_fixture, None, *spec)
               for k, spec in SPECS.items()}
    made = {k: f.result() for k, f in futures.items()}
  return work, made


def _arrays(path):
  with np.load(path) as z:
    return {k: z[k] for k in z.files}


def _checkpoint(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {n: reader.get_tensor(n)
          for n in reader.get_variable_to_shape_map()}


def expected_weights(config):
  """{name: named dims [(dim name, size)]} of T5's Mesh TF checkpoint."""
  c = config
  d = ("d_model", c["d_model"])
  heads = ("heads", c["num_heads"] * c["d_kv"])   # combined heads * d_kv
  vocab = ("vocab", -(-c["vocab_size"] // 128) * 128)
  ff = ("d_ff", c["d_ff"])
  legacy = c["norm_names"] == "layer_norm"
  norm, final = (("layer_norm", "final_layer_norm") if legacy
                 else ("rms_norm", "rms_norm"))
  out = {"shared/embedding": [vocab, d]}
  stacks = {"encoder": ["SelfAttention", "DenseReluDense"],
            "decoder": ["SelfAttention", "EncDecAttention", "DenseReluDense"]}
  for stack, kinds in stacks.items():
    for block in range(c["num_layers"]):
      for i, kind in enumerate(kinds):
        p = "%s/block_%03d/layer_%03d" % (stack, block, i)
        out[p + "/%s/scale" % norm] = [d]
        if kind == "DenseReluDense":
          gated = isinstance(c["activation"], list)
          for wi in (["wi_0", "wi_1"] if gated else ["wi"]):
            out["%s/DenseReluDense/%s/kernel" % (p, wi)] = [d, ff]
          out[p + "/DenseReluDense/wo/kernel"] = [ff, d]
          continue
        for w in "qkv":
          out["%s/%s/%s" % (p, kind, w)] = [d, heads]
        out["%s/%s/o" % (p, kind)] = [heads, d]
        if kind == "SelfAttention" and (
            block == 0 or c["relative_attention"] == "bias"):
          out[p + "/SelfAttention/relative_attention_bias"] = [
              ("heads", c["num_heads"]), ("buckets", 32)]
    out["%s/%s/scale" % (stack, final)] = [d]
  if not c["tied_logits"]:
    out["decoder/logits/kernel"] = [d, vocab]
  return out


def factored_dims(dims, min_size):
  """Adafactor's rule: the two largest dims (stable sort: ties keep
  declaration order) if the second is >= min_size, else None."""
  if len(dims) < 2:
    return None
  ranked = sorted(dims, key=lambda nd: -nd[1])
  return ranked[:2] if ranked[1][1] >= min_size else None


def expected_slots(weights, min_size):
  out = {}
  for name, dims in weights.items():
    f = factored_dims(dims, min_size)
    if f:
      out[name + "_slot_vr"] = [nd for nd in dims if nd != f[0]]
      out[name + "_slot_vc"] = [nd for nd in dims if nd != f[1]]
    else:
      out[name + "_slot_v"] = dims
  return out


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_checkpoints_have_t5s_names_shapes_and_dtypes(fixtures, variant):
  fx = fixtures[1][variant]
  c = fx["config"]
  weights = expected_weights(c)
  slots = expected_slots(weights, c["min_dim_size_to_factor"])
  expected = {n: ([s for _, s in dims], c["master_dtype"])
              for n, dims in weights.items()}
  expected.update({n: ([s for _, s in dims], "float32")
                   for n, dims in slots.items()})
  expected["global_step"] = ([], "int64")
  for prefix in (fx["checkpoint"], fx["checkpoint_after"]):
    table = {n: tuple(v) for n, v in fx["checkpoint_variables"][prefix].items()}
    assert table == {n: tuple(v) for n, v in expected.items()}, prefix
    # ... and the files say so (read by TF's reader, not the child).
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_variable_to_shape_map() == {
        n: s for n, (s, _) in expected.items()}
    assert {n: d.name for n, d in reader.get_variable_to_dtype_map().items()
            } == {n: d for n, (_, d) in expected.items()}
  # The shared relative bias lives in block_000 of each stack only.
  biases = sorted(n for n in weights if "relative_attention_bias" in n)
  assert biases == ["decoder/block_000/layer_000/SelfAttention/"
                    "relative_attention_bias",
                    "encoder/block_000/layer_000/SelfAttention/"
                    "relative_attention_bias"]
  # Some weights keep an unfactored slot, most are factored.
  kinds = {n.rsplit("_slot_", 1)[1] for n in slots}
  assert kinds == {"v", "vr", "vc"}
  names = sorted(os.listdir(fx["dir"]))
  step = c["step"]
  for s in (step, step + 1):
    for suffix in ("index", "meta", "data-00000-of-00002",
                   "data-00001-of-00002"):
      assert "model.ckpt-%d.%s" % (s, suffix) in names
  with open(os.path.join(fx["dir"], "checkpoint")) as f:
    text = f.read()
  assert 'model_checkpoint_path: "model.ckpt-%d"' % (step + 1) in text


def test_the_child_ran_mesh_tfs_own_code_configured_as_t5(fixtures):
  made = fixtures[1]
  for fx in made.values():
    assert fx["meshtf_blocked"] is True
    assert fx["mesh_tensorflow_file"].endswith(
        os.path.join("site-packages", "mesh_tensorflow", "__init__.py"))
    assert fx["restored_step"] == fx["config"]["step"]
  with open(made["t5.1.1"]["files"]["operative_config"]) as f:
    v11 = f.read()
  with open(made["t5.1.0"]["files"]["operative_config"]) as f:
    v10 = f.read()
  assert "encoder/DenseReluDense.activation = ['gelu', 'linear']" in v11
  assert "LayerStack.sublayers_per_layer" in v11
  assert "get_variable_dtype.master_dtype = 'bfloat16'" in v11
  assert "encoder/DenseReluDense.activation = 'relu'" in v10
  assert "dropout_rate = 0.1" in v10
  assert "decoder/LayerStack.norm_epsilon = 1e-06" in v10
  assert ("decoder/Unitransformer.shared_embedding_and_softmax_weights = True"
          in v10)
  assert "SelfAttention.relative_attention_type = 'bias_shared'" in v10


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_losses_follow_the_documented_definition(fixtures, variant):
  fx = fixtures[1][variant]
  c = fx["config"]
  ref = _arrays(fx["files"]["reference"])
  targets = _arrays(fx["files"]["batch"])["targets"]
  logits = ref["logits"].astype(np.float64)
  mask = targets > 0
  assert np.isfinite(logits).all()
  assert (logits[~mask] == 0).all()          # padding zeroed, no logit bias
  log_z = np.log(np.exp(logits).sum(-1))
  ce = (log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0])
  np.testing.assert_allclose(ref["cross_entropy"], ce * mask, atol=2e-5)
  np.testing.assert_allclose(ref["log_z"], log_z, atol=2e-5)
  np.testing.assert_allclose(ref["scores"], -(ce * mask).sum(-1), rtol=1e-5)
  denominator = targets.size                 # padding included
  loss_eval = (ce * mask).sum() / denominator
  loss_train = ((ce + c["z_loss"] * log_z ** 2) * mask).sum() / denominator
  assert np.isfinite([ref["loss_eval"], ref["loss_train"]]).all()
  np.testing.assert_allclose(ref["loss_eval"], loss_eval, rtol=1e-5)
  np.testing.assert_allclose(ref["loss_train"], loss_train, rtol=1e-5)
  assert fx["optimizer"]["loss_at_step"] == pytest.approx(
      float(ref["loss_train"]), rel=1e-6)


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_decode_has_the_batchs_shape(fixtures, variant):
  fx = fixtures[1][variant]
  ref = _arrays(fx["files"]["reference"])
  inputs = _arrays(fx["files"]["batch"])["inputs"]
  decode = ref["decode"]
  assert decode.shape == inputs.shape and decode.dtype == np.int32
  assert decode.min() >= 0 and decode.max() < 128
  assert len(set(decode.ravel().tolist())) > 4      # not one repeated id
  np.testing.assert_array_equal(ref["decode_clean"],
                                mesh_tf_t5.clean_decodes(decode))


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_the_adafactor_step_follows_adafactors_rule(fixtures, variant):
  fx = fixtures[1][variant]
  c, opt = fx["config"], fx["optimizer"]
  lr, decay = opt["learning_rate"], opt["decay_rate"]
  assert lr == pytest.approx(min((c["step"] + 1) ** -0.5, 0.01))
  assert decay == pytest.approx(1 - (c["step"] + 1) ** -0.8, rel=1e-6)
  step = _arrays(fx["files"]["step"])
  grads = _arrays(fx["files"]["reference"])
  weights = expected_weights(c)
  factored = 0
  for name, dims in weights.items():
    g = grads["grad/" + name].astype(np.float64)
    w0 = step["before/" + name].astype(np.float64)
    g2 = g * g + 1e-30
    f = factored_dims(dims, c["min_dim_size_to_factor"])
    if f:
      factored += 1
      axis0, axis1 = dims.index(f[0]), dims.index(f[1])
      vr = (decay * step["before/%s_slot_vr" % name]
            + (1 - decay) * g2.mean(axis0))
      vc = (decay * step["before/%s_slot_vc" % name]
            + (1 - decay) * g2.mean(axis1))
      np.testing.assert_allclose(step["after/%s_slot_vr" % name], vr,
                                 rtol=2e-5, err_msg=name)
      np.testing.assert_allclose(step["after/%s_slot_vc" % name], vc,
                                 rtol=2e-5, err_msg=name)
      # vr lacks dim f[0]; its mean over f[1] is the long-term mean.
      axis1_in_vr = [nd for nd in dims if nd != f[0]].index(f[1])
      r = 1 / np.sqrt(vr / vr.mean(axis1_in_vr, keepdims=True))
      x = g * np.expand_dims(r, axis0) * np.expand_dims(1 / np.sqrt(vc), axis1)
    else:
      v = decay * step["before/%s_slot_v" % name] + (1 - decay) * g2
      np.testing.assert_allclose(step["after/%s_slot_v" % name], v,
                                 rtol=2e-5, err_msg=name)
      x = g / np.sqrt(v)
    x /= max(1.0, np.sqrt((x * x).mean()) / c["clipping_threshold"])
    scale = max(np.sqrt((w0 * w0).mean()), 1e-3) * lr
    w1 = w0 - x * scale
    np.testing.assert_allclose(step["after/" + name], w1, rtol=1e-4,
                               atol=1e-4 * scale, err_msg=name)
    assert (step["after/" + name] != step["before/" + name]).any(), name
  assert 0 < factored < len(weights)


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_checkpoints_hold_the_state_before_and_after_the_step(fixtures,
                                                              variant):
  fx = fixtures[1][variant]
  c = fx["config"]
  step = _arrays(fx["files"]["step"])
  before, after = (_checkpoint(fx["checkpoint"]),
                   _checkpoint(fx["checkpoint_after"]))
  assert int(before["global_step"]) == c["step"]
  assert int(after["global_step"]) == c["step"] + 1
  master = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[
      c["master_dtype"]]
  for name in before:
    if name == "global_step":
      continue
    np.testing.assert_array_equal(before[name].astype(np.float32),
                                  step["before/" + name], err_msg=name)
    # model.ckpt-(N+1) = the float32 slices after the step, cast (rounded
    # to nearest even for bfloat16) to the master dtype; slots are float32.
    slot = "_slot_" in name
    np.testing.assert_array_equal(
        after[name], step["after/" + name].astype(np.float32 if slot
                                                  else master), err_msg=name)
    assert after[name].dtype == (np.float32 if slot else master), name
    if slot:                    # the warm-up steps left non-zero slots
      assert (before[name] > 0).all(), name
    else:
      assert (after[name] != before[name]).any(), name


def test_score_restores_a_checkpoint_into_mesh_tf(fixtures, tmp_path):
  work, made = fixtures
  fx = made["t5.1.0"]
  scored = mesh_tf_t5.score_checkpoint(work, fx["checkpoint"],
                                       fx["files"]["batch"], **fx["config"])
  # A fresh Mesh TF process restoring model.ckpt-N gives make's outputs.
  ref = _arrays(fx["files"]["reference"])
  assert sorted(scored["outputs"]) == sorted(ref)
  for k, v in ref.items():
    np.testing.assert_allclose(scored["outputs"][k], v, rtol=1e-6,
                               atol=1e-6, err_msg=k)
  np.testing.assert_array_equal(scored["outputs"]["decode"], ref["decode"])
  assert scored["manifest"]["restored_step"] == fx["config"]["step"]
  assert scored["manifest"]["meshtf_blocked"] is True
  # A failing child raises with its stderr's tail (here: one line, before
  # TensorFlow starts).
  bad = tmp_path / "bad_batch.npz"
  np.savez(bad, inputs=np.ones((2, 4), np.int32))
  with pytest.raises(RuntimeError, match=r"lacks \['targets'\]"):
    mesh_tf_t5.score_checkpoint(work, fx["checkpoint"], str(bad),
                                **fx["config"])


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="unknown config field.*d_modle"):
    mesh_tf_t5.resolve_config(d_modle=32)
  with pytest.raises(ValueError, match="norm_names='rmsnorm'"):
    mesh_tf_t5.resolve_config("t5.1.1", "rmsnorm")
  assert json.loads(json.dumps(mesh_tf_t5.resolve_config())) == (
      mesh_tf_t5.resolve_config())


def test_prune_stale_keeps_this_codes_fixtures_and_locked_ones(tmp_path):
  import doctest  # pylint: disable=g-import-not-at-top
  import fcntl  # pylint: disable=g-import-not-at-top
  assert doctest.run_docstring_examples(
      mesh_tf_t5.prune_stale, {"os": os}, optionflags=doctest.ELLIPSIS) is None
  code = "c0de" * 2
  names = {"t5.1.1-%s-%s" % ("1" * 12, code): "kept (this code)",
           "t5.1.0-%s-%s" % ("2" * 12, "0" * 8): "removed (other code)",
           "t5.1.0-%s" % ("3" * 12): "removed (name without a code digest)",
           "t5.1.1-%s-%s" % ("4" * 12, "f" * 8): "kept (locked by a reader)",
           "scores": "kept (not a fixture)"}
  for name in names:
    os.makedirs(tmp_path / name)
  with open(str(tmp_path / ("t5.1.1-%s-%s.lock" % ("4" * 12, "f" * 8))),
            "w") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    removed = mesh_tf_t5.prune_stale(str(tmp_path), code)
  assert removed == sorted(n for n, why in names.items()
                           if why.startswith("removed"))
  left = {n for n in os.listdir(tmp_path) if not n.endswith(".lock")}
  assert left == {n for n, why in names.items() if why.startswith("kept")}
