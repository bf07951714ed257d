"""meshtf's own T5 against Mesh TensorFlow 0.1.21's: checkpoints that Mesh
TF's code wrote (tests/compat/mesh_tf_t5.py; a T5.1.1-shaped one with the
current norm names in bfloat16, a T5.1.0-shaped one with the legacy names
in float32; one shared relative bias table per stack) restore into the
model t2t_configs/t5.py builds, through --config.init_checkpoint's code
(meshtf/train/init_checkpoint.py), and then:
  * the eval logits and loss are Mesh TF's on the fixture's batch, to float
    rounding, on one device and on two 2-D layouts (one on each backend);
  * greedy decoding gives Mesh TF's tokens;
  * one Adafactor step from the restored slots gives Mesh TF's next weights
    and slots;
  * the weights after that step, exported as a Mesh TF checkpoint
    (mesh_tf_checkpoint.write), restore in Mesh TF's own model (its Saver)
    with the logits meshtf computes from them.
"""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import adafactor
from meshtf.models import training
from meshtf.models import transformer
from meshtf.train import config as config_lib
from meshtf.train import experiment
from meshtf.train import init_checkpoint
from meshtf.train import mesh_tf_checkpoint as mtf_ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mesh_tf_t5  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.skipif(
    not mesh_tf_t5.mesh_tf_installed(),
    reason="mesh-tensorflow 0.1.21 is not installed (pip install -e "
           "'.[test]' installs it)")

T5 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "t2t_configs", "t5.py")
SPECS = {"t5.1.1": ("t5.1.1", "rms_norm", "bfloat16"),
         "t5.1.0": ("t5.1.0", "layer_norm", "float32")}
TWO_D = [("rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
         ("rows:2;cols:2", "d_model:rows;d_kv:cols;buckets:rows")]


def _meshtf_config(fx):
  """t2t_configs/t5.py's config of the fixture's size."""
  f = fx["config"]
  c = config_lib.load_file(T5, f["variant"] + "_tiny")
  c.update(dict(
      vocab_size=f["vocab_size"], vocab_divisor=f["vocab_divisor"],
      d_model=f["d_model"], num_heads=f["num_heads"], d_kv=f["d_kv"],
      d_ff=f["d_ff"], num_layers=f["num_layers"],
      num_decoder_layers=f["num_layers"], batch_size=f["batch_size"],
      length=f["targets_length"], dropout_rate=0.0, z_loss=f["z_loss"],
      adafactor_min_dim_size_to_factor=f["min_dim_size_to_factor"],
      init_checkpoint=fx["checkpoint"], init_optimizer=True,
      mesh_shape="all:1", layout=""))
  return c


@pytest.fixture(scope="module", params=sorted(SPECS))
def case(request):
  fx = mesh_tf_t5.make_fixture(None, *SPECS[request.param])
  config = _meshtf_config(fx)
  graph, _ = experiment.build_training_graph(config)
  model = experiment.build_model(config)
  plan = init_checkpoint.plan_restore(config, graph, model)
  with np.load(fx["files"]["batch"]) as z:
    batch = {k: z[k] for k in z.files}
  with np.load(fx["files"]["reference"]) as z:
    reference = {k: z[k] for k in z.files}
  return dict(name=request.param, fx=fx, config=config, model=model,
              plan=plan, batch=batch, reference=reference)


def _features(mesh, batch):
  return {k: mtf.import_tf_tensor(
      mesh, tf.constant(v), "batch:%d;length:%d" % v.shape, name=k)
          for k, v in batch.items()}


def _impl(mesh_shape, layout, backend):
  return harness.make_impl(backend, mesh_shape, layout)


def _eval(case, mesh_shape="all:1", layout="", backend="simd", store=None):
  """meshtf's eval logits, loss and greedy decode of the fixture's batch
  from the restored checkpoint (or the given store)."""
  graph = mtf.Graph(seed=0)
  mesh = mtf.Mesh(graph, "mesh")
  feats = _features(mesh, case["batch"])
  logits, loss, _ = transformer.compute_logits_loss_metrics(
      case["model"], feats, mode="eval")
  decode = case["model"].decode(
      feats["inputs"], max_decode_length=case["batch"]["inputs"].shape[1])
  if store is None:
    store = mtf.VariableStore()
    case["plan"].restore_into(store)
  lowering = mtf.Lowering(graph, {mesh: _impl(mesh_shape, layout, backend)},
                          variable_store=store)
  return {k: lowering.export_to_tf_tensor(t).numpy()
          for k, t in (("logits", logits), ("loss", loss),
                       ("decode", decode))}


def test_the_restore_is_complete(case):
  plan = case["plan"]
  entries = case["fx"]["checkpoint_variables"][case["fx"]["checkpoint"]]
  weights = [n for n in entries if "_slot_" not in n and n != "global_step"]
  assert plan.weights == [len(weights), len(weights)]
  assert plan.slots == [len(entries) - len(weights) - 1] * 2
  assert not plan.missing and not plan.missing_slots and not plan.unused
  assert plan.step == case["fx"]["config"]["step"]
  converted = dict(plan.conversions)
  if case["fx"]["config"]["master_dtype"] == "bfloat16":
    assert converted == {("bfloat16", "float32"): plan.weights[0]}
  else:
    assert not converted


def test_logits_loss_and_decode_are_mesh_tfs_on_every_layout(case):
  ref = case["reference"]
  # Each 2-D layout on one backend, the other backend for the other (the
  # harness runs every op and layer on both).
  runs = [("all:1", "", "simd")]
  if case["name"] == "t5.1.1":
    runs += [TWO_D[0] + ("simd",), TWO_D[1] + ("placement",)]
  else:
    runs += [TWO_D[0] + ("placement",)]
  weights = (case["batch"]["targets"] > 0)[..., None]
  for mesh_shape, layout, backend in runs:
    got = _eval(case, mesh_shape, layout, backend)
    where = "%s %s %s" % (mesh_shape, layout, backend)
    # Mesh TF zeroes padding after the final norm, so its padded positions'
    # logits are 0; meshtf's equal them there too (mask_padding).
    np.testing.assert_allclose(got["logits"] * weights, ref["logits"],
                               rtol=1e-4, atol=2e-5, err_msg=where)
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-4,
                               atol=2e-5, err_msg=where)
    np.testing.assert_allclose(got["loss"], ref["loss_eval"], rtol=1e-5,
                               err_msg=where)
    np.testing.assert_array_equal(got["decode"], ref["decode_clean"],
                                  err_msg=where)


def _adafactor_step(case, mesh_shape="all:1", layout="", backend="simd"):
  """One TrainStep of meshtf's Adafactor (Mesh TF's defaults: learning rate
  min(rsqrt(step + 1), 0.01), decay 1 - (step + 1)^-0.8, parameter scale,
  clipping 1) from the restored weights, slots and step; the store after."""
  f = case["fx"]["config"]
  optimizer = adafactor.AdafactorOptimizer(
      min_dim_size_to_factor=f["min_dim_size_to_factor"],
      factor_dims_together=[("heads", "d_kv")])
  store = mtf.VariableStore()
  case["plan"].restore_into(store)

  def loss_fn(mesh, features, step=None):
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        case["model"], transformer.import_features(mesh, features), "train",
        step)
    return loss, metrics
  step = training.TrainStep(loss_fn, _impl(mesh_shape, layout, backend),
                            optimizer, variable_store=store, seed=0)
  loss = step(case["batch"])["loss"]
  return store, float(loss)


def test_one_adafactor_step_gives_mesh_tfs_next_weights(case, tmp_path):
  with np.load(case["fx"]["files"]["step"]) as z:
    after = {k[len("after/"):]: z[k] for k in z.files
             if k.startswith("after/")}
  names = mtf_ckpt.NameMap(case["model"], "adafactor")
  store, loss = _adafactor_step(case)
  np.testing.assert_allclose(loss, case["reference"]["loss_train"],
                             rtol=1e-5)
  compared = 0
  for name in store.names():
    if name == "global_step":
      assert int(store.full_value(name)) == case["fx"]["config"]["step"] + 1
      continue
    theirs = [c for c in names.candidates(name) if c in after]
    assert theirs, name
    want = after[theirs[0]]
    got = store.full_value(name).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6,
                               err_msg=name)
    compared += 1
  assert compared == len(after)
  # The way back: the stepped weights as a Mesh TF checkpoint (float32),
  # restored by Mesh TF's own model, give the logits meshtf computes.
  if case["name"] != "t5.1.1":
    return
  graph, _ = experiment.build_training_graph(case["config"])
  shapes = {v.name: [(d.name, d.size) for d in v.shape.dims]
            for v in graph.all_variables}
  values = {n: store.full_value(n) for n in store.names()}
  prefix = mtf_ckpt.write(
      str(tmp_path / "exported"), case["fx"]["config"]["step"] + 1,
      mtf_ckpt.to_mesh_tf_tensors(
          values, shapes, names, {v.name for v in graph.trainable_variables},
          tf.float32))
  scored = mesh_tf_t5.score_checkpoint(
      tmp_path, prefix, case["fx"]["files"]["batch"],
      **dict(case["fx"]["config"], master_dtype="float32"))["outputs"]
  ours = _eval(case, store=_restored_store(values))
  np.testing.assert_allclose(ours["logits"], scored["logits"], rtol=1e-4,
                             atol=2e-5)
  np.testing.assert_array_equal(ours["decode"], scored["decode_clean"])


def _restored_store(values):
  store = mtf.VariableStore()
  store.restore_values(values)
  return store


# --- the binary: fine-tune a Mesh TF checkpoint on a TSV task -----------------
def _vocab_and_tsv(directory):
  """A sentencepiece model of 20 pieces (+ 100 extra ids: the fixture's 120
  ids) and a TSV of pairs, each pair long enough to fill its own row."""
  import sentencepiece as spm
  rs = np.random.RandomState(0)

  def words(n):
    return " ".join("".join(rs.choice(list("abcdefgh"), rs.randint(2, 5)))
                    for _ in range(n))
  corpus = os.path.join(directory, "corpus.txt")
  with open(corpus, "w") as f:
    f.write("".join(words(6) + "\n" for _ in range(300)))
  spm.SentencePieceTrainer.train(
      input=corpus, model_prefix=os.path.join(directory, "spm"),
      vocab_size=20, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      model_type="unigram", minloglevel=2)
  tsv = os.path.join(directory, "train.tsv")
  with open(tsv, "w") as f:
    f.write("".join("%s\t%s\n" % (words(4), words(4)) for _ in range(64)))
  return os.path.join(directory, "spm.model"), tsv


def _binary_config(fx, vocab, tsv, finetune_steps):
  c = _meshtf_config(fx)
  c.update(dict(vocab_size=120, mesh_shape="data:2;model:2",
                layout="batch:data;heads:model;d_ff:model;vocab:model",
                finetune_steps=finetune_steps, eval_every=0, eval_steps=1,
                log_every=1, checkpoint_every=2))
  c.task.data_files, c.task.seq2seq = tsv, True
  c.task.vocab_file, c.task.extra_ids = vocab, 100
  return c


def _fine_tune(fx, vocab, tsv, model_dir, finetune_steps):
  import io
  from meshtf.train import main
  out = io.StringIO()
  main.run(_binary_config(fx, vocab, tsv, finetune_steps), "train",
           model_dir, out=out, progress=False)
  with open(os.path.join(model_dir, main.METRICS_FILE)) as f:
    losses = {r["step"]: r["loss"] for r in map(__import__("json").loads, f)}
  return losses, out.getvalue()


def test_the_binary_fine_tunes_a_mesh_tf_checkpoint_on_a_tsv(tmp_path):
  """The binary on a TSV task with its sentencepiece file and T5's 100
  extra ids, from the T5.1.1 fixture: the header's restore block, the first
  step's loss is the one Mesh TF's own model computes on that step's batch,
  and a fine-tune resumed half way repeats the uninterrupted one."""
  fx = mesh_tf_t5.make_fixture(None, *SPECS["t5.1.1"])
  vocab, tsv = _vocab_and_tsv(str(tmp_path))
  first = str(tmp_path / "ft")
  losses, header = _fine_tune(fx, vocab, tsv, first, 2)
  step = fx["config"]["step"]
  assert sorted(losses) == [step, step + 1]
  assert "init_checkpoint: %s (Mesh TF), step %d" % (fx["checkpoint"],
                                                      step) in header
  assert "  restored 52 of 52 weights, 90 of 90 optimizer slots, the step" \
      in header
  assert "vocabulary 120 ids (100 extra ids): vocabulary file %s" % vocab \
      in header
  assert "input:" not in header   # a fine-tune's data starts at its start
  # The batch of the first step, as the binary read it: one example a row.
  config = _binary_config(fx, vocab, tsv, 2)
  data = experiment.make_data(config, first)
  data.restore_train(None, step)
  batch = data.train_batch(step)
  assert batch["inputs_segmentation"].max() == 1 == batch[
      "targets_segmentation"].max()
  path = str(tmp_path / "batch.npz")
  np.savez(path, inputs=batch["inputs"], targets=batch["targets"])
  theirs = mesh_tf_t5.score_checkpoint(
      tmp_path, fx["checkpoint"], path,
      **dict(fx["config"], inputs_length=config.length))["outputs"]
  np.testing.assert_allclose(losses[step], theirs["loss_train"], rtol=1e-5)
  # Resumed from ckpt-(step + 2): the uninterrupted fine-tune's losses.
  resumed, header = _fine_tune(fx, vocab, tsv, first, 4)
  assert "resumed from step %d" % (step + 2) in header
  straight, _ = _fine_tune(fx, vocab, tsv, str(tmp_path / "straight"), 4)
  assert [resumed[step + 2], resumed[step + 3]] == [
      straight[step + 2], straight[step + 3]]
