"""Reductions (meshtf/ops/reductions.py): reduce_sum/mean/max/min/logsumexp,
softmax and log_softmax. Every layout gives the single-device values and
gradients, matching TensorFlow; reducing a split dim costs one allreduce over
its mesh axis, an unsplit one none.

Shapes: x [batch:8, vocab:8]; x3 [batch:8, hidden:4, vocab:8]. Random
uniform inputs, so max/min have no ties.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import reductions
from meshtf.ops import topk

X = "batch:8;vocab:8"
X3 = "batch:8;hidden:4;vocab:8"
BATCH, HIDDEN, VOCAB = (mtf.Dimension("batch", 8), mtf.Dimension("hidden", 4),
                        mtf.Dimension("vocab", 8))

LAYOUTS = [
    ("all:8", "vocab:all"),
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("rows:2;cols:4", "batch:cols;vocab:rows"),
]
LAYOUTS3 = [
    ("a:2;b:2;c:2", "batch:a;hidden:b;vocab:c"),
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
]

# name -> (meshtf fn, TensorFlow fn)
REDUCE = {
    "reduce_sum": (mtf.reduce_sum, tf.reduce_sum),
    "reduce_mean": (mtf.reduce_mean, tf.reduce_mean),
    "reduce_max": (mtf.reduce_max, tf.reduce_max),
    "reduce_min": (mtf.reduce_min, tf.reduce_min),
    "reduce_logsumexp": (mtf.reduce_logsumexp, tf.reduce_logsumexp),
}

# spec -> (meshtf keyword arguments, TensorFlow axis)
SPECS_2D = {
    "vocab": ({"reduced_dim": VOCAB}, 1),
    "vocab_by_name": ({"reduced_dim": "vocab"}, 1),
    "batch": ({"reduced_dim": BATCH}, 0),
    "everything": ({}, None),
    "output_shape": ({"output_shape": [BATCH]}, 1),
    "both_dims_listed": ({"reduced_dim": [BATCH, VOCAB]}, None),
}


def x2():
  return {"x": (harness.random_array([8, 8], 0, low=-2.0, high=2.0), X)}


def x3():
  return {"x": (harness.random_array([8, 4, 8], 1, low=-2.0, high=2.0), X3)}


@pytest.mark.parametrize("spec", sorted(SPECS_2D))
@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce(name, spec):
  mtf_fn, tf_fn = REDUCE[name]
  kwargs, axis = SPECS_2D[spec]
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf_fn(t["x"], **kwargs)}, x2(), LAYOUTS,
      wrt=["x"], reference=lambda t: {"y": tf_fn(t["x"], axis=axis)})


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_two_of_three_dims(name):
  mtf_fn, tf_fn = REDUCE[name]
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf_fn(t["x"], reduced_dim=[BATCH, VOCAB])},
      x3(), LAYOUTS3, wrt=["x"],
      reference=lambda t: {"y": tf_fn(t["x"], axis=[0, 2])})


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max"])
def test_reduce_to_reordered_output_shape(name):
  mtf_fn, tf_fn = REDUCE[name]
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf_fn(t["x"], output_shape=[VOCAB, BATCH])},
      x3(), LAYOUTS3, wrt=["x"],
      reference=lambda t: {"y": tf.transpose(tf_fn(t["x"], axis=1))})


def test_reduce_to_same_shape_is_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, X)
  assert mtf.reduce_sum(x, output_shape=X) is x
  assert mtf.reduce_sum(x, reduced_dim=VOCAB).shape == [BATCH]
  assert mtf.reduce_mean(x).shape == []


# --- softmax family -------------------------------------------------------------
def _tf_log_softmax_extra(x, axis, extra):
  shape = x.shape.as_list()
  shape[axis] = 1
  full = tf.concat([x, tf.fill(shape, extra)], axis)
  return x - tf.reduce_logsumexp(full, axis=axis, keepdims=True)


SOFTMAX = {
    "softmax_vocab": (lambda x: mtf.softmax(x, VOCAB),
                      lambda x: tf.nn.softmax(x, axis=1)),
    "softmax_batch": (lambda x: mtf.softmax(x, BATCH),
                      lambda x: tf.nn.softmax(x, axis=0)),
    "log_softmax_vocab": (lambda x: mtf.log_softmax(x, VOCAB),
                          lambda x: tf.nn.log_softmax(x, axis=1)),
    "log_softmax_batch": (lambda x: mtf.log_softmax(x, BATCH),
                          lambda x: tf.nn.log_softmax(x, axis=0)),
    "log_softmax_extra_logit": (
        lambda x: mtf.log_softmax(x, VOCAB, extra_logit=0.5),
        lambda x: _tf_log_softmax_extra(x, 1, 0.5)),
    "softmax_extra_logit": (
        lambda x: mtf.softmax(x, VOCAB, extra_logit=-1.0),
        lambda x: tf.exp(_tf_log_softmax_extra(x, 1, -1.0))),
    "reduce_logsumexp_vocab": (lambda x: mtf.reduce_logsumexp(x, VOCAB),
                               lambda x: tf.reduce_logsumexp(x, axis=1)),
}


@pytest.mark.parametrize("name", sorted(SOFTMAX))
def test_softmax_family(name):
  mtf_fn, tf_fn = SOFTMAX[name]
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf_fn(t["x"])}, x2(), LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf_fn(t["x"])})


def test_softmax_stable_for_large_logits():
  x = harness.random_array([8, 8], 2, low=500.0, high=600.0)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.softmax(t["x"], VOCAB),
                       "lse": mtf.reduce_logsumexp(t["x"], VOCAB) * 1e-3},
      {"x": (x, X)}, LAYOUTS, wrt=["x"], rtol=1e-4, atol=1e-5,
      reference=lambda t: {"y": tf.nn.softmax(t["x"]),
                           "lse": tf.reduce_logsumexp(t["x"], 1) * 1e-3})


# --- collectives -------------------------------------------------------------
def _forward_stats(model_fn, mesh_shape, layout):
  run = harness.run_model(model_fn, x2(), mesh_shape, layout)
  return [(s["kind"], s["mesh_axes"], s["count"])
          for s in run.lowering.collective_stats()]


@pytest.mark.parametrize("name,kind", [("reduce_sum", "allreduce_sum"),
                                       ("reduce_mean", "allreduce_sum"),
                                       ("reduce_max", "allreduce_max"),
                                       ("reduce_min", "allreduce_min")])
def test_reduce_collectives(name, kind):
  mtf_fn = REDUCE[name][0]
  model = lambda mesh, t: {"y": mtf_fn(t["x"], reduced_dim=VOCAB)}
  assert _forward_stats(model, "all:8", "vocab:all") == [
      (kind, ("all",), 1)]
  assert _forward_stats(model, "rows:2;cols:4", "batch:rows;vocab:cols") == [
      (kind, ("cols",), 1)]
  assert _forward_stats(model, "all:8", "batch:all") == []


def test_reduce_over_two_split_dims_allreduces_over_both_axes():
  model = lambda mesh, t: {"y": mtf.reduce_sum(t["x"])}
  assert _forward_stats(model, "rows:2;cols:4", "batch:rows;vocab:cols") == [
      ("allreduce_sum", ("rows", "cols"), 1)]


def test_softmax_over_split_dim_collectives():
  model = lambda mesh, t: {"y": mtf.softmax(t["x"], VOCAB)}
  stats = _forward_stats(model, "rows:2;cols:4", "batch:rows;vocab:cols")
  assert sorted(stats) == [("allreduce_max", ("cols",), 1),
                           ("allreduce_sum", ("cols",), 1)]
  assert _forward_stats(model, "rows:2;cols:4", "batch:cols") == []


# --- errors --------------------------------------------------------------------
def _x():
  graph = mtf.Graph()
  return mtf.ones(mtf.Mesh(graph, "m"), X)


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_over_missing_dim(name):
  with pytest.raises(ValueError, match="'hidden'.*no such dimension"):
    REDUCE[name][0](_x(), reduced_dim=HIDDEN)


def test_softmax_over_missing_dim():
  with pytest.raises(ValueError, match="no such dimension"):
    mtf.softmax(_x(), HIDDEN)


def test_output_shape_not_a_subset():
  with pytest.raises(ValueError, match="not a subset"):
    mtf.reduce_sum(_x(), output_shape="batch:8;hidden:4")
  with pytest.raises(ValueError, match="not a subset"):
    mtf.reduce_max(_x(), output_shape="batch:4")


def test_positional_reduced_dim_rejected():
  with pytest.raises(AssertionError, match="keyword"):
    mtf.reduce_sum(_x(), VOCAB)


@pytest.mark.parametrize("name,tf_fn", [("reduce_any", tf.reduce_any),
                                         ("reduce_all", tf.reduce_all)])
def test_logical_reductions(name, tf_fn):
  rs = np.random.RandomState(3)
  x = rs.uniform(size=[8, 8]).astype(np.float32)
  x[2, :] = 0.9  # a row that is all True, and rows that mix
  fn = getattr(mtf, name)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": fn(mtf.greater(t["x"], 0.5), reduced_dim=VOCAB),
                       "all": fn(mtf.greater(t["x"], 0.5))},
      {"x": (x, X)}, LAYOUTS,
      reference=lambda t: {"y": tf_fn(t["x"] > 0.5, axis=1),
                           "all": tf_fn(t["x"] > 0.5)})


def test_every_exported_reduction_is_tested():
  exported = {n for n in dir(mtf) if getattr(getattr(mtf, n), "__module__",
                                              None) == reductions.__name__}
  tested = set(REDUCE) | {"softmax", "log_softmax", "reduce_any",
                          "reduce_all",
                          "ReduceOperation"}  # Mesh TF's name: tests/compat
  assert exported and exported - tested == set()


# --- reduce_first / nth_largest_element / nth_smallest_element (topk.py) -----
def test_reduce_first_and_nth_elements():
  """All three in one model, over vocab (split by the layouts): n counts
  from 0. Inputs have no ties."""
  x = harness.random_array([8, 4, 8], 6, low=-2.0, high=2.0)

  def model(mesh, t):
    return {"first": topk.reduce_first(t["x"], VOCAB),
            "largest2": topk.nth_largest_element(t["x"], 2, VOCAB),
            "smallest1": topk.nth_smallest_element(t["x"], 1, VOCAB)}

  def ref(t):
    return {"first": t["x"][:, :, 0],
            "largest2": tf.math.top_k(t["x"], 3).values[..., 2],
            "smallest1": -tf.math.top_k(-t["x"], 2).values[..., 1]}
  harness.assert_layout_invariant(
      model, {"x": (x, X3)},
      [("a:2;b:2", "batch:a;vocab:b"), ("all:4", "vocab:all"),
       ("rows:2;cols:2", "vocab:rows;hidden:cols")],
      wrt=["x"], reference=ref)


def test_nth_element_errors():
  x = mtf.ones(mtf.Mesh(mtf.Graph(), "m"), X)
  with pytest.raises(ValueError, match=r"n=8 must be an integer in \[0, 8\)"):
    topk.nth_largest_element(x, 8, VOCAB)
  with pytest.raises(ValueError, match="'depth' is not a dimension"):
    topk.nth_smallest_element(x, 0, "depth")
  with pytest.raises(ValueError, match="reduce_first: reduced_dim 'depth'"):
    topk.reduce_first(x, "depth")


# --- uneven splits --------------------------------------------------------------
# batch:5 and vocab:7 split unevenly (stripes padded with poison by the
# harness; on all:8 one processor holds no vocab entry, on a:3 one holds one
# batch row): every reduction replaces the padding by its identity.
UNEVEN = "batch:5;vocab:7"
UNEVEN_LAYOUTS = [
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("a:3", "batch:a"),
    # One dim over two axes, in and against the mesh's axis order.
    ("rows:2;cols:4", "vocab:rows+cols"),
    ("rows:2;cols:4", "batch:cols+rows"),
    # Annotated: x laid out apart from the rules (which split vocab).
    ("rows:2;cols:4", harness.annotated("vocab:cols",
                                        {"x": "batch:cols;vocab:rows"})),
]


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_uneven(name):
  mtf_fn, tf_fn = REDUCE[name]
  x = harness.random_array([5, 7], 21, low=-3.0, high=-1.0)  # all negative
  harness.assert_layout_invariant(
      lambda mesh, t: {"vocab": mtf_fn(t["x"], reduced_dim="vocab"),
                       "batch": mtf_fn(t["x"], reduced_dim="batch"),
                       "all": mtf_fn(t["x"])},
      {"x": (x, UNEVEN)}, UNEVEN_LAYOUTS, wrt=["x"],
      reference=lambda t: {"vocab": tf_fn(t["x"], axis=1),
                           "batch": tf_fn(t["x"], axis=0),
                           "all": tf_fn(t["x"])})


def test_softmax_and_integer_bool_reductions_uneven():
  x = harness.random_array([5, 7], 22, low=-2.0, high=2.0)
  ints = np.random.RandomState(3).randint(-9, 9, [5, 7]).astype(np.int32)
  harness.assert_layout_invariant(
      lambda mesh, t: {
          "softmax": mtf.softmax(t["x"], "vocab"),
          "log_softmax": mtf.log_softmax(t["x"], "vocab"),
          "int_max": mtf.reduce_max(t["i"], reduced_dim="vocab"),
          "int_min": mtf.reduce_min(t["i"], reduced_dim="batch"),
          "int_sum": mtf.reduce_sum(t["i"]),
          "any": mtf.reduce_any(mtf.greater(t["i"], 7), reduced_dim="vocab"),
          "all": mtf.reduce_all(mtf.greater(t["i"], -8),
                                reduced_dim="vocab")},
      {"x": (x, UNEVEN), "i": (ints, UNEVEN)}, UNEVEN_LAYOUTS, wrt=["x"],
      reference=lambda t: {
          "softmax": tf.nn.softmax(t["x"]),
          "log_softmax": tf.nn.log_softmax(t["x"]),
          "int_max": tf.reduce_max(t["i"], 1),
          "int_min": tf.reduce_min(t["i"], 0),
          "int_sum": tf.reduce_sum(t["i"]),
          "any": tf.reduce_any(t["i"] > 7, 1),
          "all": tf.reduce_all(t["i"] > -8, 1)})
