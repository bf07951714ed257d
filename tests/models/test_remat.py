"""Rematerialization as a model choice (meshtf/models/remat.py): the
Transformer LM, the MoE LM and a pipelined LM with remat="full",
"einsum_outputs" or "weight_einsum_outputs".

1. Exact: on one device a remat model gives the plain model's loss,
   logits and gradients bit for bit (the recomputation re-runs the same
   ops, dropout masks and MoE routing included); through the harness every
   layout on both backends gives the one-device numbers.
2. Where it runs: the recomputation is in the backward pass of the
   graph -- copies of the block's ops after backward_start, each waiting
   for the block's output gradient -- and, under "einsum_outputs", the
   einsums are not recomputed; under "weight_einsum_outputs" the einsums
   of an activation with a weight are not, those between two activations
   (attention scores and context, MoE dispatch and combine) are.
3. What the plan sees: the activations kept fall none > einsum_outputs >
   weight_einsum_outputs > full, the flops rise by the recomputed forward
   ops' flops, the kept tensors under "full" are the blocks' inputs.
4. The config field reaches the binary's model; a bad policy is one line.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.lowering import lowering as lowering_lib
from meshtf.models import moe
from meshtf.models import remat
from meshtf.models import transformer
from meshtf.ops import einsum as einsum_lib
from meshtf.plan import accounting
from meshtf.train import config as config_lib
from meshtf.train import experiment
from meshtf.train import training_loop

B, L, V = 8, 8, 16
HPARAMS = moe.MoeParams(moe_num_experts=4, moe_group_size=8,
                        moe_hidden_size=16, moe_min_expert_capacity=2,
                        moe_loss_coef=1e-2, moe_router_z_loss_coef=1e-3)


def _lm(policy, kind="dense", dropout=0.1):
  kwargs = dict(vocab_size=V, d_model=8, num_layers=2, num_heads=3, d_kv=4,
                d_ff=16, max_length=L, vocab_divisor=8, remat=policy,
                dropout_rate=dropout)
  if kind == "moe":
    kwargs["feedforward_layer_fn"] = (
        lambda i: moe.MoeFeedForward(HPARAMS) if i % 2 else None)
  if kind == "pipeline":
    kwargs.update(pipeline_stages=2, num_microbatches=2, dropout_rate=0.0)
  return transformer.make_unitransformer(**kwargs)


def _model(lm):
  def fn(mesh, x):
    step = mtf.constant(mesh, 7, dtype=tf.int32)
    logits, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["targets"]}, step=step)
    out = {"loss": loss, "logits": logits}
    if "extra_loss" in metrics:
      out["extra_loss"] = metrics["extra_loss"]
    return out
  return fn


TARGETS = np.random.RandomState(0).randint(2, V, size=[B, L]).astype(np.int32)
INPUTS = {"targets": (TARGETS, "batch:%d;length:%d" % (B, L))}
# heads:3 on cols:2 is uneven (its padding poisoned by the harness).
CASES = {
    "dense_full": ("dense", "full", "rows:2;cols:2",
                   "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
    "dense_einsum_outputs": ("dense", "einsum_outputs", "rows:2;cols:2",
                             "batch:rows;heads:cols;d_ff:cols"),
    "dense_weight_einsum_outputs": ("dense", "weight_einsum_outputs",
                                    "rows:2;cols:2",
                                    "batch:cols;heads:rows;d_ff:rows"),
    "moe_full": ("moe", "full", "rows:2;cols:2",
                 "batch:cols;group:cols;experts:cols;d_ff:rows;heads:rows"),
    "moe_weight_einsum_outputs": ("moe", "weight_einsum_outputs",
                                  "rows:2;cols:2",
                                  "batch:rows;group:rows;experts:rows;"
                                  "expert_hidden:cols;heads:cols"),
    "pipeline_full": ("pipeline", "full", "pipe:2;data:2",
                      "stage:pipe;batch:data"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_remat_is_exact_and_layout_invariant(case):
  kind, policy, mesh_shape, layout = CASES[case]
  plain = harness.run_model(_model(_lm("none", kind)), INPUTS, "all:1", "")
  runs = harness.assert_layout_invariant(
      _model(_lm(policy, kind)), INPUTS, [(mesh_shape, layout)],
      rtol=2e-4, atol=2e-5)
  remat_run = harness.run_model(_model(_lm(policy, kind)), INPUTS, "all:1",
                                "")
  for name, value in plain.outputs.items():
    np.testing.assert_array_equal(remat_run.outputs[name], value, name)
  assert set(remat_run.grads) == set(plain.grads)
  for name, g in plain.grads.items():
    np.testing.assert_array_equal(remat_run.grads[name], g, name)
  graph = next(iter(runs.values())).graph
  # (In the pipeline the recomputation is inside the backward loop's body.)
  copies = [op for op in lowering_lib.all_operations(
      graph.operations[graph.backward_start:])
            if type(op).__name__ == "DependOperation"]
  assert copies, "the recomputation waits for the output gradients"
  if policy == "weight_einsum_outputs":
    kept, recomputed = _einsum_copies(graph)
    # Kept: the projections to queries, keys and values, the feed-forward's
    # (MoE: the router's and the experts') first einsum; recomputed: the
    # attention scores and context (MoE: dispatch and combine).
    assert {"heads", "memory_length", "length"} <= set().union(
        *[t.shape.dimension_names for t in recomputed])
    assert not [t for t in kept if "memory_length" in
                t.shape.dimension_names and "length" in
                t.shape.dimension_names]
    assert [t for t in kept if "d_kv" in t.shape.dimension_names]
    if kind == "moe":
      assert [t for t in kept if "expert_hidden" in t.shape.dimension_names]
      assert [t for t in recomputed
              if "expert_capacity" in t.shape.dimension_names]
  if kind == "moe":
    assert float(plain.outputs["extra_loss"]) > 0


def _einsum_copies(graph):
  """(outputs of the kept einsums' copies, outputs of the recomputed
  einsums' copies) in the backward pass (a copy keeps its original's
  name)."""
  forward = {op.name for op in graph.operations[:graph.backward_start]}
  kept, recomputed = [], []
  for op in lowering_lib.all_operations(
      graph.operations[graph.backward_start:]):
    if op.name not in forward or not isinstance(op, einsum_lib.EinsumOperation):
      continue
    kept_copy = type(op).__name__.startswith("Kept")
    (kept if kept_copy else recomputed).append(op.outputs[0])
  return kept, recomputed


def _plan_memory(policy, kind="dense"):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS),
                                 "batch:%d;length:%d" % (B, L))
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=4, num_heads=2, d_kv=4, d_ff=32,
      max_length=L, vocab_divisor=8, remat=policy,
      feedforward_layer_fn=(lambda i: moe.MoeFeedForward(HPARAMS) if i % 2
                            else None) if kind == "moe" else None)
  _, loss, _ = transformer.compute_logits_loss_metrics(
      lm, {"targets": targets})
  mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  ops = list(graph.operations)
  layout = mtf.MeshLayout("all:1", "").assign(ops)
  acc = accounting.account(ops, layout, graph.backward_start)
  kept = accounting.kept_for_backward(ops, layout, graph.backward_start)
  return acc, kept, graph


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_plan_sees_what_remat_keeps_and_recomputes(kind):
  none, kept_none, _ = _plan_memory("none", kind)
  dots, kept_dots, _ = _plan_memory("einsum_outputs", kind)
  weights, _, weights_graph = _plan_memory("weight_einsum_outputs", kind)
  full, kept_full, graph = _plan_memory("full", kind)
  saved = [a.memory["activations_saved"] for a in (none, dots, weights,
                                                   full)]
  assert saved[0] > saved[1] > saved[2] > saved[3], saved
  # Keeping the weight einsums' outputs recomputes the others once: the
  # extra einsum flops are exactly the recomputed copies' flops.
  _, recomputed = _einsum_copies(weights_graph)
  recomputed_ops = {t.operation for t in recomputed}
  assert recomputed_ops
  assert (weights.flops_by_family["einsum"] -
          none.flops_by_family["einsum"] ==
          sum(c.flops for c in weights.costs if c.op in recomputed_ops))
  assert full.flops > weights.flops > dots.flops
  assert none.memory["peak"] > full.memory["peak"]
  # Full remat recomputes every block's forward ops once: the extra flops
  # are exactly the flops of the recomputed copies (einsums included);
  # keeping the einsums' outputs recomputes none of them.
  assert full.flops > dots.flops > none.flops
  # (A copy keeps its original's name.)
  forward = {op.name for op in graph.operations[:graph.backward_start]}
  backward = set(graph.operations[graph.backward_start:])
  copies = [c for c in full.costs if c.op in backward and
            c.op.name in forward and c.family == "einsum"]
  assert copies
  assert (full.flops_by_family["einsum"] - none.flops_by_family["einsum"]
          == sum(c.flops for c in copies))
  # Each forward op is recomputed once: the norms' and softmaxes' custom
  # gradients inside a block read the block's recomputed copies, they do
  # not re-create their forward ops a second time.
  times = collections.Counter(op.name for op in backward
                              if op.name in forward)
  assert times and max(times.values()) == 1, times.most_common(3)
  assert dots.flops_by_family["einsum"] == none.flops_by_family["einsum"]
  # Under "full" each of the 8 blocks keeps its input, the [batch, length,
  # d_model] residual stream; outside the blocks the final norm keeps its
  # input and the logits' einsum the norm's output.
  residual = [t for t, _ in kept_full
              if t.shape.dimension_names == ["batch", "length", "d_model"]]
  assert len(residual) == 8 + 2, [t.name for t in residual]
  # No attention tensor [batch, heads, ...] is kept (the causal mask
  # [memory_length, length], made once outside the blocks, is).
  assert not [t for t, _ in kept_full if "heads" in t.shape.dimension_names]
  assert [t for t, _ in kept_dots if "heads" in t.shape.dimension_names]


def test_config_field_and_bad_policies():
  c = config_lib.load_file("t2t_configs/lm_tiny.py")
  c.remat = "full"
  config_lib.validate(c, check_data=False)
  model = experiment.build_model(c, experiment.MoeMetrics())
  assert model.layer_stack.remat == "full"
  c.remat = "most"
  with pytest.raises(config_lib.ConfigError, match="remat='most' is unknown"):
    config_lib.validate(c, check_data=False)
  assert config_lib.REMAT_POLICIES == remat.POLICIES
  # The binary's header names every policy but none.
  assert set(training_loop.REMAT_LINES) == set(remat.POLICIES) - {"none"}
  c.remat = "weight_einsum_outputs"
  config_lib.validate(c, check_data=False)
  assert experiment.build_model(
      c, experiment.MoeMetrics()).layer_stack.remat == c.remat
  with pytest.raises(ValueError, match="remat='some' is not one of"):
    transformer.make_layer_stack(2, remat="some")
  assert transformer.make_layer_stack(2, remat=True).remat == "full"


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_plan_estimates_the_traced_collectives(kind):
  """The recomputation's collectives as the traced program has them: the
  copies' relayouts and reductions (MoE: its alltoalls again), none for
  the gates that make the copies wait for the output gradients."""
  import collections
  _, layout = CASES[kind + "_full"][2:]
  mesh_layout = mtf.MeshLayout(CASES[kind + "_full"][2], layout)
  for policy in ("full", "einsum_outputs", "weight_einsum_outputs"):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS),
                                   "batch:%d;length:%d" % (B, L))
    _, loss, _ = transformer.compute_logits_loss_metrics(
        _lm(policy, kind, dropout=0.0), {"targets": targets})
    mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
    counts = []
    for trace in (True, False):
      c = collections.Counter()
      for r in mtf.plan.plan(graph, mesh_layout, "cpu",
                             trace=trace).collectives:
        c[(r["kind"], tuple(r["mesh_axes"]), r["elements_per_device"])] += (
            r["count"])
      counts.append(c)
    assert counts[0] == counts[1], (policy, counts)
