"""mtf.gradients builds backward meshtf ops."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf


def test_gradients_match_tensorflow_through_a_chain():
  x_np = harness.random_array([4, 6], 0)
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, "b:4;k:6")
  y = mtf.reduce_sum(mtf.tanh(x) * x + mtf.exp(x) / 3.0,
                     reduced_dim=mtf.Dimension("k", 6))
  z = mtf.reduce_sum(mtf.square(y)) + mtf.reduce_sum(x)
  g, = mtf.gradients([z], [x])
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "placement", "rows:2;cols:2", "b:rows;k:cols")})
  xt = tf.constant(x_np)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    yt = tf.reduce_sum(tf.tanh(xt) * xt + tf.exp(xt) / 3.0, axis=1)
    zt = tf.reduce_sum(yt ** 2) + tf.reduce_sum(xt)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(g).numpy(),
                             tape.gradient(zt, xt).numpy(), rtol=1e-5)


def test_unconnected_gives_none_and_grad_ys_scale():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.get_variable(mesh, "a", "k:3", initializer=mtf.ones_initializer())
  b = mtf.get_variable(mesh, "b", "k:3")
  y = mtf.reduce_sum(a * 2.0)
  ga, gb = mtf.gradients([y], [a, b])
  assert gb is None
  ga2, = mtf.gradients([y], [a], grad_ys=[mtf.constant(mesh, 3.0)])
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("placement",
                                                          "all:1", "")})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(ga).numpy(),
                             [2.0] * 3)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(ga2).numpy(),
                             [6.0] * 3)


def test_stop_gradient_blocks():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.get_variable(mesh, "a", "k:3", initializer=mtf.ones_initializer())
  y = mtf.reduce_sum(mtf.stop_gradient(a) * a)
  g, = mtf.gradients([y], [a])
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("placement",
                                                          "all:1", "")})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(g).numpy(), [1.0] * 3)


def test_data_parallel_weight_gradient_is_allreduced():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, harness.random_array([8, 4], 1), "batch:8;io:4")
  w = mtf.get_variable(mesh, "w", "io:4;out:2")
  loss = mtf.reduce_sum(mtf.einsum([x, w], output_shape="batch:8;out:2"))
  g, = mtf.gradients([loss], [w])
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("placement", "all:8",
                                                          "batch:all")})
  lowering.export_to_tf_tensor(g)
  kinds = {(s["kind"], s["mesh_axes"], s["elements_per_device"])
           for s in lowering.collective_stats()}
  assert ("allreduce_sum", ("all",), 8) in kinds


def test_square_of_a_reduction_doubles_the_small_gradient_not_x():
  """reduce_sum(square(x)) over a dim: square's gradient reads the
  reduction's gradient before its broadcast (2 * s, then times x by
  name), so the backward holds no broadcast and no product of x and a
  constant (which Grappler moved into the forward pass); the values are
  2 * dy * x exactly, and the unread broadcast is dropped."""
  x_np = harness.random_array([4, 6], 2)
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, "b:4;k:6")
  s = mtf.reduce_sum(mtf.square(x), reduced_dim=mtf.Dimension("k", 6))
  g, = mtf.gradients([s], [x], grad_ys=[mtf.import_tf_tensor(
      mesh, np.arange(4, dtype=np.float32), "b:4")])
  backward = graph.operations[graph.backward_start:]
  assert not [op for op in backward
              if isinstance(op, mtf.ops.elementwise.BroadcastOperation)]
  assert g.shape == x.shape
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "placement", "rows:2;cols:2", "b:rows;k:cols")})
  dy = np.arange(4, dtype=np.float32)[:, None]
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(g).numpy(),
                                (dy * 2.0) * x_np)


def test_an_integer_y_or_x_is_named_with_its_dtype():
  """Issue 41: gradients of an int32 loss, or with respect to an int32
  variable, were [None] without a word."""
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", "io:3")
  n = mtf.get_variable(mesh, "n", "io:3", dtype=tf.int32)
  with pytest.raises(ValueError, match=(
      r"^mtf.gradients: y 'reduce_sum:0' is int32, which has no gradient: "
      r"compute it in floating point")):
    mtf.gradients([mtf.reduce_sum(mtf.cast(w, tf.int32))], [w])
  with pytest.raises(ValueError, match=(
      r"^mtf.gradients: x 'n:0' is int32, which has no gradient: "
      r"differentiate with respect to floating-point tensors")):
    mtf.gradients([mtf.reduce_sum(w * mtf.cast(n, tf.float32))], [w, n])
