"""Normalizations whose backward pass keeps the activations' dtype
(meshtf/models/norms.py): softmax, rms_norm, layer_norm, cross_entropy.

1. In float32: values and gradients are TensorFlow's own (1e-5), and the
   same on every layout (the harness; the reduced dim split, evenly and
   not, both backends).
2. In bfloat16: values and gradients follow the float32 ones within
   bfloat16's precision (tolerances below), the statistics stay float32.
3. What the backward pass keeps: with bfloat16 activations every tensor
   kept across the backward pass that has the activation's size is
   bfloat16; float32 only as one number per position.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import norms
from meshtf.models import transformer_layers as tl
from meshtf.plan import accounting

SHAPE = "batch:4;heads:3;d:10"
D = mtf.Dimension("d", 10)
X = harness.random_array([4, 3, 10], 0, low=-2.0, high=2.0)
BIAS = np.where(harness.random_array([3, 10], 1) > 0.5, -1e9, 0.0).astype(
    np.float32)
IDS = np.random.RandomState(2).randint(0, 10, size=[4, 3]).astype(np.int32)


def _reference_rms(x, scale=1.0):
  return x * tf.math.rsqrt(tf.reduce_mean(x * x, -1, keepdims=True) + 1e-6
                           ) * scale


def _reference_layer_norm(x):
  mean = tf.reduce_mean(x, -1, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
  return (x - mean) * tf.math.rsqrt(var + 1e-6)


def _reference_cross_entropy(x, ids, smoothing=0.1, z_loss=1e-3):
  hot = tf.one_hot(ids, 10, on_value=1.0 - smoothing + smoothing / 10,
                   off_value=smoothing / 10)
  lse = tf.reduce_logsumexp(x, -1)
  return -tf.reduce_sum(hot * (x - lse[..., None]), -1) + z_loss * lse ** 2


def _model(kind, dtype=tf.float32):
  def fn(mesh, inputs):
    x = inputs["x"]
    if dtype != tf.float32:
      x = mtf.cast(x, dtype)
    if kind == "softmax":
      y = norms.softmax(x, D, bias=inputs["bias"])
    elif kind == "rms_norm":
      y = norms.rms_norm(x, D, name="n")
    elif kind == "layer_norm":
      y = norms.layer_norm(x, D, name="n")
    else:
      y = norms.cross_entropy(x, inputs["ids"], D, on_value=0.91,
                              off_value=0.01, z_loss=1e-3)
    return {"y": mtf.cast(y, tf.float32)}
  return fn


INPUTS = {"x": (X, SHAPE), "bias": (BIAS, "heads:3;d:10"),
          "ids": (IDS, "batch:4;heads:3")}
REFERENCES = {
    "softmax": lambda i: {"y": tf.nn.softmax(i["x"] + i["bias"])},
    "rms_norm": lambda i: {"y": _reference_rms(i["x"])},
    "layer_norm": lambda i: {"y": _reference_layer_norm(i["x"])},
    "cross_entropy": lambda i: {"y": _reference_cross_entropy(i["x"],
                                                              i["ids"])},
}
# d:10 on 4 processors is uneven (its padding poisoned by the harness).
LAYOUTS = [("all:4", "d:all"), ("rows:2;cols:2", "batch:rows;d:cols")]


@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_float32_is_tensorflow_on_every_layout(kind):
  harness.assert_layout_invariant(_model(kind), INPUTS, LAYOUTS, wrt=["x"],
                                  reference=REFERENCES[kind])


@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_bfloat16_follows_float32(kind):
  f32 = harness.run_model(_model(kind), INPUTS, "all:1", "", wrt=["x"])
  b16 = harness.run_model(_model(kind, tf.bfloat16), INPUTS, "rows:2;cols:2",
                          "batch:rows;d:cols", backend="simd", wrt=["x"])
  # bfloat16 keeps 8 bits of mantissa (relative 2**-8 per rounding): the
  # input, the kept output and the gradient are each rounded once.
  for name in f32.outputs:
    np.testing.assert_allclose(b16.outputs[name], f32.outputs[name],
                               rtol=2e-2, atol=2e-2)
  for name, g in f32.grads.items():
    scale = np.abs(g).max()
    np.testing.assert_allclose(b16.grads[name], g, rtol=3e-2,
                               atol=3e-2 * scale, err_msg=name)


def _kept(build):
  """[(tensor, bytes)] kept across the backward pass of build's graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  loss = build(mesh)
  variables = [v.outputs[0] for v in graph.trainable_variables]
  mtf.gradients([loss], variables)
  layout = mtf.MeshLayout("all:1", "")
  ops = list(graph.operations)
  return accounting.kept_for_backward(
      ops, layout.assign(ops), graph.backward_start)


def _attention_block(mesh):
  ctx = tl.Context(mesh, [mtf.Dimension("batch", 2)],
                   mtf.Dimension("length", 16), mtf.Dimension("d_model", 8),
                   variable_dtype=mtf.VariableDType(
                       tf.float32, activation_dtype=tf.bfloat16),
                   autoregressive=True)
  x = mtf.cast(mtf.random_normal(mesh, "batch:2;length:16;d_model:8"),
               tf.bfloat16)
  for norm in (norms.rms_norm, norms.layer_norm):
    ctx.scope = "layer_%s/att" % norm.__name__
    x = x + tl.SelfAttention(4, 4).call(ctx, norm(x, ctx.model_dim,
                                                  name=ctx.scope + "/n"))
  w = mtf.cast(mtf.get_variable(mesh, "w", "d_model:8;vocab:32"),
              tf.bfloat16)
  logits = mtf.einsum([x, w], output_shape="batch:2;length:16;vocab:32")
  ids = mtf.cast(mtf.random_uniform(mesh, "batch:2;length:16") * 32,
                 tf.int32)
  return mtf.reduce_sum(norms.cross_entropy(logits, ids, mtf.Dimension(
      "vocab", 32)))


def test_bfloat16_attention_and_norms_keep_bfloat16():
  kept = _kept(_attention_block)
  big = [(t, n) for t, n in kept if t.shape.size >= 2 * 16 * 8]
  assert big, kept
  assert {t.dtype for t, _ in big} == {tf.bfloat16}, [
      (t.name, t.dtype.name, t.shape) for t, _ in big if
      t.dtype != tf.bfloat16]
  # float32 is kept only as statistics: one number per position.
  small_f32 = [t for t, _ in kept if t.dtype == tf.float32]
  assert all(t.shape.size <= 2 * 16 for t in small_f32), small_f32
  # The attention weights [batch, heads, length, memory_length] are kept
  # once per layer, in bfloat16.
  weights = [t for t, _ in big if "memory_length" in t.shape.dimension_names
             and "heads" in t.shape.dimension_names and
             "d_kv" not in t.shape.dimension_names]
  assert len(weights) == 2, [t.shape for t in weights]
