"""Index ops (meshtf/ops/index.py, meshtf/ops/topk.py): one_hot, range,
gather, scatter_add, cumsum, top_k, top_1, argmax, sort and
sample_with_temperature.

Every op runs through the harness on layouts that split the dim it works
along (and the batch dims), on both backends, against TensorFlow's own op
and autodiff. Float inputs of the selection ops are a random permutation of
distinct values, so there are no ties (a tie's gradient is ambiguous); the
tie rule is tested separately on integers, without gradients.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.lowering import rng
from meshtf.ops import index
from meshtf.ops import topk

BATCH, LENGTH = mtf.Dimension("batch", 8), mtf.Dimension("length", 4)
VOCAB, D = mtf.Dimension("vocab", 16), mtf.Dimension("d", 4)
IDS = "batch:8;length:4"
TABLE = "vocab:16;d:4"

# Layouts splitting the looked-up / selected dim `vocab`, the batch dims, or
# both (on different axes).
VOCAB_LAYOUTS = [
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("a:2;b:4", "vocab:a;length:b"),
    ("rows:2;cols:4", "batch:cols;d:rows"),
]


def ids_array(seed=0, low=0, high=16, shape=(8, 4)):
  return np.random.RandomState(seed).randint(low, high, shape).astype(np.int32)


def distinct(shape, seed=0):
  """A random permutation of distinct values in (-1, 1): no ties."""
  n = int(np.prod(shape))
  perm = np.random.RandomState(seed).permutation(n)
  return ((perm - n / 2.0) / n).reshape(shape).astype(np.float32)


# --- one_hot and range -------------------------------------------------------
@pytest.mark.parametrize("on,off,dtype", [(1.0, 0.0, tf.float32),
                                          (3.0, -1.0, tf.float32),
                                          (1, 0, tf.int32)])
def test_one_hot(on, off, dtype):
  # -1 and 16 are out of range: all off_value, as tf.one_hot.
  ids = ids_array(low=-1, high=17)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.one_hot(t["ids"], VOCAB, on, off, dtype)},
      {"ids": (ids, IDS)}, VOCAB_LAYOUTS[:3],
      reference=lambda t: {"y": tf.one_hot(t["ids"], 16, on, off,
                                           dtype=dtype)})


def test_range():
  x = harness.random_array([8, 16], 0)
  harness.assert_layout_invariant(
      lambda mesh, t: {"i": index.mtf_range(mesh, VOCAB, tf.int32),
                       "f": t["x"] * index.range(mesh, VOCAB, tf.float32),
                       "b": mtf.cast(index.range(mesh, VOCAB, tf.bfloat16),
                                     tf.float32)},
      {"x": (x, "batch:8;vocab:16")}, VOCAB_LAYOUTS[:2] + [
          ("a:2;b:4", "vocab:a;batch:b")], wrt=["x"],
      reference=lambda t: {"i": tf.range(16), "b": tf.range(16.0),
                           "f": t["x"] * tf.range(16.0)})


# --- gather and scatter_add --------------------------------------------------
def dense(w):
  # tf.gather's gradient is IndexedSlices; a reshape's gradient makes it a
  # dense tensor, which the harness compares.
  return tf.reshape(w, tf.shape(w))


def table_and_ids(ids=None):
  return {"w": (harness.random_array([16, 4], 1), TABLE),
          "ids": (ids_array() if ids is None else ids, IDS)}


def test_gather_embedding_lookup():
  # 32 lookups into 16 rows: repeated ids, so the gradient accumulates.
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.gather(t["w"], t["ids"], VOCAB)},
      table_and_ids(), VOCAB_LAYOUTS, wrt=["w"],
      reference=lambda t: {"y": tf.gather(dense(t["w"]), t["ids"])})


def test_gather_output_shape_and_out_of_range_ids():
  ids = ids_array(low=-2, high=18)  # out of range -> zero rows
  def reference(t):
    y = tf.einsum("blv,vd->dbl", tf.one_hot(t["ids"], 16), t["w"])
    return {"y": y}
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.gather(t["w"], t["ids"], "vocab",
                                         output_shape=[D, BATCH, LENGTH])},
      table_and_ids(ids), VOCAB_LAYOUTS[:3], wrt=["w"], reference=reference)


def test_gather_with_batch_dims():
  # weights and indices share `batch`: row b reads its own entries.
  inputs = {"w": (harness.random_array([8, 16], 2), "batch:8;vocab:16"),
            "ids": (ids_array(shape=(8, 4)), "batch:8;k:4")}
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.gather(t["w"], t["ids"], VOCAB)},
      inputs, [("all:8", "vocab:all"),
               ("rows:2;cols:4", "batch:rows;vocab:cols"),
               ("a:2;b:4", "k:a;batch:b")], wrt=["w"],
      reference=lambda t: {"y": tf.gather(dense(t["w"]), t["ids"],
                                          batch_dims=1)})


def test_gather_int_bool_and_scalar_index():
  w = np.arange(64, dtype=np.int32).reshape(16, 4)
  harness.assert_layout_invariant(
      lambda mesh, t: {"i": index.gather(t["w"], t["ids"], VOCAB),
                       "b": mtf.cast(index.gather(
                           mtf.greater(t["w"], 30), t["ids"], VOCAB), tf.int32),
                       "s": index.gather(t["w"], 5, VOCAB)},
      {"w": (w, TABLE), "ids": (ids_array(), IDS)}, VOCAB_LAYOUTS[:3],
      reference=lambda t: {"i": tf.gather(t["w"], t["ids"]),
                           "b": tf.cast(tf.gather(t["w"], t["ids"]) > 30,
                                        tf.int32),
                           "s": t["w"][5]})


def test_scatter_add():
  updates = harness.random_array([8, 4, 4], 3)
  def reference(t):
    return {"y": tf.math.unsorted_segment_sum(t["u"], t["ids"], 16)}
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.scatter_add(t["u"], t["ids"], VOCAB,
                                              [VOCAB, D])},
      {"u": (updates, "batch:8;length:4;d:4"), "ids": (ids_array(), IDS)},
      VOCAB_LAYOUTS[:3], wrt=["u"], reference=reference)


def test_gather_with_ids_and_table_dims_on_one_axis():
  # Indices' batch and the table's vocab both on `all`: no processor holds a
  # matching pair of stripes, so the lookup gathers the ids and
  # reduce-scatters; the gradient gathers the updates instead.
  runs = harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.gather(t["w"], t["ids"], VOCAB)},
      table_and_ids(), [("all:8", "batch:all;vocab:all"),
                        ("rows:2;cols:4", "length:cols;vocab:cols;d:rows")],
      wrt=["w"], reference=lambda t: {"y": tf.gather(dense(t["w"]),
                                                    t["ids"])})
  stats = runs[("simd", "all:8", "batch:all;vocab:all")
               ].lowering.collective_stats()
  count = lambda kind: sum(s["count"] for s in stats if s["kind"] == kind)
  # ids (forward), ids and updates (gradient); the lookup's sum lands split
  # over the ids' axis: one reduce-scatter, no allreduce.
  assert (count("allconcat"), count("reduce_scatter"),
          count("allreduce_sum")) == (3, 1, 0)


def test_gather_collectives():
  def stats(layout):
    run = harness.run_model(
        lambda mesh, t: {"y": index.gather(t["w"], t["ids"], VOCAB)},
        table_and_ids(), layout[0], layout[1])
    return [(s["kind"], s["mesh_axes"], s["count"])
            for s in run.lowering.collective_stats()]
  # Split table: each stripe's rows, summed over the table's axis.
  assert stats(("rows:2;cols:4", "batch:rows;vocab:cols")) == [
      ("allreduce_sum", ("cols",), 1)]
  # Data parallel: local lookups.
  assert stats(("all:8", "batch:all")) == []


# --- cumsum ------------------------------------------------------------------
CUMSUM_LAYOUTS = [
    ("all:4", "length:all"),
    ("rows:2;cols:4", "batch:rows;length:cols"),
    ("rows:2;cols:4", "length:rows;batch:cols"),
]


@pytest.mark.parametrize("exclusive", [False, True])
def test_cumsum(exclusive):
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.cumsum(t["x"], LENGTH, exclusive)},
      {"x": (harness.random_array([8, 4], 4), IDS)}, CUMSUM_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.cumsum(t["x"], 1, exclusive=exclusive)})


def test_cumsum_of_pending_sum_and_integers():
  # The einsum's sum over a split `d` is still pending when cumsum runs.
  inputs = {"x": (harness.random_array([8, 4, 4], 5), "batch:8;length:4;d:4"),
            "w": (harness.random_array([4], 6), "d:4"),
            "n": (ids_array(), IDS)}
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": index.cumsum(mtf.einsum(
          [t["x"], t["w"]], output_shape=[BATCH, LENGTH]), LENGTH),
                       "n": index.cumsum(t["n"], "batch", exclusive=True)},
      inputs, [("rows:2;cols:4", "d:rows;length:cols"),
               ("rows:2;cols:4", "batch:rows;d:cols")], wrt=["x", "w"],
      reference=lambda t: {
          "y": tf.cumsum(tf.einsum("bld,d->bl", t["x"], t["w"]), 1),
          "n": tf.cumsum(t["n"], 0, exclusive=True)})


def test_cumsum_collectives():
  run = harness.run_model(
      lambda mesh, t: {"y": index.cumsum(t["x"], LENGTH)},
      {"x": (harness.random_array([8, 4], 4), IDS)}, "rows:2;cols:4",
      "batch:rows;length:cols")
  # Only the per-stripe totals travel: one element per row of the slice.
  assert [(s["kind"], s["mesh_axes"], s["elements_per_device"])
          for s in run.lowering.collective_stats()] == [
              ("allconcat", ("cols",), 4)]


# --- top_k, top_1, argmax ----------------------------------------------------
X = "batch:8;vocab:16"


def x_distinct():
  return {"x": (distinct([8, 16], 7), X)}


@pytest.mark.parametrize("k,layouts", [
    # k=3 with 2 entries per stripe: a stripe offers fewer than k candidates.
    (3, [("all:8", "vocab:all"), ("rows:2;cols:4", "batch:rows;vocab:cols"),
         ("rows:2;cols:4", "vocab:rows")]),
    # k split too (over another axis than vocab).
    (4, [("rows:2;cols:4", "vocab:rows;k:cols"), ("a:2;b:4", "k:a;vocab:b"),
         ("all:4", "k:all")]),
])
def test_top_k(k, layouts):
  k_dim = mtf.Dimension("k", k)
  def model(mesh, t):
    values, indices = topk.top_k(t["x"], VOCAB, k_dim)
    return {"values": values, "indices": indices}
  def reference(t):
    values, indices = tf.math.top_k(t["x"], k)
    return {"values": values, "indices": indices}
  harness.assert_layout_invariant(model, x_distinct(), layouts, wrt=["x"],
                                  reference=reference)


def test_top_k_reduced_dim_in_the_middle():
  x = distinct([4, 16, 2], 8)
  def model(mesh, t):
    values, indices = topk.top_k(t["x"], VOCAB, mtf.Dimension("k", 5))
    return {"values": values, "indices": indices}
  def reference(t):
    values, indices = tf.math.top_k(tf.transpose(t["x"], [0, 2, 1]), 5)
    return {"values": values, "indices": indices}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:4;vocab:16;hidden:2")},
      [("all:8", "vocab:all"), ("a:2;b:2;c:2", "batch:a;vocab:b;hidden:c")],
      wrt=["x"], reference=reference)


def test_top_k_with_k_and_vocab_on_one_axis():
  # Forward: allconcat the candidates, keep the own k stripe. Gradient: the
  # scatter along vocab gathers all of k first.
  def model(mesh, t):
    values, indices = topk.top_k(t["x"], VOCAB, mtf.Dimension("k", 4))
    return {"values": values, "indices": indices}
  harness.assert_layout_invariant(
      model, x_distinct(), [("rows:2;cols:4", "vocab:cols;k:cols"),
                            ("rows:2;cols:4", "batch:cols;vocab:rows;k:rows")],
      wrt=["x"], reference=lambda t: dict(zip(("values", "indices"),
                                              tf.math.top_k(t["x"], 4))))


@pytest.mark.parametrize("axis", [0, 1])
def test_top_1_and_argmax(axis):
  dim = [BATCH, VOCAB][axis]
  def model(mesh, t):
    values, indices = topk.top_1(t["x"], dim)  # Mesh TF 0.1.21's order
    return {"values": values, "indices": indices,
            "argmax": topk.argmax(t["x"], dim.name)}
  def reference(t):
    i = tf.argmax(t["x"], axis, output_type=tf.int32)
    return {"values": tf.reduce_max(t["x"], axis), "indices": i, "argmax": i}
  harness.assert_layout_invariant(model, x_distinct(), VOCAB_LAYOUTS[:3] + [
      ("rows:2;cols:4", "batch:rows")], wrt=["x"], reference=reference)


def test_ties_go_to_the_lowest_index():
  # Integers 0..2 in 16 columns: many ties, spread over the stripes.
  x = np.random.RandomState(9).randint(0, 3, (8, 16)).astype(np.int32)
  def model(mesh, t):
    values, indices = topk.top_k(t["x"], VOCAB, mtf.Dimension("k", 6))
    return {"values": values, "indices": indices,
            "argmax": topk.argmax(t["x"], VOCAB),
            "sorted": topk.sort(t["x"], VOCAB, descending=True)}
  def reference(t):
    values, indices = tf.math.top_k(t["x"], 6)
    return {"values": values, "indices": indices,
            "argmax": tf.argmax(t["x"], 1, output_type=tf.int32),
            "sorted": tf.sort(t["x"], 1, "DESCENDING")}
  harness.assert_layout_invariant(model, {"x": (x, X)}, VOCAB_LAYOUTS[:2],
                                  reference=reference)


def test_top_k_collectives():
  run = harness.run_model(
      lambda mesh, t: dict(zip(("v", "i"), topk.top_k(
          t["x"], VOCAB, mtf.Dimension("k", 3)))),
      x_distinct(), "rows:2;cols:4", "batch:rows;vocab:cols")
  # Values and indices of each stripe's candidates (4 rows x 3), gathered.
  assert [(s["kind"], s["mesh_axes"], s["elements_per_device"], s["count"])
          for s in run.lowering.collective_stats()] == [
              ("allconcat", ("cols",), 12, 2)]


# --- sort --------------------------------------------------------------------
SORT_LAYOUTS = [
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("rows:2;cols:4", "vocab:rows;batch:cols"),
]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_sort(descending, axis):
  dim = [BATCH, VOCAB][axis]
  direction = "DESCENDING" if descending else "ASCENDING"
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": topk.sort(t["x"], dim, descending=descending)},
      x_distinct(), SORT_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.sort(t["x"], axis, direction)})


# --- sample_with_temperature -------------------------------------------------
def gumbel_reference(logits, temperature, name):
  """Gumbel-max with meshtf's noise: the uniform op `name + "_noise"` of a
  graph with seed 0, generated whole on the host."""
  shape = logits.shape.as_list()
  u = rng.uniform_slice(rng.op_key(0, name + "_noise"),
                        tf.zeros([len(shape)], tf.int64), shape, shape,
                        1e-9, 1.0)
  noisy = logits + -tf.math.log(-tf.math.log(u)) * temperature
  return tf.argmax(noisy, -1, output_type=tf.int32)


def test_sample_with_temperature():
  logits = harness.random_array([8, 16], 10, low=-2.0, high=2.0)
  temps = np.array([0.0, 0.5, 1.0, 2.0] * 2, np.float32)
  def model(mesh, t):
    return {"t1": topk.sample_with_temperature(t["x"], VOCAB),
            "t0": topk.sample_with_temperature(t["x"], VOCAB, 0.0),
            "per_row": topk.sample_with_temperature(t["x"], VOCAB, t["temp"],
                                                    name="per_row")}
  def reference(t):
    return {"t1": gumbel_reference(t["x"], 1.0, "sample_with_temperature"),
            "t0": tf.argmax(t["x"], 1, output_type=tf.int32),
            "per_row": gumbel_reference(t["x"], t["temp"][:, None], "per_row")}
  harness.assert_layout_invariant(
      model, {"x": (logits, X), "temp": (temps, "batch:8")},
      VOCAB_LAYOUTS[:3], reference=reference)


def test_sample_with_temperature_follows_softmax():
  logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
  x = np.tile(logits, [4096, 1])
  run = harness.run_model(
      lambda mesh, t: {"s": topk.sample_with_temperature(
          t["x"], "choice", temperature=0.5)},
      {"x": (x, "draw:4096;choice:4")}, "all:4", "choice:all")
  freq = np.bincount(run.outputs["s"], minlength=4) / 4096.0
  p = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
  np.testing.assert_allclose(freq, p, atol=0.03)


# --- errors ------------------------------------------------------------------
def _mesh():
  return mtf.Mesh(mtf.Graph(), "m")


def test_dtype_errors():
  mesh = _mesh()
  x = mtf.ones(mesh, X)
  with pytest.raises(TypeError, match="indices .* integer dtype.*float32"):
    index.one_hot(x, D)
  with pytest.raises(TypeError, match="integer dtype"):
    index.gather(mtf.ones(mesh, TABLE), mtf.ones(mesh, IDS), VOCAB)
  for fn in (lambda b: topk.top_k(b, VOCAB, mtf.Dimension("k", 2)),
             lambda b: topk.argmax(b, VOCAB), lambda b: topk.sort(b, VOCAB),
             lambda b: index.cumsum(b, VOCAB)):
    with pytest.raises(TypeError, match="bool"):
      fn(mtf.ones(mesh, X, dtype=tf.bool))


def test_top_k_errors():
  x = mtf.ones(_mesh(), X)
  with pytest.raises(ValueError, match="asks for 17 of the 16 entries"):
    topk.top_k(x, VOCAB, mtf.Dimension("k", 17))
  with pytest.raises(ValueError, match="'batch' is already a dimension"):
    topk.top_k(x, VOCAB, mtf.Dimension("batch", 2))
  with pytest.raises(ValueError, match="reduced_dim 'length' is not a dim"):
    topk.top_1(x, LENGTH)
  with pytest.raises(ValueError, match="vocab:8 does not match vocab:16"):
    topk.argmax(x, mtf.Dimension("vocab", 8))


def test_gather_scatter_and_cumsum_errors():
  mesh = _mesh()
  w, ids = mtf.ones(mesh, TABLE), mtf.zeros(mesh, IDS, dtype=tf.int32)
  with pytest.raises(ValueError, match="'length' is not a dimension of"):
    index.gather(w, ids, LENGTH)
  with pytest.raises(ValueError, match="contains the looked-up dimension"):
    index.gather(w, mtf.zeros(mesh, "vocab:16", dtype=tf.int32), VOCAB)
  with pytest.raises(ValueError, match="must hold exactly the dims"):
    index.gather(w, ids, VOCAB, output_shape=[BATCH, D])
  with pytest.raises(ValueError, match="already a dimension of indices"):
    index.one_hot(ids, LENGTH)
  with pytest.raises(ValueError, match="'vocab' is not a dimension"):
    index.cumsum(ids, VOCAB)
  with pytest.raises(ValueError, match=r"'vocab' is not a dimension of shape "
                     r"\[d:4\]"):
    index.scatter_add(mtf.ones(mesh, "batch:8;length:4;d:4"), ids, VOCAB,
                      [D])


# --- uneven splits -----------------------------------------------------------
# vocab:10 and batch:6 do not divide the mesh axes: stripes of ceil(size / n)
# with padding (poisoned by the harness) on the last processors; with
# vocab:10 over 8, processors 5..7 hold no vocab entry at all.
UNEVEN_VOCAB = mtf.Dimension("vocab", 10)
UNEVEN_LAYOUTS = [
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("a:3", "batch:a"),
    ("rows:2;cols:4", "vocab:cols+rows"),
    ("a:2;b:2;c:2", "batch:a+b;vocab:c"),
    ("rows:2;cols:4", harness.annotated(
        "vocab:cols", {"x": "vocab:cols+rows", "ids": "batch:cols",
                       "table": "d:rows"})),
]


def test_index_ops_on_uneven_splits():
  """one_hot, range, gather (ids past the end read zeros, not padding),
  scatter_add and cumsum (forward and reverse) along an unevenly split
  vocab:10 / batch:6."""
  ids = np.array([[0, 9, 3, 10], [5, 5, 12, 1], [9, 8, 7, 6],
                  [2, 4, -1, 0], [1, 3, 5, 9], [8, 0, 2, 4]], np.int32)
  table = harness.random_array([10, 4], 3)
  x = harness.random_array([6, 10], 4)

  def model(mesh, t):
    vocab_ids = t["ids"]
    oh = mtf.one_hot(vocab_ids, UNEVEN_VOCAB, dtype=tf.float32)
    emb = mtf.gather(t["table"], vocab_ids, UNEVEN_VOCAB)
    back = mtf.scatter_add(emb, vocab_ids, UNEVEN_VOCAB, t["table"].shape)
    pos = mtf.cast(mtf.range(mesh, UNEVEN_VOCAB, tf.int32), tf.float32)
    return {"one_hot": oh, "emb": emb, "back": back,
            "cumsum": mtf.cumsum(t["x"] * pos, UNEVEN_VOCAB),
            "cumsum_excl": mtf.cumsum(t["x"], UNEVEN_VOCAB, exclusive=True),
            "cumsum_rev": index.CumsumOperation(
                t["x"], UNEVEN_VOCAB, reverse=True).outputs[0]}

  def reference(t):
    valid = tf.cast((t["ids"] >= 0) & (t["ids"] < 10), tf.float32)
    emb = tf.gather(t["table"], tf.clip_by_value(t["ids"], 0, 9)) * \
        valid[..., None]
    flat = tf.reshape(tf.clip_by_value(t["ids"], 0, 9), [-1])
    back = tf.math.unsorted_segment_sum(
        tf.reshape(emb, [-1, 4]) * tf.reshape(valid, [-1, 1]), flat, 10)
    pos = tf.range(10, dtype=tf.float32)
    return {"one_hot": tf.one_hot(t["ids"], 10), "emb": emb, "back": back,
            "cumsum": tf.cumsum(t["x"] * pos, 1),
            "cumsum_excl": tf.cumsum(t["x"], 1, exclusive=True),
            "cumsum_rev": tf.cumsum(t["x"], 1, reverse=True)}
  harness.assert_layout_invariant(
      model, {"ids": (ids, "batch:6;length:4"), "table": (table, "vocab:10;d:4"),
              "x": (x, "batch:6;vocab:10")},
      UNEVEN_LAYOUTS, wrt=["table", "x"], reference=reference)


def test_selection_ops_on_uneven_splits():
  """top_k (k above a stripe's size), argmax, sort and sampling along an
  unevenly split vocab:10: the padding never wins."""
  x = distinct([6, 10], 11) - 2.0   # all negative: padding zeros would win

  def model(mesh, t):
    values, indices = topk.top_k(t["x"], UNEVEN_VOCAB, mtf.Dimension("k", 3))
    return {"values": values, "indices": indices,
            "argmax": mtf.argmax(t["x"], UNEVEN_VOCAB),
            "sorted": topk.sort(t["x"], UNEVEN_VOCAB, descending=True),
            "sample": topk.sample_with_temperature(t["x"], UNEVEN_VOCAB, 0.5)}

  def reference(t):
    values, indices = tf.math.top_k(t["x"], 3)
    return {"values": values, "indices": indices,
            "argmax": tf.argmax(t["x"], 1, output_type=tf.int32),
            "sorted": tf.sort(t["x"], 1, "DESCENDING"),
            "sample": gumbel_reference(t["x"], 0.5, "sample_with_temperature")}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:6;vocab:10")},
      UNEVEN_LAYOUTS + [("rows:2;cols:4", "vocab:rows;k:cols")], wrt=["x"],
      reference=reference)
