"""Mesh TF's convolution forms through the harness: the transformer's
Conv1DLayer / SeparableConv1DLayer (meshtf/models/conv_transformer_layers.py),
mtf.layers.separable_conv1d and dense with a new dim named like a reduced
one. Tiny dims, four-device meshes splitting what the layers touch (batch,
length, d_model), both backends."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import layers
from meshtf.models import conv_transformer_layers as ctl
from meshtf.models import transformer
from meshtf.models import transformer_layers as tl

RA = harness.random_array
FOUR = "rows:2;cols:2"
B, L, D = 2, 6, 4


def _context(mesh, mode, ids=None, start=None, states=None):
  return tl.Context(mesh, [mtf.Dimension("batch", B)],
                    mtf.Dimension("length", L), mtf.Dimension("d_model", D),
                    mode=mode, inputs=ids, initial_position=start,
                    states=states)


def test_conv_layers_and_dense_are_layout_invariant():
  x = RA([B, L, D], 0)
  ids = np.array([[3, 1, 4, 1, 0, 0], [5, 9, 2, 6, 5, 3]], np.int32)

  def model(mesh, t):
    ctx = _context(mesh, "train", ids=t["ids"])
    ctx.scope = "conv"
    conv = ctl.Conv1DLayer(filter_size=3, output_size=3, activation="relu")
    ctx.scope = "sep"
    sep = ctl.SeparableConv1DLayer(-2, 1, output_size=D).call(ctx, t["x"])
    ctx.scope = "conv"
    return {"conv": conv.call(ctx, t["x"]), "sep": sep,
            # d_model:4 -> d_model:5: the kernel is [_d_model:4, d_model:5].
            "dense": layers.dense(t["x"], mtf.Dimension("d_model", 5),
                                  reduced_dims=[t["x"].shape.dims[-1]],
                                  name="same_name")}

  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;length:6;d_model:4"),
              "ids": (ids, "batch:2;length:6")},
      [(FOUR, "batch:rows;length:cols"), (FOUR, "d_model:rows;length:cols")],
      wrt=["x"])
  run = next(iter(runs.values()))
  shapes = {v.name: str(v.shape) for v in run.graph.trainable_variables}
  assert shapes["conv/conv1d/kernel"] == "[fw:3, input_dim:4, d_model:3]"
  assert shapes["same_name/kernel"] == "[_d_model:4, d_model:5]"
  assert "sep/separable_conv1d/depthwise_conv_hack/depthwise_dense_3/kernel" in (
      shapes)


def test_decoding_states_match_tensorflow():
  x, old, new = RA([B, L, D], 1), RA([B, 3, D], 2), RA([B, D], 3)
  start = np.array([2, 4], np.int32)

  def model(mesh, t):
    ctx = _context(mesh, "first_part", start=t["start"])
    layer = ctl.Conv1D()
    layer.record_states_first_part_mode(ctx, t["x"], 3)
    inc = _context(mesh, "incremental", states=[t["old"]])
    window = layer.record_states_incremental_mode(inc, t["new"], 3)
    return {"first": ctx.new_states[0], "window": window}

  def reference(t):   # TensorFlow, so that gradients are checked too
    zero = tf.zeros([D])
    first = tf.stack([tf.stack([t["x"][b, i - 3 + j] if i - 3 + j >= 0
                                else zero for j in range(3)])
                      for b, i in enumerate(start)])
    return {"first": first,
            "window": tf.concat([t["old"][:, 1:], t["new"][:, None]], 1)}

  harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;length:6;d_model:4"),
              "old": (old, "batch:2;length:3;d_model:4"),
              "new": (new, "batch:2;d_model:4"),
              "start": (start, "batch:2")},
      [(FOUR, "batch:rows;length:cols"), (FOUR, "d_model:rows;batch:cols")],
      wrt=["x", "old", "new"], reference=reference)


def test_incremental_conv_equals_full_sequence_conv():
  """Decoding step by step gives the causal full-sequence outputs."""
  x = RA([B, L, D], 4)
  ids = np.ones([B, L], np.int32)

  def model(mesh, t):
    layer = ctl.SeparableConv1DLayer(-2, 0, output_size=D)
    ctx = _context(mesh, "train", ids=t["ids"])
    ctx.scope = "s"
    full = layer.call(ctx, t["x"])
    length = t["x"].shape.dims[1]
    first = _context(mesh, "first_part", ids=t["ids"], start=mtf.constant(
        mesh, 2, shape=mtf.Shape([mtf.Dimension("batch", B)]),
        dtype=tf.int32))
    first.scope = "s"
    layer.call(first, t["x"])
    step = _context(mesh, "incremental", states=first.new_states)
    step.scope = "s"
    x2 = mtf.reduce_sum(mtf.slice(t["x"], 2, 1, "length"),
                        reduced_dim=mtf.Dimension("length", 1))
    y2 = layer.call(step, x2)
    want = mtf.reduce_sum(mtf.slice(full, 2, 1, length.name),
                          reduced_dim=mtf.Dimension("length", 1))
    return {"step": y2, "full": want}

  run = harness.run_model(model, {"x": (x, "batch:2;length:6;d_model:4"),
                                  "ids": (ids, "batch:2;length:6")},
                          FOUR, "batch:rows;d_model:cols")
  np.testing.assert_allclose(run.outputs["step"], run.outputs["full"],
                             rtol=1e-5, atol=1e-5)


def test_layer_stack_layers_keyword_and_errors():
  stack = transformer.LayerStack(layers=[ctl.Conv1DLayer(3, 8)])
  assert stack.num_layers == 1
  with pytest.raises(ValueError, match="pass the layer list once"):
    transformer.LayerStack([], layers=[])
  with pytest.raises(ValueError, match="max_relative_pos -1 < "):
    ctl.SeparableConv1DLayer(0, -1, 4)
  with pytest.raises(ValueError, match="must be positive"):
    ctl.Conv1DLayer(0, 4)
