"""More of Mesh TF's ops.py names (meshtf/compat/helpers.py):
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


def test_conv_transpose_operations_and_backprops_match_tensorflow():
  x = harness.random_array([2, 3, 3, 3], 5)
  f = harness.random_array([3, 3, 4, 3], 6)   # [fh, fw, out, in]
  dy = harness.random_array([2, 6, 6, 4], 7)
  strides = [1, 2, 2, 1]

  def model(mesh, t):
    y = mtf.Conv2dTransposeOperation(t["x"], t["f"], strides,
                                     "SAME").outputs[0]
    return {
        "y": y,
        "dx": mtf.conv2d_transpose_backprop_input(t["x"].shape, t["f"],
                                                  t["dy"], strides, "SAME"),
        "df": mtf.conv2d_transpose_backprop_filter(t["x"], t["f"].shape,
                                                   t["dy"], strides, "SAME"),
    }

  def reference(t):
    with tf.GradientTape() as tape:
      tape.watch([t["x"], t["f"]])
      y = tf.nn.conv2d_transpose(t["x"], t["f"], [2, 6, 6, 4], strides,
                                 "SAME")
      objective = tf.reduce_sum(y * t["dy"])
    dx, df = tape.gradient(objective, [t["x"], t["f"]])
    return {"y": y, "dx": dx, "df": df}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;h:3;w:3;in:3"),
              "f": (f, "fh:3;fw:3;out:4;in:3"),
              "dy": (dy, "batch:2;h:6;w:6;out:4")},
      [("all:2", "batch:all"), ("rows:2;cols:2", "batch:rows;out:cols")],
      wrt=["x", "f", "dy"], reference=reference)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x3 = mtf.zeros(mesh, "batch:1;d:2;h:2;w:2;in:3")
  f3 = mtf.zeros(mesh, "fd:2;fh:2;fw:2;out:4;in:3")
  y3 = mtf.Conv3dTransposeOperation(x3, f3, [1, 2, 2, 2, 1],
                                    "SAME").outputs[0]
  assert y3.shape == mtf.convert_to_shape("batch:1;d:4;h:4;w:4;out:4")
  assert mtf.conv3d_transpose_backprop_input(
      x3.shape, f3, y3, [1, 2, 2, 2, 1], "SAME").shape == x3.shape
  assert mtf.conv3d_transpose_backprop_filter(
      x3, f3.shape, y3, [1, 2, 2, 2, 1], "SAME").shape == f3.shape
  with pytest.raises(ValueError, match="not input_shape"):
    mtf.conv3d_transpose_backprop_input("batch:1;d:3;h:2;w:2;in:3", f3, y3,
                                        [1, 2, 2, 2, 1], "SAME")


def test_pool_backprop_gives_ties_the_gradient_as_mesh_tf():
  x = np.round(harness.random_array([2, 4, 6, 3], 8) * 2) / 2  # many ties
  dy = harness.random_array([2, 2, 3, 3], 9)

  def model(mesh, t):
    y = mtf.PoolOperation(t["x"], [2, 2], [2, 2], "MAX_2D").outputs[0]
    avg = mtf.PoolOperation(t["x"], [2, 2], [2, 2], "AVG_2D").outputs[0]
    return {
        "max": mtf.pool_backprop(t["x"], y, t["dy"], [2, 2], [2, 2],
                                 "MAX_2D"),
        "avg": mtf.pool_backprop(t["x"], avg, t["dy"], [2, 2], [2, 2],
                                 "AVG_2D"),
    }
  runs = harness.assert_layout_invariant(
      model, {"x": (x, "batch:2;h:4;w:6;c:3"),
              "dy": (dy, "batch:2;h:2;w:3;c:3")},
      [("all:2", "h:all"), ("rows:2;cols:3", "batch:rows;w:cols")])
  out = next(iter(runs.values())).outputs
  up = lambda t: t.repeat(2, axis=1).repeat(2, axis=2)
  pooled = x.reshape([2, 2, 2, 3, 2, 3]).max(axis=(2, 4))
  np.testing.assert_allclose(out["max"], (x == up(pooled)) * up(dy),
                             rtol=1e-6)
  np.testing.assert_allclose(out["avg"], up(dy) / 4, rtol=1e-6)
  assert ((x == up(pooled)).reshape([2, 2, 2, 3, 2, 3]).sum(axis=(2, 4))
          > 1).any()  # the data has ties
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  odd = mtf.zeros(mesh, "batch:1;h:5;w:4;c:1")
  with pytest.raises(ValueError, match="h:5 .* does not divide by ksize 2"):
    mtf.pool_backprop(odd, odd, odd, [2, 2], [2, 2], "MAX_2D")


def test_argument_orders_are_mesh_tf_s():
  """Positional calls written for Mesh TF mean the same here."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, np.array([[1.0, 2.0], [3.0, -4.0]],
                                          np.float32), "b:2;v:2")
  v = x.shape.dims[1]
  values, indices = mtf.top_1(x, v, "top")          # (x, dim, name)
  lse = mtf.reduce_logsumexp(x, v, 0.0)             # (x, dim, extra_logit)
  leaky = mtf.leaky_relu(x, 0.5, "leaky")
  picked = mtf.where(mtf.greater(x, 0.0), x, 0.0)
  w = mtf.get_variable(mesh, "w", "v:2", tf.float32, tf.float32, tf.float32,
                       tf.float32, mtf.ones_initializer())
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:1", "", ["/cpu:0"])})
  ex = lambda t: lowering.export_to_tf_tensor(t).numpy()
  np.testing.assert_array_equal(ex(indices), [1, 0])
  np.testing.assert_array_equal(ex(values), [2.0, 3.0])
  np.testing.assert_allclose(
      ex(lse), np.log(np.exp([[1, 2], [3, -4]]).sum(1) + 1.0), rtol=1e-6)
  np.testing.assert_allclose(ex(leaky), [[1, 2], [3, -2]])
  np.testing.assert_allclose(ex(picked), [[1, 2], [3, 0]])
  np.testing.assert_array_equal(ex(w), [1.0, 1.0])  # the 8th: initializer
