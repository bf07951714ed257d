"""The Transformer LM and the MoE LM train layout-invariant under uneven
splits (GSPMD 4.1): vocab 250, 6 heads and d_ff 100 (and 6 experts) split 4
and 8 ways -- sizes the mesh axes do not divide, so the stripes are padded
and some processors hold no head at all. Three training steps (Adam with
gradient clipping; the padding poisoned with NaN) give the single-device
losses and variables, on both backends.
"""
import numpy as np
import pytest

import harness
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.models import moe
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer

B, L, V = 8, 8, 250
STEPS = 3

DENSE_LAYOUTS = [
    # 4 ways: vocab 250 -> stripes of 63, heads 6 -> 2 (one processor of
    # each row holds none), d_ff 100 -> 25; with a data-parallel batch.
    ("rows:2;cols:4", "batch:rows;vocab:cols;d_ff:cols;heads:cols"),
    # 8 ways: vocab -> 32 (6 of padding), heads -> 1 (two processors hold
    # none), d_ff -> 13 (4 of padding).
    ("all:8", "vocab:all;d_ff:all;heads:all"),
]
MOE_LAYOUTS = [
    # GShard: 6 experts over 4 processors (2 of padding), with the routing
    # groups on the same axis (uneven alltoalls), model parallel on rows.
    ("rows:2;cols:4", "batch:cols;group:cols;experts:cols;vocab:rows;"
     "d_ff:rows;heads:rows"),
    # 8 ways: experts, vocab, heads and d_ff all padded.
    ("all:8", "experts:all;vocab:all;heads:all;d_ff:all"),
]


def make_lm(with_moe):
  hparams = moe.MoeParams(moe_num_experts=6, moe_group_size=8,
                          moe_hidden_size=12, moe_min_expert_capacity=2,
                          moe_loss_coef=1e-2, moe_num_groups=4)
  # The MoE LM is one layer with the MoE feed-forward (attention and the
  # dense feed-forward are the dense LM's).
  ffn = (lambda i: moe.MoeFeedForward(hparams)) if with_moe else None
  # Dropout is off: its per-slice random numbers are tested on uneven
  # layouts elsewhere, and on 8 placement devices they triple the trace.
  return transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=1, num_heads=6,
      d_kv=4, d_ff=100, max_length=L, vocab_divisor=1, z_loss=1e-3,
      feedforward_layer_fn=ffn)


def train(with_moe, backend, mesh_shape, layout):
  """Losses of STEPS training steps and the final variables."""
  step_fn = training.TrainStep(
      transformer.loss_fn(make_lm(with_moe)),
      harness.make_impl(backend, mesh_shape, layout),
      optimize.AdamWeightDecayOptimizer(1e-2, bias_correction=True),
      clip_gradient_norm=1.0)
  # One batch, seen every step: the loss must fall.
  targets = np.random.RandomState(0).randint(2, V, size=[B, L]).astype(
      np.int32)
  losses = []
  # Poisoned padding: an op that read padding would corrupt the numbers.
  with mesh_impl_lib.poison_padding():
    for _ in range(STEPS):
      losses.append(float(step_fn({"targets": targets})["loss"]))
  store = step_fn.variable_store
  return losses, {n: store.full_value(n) for n in store.names()}


@pytest.mark.parametrize("with_moe", [False, True], ids=["lm", "moe_lm"])
def test_uneven_lm_trains_like_one_device(with_moe):
  base_losses, base_vars = train(with_moe, "placement", "all:1", "")
  assert all(np.isfinite(base_losses)) and base_losses[-1] < base_losses[0]
  if with_moe:
    assert any("MoE" in n for n in base_vars)
  layouts = MOE_LAYOUTS if with_moe else DENSE_LAYOUTS
  for backend in harness.BACKENDS:
    # The placement backend's program grows with the mesh (~35 s a training
    # on 8 devices here): it runs the 4-way uneven layout, SPMD both.
    for mesh_shape, layout in (layouts[:1] if backend == "placement"
                               else layouts):
      what = "%s %s %s" % (backend, mesh_shape, layout)
      losses, variables = train(with_moe, backend, mesh_shape, layout)
      np.testing.assert_allclose(losses, base_losses, rtol=2e-5,
                                 err_msg=what)
      assert sorted(variables) == sorted(base_vars), what
      for name, value in base_vars.items():
        # Adam divides by the gradients' root mean square: float summation
        # order shows in the last digits of tiny updates.
        np.testing.assert_allclose(variables[name], value, rtol=1e-3,
                                   atol=1e-4, err_msg="%s %s" % (what, name))
