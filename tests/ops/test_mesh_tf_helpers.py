"""More of Mesh TF's ops.py names (meshtf/ops/mesh_tf_helpers.py):
AddOperation / MinMaxOperation broadcast with their gradients on every
layout; the conv backprop functions equal meshtf's own conv gradients; the
small utilities give Mesh TF's results."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf

LAYOUTS = [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
    ("rows:2;cols:4", "io:rows;hidden:cols"),
]


def test_add_and_min_max_operations_broadcast_with_gradients():
  x = harness.random_array([8, 4], 0)
  y = harness.random_array([4, 2], 1)

  def model(mesh, t):
    shape = mtf.Shape(t["x"].shape.dims + t["y"].shape.dims[1:])
    return {
        "add": mtf.AddOperation(t["x"], t["y"], shape).outputs[0],
        "max": mtf.MinMaxOperation(tf.maximum, t["x"], t["y"],
                                   shape).outputs[0],
        "min": mtf.MinMaxOperation(tf.minimum, t["x"], t["y"],
                                   shape).outputs[0],
    }
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:8;hidden:4"), "y": (y, "hidden:4;io:2")},
      LAYOUTS, wrt=["x", "y"],
      reference=lambda t: {
          "add": t["x"][:, :, None] + t["y"][None],
          "max": tf.maximum(t["x"][:, :, None], t["y"][None]),
          "min": tf.minimum(t["x"][:, :, None], t["y"][None])})


def test_conv_backprop_functions_are_the_conv_gradients():
  x = harness.random_array([2, 6, 6, 3], 2)
  w = harness.random_array([3, 3, 3, 4], 3)
  dy = harness.random_array([2, 6, 6, 4], 4)

  def model(mesh, t):
    y = mtf.conv2d(t["x"], t["w"], [1, 1, 1, 1], "SAME")
    dx, dw = mtf.gradients([mtf.reduce_sum(y * t["dy"])], [t["x"], t["w"]])
    return {
        "dx": mtf.conv2d_backprop_input(t["x"].shape, t["w"], t["dy"],
                                        [1, 1, 1, 1], "SAME") - dx,
        "dw": mtf.conv2d_backprop_filter(t["x"], t["w"].shape, t["dy"],
                                         [1, 1, 1, 1], "SAME") - dw,
    }
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;h:6;w:6;in:3"),
              "w": (w, "fh:3;fw:3;in:3;out:4"),
              "dy": (dy, "batch:2;h:6;w:6;out:4")},
      [("all:2", "batch:all"), ("rows:2;cols:4", "batch:rows;out:cols")])
  for out in next(iter(runs.values())).outputs.values():
    np.testing.assert_allclose(out, 0.0, atol=1e-5)


def test_small_helpers_as_mesh_tf():
  assert mtf.is_subsequence([], [1]) and mtf.is_subsequence([1, 3], [1, 2, 3])
  assert not mtf.is_subsequence([3, 1], [1, 2, 3])
  shape = mtf.convert_to_shape("r:2;c:4")
  # Processor 6 is (1, 2): reducing over c leaves its row, 1; over r, 2.
  assert mtf.pnum_to_group(shape, [1], 6) == 1
  assert mtf.pnum_to_group(shape, [0], 6) == 2
  assert mtf.pretty_print_counters([("p/a", 2), ("p/b", 3), ("q", 1)]) == (
      "p: 5\n p/a: 2\n p/b: 3\nq: 1")
  assert mtf.transpose_list_of_lists([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]
  assert mtf.binary_reduction_fn("MIN") is tf.minimum
  assert mtf.reduction_fn("MAX") is tf.reduce_max
  with pytest.raises(ValueError, match="PROD"):
    mtf.reduction_fn("PROD")
  assert mtf.parallel(["/cpu:0"] * 2, lambda a, b: a + b, [1, 2],
                      [10, 20]) == [11, 22]
  with pytest.raises(ValueError, match="one entry per device"):
    mtf.parallel(["/cpu:0"] * 2, abs, [1])
  x = np.arange(2 * 3 * 4 * 4 * 2, dtype=np.float32).reshape([2, 3, 4, 4, 2])
  np.testing.assert_allclose(
      mtf.pool_fn("MAX_2D")(tf.constant(x), [2, 2], [2, 2], "VALID"),
      tf.reshape(tf.nn.max_pool2d(x.reshape([6, 4, 4, 2]), 2, 2, "VALID"),
                 [2, 3, 2, 2, 2]))
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a = mtf.zeros(mesh, "batch:2")
  b = mtf.zeros(mesh, "d:3")
  mtf.verify_no_new_dims([a.shape, b.shape], mtf.Shape(b.shape.dims))
  with pytest.raises(ValueError, match="no input"):
    mtf.verify_no_new_dims([a.shape], b.shape)
  s1, s2 = mtf.binary_arguments_to_tensors(a, 2.0)
  assert s1 is a and s2.shape == mtf.Shape([]) and s2.dtype == a.dtype
  assert mtf.mtf_abs(a).shape == a.shape and mtf.mtf_pow(a, 2.0).shape == (
      a.shape)
