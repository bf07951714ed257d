"""Mesh TF checkpoints in and out (meshtf/train/mesh_tf_checkpoint.py,
init_checkpoint.py), without Mesh TF: tests/compat/test_mesh_tf_t5.py
checks the same against Mesh TF 0.1.21's own code.

A tiny T5.1.1-shaped model's variables (Adafactor slots with heads and d_kv
factored together included) written in Mesh TF's names and combined shapes
read back slice by slice into every processor of three layouts (heads and
d_kv split, uneven over 3 processors) with their values; the name table
maps blocks, norms (both namings) and slots; a bfloat16 checkpoint converts
to float32; bad paths, shapes and architectures are one line each.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import meshtf as mtf
import t5_tiny
from meshtf.train import experiment
from meshtf.train import init_checkpoint
from meshtf.train import mesh_tf_checkpoint as mtf_ckpt
from meshtf.train.errors import UsageError


def _graph_values(config, seed=0):
  """The symbolic training graph and random values of its variables."""
  graph, _ = experiment.build_training_graph(config)
  rs = np.random.RandomState(seed)
  values = {}
  for v in graph.all_variables:
    if v.name == "global_step":
      values[v.name] = np.int64(1234)
    else:
      values[v.name] = rs.randn(*v.shape.to_integer_list).astype(np.float32)
  return graph, values


def _export(tmp_path, config, graph, values, dtype=tf.float32,
            norm_name="rms_norm"):
  model = experiment.build_model(config)
  names = mtf_ckpt.NameMap(model, config.optimizer, norm_name)
  shapes = {v.name: [(d.name, d.size) for d in v.shape.dims]
            for v in graph.all_variables}
  tensors = mtf_ckpt.to_mesh_tf_tensors(
      values, shapes, names, {v.name for v in graph.trainable_variables},
      dtype)
  tensors.pop(mtf_ckpt.STEP)
  return mtf_ckpt.write(str(tmp_path / "mtf"), 1234, tensors), model


def test_the_name_table_is_mesh_tfs():
  config = t5_tiny.config()
  names = mtf_ckpt.NameMap(experiment.build_model(config), "adafactor")
  table = {
      "shared/embedding": "shared/embedding",
      "encoder/layer_000/SelfAttention/q":
          "encoder/block_000/layer_000/SelfAttention/q",
      "encoder/layer_000/SelfAttention/relative_attention_bias":
          "encoder/block_000/layer_000/SelfAttention/relative_attention_bias",
      "encoder/layer_002/SelfAttention/norm/rms_norm_scale":
          "encoder/block_001/layer_000/rms_norm/scale",
      "encoder/layer_003/GatedDenseReluDense/wi_1/kernel":
          "encoder/block_001/layer_001/DenseReluDense/wi_1/kernel",
      "encoder/final_norm/rms_norm_scale": "encoder/rms_norm/scale",
      "decoder/layer_004/EncDecAttention/o":
          "decoder/block_001/layer_001/EncDecAttention/o",
      "decoder/layer_005/GatedDenseReluDense/wo/kernel/slot_vr":
          "decoder/block_001/layer_002/DenseReluDense/wo/kernel_slot_vr",
      "decoder/logits/kernel": "decoder/logits/kernel",
      "global_step": "global_step",
  }
  for ours, theirs in table.items():
    assert names.to_mesh_tf(ours) == theirs, ours
  legacy = names.candidates("decoder/layer_003/SelfAttention/norm/"
                            "rms_norm_scale")
  assert legacy == ["decoder/block_001/layer_000/rms_norm/scale",
                    "decoder/block_001/layer_000/layer_norm/scale"]
  assert names.candidates("decoder/final_norm/rms_norm_scale")[1] == (
      "decoder/final_layer_norm/scale")
  adam = mtf_ckpt.NameMap(experiment.build_model(config), "adam")
  assert adam.to_mesh_tf("shared/embedding/slot_m") == "shared/embedding/adam_m"


@pytest.mark.parametrize("norm_name", ["rms_norm", "layer_norm"])
def test_written_checkpoint_reads_back_slice_by_slice(tmp_path, norm_name):
  config = t5_tiny.config(init_optimizer=True)
  graph, values = _graph_values(config)
  prefix, model = _export(tmp_path, config, graph, values,
                          norm_name=norm_name)
  entries = mtf_ckpt.read_entries(prefix)
  q = "encoder/block_000/layer_000/SelfAttention/q"
  assert entries[q] == ([16, 8], tf.float32)          # heads*d_kv combined
  assert entries[q + "_slot_vc"] == ([16], tf.float32)   # factored as Mesh TF
  assert entries[q + "_slot_vr"] == ([8], tf.float32)
  assert (("encoder/block_000/layer_000/%s/scale" % norm_name) in entries)
  plan = init_checkpoint.plan_restore(config, graph, model, prefix)
  n_weights = len(graph.trainable_variables)
  assert plan.weights == [n_weights, n_weights] and not plan.missing
  assert plan.slots[0] == plan.slots[1] > n_weights and not plan.unused
  assert plan.step == 1234 and not plan.conversions
  for mesh_shape, layout in [("all:1", ""),
                             ("rows:2;cols:2", "heads:rows;d_kv:cols;"
                              "d_ff:cols;vocab:rows"),
                             ("a:3", "d_kv:a;d_ff:a;vocab:a")]:
    mesh_layout = mtf.MeshLayout(mtf.convert_to_shape(mesh_shape), layout)
    for name, source in plan.sources.items():
      shape = graph.variables_by_name[name].shape
      sizes = mesh_layout.slice_shape(shape)
      for p in range(mesh_layout.size):
        begin = mesh_layout.slice_begin(shape, p)
        got = source(np.array(begin), sizes)
        full = np.asarray(values[name])
        want = full[tuple(slice(b, b + n) for b, n in zip(begin, sizes))]
        np.testing.assert_array_equal(
            got[tuple(slice(0, n) for n in want.shape)], want,
            err_msg="%s %s p%d" % (name, layout, p))
        if want.ndim:   # zeros past the end of uneven splits
          assert not got[tuple(slice(n, None) for n in want.shape)].any()


def test_bfloat16_checkpoint_converts_and_is_said(tmp_path):
  config = t5_tiny.config()
  graph, values = _graph_values(config)
  prefix, model = _export(tmp_path, config, graph, values, tf.bfloat16)
  plan = init_checkpoint.plan_restore(config, graph, model, prefix)
  n = len(graph.trainable_variables)
  assert plan.conversions == {("bfloat16", "float32"): n}
  assert plan.slots == [0, 0] and plan.unused_slots > n
  lines = plan.lines()
  assert lines[0].startswith("init_checkpoint: %s (Mesh TF), step 1234"
                             % prefix)
  assert "  converted bfloat16 -> float32: %d entries" % n in lines
  assert any("unused: %d optimizer slot" % plan.unused_slots in l
             for l in lines)
  name = "decoder/logits/kernel"
  source = plan.sources[name]
  got = source(np.zeros(2, np.int64), [16, 40])
  want = tf.cast(tf.cast(values[name], tf.bfloat16), tf.float32).numpy()
  np.testing.assert_array_equal(got, want)


def test_a_missing_weight_is_fresh_and_said(tmp_path):
  """A T5.1.1 checkpoint into a model with one more layer of each stack:
  the new layers' weights start fresh, each named."""
  config = t5_tiny.config()
  graph, values = _graph_values(config)
  prefix, _ = _export(tmp_path, config, graph, values)
  deeper = t5_tiny.config(num_layers=3)
  graph3, _ = experiment.build_training_graph(deeper)
  plan = init_checkpoint.plan_restore(
      deeper, graph3, experiment.build_model(deeper), prefix)
  assert plan.weights[0] == len(graph.trainable_variables)
  assert "encoder/layer_005/GatedDenseReluDense/wi_0/kernel" in plan.missing
  assert ("  initialized fresh (not in the checkpoint): "
          "encoder/layer_004/SelfAttention/q") in plan.lines()


def test_bad_init_checkpoints_are_one_line(tmp_path):
  config = t5_tiny.config()
  graph, values = _graph_values(config)
  prefix, model = _export(tmp_path, config, graph, values)
  not_ckpt = tmp_path / "notes.txt"
  not_ckpt.write_text("hello")
  cases = [
      (str(tmp_path / "nowhere"), "does not exist: give a Mesh TF"),
      (str(not_ckpt), "is a file that is not a checkpoint"),
      (str(tmp_path), "is a folder with no checkpoint in it"),
  ]
  for path, words in cases:
    with pytest.raises(UsageError, match=words):
      init_checkpoint.plan_restore(config, graph, model, path)
  wider = t5_tiny.config(d_model=24)
  graph24, _ = experiment.build_training_graph(wider)
  with pytest.raises(UsageError) as e:
    init_checkpoint.plan_restore(wider, graph24,
                                 experiment.build_model(wider), prefix)
  assert "has shape [40, 16] but the model's variable 'shared/embedding'" \
      in str(e.value) and "\n" not in str(e.value)
  # Another network's checkpoint (a Keras-style one, say).
  other = mtf_ckpt.write(str(tmp_path / "bert"), 7, {
      "bert/embeddings/word_embeddings": np.zeros([40, 16], np.float32),
      "bert/encoder/layer_0/attention/self/query/kernel":
          np.zeros([16, 16], np.float32)})
  with pytest.raises(UsageError) as e:
    init_checkpoint.plan_restore(config, graph, model,
                                 os.path.dirname(other))
  assert ("is of another architecture: none of the model's %d weights is in "
          "it (its entries: bert/embeddings/word_embeddings" % len(
              graph.trainable_variables)) in str(e.value)
  assert "shared/embedding" in str(e.value)
