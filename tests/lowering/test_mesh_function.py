"""MeshFunction: lower once, run a training step many times."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf


def build(mesh, x_tf):
  w = mtf.get_variable(mesh, "w", "io:8;hidden:4",
                       initializer=mtf.random_normal_initializer(stddev=0.5))
  x = mtf.import_tf_tensor(mesh, x_tf, "batch:8;io:8")
  loss = mtf.reduce_mean(mtf.square(mtf.einsum([x, w], output_shape=
                                               "batch:8;hidden:4")))
  g, = mtf.gradients([loss], [w])
  mtf.assign_sub(w, g * 0.1)
  return {"loss": loss}


def run(mesh_shape, layout, steps, use_tf_function=True, backend="placement"):
  fn = mtf.MeshFunction(build, harness.make_impl(backend, mesh_shape,
                                                 layout),
                        use_tf_function=use_tf_function)
  x = harness.random_array([8, 8], 0)
  return [float(fn(x)["loss"]) for _ in range(steps)], fn


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
def test_variables_persist_and_layouts_agree(backend):
  l1, f1 = run("all:1", "", 4)
  l8, f8 = run("rows:2;cols:4", "batch:rows;hidden:cols", 4, backend=backend)
  assert l1[-1] < l1[0]
  np.testing.assert_allclose(l8, l1, rtol=1e-5)
  np.testing.assert_allclose(f8.variable_value("w"), f1.variable_value("w"),
                             rtol=1e-5)
  assert f8.variable_store.names() == ["w"]


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
def test_traced_once_and_eager_mode_agrees(backend):
  traces = []
  def counting_build(mesh, x_tf):
    traces.append(1)
    return build(mesh, x_tf)
  fn = mtf.MeshFunction(counting_build, harness.make_impl(backend, "all:8",
                                                          "batch:all"))
  x = harness.random_array([8, 8], 0)
  losses = [float(fn(x)["loss"])]
  # Once, although the first call makes the variables: they are not the
  # tf.function's (mesh_impl.NOT_LIFTED), so it does not trace again.
  assert len(traces) == 1
  losses += [float(fn(x)["loss"]) for _ in range(2)]
  assert len(traces) == 1
  eager, _ = run("all:8", "batch:all", 3, use_tf_function=False,
                 backend=backend)
  np.testing.assert_allclose(losses, eager, rtol=1e-6)
  assert any(s["kind"] == "allreduce_sum" for s in fn.collective_stats())


def test_lowering_in_eager_returns_values():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.ones([4, 2]), "batch:4;io:2")
  s = mtf.reduce_sum(x)
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("placement", "all:2",
                                                          "batch:all")})
  out = lowering.export_to_tf_tensor(s)
  assert float(out.numpy()) == 8.0


def test_tracing_does_not_count_against_the_collective_deadline():
  """A slow trace (a large model on a loaded host) is not a lost peer: the
  step is traced before the collectives' deadline starts, and its first
  run gets FIRST_RUN_ALLOWANCE times the timeout (TF instantiates it)."""
  import time
  impl = mtf.SimdMeshImpl("all:8", "batch:all", harness.DEVICES,
                          collective_timeout_seconds=5)

  def slow_build(mesh, x_tf):
    time.sleep(8)   # longer than the timeout
    return build(mesh, x_tf)
  fn = mtf.MeshFunction(slow_build, impl)
  x = harness.random_array([8, 8], 0)
  first = float(fn(x)["loss"])
  assert float(fn(x)["loss"]) < first
  assert mtf.MeshFunction.FIRST_RUN_ALLOWANCE > 1
