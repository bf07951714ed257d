"""Mesh TensorFlow's MoE1D / MoE2D in meshtf (meshtf/compat/moe_layers.py).

- A language model with a MoE1D block (top-2, random second policy, expert
  dropout) and a MoE2D block (hierarchical) gives the single-device loss
  and gradients under data-, data+expert- and expert+hidden-parallel
  layouts on both backends; batch and experts on one axis reshard by
  alltoall. (That the numbers are Mesh TF's own is
  tests/compat/test_mesh_tf_moe_layers.py.)
- Mesh TF's grouping and capacity formulas; its research gatings and a bad
  MoE2D expert count are refused in one line.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.compat import moe
from meshtf.compat import moe_layers as mesh_tf_moe
from meshtf.models import transformer

B, L, V = 8, 8, 16


def make_lm():
  def ffn(i):
    if i == 0:
      return moe.MoE1D(num_experts=4, hidden_size=16, group_size=8,
                       min_expert_capacity=2, dropout_rate=0.1,
                       use_second_place_loss=True)
    return moe.MoE2D(expert_x=2, expert_y=4, hidden_size=8, group_size=8)
  # The model's layout / mesh_shape fix the group count (a multiple of 2
  # groups), the same on every mesh the test runs on, as a Mesh TF model's
  # layout does.
  return transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=2, num_heads=4, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1, feedforward_layer_fn=ffn,
      layout="batch:data", mesh_shape="data:2")


LAYOUTS = [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "batch:rows;experts:cols;expert_x:rows;expert_y:cols;"
     "heads:cols;d_ff:cols"),
    ("rows:2;cols:4", "batch:cols;experts:cols;expert_hidden:rows"),
]


def test_mesh_tf_moe_lm_layout_invariant():
  targets = np.random.RandomState(0).randint(2, V, size=[B, L]).astype(
      np.int32)
  lm = make_lm()

  def model(mesh, x):
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["targets"]})
    return {"loss": loss, "extra_loss": metrics["extra_loss"]}
  runs = harness.assert_layout_invariant(
      model, {"targets": (targets, "batch:%d;length:%d" % (B, L))}, LAYOUTS)
  base = next(iter(runs.values()))
  names = sorted(base.grads)
  for suffix in ("layer_001/MoE1D/top_2_gating/kernel",
                 "layer_001/MoE1D/wi/kernel",
                 "layer_003/MoE2D/outer_gating/kernel",
                 "layer_003/MoE2D/inner_gating/kernel",
                 "layer_003/MoE2D/wo/kernel"):
    assert [n for n in names if n.endswith(suffix)], (suffix, names)
    grad = [base.grads[n] for n in names if n.endswith(suffix)][0]
    assert np.abs(grad).max() > 0, suffix
  assert float(base.outputs["extra_loss"]) > 0.0
  for backend in harness.BACKENDS:
    kinds = {s["kind"] for s in
             runs[(backend,) + LAYOUTS[2]].lowering.collective_stats()}
    assert "alltoall" in kinds, (backend, kinds)


def test_mesh_tf_groups_and_capacity():
  # Mesh TF rounds the group count down (meshtf's own MoE rounds it up).
  assert mesh_tf_moe.split_into_groups(96, 64, 1) == (1, 96)
  assert moe.split_into_groups(96, 64, 1) == (2, 48)
  assert mesh_tf_moe.split_into_groups(64, 8, 4) == (8, 8)
  # No factor 2 for top-2; int() rounds down; the least capacity wins.
  assert mesh_tf_moe.expert_capacity(64, 4, 1.25, 4) == 20
  assert mesh_tf_moe.expert_capacity(64, 4, 1.0, 4) == 16
  assert mesh_tf_moe.expert_capacity(10, 16, 1.25, 2) == 2
  with pytest.raises(ValueError, match="multiple of 3"):
    mesh_tf_moe.split_into_groups(64, 8, 3)


def test_unsupported_mesh_tf_options_refused_in_one_line():
  for kwargs, what in ((dict(moe_gating="ntlb"), "ntlb"),
                       (dict(use_experts_attention=True),
                        "moe_use_experts_attention"),
                       (dict(second_policy_train="often"), "often")):
    with pytest.raises(ValueError, match=what) as e:
      moe.MoE1D(**kwargs)
    assert "\n" not in str(e.value)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:4;length:8;d_model:4")
  hp = mesh_tf_moe.HParams(moe_num_experts=4)
  with pytest.raises(ValueError, match=r"\[X, Y\]"):
    moe.transformer_moe_layer_v2(x, x.shape.dims[-1], hp, True)


def test_mesh_tf_entry_points_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:4;length:8;d_model:4")
  hp = mesh_tf_moe.HParams()
  mesh_tf_moe.set_default_moe_hparams(hp)
  hp.moe_num_experts, hp.moe_hidden_size = 4, 8
  y, loss = moe.transformer_moe_layer_v1(x, x.shape.dims[-1], hp, True)
  assert y.shape == x.shape and loss.shape == mtf.Shape([])
  hp.moe_num_experts = [2, 2]
  with tf.compat.v1.variable_scope("two_level"):
    y, loss = moe.transformer_moe_layer_v2(x, x.shape.dims[-1], hp, False)
  assert y.shape == x.shape and loss.shape == mtf.Shape([])
