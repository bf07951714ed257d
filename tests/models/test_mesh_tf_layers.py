"""More of Mesh TF's mtf.layers names (meshtf/models/mesh_tf_layers.py):
layout-invariant values and gradients, matching TensorFlow's math where it
has the same function."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import layers

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
