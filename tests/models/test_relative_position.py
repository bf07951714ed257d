"""T5's relative position bias (meshtf/models/relative_position.py) and the
T5-shaped Transformer (SelfAttention's relative_attention_type, LayerStack's
mask_padding).

The buckets equal T5's definition computed in numpy for distances -300..300
(bidirectional and causal); tiny T5.1.1- and T5.1.0-shaped encoder-decoders
(a shared table, per-layer tables, packed examples with per-segment
positions) give the single-device loss, logits and gradients on 8 virtual
devices under layouts that split heads (the table's dim), the length and
memory_length (the bias's dims), unevenly over 3 processors, on both
backends, and under remat as without; cached greedy decoding, whose bias comes from the scalar decoding
position, equals the full model's argmax at every position.
"""
import math

import numpy as np
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import relative_position
from meshtf.models import transformer

B, L, V = 4, 8, 24
TWO = "rows:2;cols:4"


def _t5_bucket(rel, bidirectional, num_buckets=32, max_distance=128):
  """T5's bucket of memory_position - query_position, in numpy float32."""
  n = -rel.astype(np.int64)
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore", invalid="ignore"):
    large = max_exact + (
        np.log(n.astype(np.float32) / np.float32(max_exact))
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  return ret + np.where(n < max_exact, n, large)


def test_buckets_are_t5s():
  rel = np.arange(-300, 301, dtype=np.int32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.constant(rel), "rel:%d" % len(rel))
  outs = [relative_position.relative_position_bucket(x, bidirectional=b)
          for b in (True, False)]
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "placement", "all:1", "")})
  for bidirectional, out in zip((True, False), outs):
    got = lowering.export_to_tf_tensor(out).numpy()
    want = _t5_bucket(rel, bidirectional)
    np.testing.assert_array_equal(got, want)
    assert got.min() == 0 and got.max() == 31
  # What T5's buckets are: exact up to 8 (bidirectional) / 16 (causal)
  # apart, a far-away bucket shared beyond max_distance, later memory
  # positions on their own half when bidirectional, all of them in bucket
  # 0 when causal.
  bi, causal = (_t5_bucket(rel, b) for b in (True, False))
  zero = 300
  assert list(bi[zero - 7:zero + 1]) == list(range(7, -1, -1))
  assert list(bi[zero + 1:zero + 8]) == list(range(17, 24))
  assert (causal[zero:] == 0).all() and causal[zero - 15] == 15
  assert (bi[:zero - 127] == 15).all() and (causal[:zero - 127] == 31).all()


def _packed(seed):
  """inputs / targets with two packed segments per row, their segment ids
  and per-segment positions, then padding."""
  rs = np.random.RandomState(seed)
  out = {k: np.zeros([B, L], np.int32) for k in
         ("inputs", "targets", "inputs_segmentation", "targets_segmentation",
          "inputs_position", "targets_position")}
  for b in range(B):
    for part in ("inputs", "targets"):
      start = 0
      for s, n in enumerate((rs.randint(2, 5), rs.randint(1, 3))):
        out[part][b, start:start + n] = rs.randint(2, V, size=n)
        out[part][b, start + n - 1] = 1
        out[part + "_segmentation"][b, start:start + n] = s + 1
        out[part + "_position"][b, start:start + n] = np.arange(n)
        start += n
  return out


def _t5(version, **kwargs):
  """A tiny T5.1.1 (gated GELU, untied logits, one shared table) or T5.1.0
  (ReLU, tied embedding, a table per layer) encoder-decoder."""
  common = dict(vocab_size=V, d_model=8, num_layers=2, num_heads=4, d_kv=2,
                d_ff=12, max_length=L, vocab_divisor=1,
                positional_embedding=False, mask_padding=True, **kwargs)
  if version == "1.1":
    return transformer.make_bitransformer(
        gated=True, activation="gelu",
        relative_attention_type="bias_shared", **common)
  return transformer.make_bitransformer(
      shared_embedding_and_softmax_weights=True,
      relative_attention_type="bias", **common)


def test_a_shared_table_under_remat():
  """remat recomputes each block in its gradient: the shared table is made
  outside every block (LayerStack.before_stack), so all layers may read it;
  the loss and gradients are those without remat."""
  feats = _packed(3)
  shape = "batch:%d;length:%d" % (B, L)
  outs = {}
  for remat in ("none", "full"):
    model_obj = _t5("1.1", remat=remat)

    def model(mesh, x, model_obj=model_obj):
      # bfloat16 activations: the table is a cast of the variable, a tensor
      # a recomputed block must not own.
      _, loss, _ = transformer.compute_logits_loss_metrics(
          model_obj, x, variable_dtype=dtypes.VariableDType(
              tf.float32, tf.float32, tf.bfloat16))
      return {"loss": loss}
    outs[remat] = harness.run_model(
        model, {k: (v, shape) for k, v in feats.items()}, "all:1", "")
  none, full = outs["none"], outs["full"]
  np.testing.assert_allclose(full.outputs["loss"], none.outputs["loss"],
                             rtol=1e-6)
  assert sorted(full.grads) == sorted(none.grads) and len(none.grads) > 40
  for name, value in none.grads.items():
    np.testing.assert_allclose(full.grads[name], value, rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_t5_shapes_are_layout_invariant():
  feats = _packed(0)
  shape = "batch:%d;length:%d" % (B, L)
  for version in ("1.1", "1.0"):
    model_obj = _t5(version)

    def model(mesh, x, model_obj=model_obj):
      logits, loss, _ = transformer.compute_logits_loss_metrics(
          model_obj, x, mode="eval")
      return {"loss": loss, "logits": logits}
    harness.assert_layout_invariant(
        model, {k: (v, shape) for k, v in feats.items()},
        [(TWO, "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
         (TWO, "length:rows;memory_length:cols;vocab:cols"),
         ("a:3", "heads:a;d_ff:a")],
        rtol=2e-4, atol=2e-5)


def test_the_shared_table_is_one_variable_per_stack():
  names = {}
  for version in ("1.1", "1.0"):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    feats = transformer.import_features(mesh, {
        k: v for k, v in _packed(1).items() if not k.endswith("position")})
    transformer.compute_logits_loss_metrics(_t5(version), feats)
    names[version] = sorted(v.name for v in graph.all_variables
                            if v.name.endswith("relative_attention_bias"))
  assert names["1.1"] == [
      "decoder/layer_000/SelfAttention/relative_attention_bias",
      "encoder/layer_000/SelfAttention/relative_attention_bias"]
  assert len(names["1.0"]) == 4     # 2 self-attention layers per stack


def test_cached_greedy_decoding_keeps_the_bias():
  """Each greedily decoded token is the full model's argmax given the
  tokens before it: the incremental steps' bias (from the scalar position)
  is the full pass's, at every position; the same tokens on a 2-D layout."""
  rs = np.random.RandomState(2)
  inputs = rs.randint(2, V, size=[B, L]).astype(np.int32)
  inputs[1, 5:] = 0
  model_obj = _t5("1.1")

  def run(mesh_shape, layout):
    graph = mtf.Graph(seed=0)
    mesh = mtf.Mesh(graph, "m")
    x = mtf.import_tf_tensor(mesh, tf.constant(inputs), "batch:%d;length:%d"
                             % (B, L))
    greedy = model_obj.decode(x)
    logits, _ = model_obj.call_simple(
        x, greedy, compute_loss=False, mode="infer",
        decoder_sequence_id=mtf.ones(mesh, greedy.shape, dtype=tf.int32))
    lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
        "simd", mesh_shape, layout)})
    return [lowering.export_to_tf_tensor(t).numpy() for t in (greedy, logits)]
  greedy, logits = run("all:1", "")
  for b in range(B):
    ends = np.where(greedy[b] == 1)[0]
    n = ends[0] + 1 if len(ends) else L
    np.testing.assert_array_equal(greedy[b, :n], logits[b, :n].argmax(-1))
  np.testing.assert_array_equal(
      run(TWO, "batch:rows;heads:cols;d_ff:cols")[0], greedy)


def test_bad_relative_attention_types_are_refused():
  for bad in ("relative", "contextual"):
    try:
      transformer.make_layer_stack(1, relative_attention_type=bad)
    except ValueError as e:
      assert "relative_attention_type %r" % bad in str(e)
    else:
      raise AssertionError("accepted %r" % bad)
