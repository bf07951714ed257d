"""Transformer models (meshtf/models/transformer.py, transformer_layers.py,
training.py).

The full models run through the layout harness (the loss, the LM's logits,
and the gradients of every variable on 1 device vs 8 virtual devices, both
backends); a 1-block LM matches a numpy Transformer; masks and positions
are checked against their definitions on one device; a tiny language model
learns a copy task with TrainStep; and a paper-scale model builds
symbolically.
"""
import math
import time

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.layouts import tensor_layouts
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer
from meshtf.models import transformer_layers as tl

TWO = "rows:2;cols:4"
PAPER = "batch:rows;vocab:cols;d_ff:cols;heads:cols"
B, L, V = 8, 8, 16


def _packed_lm_batch(seed):
  """Packed LM features: two segments per row, then padding."""
  rs = np.random.RandomState(seed)
  targets = np.zeros([B, L], np.int32)
  seg = np.zeros([B, L], np.int32)
  pos = np.zeros([B, L], np.int32)
  for b in range(B):
    n1 = rs.randint(2, 5)
    n2 = rs.randint(1, L - n1 + 1 - (b % 2))
    for s, (start, n) in enumerate([(0, n1), (n1, n2)]):
      targets[b, start:start + n] = rs.randint(2, V, size=n)
      targets[b, start + n - 1] = 1                      # EOS
      if n > 2:
        targets[b, start + 1] = 1                        # inputs | targets
      seg[b, start:start + n] = s + 1
      pos[b, start:start + n] = np.arange(n)
  return targets, seg, pos


def _step(mesh):
  return mtf.constant(mesh, 7, [], dtype=tf.int32)


# --- full models on every layout ----------------------------------------------
def test_lm_layout_invariant_packed_smoothing_gated():
  targets, seg, pos = _packed_lm_batch(0)
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=1, num_heads=4, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1, label_smoothing=0.1, z_loss=1e-2,
      loss_on_targets_only=True, gated=True)

  def model(mesh, x):
    logits, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["targets"], "targets_segmentation": x["seg"],
             "targets_position": x["pos"]})
    return {"loss": loss, "logits": logits, "accuracy": metrics["accuracy"]}
  shape = "batch:%d;length:%d" % (B, L)
  harness.assert_layout_invariant(
      model, {"targets": (targets, shape), "seg": (seg, shape),
              "pos": (pos, shape)},
      [("all:8", "batch:all"), (TWO, PAPER), (TWO, "length:rows;d_model:cols")],
      rtol=2e-4, atol=2e-5)


def test_loss_and_metric_sums_go_out_as_one_allreduce():
  """With the batch split, the token count, the loss sum and the correct
  count are one fused allreduce of 3 scalars (metrics made before read)."""
  targets = _packed_lm_batch(1)[0]
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=1, num_heads=4, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1)

  def model(mesh, ids):
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": mtf.import_tf_tensor(mesh, ids, "batch:%d;length:%d"
                                             % (B, L))})
    return [loss, metrics["accuracy"], metrics["num_tokens"]]
  fn = mtf.MeshFunction(model, harness.make_impl("simd", "all:4",
                                                  "batch:all"))
  one = mtf.MeshFunction(model, harness.make_impl("simd", "all:1", ""))
  np.testing.assert_allclose([float(v) for v in fn(tf.constant(targets))],
                             [float(v) for v in one(tf.constant(targets))],
                             rtol=1e-6)
  stats = fn.collective_stats()
  assert [(s["elements_per_device"], s["count"]) for s in stats] == [
      (3, 1)], stats


def test_step_dropout_is_layout_invariant():
  x_np = harness.random_array([B, L, 8], 3)

  def model(mesh, x):
    dims = x["x"].shape.dims
    ctx = tl.Context(mesh, dims[:1], dims[1], dims[2])
    ctx.step = mtf.constant(mesh, 5, [], dtype=tf.int64)
    return {"y": tl.dropout(x["x"], ctx, 0.3, name="drop"),
            "z": tl.dropout(x["x"], ctx, 0.5, broadcast_dims=["length"],
                            name="drop_b")}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:%d;length:%d;d_model:8" % (B, L))},
      [("all:8", "batch:all"), (TWO, "length:rows;d_model:cols"),
       (TWO, "d_model:rows;batch:cols")], wrt=["x"])


def test_step_dropout_in_a_graph_calls_one_shared_function_same_bits():
  """In a traced program the step's uniform draw is a call of a shared,
  not-inlined function (rng.shared_function), bit for bit the op-by-op
  draw."""
  from meshtf.lowering import rng
  key = rng.op_key(7, "drop")
  begin = tf.constant([2, 0], tf.int64)
  step = tf.constant(5, tf.int64)
  direct = tl._StepUniformSlice([2, 8], [4, 8], tf.float32)(key, begin, step)
  impl = mtf.SimdMeshImpl("all:2", "length:all", harness.DEVICES[:2])

  def build(mesh, x_tf):
    x = mtf.import_tf_tensor(mesh, x_tf, "length:4;d_model:8")
    ctx = tl.Context(mesh, [], x.shape.dims[0], x.shape.dims[1])
    ctx.step = mtf.constant(mesh, 5, [], dtype=tf.int64)
    return {"a": tl.dropout(x, ctx, 0.25, name="drop"),
            "b": tl.dropout(x, ctx, 0.25, name="drop_b")}
  fn = mtf.MeshFunction(build, impl)
  fn(np.ones([4, 8], np.float32))
  ops = fn.lowering.program.graph.get_operations()
  calls = {op.get_attr("f").name for op in ops if op.type in (
      "PartitionedCall", "StatefulPartitionedCall")}
  assert len(calls) == 1
  assert not [op for op in ops if op.type == "BitwiseXor"]
  shared = rng.shared_function(("step_uniform", (2, 8), (4, 8), "float32"),
                               None)
  np.testing.assert_array_equal(
      shared(rng.key_words(key), begin, step).numpy(), direct.numpy())


def _tiny_bitransformer():
  """Encoder [SelfAttention, DenseReluDense], decoder [SelfAttention,
  EncDecAttention]: every layer kind once, to keep the graph small."""
  def stack(layer_list):
    return transformer.LayerStack(layer_list, norm_type="layer_norm")
  kwargs = dict(d_model=8, input_vocab_size=V, max_length=L, vocab_divisor=1,
                positional_embedding="sinusoidal", z_loss=1e-3)
  encoder = transformer.Unitransformer(
      stack([tl.SelfAttention(4, 4), tl.DenseReluDense(16)]),
      output_vocab_size=None, autoregressive=False, name="encoder", **kwargs)
  decoder = transformer.Unitransformer(
      stack([tl.SelfAttention(4, 4), tl.EncDecAttention(4, 4)]),
      output_vocab_size=V, autoregressive=True, name="decoder",
      shared_embedding_and_softmax_weights=True, **kwargs)
  return transformer.Bitransformer(encoder, decoder, shared_embedding=True)


def test_encdec_layout_invariant_padding_shared_embeddings():
  rs = np.random.RandomState(1)
  inputs = rs.randint(2, V, size=[B, L]).astype(np.int32)
  targets = rs.randint(2, V, size=[B, L]).astype(np.int32)
  for b in range(B):          # padding at the ends
    inputs[b, L - b % 3:] = 0
    targets[b, L - (b + 1) % 4:] = 0
  model_obj = _tiny_bitransformer()

  def model(mesh, x):
    _, loss, _ = transformer.compute_logits_loss_metrics(
        model_obj, {"inputs": x["inputs"], "targets": x["targets"]})
    return {"loss": loss}
  shape = "batch:%d;length:%d" % (B, L)
  inputs = {"inputs": (inputs, shape), "targets": (targets, shape)}
  model_parallel = [(TWO, PAPER), (TWO, "memory_length:cols;d_kv:rows")]
  runs = harness.assert_layout_invariant(
      model, inputs, [("all:8", "batch:all")] + model_parallel,
      rtol=2e-4, atol=2e-5)
  names = [v.name for v in next(iter(runs.values())).graph.trainable_variables]
  assert "shared/embedding" in names
  assert "decoder/layer_001/EncDecAttention/q" in names
  assert not any(n.endswith("logits/kernel") for n in names)


# --- semantics on one device --------------------------------------------------
def _one_device(model_fn, inputs):
  return harness.run_model(model_fn, inputs, "all:1", "").outputs


def _np_rms(x, scale):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def _inputs_part(targets, seg):
  """Numpy delimited_lm_inputs_mask: through the first EOS of a segment."""
  out = np.zeros_like(targets)
  for b in range(targets.shape[0]):
    for i in range(targets.shape[1]):
      same = seg[b, :i] == seg[b, i]
      eos_before = np.sum((targets[b, :i] == 1) & same)
      out[b, i] = int(eos_before == 0 and targets[b, i] != 0)
  return out


def test_lm_matches_a_numpy_transformer():
  """Loss and logits of a 1-block packed LM against the same model written
  in numpy with the variables' values."""
  targets, seg, pos = _packed_lm_batch(4)
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=1, num_heads=2, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1, label_smoothing=0.1, z_loss=1e-2,
      loss_on_targets_only=True)

  def model(mesh, x):
    logits, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["t"], "targets_segmentation": x["s"],
             "targets_position": x["p"]})
    return {"loss": loss, "logits": logits, "accuracy": metrics["accuracy"]}
  shape = "batch:%d;length:%d" % (B, L)
  run = harness.run_model(model, {"t": (targets, shape), "s": (seg, shape),
                                  "p": (pos, shape)}, "all:1", "")
  w = {op.name: np.asarray(entry.full_value())
       for op, entry in run.lowering.variables.items()}
  sa = "decoder/layer_000/SelfAttention/"
  ff = "decoder/layer_001/DenseReluDense/"
  inputs = np.where(np.arange(L) > 0, np.roll(targets, 1, 1), 0)
  inputs = inputs * (np.roll(seg, 1, 1) == seg)
  x = w["decoder/embedding"][inputs] + w["decoder/positional_embedding"][pos]
  n = _np_rms(x, w[sa + "norm/rms_norm_scale"])
  q, k, v = [np.einsum("bld,dhk->bhlk", n, w[sa + c]) for c in "qkv"]
  visible = (np.arange(L)[None, :] <= np.arange(L)[:, None])[None] & (
      seg[:, :, None] == seg[:, None, :])
  a = np.einsum("bhik,bhjk->bhij", q, k) + np.where(visible, 0, -1e9)[:, None]
  a = np.exp(a - a.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  x = x + np.einsum("bhlk,hkd->bld", np.einsum("bhij,bhjk->bhik", a, v),
                    w[sa + "o"])
  n = _np_rms(x, w[ff + "norm/rms_norm_scale"])
  x = x + np.maximum(n @ w[ff + "wi/kernel"], 0) @ w[ff + "wo/kernel"]
  x = _np_rms(x, w["decoder/final_norm/rms_norm_scale"])
  logits = x @ w["decoder/logits/kernel"]
  np.testing.assert_allclose(run.outputs["logits"], logits, rtol=1e-4,
                             atol=1e-4)
  lse = np.log(np.exp(logits).sum(-1))
  soft = np.full(logits.shape, 0.1 / V)
  np.put_along_axis(soft, targets[..., None], 0.9 + 0.1 / V, -1)
  per_token = lse - (soft * logits).sum(-1) + 1e-2 * lse ** 2
  weights = (targets != 0) & (_inputs_part(targets, seg) == 0)
  np.testing.assert_allclose(run.outputs["loss"],
                             (per_token * weights).sum() / weights.sum(),
                             rtol=1e-5)
  correct = logits.argmax(-1) == targets
  np.testing.assert_allclose(run.outputs["accuracy"],
                             (correct * weights).sum() / weights.sum(),
                             rtol=1e-6)


def test_causal_and_segment_masks_hide_what_they_should():
  """Row 1 differs from row 0 only in position 5 (second segment): logits
  of segment 1 (positions 0-3) and of position 4 are unchanged."""
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=8, num_layers=1, num_heads=2, d_kv=4, d_ff=16,
      max_length=L, vocab_divisor=1)
  targets = np.array([[3, 4, 5, 1, 6, 7, 8, 1]] * 2, np.int32)
  targets[1, 5] = 9
  seg = np.array([[1, 1, 1, 1, 2, 2, 2, 2]] * 2, np.int32)
  pos = np.array([[0, 1, 2, 3, 0, 1, 2, 3]] * 2, np.int32)

  def model(mesh, x):
    logits, _, _ = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["t"], "targets_segmentation": x["s"],
             "targets_position": x["p"]}, mode="eval")
    return {"logits": logits}
  shape = "batch:2;length:8"
  logits = _one_device(model, {"t": (targets, shape), "s": (seg, shape),
                               "p": (pos, shape)})["logits"]
  # The decoder reads targets shifted right, so position 6 is the first to
  # see the change.
  np.testing.assert_allclose(logits[0, :6], logits[1, :6], rtol=1e-6)
  assert np.abs(logits[0, 6:] - logits[1, 6:]).max() > 1e-4


def test_masks_weights_and_positions_match_their_definitions():
  targets, seg, pos = _packed_lm_batch(2)
  d_model = mtf.Dimension("d_model", 8)

  def model(mesh, x):
    t, s = x["t"], x["s"]
    return {
        "inputs_part": mtf.cast(tl.delimited_lm_inputs_mask(t, s), tf.int32),
        "ar_inputs": tl.autoregressive_inputs(t, s),
        "signal": tl.sinusoidal_position_signal(x["p"], d_model),
    }
  shape = "batch:%d;length:%d" % (B, L)
  out = _one_device(model, {"t": (targets, shape), "s": (seg, shape),
                            "p": (pos, shape)})
  want_inputs = _inputs_part(targets, seg)
  want_ar = np.zeros_like(targets)
  for b in range(B):
    for i in range(1, L):
      if seg[b, i - 1] == seg[b, i]:
        want_ar[b, i] = targets[b, i - 1]
  np.testing.assert_array_equal(out["inputs_part"], want_inputs)
  np.testing.assert_array_equal(out["ar_inputs"], want_ar)
  c = np.arange(4)
  angle = pos[..., None] * np.exp(-math.log(1e4) * c / 3.0)
  np.testing.assert_allclose(
      out["signal"], np.concatenate([np.sin(angle), np.cos(angle)], -1),
      rtol=1e-5, atol=1e-5)


def test_step_dropout_changes_with_the_step_only():
  def model(mesh, x):
    out = {}
    for s in (3, 3, 4):
      ctx = tl.Context(mesh, [], x["x"].shape.dims[0], x["x"].shape.dims[1])
      ctx.step = mtf.constant(mesh, s, [], dtype=tf.int64)
      out["s%d_%d" % (s, len(out))] = tl.dropout(x["x"], ctx, 0.25,
                                                 name="drop")
    ctx.mode = "eval"
    out["eval"] = tl.dropout(x["x"], ctx, 0.25, name="drop")
    return out
  x = np.ones([64, 64], np.float32)
  out = _one_device(model, {"x": (x, "length:64;d_model:64")})
  a, a2, b = out["s3_0"], out["s3_1"], out["s4_2"]
  # Equal op names in one graph are made unique, so a and a2 are two
  # different draws; each keeps ~75% and scales by 1/0.75.
  for m in (a, a2, b):
    assert set(np.unique(m)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((m > 0).mean() - 0.75) < 0.03
  assert (a != b).mean() > 0.2 and (a != a2).mean() > 0.2
  # Independent draws: both kept with probability 0.75^2.
  assert abs(((a > 0) & (b > 0)).mean() - 0.5625) < 0.03
  np.testing.assert_array_equal(out["eval"], x)
  # Same name, same step, new graph: the same mask.
  again = _one_device(model, {"x": (x, "length:64;d_model:64")})
  np.testing.assert_array_equal(again["s3_0"], a)


def test_function_layer_extra_losses_are_added():
  def aux_layer(x, context):
    w = mtf.get_variable(context.mesh, context.scope + "/w", [],
                         initializer=mtf.constant_initializer(0.5))
    context.losses.append(mtf.reduce_mean(mtf.square(x)) * w)
    return x * w
  stack = transformer.make_layer_stack(
      1, num_heads=2, d_kv=4, d_ff=16,
      feedforward_layer_fn=lambda i: aux_layer)
  lm = transformer.Unitransformer(stack, d_model=8, input_vocab_size=V,
                                  output_vocab_size=V, autoregressive=True,
                                  max_length=L, vocab_divisor=1)
  targets, _, _ = _packed_lm_batch(3)

  def model(mesh, x):
    _, loss, metrics = transformer.compute_logits_loss_metrics(
        lm, {"targets": x["t"]})
    return {"loss": loss, "token_loss": metrics["token_loss"],
            "extra": metrics["extra_loss"]}
  out = _one_device(model, {"t": (targets, "batch:%d;length:%d" % (B, L))})
  assert out["extra"] > 0
  np.testing.assert_allclose(out["loss"], out["token_loss"] + out["extra"],
                             rtol=1e-6)


def test_bad_configurations_raise_clear_errors():
  stack = transformer.make_layer_stack(1, 2, 4, 16)
  with pytest.raises(ValueError, match="positional_embedding"):
    transformer.Unitransformer(stack, 8, V, V, True, L,
                               positional_embedding="rotary")
  with pytest.raises(ValueError, match="output_vocab_size"):
    transformer.Unitransformer(stack, 8, V, None, True, L)
  with pytest.raises(ValueError, match="norm_type"):
    transformer.LayerStack([], norm_type="batch_norm")
  enc = transformer.Unitransformer(stack, 8, V, None, False, L, name="e")
  dec = transformer.Unitransformer(stack, 8, 2 * V, 2 * V, True, L,
                                   vocab_divisor=1, name="d")
  with pytest.raises(ValueError, match="shared_embedding"):
    transformer.Bitransformer(enc, dec, shared_embedding=True)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  lm = transformer.Unitransformer(
      transformer.LayerStack([lambda x, c: mtf.reduce_sum(x)]), 8, V, V,
      True, L)
  ids = mtf.zeros(mesh, "batch:2;length:8", dtype=tf.int32)
  with pytest.raises(ValueError, match="must return a Tensor of shape"):
    lm.call_simple(ids, ids)
  with pytest.raises(ValueError, match="integer"):
    lm.call_simple(mtf.zeros(mesh, "batch:2;length:8"), ids)
  with pytest.raises(ValueError, match="'inputs'"):
    transformer.compute_logits_loss_metrics(
        transformer.Bitransformer(enc, transformer.Unitransformer(
            stack, 8, V, V, True, L, name="d2")), {"targets": ids})


# --- training -----------------------------------------------------------------
def _copy_batch(rs, batch, n):
  """[s_1..s_n, EOS, s_1..s_n, EOS]: the loss is on the copy."""
  seq = rs.randint(2, V, size=[batch, n]).astype(np.int32)
  eos = np.ones([batch, 1], np.int32)
  return np.concatenate([seq, eos, seq, eos], axis=1)


def test_tiny_lm_learns_the_copy_task():
  """7 random tokens, EOS, their copy, EOS; fresh batches every step, so
  the accuracy (measured before each update) is on unseen sequences."""
  length = 16
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_kv=8, d_ff=64,
      max_length=length, vocab_divisor=1, loss_on_targets_only=True,
      z_loss=0.0)
  impl = harness.make_impl("placement", "all:1", "")
  train = training.TrainStep(
      transformer.loss_fn(lm), impl,
      optimize.AdamWeightDecayOptimizer(optimize.warmup_then_decay(
          3e-2, 20, "constant"), bias_correction=True),
      clip_gradient_norm=1.0)
  rs = np.random.RandomState(0)
  start = time.time()
  history = []
  for _ in range(300):    # ~40 steps are enough with these settings
    out = train({"targets": _copy_batch(rs, 32, length // 2 - 1)})
    history.append(float(out["accuracy"]))
    if len(history) >= 10 and min(history[-10:]) >= 0.97:
      break
  elapsed = time.time() - start
  assert min(history[-10:]) >= 0.95, (len(history), history[-10:])
  assert history[0] < 0.3
  assert int(out["step"]) == len(history) - 1
  # Loss only on the copy and its EOS: length / 2 tokens per row.
  assert float(out["num_tokens"]) == 32 * (length // 2)
  assert "gradient_norm" in out
  assert elapsed < 60, elapsed


# --- paper scale, symbolic ----------------------------------------------------
def test_paper_scale_model_builds_symbolically_in_seconds():
  lm = transformer.make_unitransformer(
      vocab_size=32768, d_model=1024, num_layers=2, num_heads=128, d_kv=128,
      d_ff=65536, max_length=256, dropout_rate=0.1)
  mesh_shape = mtf.convert_to_shape("rows:16;cols:32")
  rules = mtf.convert_to_layout_rules(PAPER)
  start = time.time()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  targets = mtf.zeros(mesh, "batch:512;length:256", dtype=tf.int32)
  _, loss, _ = transformer.compute_logits_loss_metrics(
      lm, {"targets": targets}, step=_step(mesh))
  variables = [v.outputs[0] for v in graph.trainable_variables]
  grads = mtf.gradients([loss], variables)
  optimize.AdafactorOptimizer().apply_grads(grads, variables)
  for op in graph.operations:          # the layout is valid everywhere
    for t in op.outputs:
      tensor_layouts.tensor_layout(t.shape, mesh_shape, rules)
  elapsed = time.time() - start
  assert elapsed < 10, elapsed
  assert all(g is not None for g in grads)
  params = sum(v.shape.size for v in graph.trainable_variables)
  assert params > 250e6        # 2 x (2 x 1024 x 65536 + 4 x 1024 x 16384) + ...
  per_device = 0
  for v in graph.trainable_variables:
    layout = tensor_layouts.tensor_layout(v.shape, mesh_shape, rules)
    split = 1
    for a in layout:
      if a is not None:
        split *= mesh_shape.dims[a].size
    per_device += v.shape.size // split
  assert per_device < params / 25     # model-parallel over the 32 columns
