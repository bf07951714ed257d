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
