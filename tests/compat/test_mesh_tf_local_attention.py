"""Mesh TF's blocked local and memory-compressed attention
(meshtf/compat/local_attention.py): layout-invariant values and
gradients with the blocks dims split (halo exchanges across processors),
and the masks checked against a direct computation."""
import numpy as np
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.compat import layers

HEADS, KV = mtf.Dimension("heads", 2), mtf.Dimension("kv", 3)


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _with_variables(mesh, outputs):
  """outputs plus every variable's value, to check against numpy."""
  for v in mesh.graph.trainable_variables:
    outputs["var:" + v.name] = v.outputs[0]
  return outputs


def test_local_1d_spatial_blocks_match_direct_attention():
  # [batch:2, nb:4, w:3, d:4]: blocks of 3 positions, each sees its own
  # block and the previous one (zeros before the first).
  x = harness.random_array([2, 4, 3, 4], 0)

  def model(mesh, t):
    return _with_variables(mesh, {
        "causal": layers.local_self_attention_spatial_blocks(
            t["x"], KV, HEADS, is_training=False, mask_right=True,
            name="causal"),
        "both": layers.local_self_attention_spatial_blocks(
            t["x"], KV, HEADS, is_training=False, name="both")})
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;nb:4;w:3;d:4")},
      [("all:4", "nb:all"), ("r:2;c:2", "nb:r;heads:c")],
      wrt=["x"])
  run = next(iter(runs.values()))
  q, k, v, o = (run.outputs["var:causal/" + n] for n in "qkvo")
  # Direct: block b attends to blocks b-1 and b (zeros for b-1 < 0),
  # hiding positions to the right of the query in its own block.
  padded = np.concatenate([np.zeros_like(x[:, :1]), x], axis=1)
  memory = np.concatenate([padded[:, :-1], padded[:, 1:]], axis=2)  # [2,4,6,4]
  qs = np.einsum("bnwd,dhk->bhnwk", x, q)
  ks = np.einsum("bnmd,dhk->bhnmk", memory, k)
  vs = np.einsum("bnmd,dhk->bhnmk", memory, v)
  bias = np.where(np.arange(6)[None, :] > np.arange(3)[:, None] + 3, -1e9, 0)
  att = _softmax(np.einsum("bhnwk,bhnmk->bhnwm", qs, ks) + bias)
  want = np.einsum("bhnwm,bhnmk,hkd->bnwd", att, vs, o)
  np.testing.assert_allclose(run.outputs["causal"], want, rtol=1e-4,
                             atol=1e-5)


def test_local_2d_spatial_blocks_and_raster_mask():
  x = harness.random_array([1, 2, 2, 2, 2, 4], 1)

  def model(mesh, t):
    return {"causal": layers.local_2d_self_attention_spatial_blocks(
                t["x"], KV, HEADS, is_training=False, mask_right=True,
                name="causal"),
            "both": layers.local_2d_self_attention_spatial_blocks(
                t["x"], KV, HEADS, is_training=False, name="both")}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:1;nh:2;nw:2;h:2;w:2;d:4")},
      [("all:4", "nw:all"), ("r:2;c:2", "nh:r;nw:c")], wrt=["x"])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  h, w = mtf.Dimension("h", 2), mtf.Dimension("w", 3)
  bias = layers.attention_bias_local_2d_block(
      mesh, h, w, mtf.Dimension("memory_h", 2), mtf.Dimension("memory_w", 3))
  got = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])}).export_to_tf_tensor(bias).numpy()
  assert got.shape == (2, 3, 4, 6)
  for i in range(2):
    for j in range(3):
      for mi in range(4):
        for mj in range(6):
          row, col = mi - 2, mj - 3
          visible = row < i or (row == i and col <= j)
          assert (got[i, j, mi, mj] == 0) == visible, (i, j, mi, mj)


def test_memory_compressed_attention_and_local_incremental_decoding():
  x = harness.random_array([2, 8, 4], 2)

  def model(mesh, t):
    return _with_variables(mesh, {
        "compressed": layers.multihead_self_attention_memory_compressed(
            t["x"], True, 2, KV, HEADS, is_training=False, name="mc")})
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;length:8;d:4")},
      [("all:2", "batch:all"), ("r:2;c:2", "batch:r;heads:c")], wrt=["x"])
  run = next(iter(runs.values()))
  q, k, v, o = (run.outputs["var:mc/" + n] for n in "qkvo")
  memory = x.reshape([2, 4, 2, 4]).mean(2)
  logits = np.einsum("bld,dhk,bme,ehk->bhlm", x, q, memory, k)
  hidden = np.arange(4)[None, :] * 2 + 1 > np.arange(8)[:, None]
  logits = np.where(hidden, logits - 1e9, logits)
  # extra_logit 0: one more logit of value 0 in every softmax.
  z = np.concatenate([logits, np.zeros(logits.shape[:-1] + (1,))], -1)
  att = _softmax(z)[..., :-1]
  want = np.einsum("bhlm,bme,ehk,hkd->bld", att, memory, v, o)
  np.testing.assert_allclose(run.outputs["compressed"], want, rtol=1e-4,
                             atol=1e-5)

  # Incremental local attention writes the ring cache at step mod window.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, io = mtf.Dimension("batch", 2), mtf.Dimension("d", 4)
  window = mtf.Dimension("window", 3)
  cache = mtf.zeros(mesh, mtf.Shape([batch, HEADS, window, KV]))
  xs = mtf.random_uniform(mesh, mtf.Shape([batch, io]))
  y, k_new, _ = layers.masked_local_attention_1d_incremental(
      xs, cache, cache, mtf.constant(mesh, 4, dtype=tf.int32), name="loc")
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])})
  k_np = lowering.export_to_tf_tensor(k_new).numpy()
  assert np.abs(k_np[:, :, [0, 2]]).max() == 0
  assert np.abs(k_np[:, :, 1]).min() > 0
  assert lowering.export_to_tf_tensor(y).numpy().shape == (2, 4)
