"""mtf.layers (meshtf/models/layers.py) through the layout harness.

Each layer runs on the 1-device mesh and on 8 virtual devices with layouts
that split the dims it touches, on both backends; where the weights are
fixed (constant / ones initializers) the single-device run is also checked
against a TensorFlow reference, values and input gradients.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import layers

RA = harness.random_array
TWO = "rows:2;cols:4"


# --- dense -------------------------------------------------------------------
def test_dense_matches_tf_on_every_layout():
  x_np, w_np = RA([8, 8], 0), RA([8, 16], 1)

  def model(mesh, x):
    d_ff = mtf.Dimension("d_ff", 16)
    y = layers.dense(x["x"], d_ff, activation=mtf.relu,
                     kernel_initializer=mtf.constant_initializer(w_np))
    return {"y": y}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;d_model:8")},
      [("all:8", "d_ff:all"), (TWO, "batch:rows;d_model:cols"),
       (TWO, "d_model:rows;d_ff:cols")],
      wrt=["x"], reference=lambda x: {"y": tf.nn.relu(x["x"] @ w_np)})


def test_dense_expert_dims_and_several_reduced_dims():
  x_np, w_np = RA([2, 4, 2, 4], 2), RA([2, 2, 4, 8], 3)

  def model(mesh, x):
    out = mtf.Dimension("d_ff", 8)
    xx = x["x"]
    y = layers.dense(xx, out, reduced_dims=xx.shape.dims[2:],
                     expert_dims=[xx.shape.dims[0]],
                     kernel_initializer=mtf.constant_initializer(w_np))
    return {"y": y}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "expert:2;batch:4;a:2;b:4")},
      [(TWO, "expert:rows;d_ff:cols"), (TWO, "batch:rows;b:cols"),
       (TWO, "a:rows;batch:cols")],
      wrt=["x"],
      reference=lambda x: {"y": tf.einsum("ebij,eijf->ebf", x["x"], w_np)})


def test_dense_variable_names_and_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:2;d_model:4")
  h = layers.dense(x, mtf.Dimension("d_ff", 8))
  y = layers.dense(h, mtf.Dimension("d_model", 4), use_bias=False)
  assert [v.name for v in graph.trainable_variables] == [
      "dense/kernel", "dense/bias", "dense_1/kernel"]
  assert y.shape == mtf.convert_to_shape("batch:2;d_model:4")
  assert graph.trainable_variables[0].shape == mtf.convert_to_shape(
      "d_model:4;d_ff:8")
  with pytest.raises(ValueError):
    layers.dense(x, mtf.Dimension("batch", 3))


# --- normalization -----------------------------------------------------------
def _tf_layer_norm(x, eps=1e-6):
  mean = tf.reduce_mean(x, -1, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
  return (x - mean) * tf.math.rsqrt(var + eps)


NORM_LAYOUTS = [("all:8", "d_model:all"), (TWO, "batch:rows;d_model:cols"),
                (TWO, "d_model:rows;batch:cols")]


def test_layer_norm_matches_tf():
  x_np = RA([8, 16], 4) * 3.0 + 1.0

  def model(mesh, x):
    dim = x["x"].shape.dims[-1]
    return {"y": layers.layer_norm(x["x"], dim)}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;d_model:16")}, NORM_LAYOUTS, wrt=["x"],
      reference=lambda x: {"y": _tf_layer_norm(x["x"])}, atol=1e-4,
      rtol=1e-4)


def test_rms_norm_matches_tf():
  x_np = RA([8, 16], 5) * 3.0

  def model(mesh, x):
    dim = x["x"].shape.dims[-1]
    return {"y": layers.rms_norm(x["x"], dim)}

  def ref(x):
    v = tf.reduce_mean(tf.square(x["x"]), -1, keepdims=True)
    return {"y": x["x"] * tf.math.rsqrt(v + 1e-6)}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;d_model:16")}, NORM_LAYOUTS, wrt=["x"],
      reference=ref, atol=1e-4, rtol=1e-4)


# --- embedding and cross entropy ----------------------------------------------
def test_embedding_matches_tf_gather():
  table = RA([16, 8], 6)
  ids = np.random.RandomState(7).randint(0, 16, size=[8, 4]).astype(np.int32)

  def model(mesh, x):
    vocab, d_model = mtf.Dimension("vocab", 16), mtf.Dimension("d_model", 8)
    return {"y": layers.embedding(
        x["ids"], vocab, d_model,
        initializer=mtf.constant_initializer(table))}
  harness.assert_layout_invariant(
      model, {"ids": (ids, "batch:8;length:4")},
      [("all:8", "vocab:all"), (TWO, "batch:rows;vocab:cols"),
       (TWO, "vocab:rows;d_model:cols")],
      reference=lambda x: {"y": tf.gather(table, x["ids"])})


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_softmax_cross_entropy_matches_tf(z_loss):
  logits = RA([8, 16], 8) * 4.0
  targets = np.asarray(tf.nn.softmax(RA([8, 16], 9) * 3.0))

  def model(mesh, x):
    vocab = x["logits"].shape.dims[-1]
    return {"loss": layers.softmax_cross_entropy_with_logits(
        x["logits"], x["targets"], vocab, z_loss=z_loss)}

  def ref(x):
    loss = tf.nn.softmax_cross_entropy_with_logits(x["targets"], x["logits"])
    lse = tf.reduce_logsumexp(x["logits"], -1)
    return {"loss": loss + z_loss * tf.square(lse)}
  shape = "batch:8;vocab:16"
  harness.assert_layout_invariant(
      model, {"logits": (logits, shape), "targets": (targets, shape)},
      [("all:8", "vocab:all"), (TWO, "batch:rows;vocab:cols"),
       (TWO, "vocab:rows;batch:cols")],
      wrt=["logits", "targets"], reference=ref)


def test_cross_entropy_with_one_hot_targets():
  logits = RA([8, 16], 10) * 4.0
  ids = np.random.RandomState(11).randint(0, 16, size=[8]).astype(np.int32)

  def model(mesh, x):
    vocab = x["logits"].shape.dims[-1]
    return {"loss": layers.softmax_cross_entropy_with_logits(
        x["logits"], mtf.one_hot(x["ids"], vocab), vocab)}
  harness.assert_layout_invariant(
      model, {"logits": (logits, "batch:8;vocab:16"), "ids": (ids, "batch:8")},
      [("all:8", "vocab:all"), (TWO, "batch:rows;vocab:cols"),
       (TWO, "vocab:rows;batch:cols")], wrt=["logits"],
      reference=lambda x: {"loss": tf.nn.sparse_softmax_cross_entropy_with_logits(
          x["ids"], x["logits"])})


# --- feed-forward ------------------------------------------------------------
def test_dense_relu_dense_layout_invariant(dropout=0.25):
  x_np = RA([8, 8], 12)

  def model(mesh, x):
    y = layers.dense_relu_dense(x["x"], mtf.Dimension("d_ff", 16),
                                dropout=dropout)
    return {"y": y}
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;d_model:8")},
      [("all:8", "d_ff:all"), (TWO, "batch:rows;d_ff:cols"),
       (TWO, "d_model:rows;d_ff:cols")], wrt=["x"])
  names = [v.name for v in next(iter(runs.values())).graph.trainable_variables]
  assert names == ["dense_relu_dense/wi/kernel", "dense_relu_dense/wo/kernel"]


# --- attention ---------------------------------------------------------------
B, H, L, D = 2, 4, 8, 4
IDS = np.array([[5, 3, 7, 1, 2, 9, 0, 0], [4, 4, 8, 6, 1, 0, 0, 0]], np.int32)
# Every query keeps at least one unmasked key (a fully masked row would only
# compare rounding of -1e9 sums).
SEG = np.array([[1, 1, 1, 2, 2, 3, 3, 3], [1, 1, 2, 2, 2, 2, 2, 2]], np.int32)


def _np_masks():
  causal = np.where(np.arange(L)[:, None] < np.arange(L)[None, :], -1e9, 0.0)
  pad = np.where(IDS == 0, -1e9, 0.0)                        # [b, m]
  seg = np.where(SEG[:, :, None] != SEG[:, None, :], -1e9, 0.0)   # [b, l, m]
  return causal, pad, seg


def test_attention_masks():
  def model(mesh, x):
    length = x["ids"].shape.dims[-1]
    pos = mtf.range(mesh, length, tf.int32)
    return {"causal": layers.attention_mask_autoregressive(pos),
            "pad": layers.attention_mask_ignore_padding(x["ids"]),
            "seg": layers.attention_mask_same_segment(x["seg"])}
  causal, pad, seg = _np_masks()
  runs = harness.assert_layout_invariant(
      model, {"ids": (IDS, "batch:2;length:8"),
              "seg": (SEG, "batch:2;length:8")},
      [(TWO, "batch:rows;length:cols"), (TWO, "length:rows;memory_length:cols"),
       ("all:8", "memory_length:all")])
  out = next(iter(runs.values())).outputs
  np.testing.assert_array_equal(out["causal"], causal.astype(np.float32))
  np.testing.assert_array_equal(out["pad"], pad.astype(np.float32))
  np.testing.assert_array_equal(out["seg"], seg.astype(np.float32))


ATTN_LAYOUTS = [(TWO, "batch:rows;heads:cols"), (TWO, "heads:rows;d_kv:cols"),
                (TWO, "length:rows;memory_length:cols")]


def test_dot_product_attention_matches_tf_with_masks():
  q_np, k_np, v_np = RA([B, H, L, D], 13), RA([B, H, L, D], 14), RA(
      [B, H, L, D], 15)

  def model(mesh, x):
    length = x["ids"].shape.dims[-1]
    mask = (layers.attention_mask_autoregressive(
        mtf.range(mesh, length, tf.int32))
            + layers.attention_mask_ignore_padding(x["ids"])
            + layers.attention_mask_same_segment(x["seg"]))
    return {"o": layers.dot_product_attention(x["q"], x["k"], x["v"], mask)}

  causal, pad, seg = _np_masks()
  bias = (causal[None, None] + pad[:, None, None, :]
          + seg[:, None]).astype(np.float32)

  def ref(x):
    logits = tf.einsum("bhld,bhmd->bhlm", x["q"], x["k"]) + bias
    return {"o": tf.einsum("bhlm,bhmd->bhld", tf.nn.softmax(logits), x["v"])}
  q_shape = "batch:2;heads:4;length:8;d_kv:4"
  m_shape = "batch:2;heads:4;memory_length:8;d_kv:4"
  harness.assert_layout_invariant(
      model, {"q": (q_np, q_shape), "k": (k_np, m_shape), "v": (v_np, m_shape),
              "ids": (IDS, "batch:2;length:8"),
              "seg": (SEG, "batch:2;length:8")},
      ATTN_LAYOUTS, wrt=["q", "k", "v"], reference=ref)


def test_dot_product_attention_dropout_layout_invariant():
  q_np, k_np = RA([B, H, L, D], 16), RA([B, H, L, D], 17)

  def model(mesh, x):
    k = layers.rename_length_to_memory_length(x["k"])
    return {"o": layers.dot_product_attention(x["q"], k, k, None,
                                              dropout=0.3)}
  shape = "batch:2;heads:4;length:8;d_kv:4"
  harness.assert_layout_invariant(
      model, {"q": (q_np, shape), "k": (k_np, shape)}, ATTN_LAYOUTS[:2],
      wrt=["q", "k"])


def test_multihead_self_attention_layout_invariant():
  x_np = RA([B, L, 8], 18)

  def model(mesh, x):
    length = x["x"].shape.dims[1]
    mask = layers.attention_mask_autoregressive(
        mtf.range(mesh, length, tf.int32))
    y = layers.multihead_attention(x["x"], None, mask,
                                   mtf.Dimension("d_kv", D),
                                   mtf.Dimension("heads", H))
    return {"y": y}
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:2;length:8;d_model:8")},
      [(TWO, "batch:rows;heads:cols"), (TWO, "heads:rows;d_kv:cols"),
       (TWO, "length:rows;d_model:cols")], wrt=["x"])
  graph = next(iter(runs.values())).graph
  assert [v.name for v in graph.trainable_variables] == [
      "multihead_attention/" + n for n in "qkvo"]


def test_multihead_attention_matches_tf_with_memory():
  x_np, m_np = RA([B, L, 8], 19), RA([B, 6, 8], 20)
  wq, wk, wv = RA([8, H, D], 21), RA([8, H, D], 22), RA([8, H, D], 23)
  wo = RA([H, D, 8], 24)

  def model(mesh, x):
    graph_vars_init = {"q": wq, "k": wk, "v": wv, "o": wo}
    y = layers.multihead_attention(x["x"], x["m"], None,
                                   mtf.Dimension("d_kv", D),
                                   mtf.Dimension("heads", H))
    # Fixed weights for the TensorFlow check (the layer itself takes no
    # initializers, as in Mesh TensorFlow): swap them in before lowering.
    for v in mesh.graph.trainable_variables:
      v._initializer = mtf.constant_initializer(
          graph_vars_init[v.name.split("/")[-1]])
    return {"y": y}

  def ref(x):
    q = tf.einsum("bli,ihd->bhld", x["x"], wq)
    k = tf.einsum("bmi,ihd->bhmd", x["m"], wk)
    v = tf.einsum("bmi,ihd->bhmd", x["m"], wv)
    w = tf.nn.softmax(tf.einsum("bhld,bhmd->bhlm", q, k))
    return {"y": tf.einsum("bhmd,bhlm,hdi->bli", v, w, wo)}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:2;length:8;d_model:8"),
              "m": (m_np, "batch:2;memory_length:6;d_model:8")},
      [(TWO, "batch:rows;heads:cols"), (TWO, "memory_length:rows;d_kv:cols")],
      wrt=["x", "m"], reference=ref, rtol=1e-4, atol=1e-4)


# --- dense_product -----------------------------------------------------------
SMALL = "rows:2;cols:2"  # 4 devices: SPMD runs on 8 cost ~3x more
def test_dense_product_geglu_matches_tf():
  """["gelu", None] (a GEGLU): gelu(x W0) * (x W1), both factors' kernels
  set by the shared kernel_initializer kwarg."""
  x_np, w_np = RA([8, 8], 30), RA([8, 16], 31)

  def model(mesh, x):
    d_model, d_ff = x["x"].shape.dims[-1], mtf.Dimension("d_ff", 16)
    return {"y": layers.dense_product(
        x["x"], [d_model], [d_ff], ["gelu", None], use_bias=False,
        kernel_initializer=mtf.constant_initializer(w_np))}

  def ref(x):
    h = x["x"] @ w_np
    return {"y": tf.nn.gelu(h, approximate=True) * h}
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;d_model:8")},
      [("all:4", "d_ff:all"), (SMALL, "batch:rows;d_model:cols"),
       (SMALL, "d_model:rows;d_ff:cols")],
      wrt=["x"], reference=ref, rtol=1e-4, atol=1e-4)
  graph = next(iter(runs.values())).graph
  assert [v.name for v in graph.trainable_variables] == [
      "dense_product_0/kernel", "dense_product_1/kernel"]


def test_dense_product_names_and_activations():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:2;d_model:4")
  d_model, d_ff = x.shape.dims[-1], mtf.Dimension("d_ff", 8)
  y = layers.dense_product(x, [d_model], [d_ff], activation_functions="relu",
                           name="ffn")
  layers.dense_product(x, [d_model], [d_ff], ["linear", mtf.sigmoid])  # GLU
  assert y.shape == mtf.convert_to_shape("batch:2;d_ff:8")
  assert [v.name for v in graph.trainable_variables] == [
      "ffn/kernel", "ffn/bias", "dense_product_0/kernel",
      "dense_product_0/bias", "dense_product_1/kernel", "dense_product_1/bias"]
  with pytest.raises(ValueError, match="'no_such_op' is not a meshtf op"):
    layers.dense_product(x, [d_model], [d_ff], ["no_such_op"])


# --- batch_norm --------------------------------------------------------------
BN_MOMENTUM, BN_EPS = 0.9, 1e-3
BN_MOVING_MEAN = RA([4], 32)


def test_batch_norm_matches_tf_and_updates_moving_stats():
  """Training over [batch, length] (split by the layouts): the output and
  its gradients match tf.nn.batch_normalization with the batch moments, and
  the assigns move the moving statistics by (1 - momentum) * moment (read
  back with read_variable)."""
  from meshtf.ops import variables
  x_np = RA([8, 2, 4], 33) * 2.0 + 0.5

  def model(mesh, x):
    y, updates = layers.batch_norm(x["x"], True, BN_MOMENTUM, BN_EPS)
    assert [op.name for op in updates] == ["batch_norm/bn_mean_update",
                                           "batch_norm/bn_var_update"]
    v = {var.name: var for var in mesh.graph.all_variables}
    out = {"y": y}
    for n in ("mean", "variance"):
      var = v["batch_norm/bn_moving_" + n]
      out[n + "_step"] = (variables.read_variable(var) -
                          BN_MOMENTUM * var.outputs[0])
    return out

  def ref(x):
    mean, var = tf.nn.moments(x["x"], [0, 1])
    step = lambda m: tf.stop_gradient((1.0 - BN_MOMENTUM) * m)
    return {"y": tf.nn.batch_normalization(x["x"], mean, var, None, None,
                                           BN_EPS),
            "mean_step": step(mean), "variance_step": step(var)}
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;length:2;channels:4")},
      [("all:4", "batch:all"), (SMALL, "batch:rows;channels:cols"),
       (SMALL, "length:rows;batch:cols")],
      wrt=["x"], reference=ref, rtol=1e-4, atol=1e-4)
  graph = next(iter(runs.values())).graph
  assert [v.name for v in graph.trainable_variables] == [
      "batch_norm/batch_norm_scale", "batch_norm/batch_norm_bias"]
  assert [v.name for v in graph.all_variables][2:] == [
      "batch_norm/bn_moving_mean", "batch_norm/bn_moving_variance"]


def test_batch_norm_eval_uses_moving_stats():
  """is_training=False: (x - moving_mean) / sqrt(moving_variance + eps),
  no updates; dims_to_normalize names the dims."""
  x_np = RA([8, 2, 4], 34)

  def model(mesh, x):
    y, updates = layers.batch_norm(x["x"], False, BN_MOMENTUM, BN_EPS,
                                   dims_to_normalize=x["x"].shape.dims[:2],
                                   name="bn_eval")
    assert updates == []
    # A known moving mean for the reference (the default is random normal).
    mesh.graph.all_variables[2]._initializer = mtf.constant_initializer(
        BN_MOVING_MEAN)
    return {"y": y}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;length:2;channels:4")},
      [("all:2", "channels:all")], wrt=["x"], reference=lambda x: {
          "y": (x["x"] - BN_MOVING_MEAN) / np.sqrt(1.0 + BN_EPS)},
      rtol=1e-4, atol=1e-4)


def test_batch_norm_errors():
  x = mtf.zeros(mtf.Mesh(mtf.Graph(), "m"), "batch:2;channels:4")
  with pytest.raises(ValueError, match="batch_norm: no dim"):
    layers.batch_norm(x, True, 0.9, dims_idx_start=1, dims_idx_end=1)
  with pytest.raises(ValueError, match="has no dimension depth"):
    layers.batch_norm(x, True, 0.9, dims_to_normalize=[
        mtf.Dimension("depth", 2)])


# --- masked_local_attention_1d -----------------------------------------------
def _tf_local_attention(x, wq, wk, wv, wo, window):
  q = tf.einsum("bli,ihd->bhld", x, wq)
  k = tf.einsum("bmi,ihd->bhmd", x, wk)
  v = tf.einsum("bmi,ihd->bhmd", x, wv)
  n = x.shape[1]
  p, m = np.arange(n)[:, None], np.arange(n)[None, :]
  bias = np.where((m <= p) & (m > p - window), 0.0, -1e9).astype(np.float32)
  w = tf.nn.softmax(tf.einsum("bhld,bhmd->bhlm", q, k) + bias)
  return tf.einsum("bhlm,bhmd,hdi->bli", w, v, wo)


LOCAL_X = RA([2, 16, 4], 34)
LOCAL_W = [RA([4, 2, 2], 35 + i) for i in range(3)] + [RA([2, 2, 4], 38)]


def _local_attention_model(window, length_per_split):
  def model(mesh, x):
    heads, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 2)
    d_model = x["x"].shape.dims[-1]
    shapes = [[d_model, heads, d_kv]] * 3 + [[heads, d_kv, d_model]]
    # Not trainable: the weights' gradients are plain einsums (tested
    # elsewhere), and leaving them out keeps the test quick.
    params = [mtf.get_variable(mesh, n, s, trainable=False,
                               initializer=mtf.constant_initializer(w))
              for n, s, w in zip("qkvo", shapes, LOCAL_W)]
    kv = []
    y = layers.masked_local_attention_1d(
        x["x"], d_kv, heads, window_size=window,
        length_per_split=length_per_split, params=params, return_kv=kv)
    assert [t.shape for t in kv] == [mtf.convert_to_shape(
        "batch:2;heads:2;length:16;d_kv:2")] * 2
    return {"y": y}
  return model


def test_masked_local_attention_1d_matches_tf():
  """Position p sees (p - window, p]. Window 6 with blocks of 4: the halo is
  a block and a half, from the previous processor where length is split
  (alone, or with heads or batch)."""
  harness.assert_layout_invariant(
      _local_attention_model(6, 4),
      {"x": (LOCAL_X, "batch:2;length:16;d_model:4")},
      [("all:4", "length:all"), (SMALL, "length:rows;heads:cols"),
       ("a:2;b:2", "batch:a;length:b")],
      wrt=["x"], reference=lambda x: {"y": _tf_local_attention(
          x["x"], *LOCAL_W, window=6)}, rtol=1e-4, atol=1e-4)


def test_masked_local_attention_1d_blocks_longer_than_window():
  """Window 3 with blocks of 8 (the mask, not the halo, limits the window)."""
  harness.assert_layout_invariant(
      _local_attention_model(3, 8),
      {"x": (LOCAL_X, "batch:2;length:16;d_model:4")},
      [("all:2", "length:all")], wrt=["x"],
      reference=lambda x: {"y": _tf_local_attention(
          x["x"], *LOCAL_W, window=3)}, rtol=1e-4, atol=1e-4)


def test_masked_local_attention_1d_variables_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:2;length:16;d_model:4")
  heads, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 2)
  y = layers.masked_local_attention_1d(x, d_kv, heads, window_size=4)
  assert y.shape == x.shape
  assert [v.name for v in graph.trainable_variables] == [
      "masked_local_attention_1d/" + n for n in "qkvo"]
  with pytest.raises(ValueError, match="length_per_split=5 must divide"):
    layers.masked_local_attention_1d(x, d_kv, heads, length_per_split=5)



def test_masked_local_attention_1d_blocks_split_unevenly():
  """Blocks of 8: 2 blocks over 4 processors (two hold none) or 3 blocks of
  the length 12 split unevenly -- the halo comes from a gathered blocks
  dim; still the numbers of one device."""
  harness.assert_layout_invariant(
      _local_attention_model(6, 8),
      {"x": (LOCAL_X, "batch:2;length:16;d_model:4")},
      [("all:4", "length:all"), ("a:3", "length:a")],
      wrt=["x"], reference=lambda x: {"y": _tf_local_attention(
          x["x"], *LOCAL_W, window=6)}, rtol=1e-4, atol=1e-4)


# --- uneven splits -------------------------------------------------------------
def test_layers_on_uneven_splits():
  """d_model:10, vocab:13, batch:5 and channels:3 split unevenly (padding
  poisoned by the harness): layer_norm and rms_norm over a padded d_model,
  the embedding lookup and the cross entropy over a padded vocab, and
  batch_norm's moments over a padded batch."""
  x_np = RA([5, 10], 40) * 3.0 + 1.0
  logits = RA([5, 13], 41) * 4.0
  ids = np.array([0, 12, 5, 7, 3], np.int32)
  table = RA([13, 10], 42)
  c_np = RA([5, 2, 3], 43) * 2.0 + 0.5

  def model(mesh, x):
    d_model = x["x"].shape.dims[-1]
    vocab = x["logits"].shape.dims[-1]
    y, _ = layers.batch_norm(x["c"], True, BN_MOMENTUM, BN_EPS)
    return {"layer_norm": layers.layer_norm(x["x"], d_model),
            "rms_norm": layers.rms_norm(x["x"], d_model),
            "embedding": layers.embedding(
                x["ids"], vocab, d_model,
                initializer=mtf.constant_initializer(table)),
            "xent": layers.softmax_cross_entropy_with_logits(
                x["logits"], mtf.one_hot(x["ids"], vocab), vocab, z_loss=1e-2),
            "batch_norm": y}

  def ref(x):
    v = tf.reduce_mean(tf.square(x["x"]), -1, keepdims=True)
    lse = tf.reduce_logsumexp(x["logits"], -1)
    mean, var = tf.nn.moments(x["c"], [0, 1])
    return {"layer_norm": _tf_layer_norm(x["x"]),
            "rms_norm": x["x"] * tf.math.rsqrt(v + 1e-6),
            "embedding": tf.gather(table, x["ids"]),
            "xent": tf.nn.sparse_softmax_cross_entropy_with_logits(
                x["ids"], x["logits"]) + 1e-2 * tf.square(lse),
            "batch_norm": tf.nn.batch_normalization(x["c"], mean, var, None,
                                                    None, BN_EPS)}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:5;d_model:10"),
              "logits": (logits, "batch:5;vocab:13"), "ids": (ids, "batch:5"),
              "c": (c_np, "batch:5;length:2;channels:3")},
      [("all:8", "d_model:all"), (TWO, "batch:rows;vocab:cols"),
       ("a:3", "vocab:a;channels:a"), ("a:3", "batch:a"),
       (TWO, "d_model:cols+rows;channels:cols"),
       (TWO, harness.annotated("vocab:cols", {
           "x": "batch:cols;d_model:rows", "logits": "batch:rows+cols",
           "c": "channels:rows;length:cols"}))],
      wrt=["x", "logits", "c"], reference=ref, rtol=1e-4, atol=1e-4)


def test_corr_and_weights_nonzero_as_mesh_tf():
  """Mesh TF's layers.corr (tfp.stats.correlation, channels as the event
  axis) and weights_nonzero, on a layout that splits the sample dim."""
  x = harness.random_array([8, 3], 11)
  t = np.array([[0, 3, 1], [2, 0, 0]] * 4, np.float32)

  def reference(v):
    c = v["x"] - tf.reduce_mean(v["x"], axis=0)
    cov = tf.einsum("bi,bj->ij", c, c)
    n = tf.sqrt(tf.reduce_sum(c * c, axis=0))
    return {"c": cov / (n[:, None] * n[None]),
            "w": tf.cast(tf.not_equal(v["t"], 0), tf.float32)}
  harness.assert_layout_invariant(
      lambda mesh, v: {"c": mtf.layers.corr(v["x"], v["x"].shape.dims[1]),
                       "w": mtf.layers.weights_nonzero(v["t"])},
      {"x": (x, "batch:8;channels:3"), "t": (t, "batch:8;channels:3")},
      [("all:4", "batch:all")], reference=reference)
