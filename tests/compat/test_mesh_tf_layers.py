"""More of Mesh TF's mtf.layers names (meshtf/compat/layers_extra.py):
layout-invariant values and gradients, matching TensorFlow's math where it
has the same function."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.compat import layers

LAYOUTS = [("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;d:cols")]


def test_jitter_cross_entropy_and_compress_mean():
  x = harness.random_array([8, 4], 0, low=-3.0, high=3.0)
  z = harness.random_array([8, 4], 1, low=0.0, high=1.0)

  def model(mesh, t):
    return {
        "jitter": layers.multiplicative_jitter(t["x"], 0.1),
        "xent": layers.sigmoid_cross_entropy_with_logits(t["x"], t["z"]),
        "compressed": layers.compress_mean(t["x"], t["x"].shape.dims[0], 4),
    }
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:8;d:4"), "z": (z, "batch:8;d:4")}, LAYOUTS,
      wrt=["x", "z"])
  out = next(iter(runs.values())).outputs
  ratio = out["jitter"] / x
  assert 0.9 <= ratio.min() < 1.0 < ratio.max() <= 1.1
  np.testing.assert_allclose(
      out["xent"], tf.nn.sigmoid_cross_entropy_with_logits(z, x), rtol=1e-5)
  np.testing.assert_allclose(out["compressed"],
                             x.reshape([2, 4, 4]).mean(1), rtol=1e-5)


def test_local_block_bias_and_annealed_dropout():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  block = mtf.Dimension("block_length", 3)
  bias = layers.attention_bias_local_block(
      mesh, block, mtf.Dimension("memory_length", 6))
  x = mtf.ones(mesh, "batch:64;d:16")
  half = layers.annealed_dropout(x, True, 0, 100, init_rate=0.5, step=50)
  done = layers.annealed_dropout(x, True, 0, 100, init_rate=0.5, step=100)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])})
  got = lowering.export_to_tf_tensor(bias).numpy()
  # The previous block is all visible; the current one hides the future.
  want = np.concatenate([np.zeros([3, 3]),
                         np.triu(np.full([3, 3], -1e9), 1)], axis=1)
  np.testing.assert_array_equal(got, want)
  kept = lowering.export_to_tf_tensor(half).numpy()
  # Rate 0.25 halfway: kept values are scaled by 1 / 0.75.
  assert 0.15 < (kept == 0).mean() < 0.35
  np.testing.assert_allclose(kept[kept != 0], 1 / 0.75, rtol=1e-6)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(done), 1.0)
  with pytest.raises(ValueError, match="step="):
    layers.annealed_dropout(x, True, 0, 100, init_rate=0.5)


def test_clip_activation_gradient_and_unit_scaling():
  x = harness.random_array([8, 4], 2)
  w = harness.random_array([4, 2], 3)

  def model(mesh, t):
    y = layers.clip_activation_gradient(t["x"], clip_rms_norm=1e-3)
    out = {"clipped": mtf.einsum([y, t["w"]], output_shape="batch:8;e:2")}
    layers.unit_scaling_convention(True)
    try:
      out["scaled"] = layers.us_einsum([t["x"], t["w"]],
                                       output_shape="batch:8;e:2")
    finally:
      layers.unit_scaling_convention(False)
    return out
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:8;d:4"), "w": (w, "d:4;e:2")}, LAYOUTS,
      wrt=["x"])
  base = next(iter(runs.values()))
  # float32 against a float64 reference: entries near 0 need an atol.
  np.testing.assert_allclose(base.outputs["scaled"], x @ w / 2.0, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(base.outputs["clipped"], x @ w, rtol=1e-5,
                             atol=1e-6)
  # The gradient reaching x through the clipped path has rms <= 1e-3; the
  # unclipped one (through us_einsum) is the rest.
  c_scaled = harness.random_array([8, 2], 1235)
  unclipped = c_scaled @ w.T / 2.0
  through_clip = base.grads["x"] - unclipped
  assert np.sqrt(np.mean(np.square(through_clip))) <= 1e-3 * 1.0001


def test_attention_params_and_incremental_self_attention():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, io, kv = (mtf.Dimension("heads", 2), mtf.Dimension("d", 4),
                   mtf.Dimension("kv", 3))
  params = layers.multihead_attention_params(mesh, heads, io, kv, tf.float32)
  assert [p.shape for p in params] == [mtf.Shape([heads, io, kv])] * 4
  memory = mtf.Dimension("memory_length", 5)
  batch = mtf.Dimension("batch", 2)
  cache = mtf.zeros(mesh, mtf.Shape([batch, heads, memory, kv]))
  x = mtf.random_uniform(mesh, mtf.Shape([batch, io]))
  step = mtf.constant(mesh, 2, dtype=tf.int32)
  y, k, v = layers.multihead_self_attention_incremental(
      x, cache, cache, step, tf.float32, tf.float32, name="att")
  y2 = layers.multihead_encdec_attention_incremental(
      x, *[mtf.get_variable(mesh, "att/" + n, shape=s) for n, s in (
          ("q", mtf.Shape([io, heads, kv])),
          ("o", mtf.Shape([heads, kv, io])))], k, v, None)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])})
  k_np = lowering.export_to_tf_tensor(k).numpy()
  # Only position 2 of the cache is written; the query attends to it
  # alone (earlier keys are zeros but visible: equal logits 0).
  assert np.abs(k_np[:, :, [0, 1, 3, 4]]).max() == 0
  assert np.abs(k_np[:, :, 2]).max() > 0
  assert lowering.export_to_tf_tensor(y).numpy().shape == (2, 4)
  assert lowering.export_to_tf_tensor(y2).numpy().shape == (2, 4)


def _revnet(mesh, x, recompute):
  """Two revnet blocks, f_i(t) = tanh(t . w_i) with w_i [d, d']."""
  d = x.shape.dims[-1]
  x1, x1b, x2, x2b = x, None, x * 0.5, None
  for i in range(2):
    w = mtf.get_variable(mesh, "w%d" % i, mtf.Shape(
        [d, mtf.Dimension("d_out", d.size)]),
        initializer=mtf.random_normal_initializer(stddev=0.5))

    def f(t, w=w):
      y = mtf.einsum([t, w], output_shape=t.shape.dims[:-1] + [
          w.shape.dims[-1]])
      return mtf.tanh(mtf.rename_dimension(y, "d_out", d.name))
    x1, x1b, x2, x2b = layers.reversible_half_residual_and_swap(
        x1, x1b, x2, x2b, f, recompute_grads=recompute)
  return {"y": (x1 + x2) * 0.5}


def test_reversible_blocks_recompute_the_same_gradients():
  x = harness.random_array([8, 4], 10)
  inputs = {"x": (x, "batch:8;d:4")}
  plain = harness.run_model(lambda m, t: _revnet(m, t["x"], False), inputs,
                            "all:1", "", wrt=["x"])
  runs = harness.assert_layout_invariant(
      lambda m, t: _revnet(m, t["x"], True), inputs, LAYOUTS, wrt=["x"])
  rebuilt = next(iter(runs.values()))
  np.testing.assert_allclose(rebuilt.outputs["y"], plain.outputs["y"],
                             rtol=1e-6)
  assert set(rebuilt.grads) == {"x", "w0", "w1"}
  for n, g in plain.grads.items():
    np.testing.assert_allclose(rebuilt.grads[n], g, rtol=1e-5, atol=1e-6,
                               err_msg=n)


def test_dense_initializers_and_mesh_tf_argument_orders():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "batch:4;d:64", dtype=tf.bfloat16)
  d_ff = mtf.Dimension("d_ff", 256)
  layers.dense(x, d_ff, [x.shape.dims[-1]], name="default")
  layers.dense(x, d_ff, [x.shape.dims[-1]], None, True, None, tf.float32,
               tf.float32, None,
               layers.VarianceScalingInitializer(4.0, "fan_out", "uniform"),
               name="uniform")   # Mesh TF's positional order

  class Constant(layers.DenseInitializer):
    def __call__(self, reduced_dims, new_dims):
      return mtf.constant_initializer(len(reduced_dims) + len(new_dims))
  layers.dense(x, d_ff, kernel_initializer=Constant(), name="const")
  table = layers.embedding_weights(mesh, mtf.Dimension("vocab", 5), d_ff,
                                   tf.float32, "emb",
                                   mtf.Dimension("ensemble", 3))
  assert table.shape == mtf.convert_to_shape("ensemble:3;vocab:5;d_ff:256")
  variables = {v.name: v for v in graph.trainable_variables}
  # bfloat16 activations keep float32 variables, as Mesh TF.
  assert variables["default/kernel"].dtype == tf.float32
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])})
  value = lambda n: lowering.export_to_tf_tensor(
      variables[n].outputs[0]).numpy()
  default = value("default/kernel")
  # Truncated at 2 stddevs of sqrt(1/64): the spread is 0.88 of that.
  assert np.abs(default).max() <= 2 / 8 + 1e-6
  np.testing.assert_allclose(default.std(), 0.8796 / 8, rtol=0.05)
  uniform = value("uniform/kernel")
  limit = np.sqrt(3 * 4.0 / 256)
  assert np.abs(uniform).max() <= limit and np.abs(uniform).max() > 0.9 * limit
  np.testing.assert_array_equal(value("const/kernel"), 2.0)
  with pytest.raises(ValueError, match="mode 'fan_sum'"):
    layers.VarianceScalingInitializer(mode="fan_sum")


def test_attention_is_training_is_the_fifth_argument_as_mesh_tf():
  q = harness.random_array([2, 3, 4], 11)
  k = harness.random_array([2, 5, 4], 12)

  def model(mesh, t):
    kk = mtf.rename_dimension(t["k"], "length", "memory_length")
    # Positionally (q, k, v, mask, is_training, dropout): with is_training
    # False the dropout of 0.5 is off.
    return {"o": layers.dot_product_attention(t["q"], kk, kk, None, False,
                                              0.5)}
  harness.assert_layout_invariant(
      model, {"q": (q, "batch:2;length:3;d:4"),
              "k": (k, "batch:2;length:5;d:4")},
      [("all:2", "batch:all")], wrt=["q", "k"],
      reference=lambda t: {"o": tf.nn.softmax(
          tf.einsum("bld,bmd->blm", t["q"], t["k"])) @ t["k"]})
