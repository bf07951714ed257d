"""Mesh TF's generic per-slice ops (meshtf/ops/slicewise.py) and its
Operation names and helpers (meshtf/compat/op_classes.py): layout-invariant
forward and backward through the harness, unsplittable dims refused."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf

X_SHAPE = "batch:8;hidden:4"
LAYOUTS = [("all:8", "batch:all"), ("rows:2;cols:4", "batch:cols;hidden:rows")]


@pytest.mark.parametrize("with_grad_function", [False, True])
def test_slicewise_elementwise(with_grad_function):
  """A per-slice tf_fn: its gradient is grad_function's, or TF's per-slice
  gradient of tf_fn (GenericGradOperation)."""
  x = harness.random_array([8, 4], 0)
  grad_fn = (lambda op, dy: [dy * op.outputs[0]]) if with_grad_function \
      else None
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.slicewise(tf.exp, [t["x"]],
                                          grad_function=grad_fn)},
      {"x": (x, X_SHAPE)}, LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.exp(t["x"])})


def test_cwise_two_inputs_and_generic_gradient():
  x, y = harness.random_array([8, 4], 1), harness.random_array([8, 4], 2)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf.cwise(lambda a, b: a * tf.sin(b),
                                      [t["x"], t["y"]])},
      {"x": (x, X_SHAPE), "y": (y, X_SHAPE)}, LAYOUTS, wrt=["x", "y"],
      reference=lambda t: {"z": t["x"] * tf.sin(t["y"])})


def test_slicewise_refuses_a_split_unsplittable_dim():
  """A tf_fn that needs 'hidden' whole (a softmax over it) must not get it
  split: one clear LayoutError before any TF work."""
  def model(mesh, t):
    return {"y": mtf.slicewise(lambda a: tf.nn.softmax(a, axis=1), [t["x"]],
                               splittable_dims=["batch"])}
  x = harness.random_array([8, 4], 3)
  with pytest.raises(mtf.LayoutError, match="'hidden' is not splittable"):
    harness.run_model(model, {"x": (x, X_SHAPE)}, "all:4", "hidden:all")
  harness.assert_layout_invariant(model, {"x": (x, X_SHAPE)},
                                  [("all:8", "batch:all")])


def test_binary_op_with_broadcasting_and_scalar_add():
  x = harness.random_array([8, 4], 4)
  y = harness.random_array([4, 2], 5)
  harness.assert_layout_invariant(
      lambda mesh, t: {
          "z": mtf.binary_op_with_broadcasting(tf.maximum, t["x"], t["y"]),
          "s": mtf.ScalarAddOperation(t["x"], 2.0).outputs[0]},
      {"x": (x, X_SHAPE), "y": (y, "hidden:4;io:2")},
      [("rows:2;cols:4", "batch:cols;io:rows")],
      reference=lambda t: {"z": tf.maximum(t["x"][:, :, None], t["y"][None]),
                           "s": t["x"] + 2.0})


def test_ops_py_helpers():
  mesh_shape = mtf.convert_to_shape("r:2;c:4")
  assert mtf.list_product([2, 3, 4]) == 24 and mtf.list_product([]) == 1
  assert mtf.pnum_to_processor_coordinates(mesh_shape, 6) == [1, 2]
  assert mtf.processor_coordinates_to_pnum(mesh_shape, [1, 2]) == 6
  assert mtf.processor_groups(mesh_shape, [0]) == [[0, 4], [1, 5], [2, 6],
                                                   [3, 7]]
  hidden = mtf.Dimension("hidden", 16)
  assert mtf.tensor_dim_to_mesh_dim_size("hidden:c", mesh_shape, hidden) == 4
  # A MeshLayout in place of (rules, mesh shape); multi-axis rules multiply.
  assert mtf.tensor_dim_to_mesh_dim_size(
      mtf.MeshLayout(mesh_shape, "hidden:r+c"), None, hidden) == 8
  assert mtf.tensor_dim_to_mesh_dim_size("hidden:c", None, hidden) == 1
  assert mtf.tensor_dim_to_size_per_split("hidden:c", mesh_shape, hidden) == 4
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [hidden])
  assert mtf.log_variable_sizes(graph.trainable_variables) == 16
  assert mtf.scalar_summary("loss", mtf.zeros(mesh, [])) is None


def test_splittability_as_mesh_tf():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  x = mtf.zeros(mesh, "a:4;b:6")
  assert mtf.SliceOperation(x, 1, 2, "b").unsplittable_dims == {"b"}
  assert mtf.ConcatOperation([x, x], "b").splittable_dims == {"a"}
  assert mtf.EinsumOperation([x], mtf.Shape(x.shape.dims[:1])
                             ).unsplittable_dims == frozenset()
  op = mtf.Constant(mesh, 0, x.shape, tf.int32)
  assert op._initialize_splittable_and_unsplittable_dims(
      "unsplittable", ["b"]) == ({"b"}, {"a"})
  np.testing.assert_array_equal(op._value, np.zeros([4, 6]))
