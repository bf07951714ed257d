"""einsum and matmul (meshtf/ops/einsum.py): every layout gives the
single-device values and gradients, matching tf.einsum; a split reduced dim
costs one allreduce over its mesh axis, an unsplit one none.

Shapes: x [batch:8, io:4], w [io:4, hidden:8], s [io:4].
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf

X = "batch:8;io:4"
W = "io:4;hidden:8"
S = "io:4"

# Split the reduced dim (io), the kept dims (batch, hidden), and mixtures.
LAYOUTS = [
    ("rows:2;cols:4", "io:cols"),
    ("all:8", "batch:all"),
    ("all:8", "hidden:all"),
    ("rows:2;cols:4", "batch:rows;io:cols"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
]


def inputs():
  return {"x": (harness.random_array([8, 4], 0), X),
          "w": (harness.random_array([4, 8], 1), W),
          "s": (harness.random_array([4], 2), S)}


def forward_stats(model_fn, mesh_shape, layout):
  run = harness.run_model(model_fn, inputs(), mesh_shape, layout)
  return [(s["kind"], s["mesh_axes"], s["count"])
          for s in run.lowering.collective_stats()]


# name -> (meshtf model body, TensorFlow reference)
CASES = {
    "output_shape": (
        lambda t: mtf.einsum([t["x"], t["w"]], output_shape="batch:8;hidden:8"),
        lambda t: tf.einsum("bi,ih->bh", t["x"], t["w"])),
    "output_shape_transposed": (
        lambda t: mtf.einsum([t["x"], t["w"]], output_shape="hidden:8;batch:8"),
        lambda t: tf.einsum("bi,ih->hb", t["x"], t["w"])),
    "reduced_dims": (
        lambda t: mtf.einsum([t["x"], t["w"]],
                             reduced_dims=[mtf.Dimension("io", 4)]),
        lambda t: tf.einsum("bi,ih->bh", t["x"], t["w"])),
    "no_output_shape": (
        lambda t: mtf.einsum([t["x"], t["w"]]),
        lambda t: tf.einsum("bi,ih->bh", t["x"], t["w"])),
    "matmul": (
        lambda t: mtf.matmul(t["x"], t["w"]),
        lambda t: tf.matmul(t["x"], t["w"])),
    "matmul_output_shape": (
        lambda t: mtf.matmul(t["x"], t["w"], output_shape="hidden:8;batch:8"),
        lambda t: tf.transpose(tf.matmul(t["x"], t["w"]))),
    "three_inputs": (
        lambda t: mtf.einsum([t["x"], t["s"], t["w"]],
                             output_shape="batch:8;hidden:8"),
        lambda t: tf.einsum("bi,i,ih->bh", t["x"], t["s"], t["w"])),
    "no_reduction_outer": (
        lambda t: mtf.einsum([t["x"], t["w"]],
                             output_shape="batch:8;io:4;hidden:8"),
        lambda t: tf.einsum("bi,ih->bih", t["x"], t["w"])),
    "reduce_everything": (
        lambda t: mtf.einsum([t["x"], t["w"]], output_shape=[]),
        lambda t: tf.einsum("bi,ih->", t["x"], t["w"])),
    # batch appears only in x and is summed out: x's gradient is a broadcast.
    "dim_only_in_one_input": (
        lambda t: mtf.einsum([t["x"], t["w"]], output_shape="hidden:8"),
        lambda t: tf.einsum("bi,ih->h", t["x"], t["w"])),
    "single_input_sum": (
        lambda t: mtf.einsum([t["x"]], output_shape="io:4"),
        lambda t: tf.einsum("bi->i", t["x"])),
    "single_input_transpose": (
        lambda t: mtf.einsum([t["x"]], output_shape="io:4;batch:8"),
        lambda t: tf.transpose(t["x"])),
    "same_input_twice": (
        lambda t: mtf.einsum([t["x"], t["x"]], output_shape="batch:8"),
        lambda t: tf.reduce_sum(t["x"] * t["x"], 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_einsum(case):
  body, ref = CASES[case]
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": body(t)}, inputs(), LAYOUTS[:4],
      wrt=["x", "w", "s"], reference=lambda t: {"y": ref(t)})


def test_einsum_output_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x, w = mtf.ones(mesh, X), mtf.ones(mesh, W)
  assert mtf.einsum([x, w]).shape == "batch:8;hidden:8"
  assert mtf.einsum([x, w], reduced_dims=[mtf.Dimension("io", 4)]).shape == "batch:8;hidden:8"
  assert mtf.einsum([x, w], reduced_dims=[]).shape == "batch:8;io:4;hidden:8"
  assert mtf.matmul(x, w).shape == "batch:8;hidden:8"


@pytest.mark.parametrize("mesh_shape,layout,expected", [
    # io split: local partial sums, one allreduce over io's axis.
    ("rows:2;cols:4", "io:cols", [("allreduce_sum", ("cols",), 1)]),
    ("rows:2;cols:4", "batch:rows;io:cols", [("allreduce_sum", ("cols",), 1)]),
    ("rows:2;cols:4", "io:cols;hidden:rows",
     [("allreduce_sum", ("cols",), 1)]),
    # io not split: purely local.
    ("all:8", "batch:all", []),
    ("all:8", "hidden:all", []),
    ("rows:2;cols:4", "batch:rows;hidden:cols", []),
])
def test_einsum_collectives(mesh_shape, layout, expected):
  model = lambda mesh, t: {"y": mtf.matmul(t["x"], t["w"])}
  assert forward_stats(model, mesh_shape, layout) == expected


def test_weight_gradient_allreduces_over_batch():
  """Data parallel: dL/dw sums over the split batch dim."""
  model = lambda mesh, t: {"y": mtf.matmul(t["x"], t["w"])}
  run = harness.run_model(model, inputs(), "all:8", "batch:all", wrt=["w"])
  kinds = [(s["kind"], s["mesh_axes"]) for s in
           run.lowering.collective_stats()]
  assert kinds == [("allreduce_sum", ("all",))]
  expected = np.einsum("bi,bh->ih", inputs()["x"][0],
                       harness.random_array([8, 8], 1234))
  np.testing.assert_allclose(run.grads["w"], expected, rtol=1e-5, atol=1e-5)


def test_einsum_pending_sum_feeds_nonlinear_op():
  """A pending sum read by a nonlinear op is reduced first."""
  def model(mesh, t):
    return {"y": mtf.tanh(mtf.matmul(t["x"], t["w"])) * 2.0}
  harness.assert_layout_invariant(
      model, inputs(), LAYOUTS, wrt=["x", "w"],
      reference=lambda t: {"y": tf.tanh(t["x"] @ t["w"]) * 2.0})


# --- errors --------------------------------------------------------------------
def _mesh():
  return mtf.Mesh(mtf.Graph(), "m")


def test_output_dim_not_in_inputs():
  mesh = _mesh()
  x, w = mtf.ones(mesh, X), mtf.ones(mesh, W)
  with pytest.raises(ValueError, match="'?vocab'?:16 is not a dimension"):
    mtf.einsum([x, w], output_shape="batch:8;vocab:16")


def test_output_dim_with_another_size_than_the_inputs():
  """Issue 41: this said "broadcast afterwards with mtf.broadcast", which
  cannot help: the name is the inputs', with another size."""
  mesh = _mesh()
  x = mtf.ones(mesh, "batch:8;io:4", name="x")
  with pytest.raises(ValueError) as e:
    mtf.einsum([x], output_shape="batch:8;io:6")
  assert str(e.value) == (
      "einsum output dimension io:6 has size 4 in the inputs (x:0 [batch:8, "
      "io:4]): dims that share a name have one size; write io:4 in "
      "output_shape, or give the new dim another name")


def test_dtype_mismatch():
  mesh = _mesh()
  with pytest.raises(TypeError, match="differ in dtype"):
    mtf.einsum([mtf.ones(mesh, X), mtf.ones(mesh, W, dtype=tf.float64)],
               output_shape="batch:8;hidden:8")


def test_no_inputs():
  with pytest.raises(ValueError, match="at least one input"):
    mtf.einsum([], output_shape=[])


def test_size_conflict():
  mesh = _mesh()
  with pytest.raises(ValueError, match="'io' has size 4"):
    mtf.einsum([mtf.ones(mesh, X), mtf.ones(mesh, "io:5;hidden:8")])


def test_all_dims_must_split_over_distinct_axes():
  # Each tensor is fine alone, but batch and hidden meet in the einsum.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.ones([8, 4]), X)
  w = mtf.import_tf_tensor(mesh, tf.ones([4, 8]), W)
  y = mtf.einsum([x, w], output_shape="io:4")
  impl = harness.make_impl("placement", "all:8", "batch:all;hidden:all")
  with pytest.raises(mtf.LayoutError, match="einsum") as e:
    mtf.Lowering(graph, {mesh: impl})
  assert "'batch'" in str(e.value) and "'hidden'" in str(e.value)
  del y


# --- uneven splits ----------------------------------------------------------
UNEVEN_LAYOUTS = [
    ("rows:2;cols:4", "io:cols"),                 # io:5 -> stripes of 2
    ("all:8", "hidden:all"),                      # hidden:7, one stripe empty
    ("rows:2;cols:4", "batch:rows;io:cols"),      # batch:3 and io:5
    ("a:3;b:2", "batch:a;hidden:b"),
    ("rows:2;cols:4", "io:cols+rows"),            # io:5 over 8, cols major
    ("a:2;b:2;c:2", "batch:c;hidden:b+a"),
    ("rows:2;cols:4", harness.annotated(
        "io:cols", {"x": "batch:rows+cols", "w": "hidden:rows;io:cols",
                    "s": ""})),
]


def test_einsum_uneven():
  """Contractions over an unevenly split dim (padding poisoned with NaN by
  the harness: every operand's padding is zeroed before the local einsum),
  and kept uneven dims, forward and gradients."""
  x = harness.random_array([3, 5], 0)
  w = harness.random_array([5, 7], 1)
  s = harness.random_array([5], 2)

  def model(mesh, t):
    return {"matmul": mtf.einsum([t["x"], t["w"]],
                                 output_shape="batch:3;hidden:7"),
            "three": mtf.einsum([t["x"], t["w"], t["s"]],
                                output_shape="hidden:7;batch:3"),
            "sum_out": mtf.einsum([t["x"]], output_shape="batch:3"),
            "outer": mtf.einsum([t["x"], t["s"]],
                                output_shape="batch:3;io:5")}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:3;io:5"), "w": (w, "io:5;hidden:7"),
              "s": (s, "io:5")},
      UNEVEN_LAYOUTS, wrt=["x", "w", "s"],
      reference=lambda t: {
          "matmul": tf.einsum("bi,ih->bh", t["x"], t["w"]),
          "three": tf.einsum("bi,ih,i->hb", t["x"], t["w"], t["s"]),
          "sum_out": tf.reduce_sum(t["x"], 1),
          "outer": t["x"] * t["s"]})
