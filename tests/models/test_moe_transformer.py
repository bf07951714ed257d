"""A tiny MoE language model (GShard: an MoE feed-forward layer in every
other block) gives the single-device loss and gradients under data-parallel,
data + model-parallel (the Mesh-TensorFlow paper's layout) and
data + expert-parallel (GShard) layouts, on both backends."""
import numpy as np

import harness
from meshtf.models import moe
from meshtf.models import transformer

B, L, V = 8, 8, 16
HPARAMS = moe.MoeParams(moe_num_experts=4, moe_group_size=8,
                        moe_hidden_size=16, moe_min_expert_capacity=2,
                        moe_loss_coef=1e-2, moe_router_z_loss_coef=1e-3)


def make_lm():
  return transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=2, num_heads=4, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1,
      feedforward_layer_fn=lambda i: moe.MoeFeedForward(HPARAMS)
      if i % 2 == 1 else None)


LAYOUTS = [
    # Data parallel: batch and the routing groups split 8 ways.
    ("all:8", "batch:all;group:all;group_unsplit:all"),
    # Data + model parallel as in the Mesh-TensorFlow paper (section 9).
    ("rows:2;cols:4", "batch:rows;vocab:cols;d_ff:cols;heads:cols;"
     "expert_hidden:cols"),
    # Data + expert parallel as in GShard: groups and experts on one axis.
    ("rows:2;cols:4", "batch:cols;group:cols;experts:cols;d_ff:rows;"
     "heads:rows"),
    # ... over both axes at once (8 groups and 4 experts over all 8
    # processors: the experts padded; a relayout between dims over several
    # axes gathers and splits, it has no alltoall form yet).
    ("rows:2;cols:4", "batch:rows+cols;group:rows+cols;experts:cols+rows"),
    # The paper layout for the weights, the targets annotated to split the
    # batch over both axes.
    ("rows:2;cols:4", harness.annotated(
        "vocab:cols;d_ff:cols;heads:cols;expert_hidden:cols",
        {"targets": "batch:rows+cols"})),
]


def test_moe_lm_layout_invariant_and_alltoall():
  rs = np.random.RandomState(0)
  targets = rs.randint(2, V, size=[B, L]).astype(np.int32)
  lm = make_lm()

  def model(mesh, x):
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["targets"]})
    return {"loss": loss, "extra_loss": metrics["extra_loss"]}
  runs = harness.assert_layout_invariant(
      model, {"targets": (targets, "batch:%d;length:%d" % (B, L))}, LAYOUTS)
  base = next(iter(runs.values()))
  assert any("MoE/wi/kernel" in n for n in base.grads)
  assert float(base.outputs["extra_loss"]) > 0.0
  for backend in harness.BACKENDS:
    kinds = {s["kind"] for s in
             runs[(backend,) + LAYOUTS[2]].lowering.collective_stats()}
    assert "alltoall" in kinds, (backend, kinds)
