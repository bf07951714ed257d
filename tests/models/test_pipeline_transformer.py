"""A pipelined Transformer LM (make_unitransformer(pipeline_stages=...,
num_microbatches=..., circular_repeats=...)).

1. Through the layout harness: 2 and 4 stages, plain and circular, with
   data or model parallelism on the other mesh axis, both backends: the
   loss, logits and every gradient as on one device.
2. On one device the pipelined model is the unpipelined one: the same
   initial weights (stacked), the same loss and logits, and each stacked
   gradient's [stage, repeat] part is its layer's gradient.
3. Greedy decoding reads the stacked weights layer by layer and gives the
   unpipelined model's ids; bad sizes raise one clear line.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import transformer

B, L, V = 8, 8, 16


def _lm(stages=1, micro=1, repeats=1, num_layers=None):
  return transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=num_layers or stages * repeats,
      num_heads=3, d_kv=4, d_ff=16, max_length=L, vocab_divisor=8,
      pipeline_stages=stages, num_microbatches=micro,
      circular_repeats=repeats)


def _packed_batch(seed):
  """Two segments per row: the segment ids travel with their microbatch."""
  rs = np.random.RandomState(seed)
  targets = rs.randint(2, V, size=[B, L]).astype(np.int32)
  seg = np.ones([B, L], np.int32)
  for b in range(B):
    seg[b, 2 + b % 4:] = 2
    targets[b, L - b % 3:] = 0
    seg[b, L - b % 3:] = 0
  return targets, seg


def _model(lm):
  def fn(mesh, x):
    logits, loss, _ = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["targets"], "targets_segmentation": x["seg"]})
    return {"loss": loss, "logits": logits}
  return fn


TARGETS, SEG = _packed_batch(0)
SHAPE = "batch:%d;length:%d" % (B, L)
INPUTS = {"targets": (TARGETS, SHAPE), "seg": (SEG, SHAPE)}


# (stages, microbatches, circular repeats, mesh, layout): the stage dim on
# one axis, data or model parallelism on the other (heads:3 on model:2 is
# an uneven split, its padding poisoned by the harness). 4 devices for 2
# stages: 8 virtual devices on 2 cores would triple an SPMD run's time.
CASES = {
    "2_stages_data": (2, 4, 1, "pipe:2;data:2", "stage:pipe;batch:data"),
    "2_stages_circular_model": (2, 2, 2, "pipe:2;model:2",
                                "stage:pipe;heads:model;d_ff:model"),
    "4_stages_model": (4, 2, 1, "pipe:4;model:2",
                       "stage:pipe;heads:model;d_ff:model;vocab:model"),
    "4_stages_circular_data": (4, 2, 2, "pipe:4;data:2",
                               "stage:pipe;batch:data"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pipelined_lm_is_layout_invariant(case):
  stages, micro, repeats, mesh_shape, layout = CASES[case]
  runs = harness.assert_layout_invariant(
      _model(_lm(stages, micro, repeats)), INPUTS, [(mesh_shape, layout)],
      rtol=2e-4, atol=2e-5)
  for run in runs.values():
    kinds = {s["kind"] for s in run.lowering.collective_stats()
             if tuple(s["mesh_axes"]) == ("pipe",)}
    assert "permute" in kinds, kinds


def _chunk_of(name, stages, repeats, per_chunk):
  """'decoder/pipeline/layer_001/x' -> [(s, r, 'decoder/layer_<i>/x')]."""
  head, rest = name.split("/pipeline/layer_")
  k, rest = int(rest[:3]), rest[3:]
  return [(s, r, "%s/layer_%03d%s" % (head, (r * stages + s) * per_chunk + k,
                                      rest))
          for s in range(stages) for r in range(repeats)]


@pytest.mark.parametrize("stages,micro,repeats,blocks", [(2, 4, 1, 2),
                                                         (2, 2, 2, 1)])
def test_pipelined_lm_is_the_unpipelined_lm_on_one_device(stages, micro,
                                                          repeats, blocks):
  """blocks: Transformer blocks (2 layers each) a chunk."""
  num_layers = blocks * stages * repeats
  plain = harness.run_model(_model(_lm(num_layers=num_layers)), INPUTS,
                            "all:1", "")
  piped = harness.run_model(_model(_lm(stages, micro, repeats, num_layers)),
                            INPUTS, "all:1", "")
  np.testing.assert_allclose(piped.outputs["loss"], plain.outputs["loss"],
                             1e-6, 1e-6)
  np.testing.assert_allclose(piped.outputs["logits"],
                             plain.outputs["logits"], 1e-5, 1e-5)
  per_chunk = 2 * num_layers // (stages * repeats)   # layers: 2 per block
  matched = set()
  for name, g in piped.grads.items():
    if "/pipeline/" not in name:
      np.testing.assert_allclose(g, plain.grads[name], 2e-5, 2e-5, name)
      matched.add(name)
      continue
    for s, r, original in _chunk_of(name, stages, repeats, per_chunk):
      part = g[s, r] if repeats > 1 else g[s]
      np.testing.assert_allclose(part, plain.grads[original], 2e-5, 2e-5,
                                 original)
      matched.add(original)
  assert matched == set(plain.grads)


def test_greedy_decoding_reads_the_stacked_weights():
  """The decoder's steps run the layers one by one on their part of the
  stacked variables: the same ids as the unpipelined model."""
  prompts = np.zeros([B, L], np.int32)
  prompts[:, :2] = TARGETS[:, :2]

  def model(lm):
    def fn(mesh, x):
      return {"ids": lm.sample_autoregressive(x["prompts"], max_steps=4,
                                              temperature=0.0)}
    return fn
  inputs = {"prompts": (prompts, SHAPE)}
  plain = harness.run_model(model(_lm(num_layers=4)), inputs, "all:1", "")
  piped = harness.run_model(model(_lm(2, 2, 2, num_layers=4)), inputs,
                            "pipe:2;data:2", "stage:pipe;batch:data")
  np.testing.assert_array_equal(piped.outputs["ids"], plain.outputs["ids"])


def test_bad_pipeline_sizes_raise_one_clear_line():
  with pytest.raises(ValueError, match=r"LayerStack: 6 layers do not split "
                     r"into pipeline_stages \* circular_repeats = 2 \* 2 = 4"
                     r" equal chunks: use a multiple of 4 layers"):
    _lm(2, 2, 2, num_layers=3)
  with pytest.raises(ValueError, match=r"pipelined stages must hold the same"
                     r" layers, but layer 1 is DenseReluDense"):
    _lm(2, 2, 1, num_layers=1)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  targets = mtf.zeros(mesh, "batch:6;length:8", dtype=tf.int32)
  with pytest.raises(ValueError, match=r"batch size 6 is not divisible by "
                     r"num_microbatches=4"):
    transformer.compute_logits_loss_metrics(_lm(2, 4, 1),
                                            {"targets": targets})


# --- the loop -----------------------------------------------------------------
def _pipelined_graph(micro, batch, remat="none", width=1, dtype=None):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8 * width, num_layers=4, num_heads=2,
      d_kv=4 * width, d_ff=16 * width, max_length=L, vocab_divisor=8,
      pipeline_stages=2, num_microbatches=micro, remat=remat)
  targets = mtf.import_tf_tensor(mesh, tf.zeros([batch, L], tf.int32),
                                 "batch:%d;length:%d" % (batch, L))
  variable_dtype = (None if dtype is None else
                    dtypes.VariableDType(tf.float32, activation_dtype=dtype))
  _, loss, _ = transformer.compute_logits_loss_metrics(
      lm, {"targets": targets}, variable_dtype=variable_dtype)
  mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  return graph


def test_the_program_does_not_grow_with_the_microbatches():
  """One mtf.while_loop: M = 4 and M = 32 give the same meshtf ops and the
  same traced per-device TF program (node for node, but for how TF spells
  zeros: a constant below 1,000 elements, a Fill of two constants above --
  the output accumulator grows with M), and the plan counts what a step runs -- M + S - 1 iterations
  of the body's flops and collectives, one recorded buffer per
  iteration -- with the traced and the estimated collectives equal."""
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.plan import accounting
  layout = mtf.MeshLayout("pipe:2;data:2", "stage:pipe;batch:data")
  counts, tf_nodes, history = [], [], []
  for micro in (4, 32):
    graph = _pipelined_graph(micro, batch=2 * micro)
    ops = list(lowering_lib.all_operations(graph.operations))
    counts.append(len(ops))
    loop = [op for op in graph.operations
            if type(op).__name__ == "WhileLoopOperation"]
    assert len(loop) == 1 and loop[0].trip_count == micro + 1
    traced = mtf.plan.plan(graph, layout, "cpu")
    tf_nodes.append(_program_nodes(graph, layout))
    estimated = mtf.plan.plan(graph, layout, "cpu", trace=False)
    assert _collectives(traced) == _collectives(estimated)
    permutes = sum(r["count"] for r in traced.collectives
                   if r["kind"] == "permute")
    # The buffer shifts forward and its gradient back in every iteration,
    # and the backward loop re-runs the forward shift.
    assert permutes == 3 * (micro + 1)
    kept = accounting.kept_for_backward(graph.operations,
                                        layout.assign(ops),
                                        graph.backward_start)
    history += [n for t, n in kept if isinstance(t, accounting.LoopHistory)]
  assert counts[0] == counts[1], counts
  import collections
  kinds = [collections.Counter(t for t in nodes if t not in ("Const", "Fill"))
           for nodes in tf_nodes]
  assert kinds[0] == kinds[1]
  assert len(tf_nodes[1]) - len(tf_nodes[0]) <= 9   # 3 zeros as Fill
  # Recorded per iteration and processor: the buffer [stage/2, (2
  # rows)/2, length, d_model] in float32 and the iteration number.
  assert history == [5 * (1 * 1 * L * 8 * 4 + 4), 33 * (1 * 1 * L * 8 * 4 + 4)]


def _collectives(report):
  import collections
  out = collections.Counter()
  for r in report.collectives:
    out[(r["kind"], tuple(r["mesh_axes"]), r["elements_per_device"])] += (
        r["count"])
  return out


def _program_nodes(graph, layout):
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.lowering import simd
  from meshtf.plan import report
  impl = simd.SimdMeshImpl(layout, None, report.notional_devices(layout.size))
  lowering = lowering_lib.Lowering(graph, {graph.operations[0].mesh: impl},
                                   launch=False,
                                   outputs=report.step_outputs(
                                       graph.operations))
  return [op.type for op in lowering.program.graph.get_operations()]


def test_remat_inside_the_pipeline_stages_keeps_less_per_iteration():
  """remat="full" inside the stages: the backward loop's iteration
  recomputes each layer from its input again, so its transient peak falls
  (a model wide enough for activations to outweigh the weights'
  gradients); what the loop records per iteration (its buffers) is the
  same."""
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.plan import accounting
  layout = mtf.MeshLayout("pipe:2;data:2", "stage:pipe;batch:data")
  out = {}
  for policy in ("none", "full"):
    graph = _pipelined_graph(4, 32, policy, width=4)
    ops = list(graph.operations)
    graph_layout = layout.assign(lowering_lib.all_operations(ops))
    span, _ = accounting._buffers(ops, graph_layout)  # pylint: disable=protected-access
    out[policy] = {
        "iteration": max(n for k, (_, _, n) in span.items()
                         if isinstance(k, tuple) and "gradient" in k[1].name),
        "history": sum(n for k, (_, _, n) in span.items()
                       if isinstance(k, accounting.LoopHistory))}
  assert out["full"]["history"] == out["none"]["history"]
  assert out["full"]["iteration"] < out["none"]["iteration"], out


def test_weight_gradients_are_reduced_once_per_step():
  """bfloat16 activations, float32 weights, data parallelism: each
  iteration's weight gradient (a bfloat16 partial sum over the batch's
  axis) is cast to float32 and summed over the iterations still pending,
  so the allreduces over `data` are the same for M = 4 and M = 32 (once
  per step), traced as estimated; and the plan's compute on XLA hardware
  counts the loop body once per iteration (at least the flops at peak)."""
  layout = mtf.MeshLayout("pipe:2;data:2", "stage:pipe;batch:data")
  over_data = []
  for micro in (4, 32):
    graph = _pipelined_graph(micro, batch=2 * micro, dtype=tf.bfloat16)
    traced = mtf.plan.plan(graph, layout, "cpu")
    assert _collectives(traced) == _collectives(
        mtf.plan.plan(graph, layout, "cpu", trace=False))
    over_data.append(sum(r["count"] for r in traced.collectives
                         if r["mesh_axes"] == ["data"]))
    tpu = mtf.plan.plan(graph, layout, "tpuv3", trace=False)
    assert tpu.compute_seconds() >= (tpu.accounting.flops /
                                     tpu.hardware.peak_flops)
  assert over_data[0] == over_data[1], over_data
