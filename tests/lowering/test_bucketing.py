"""Gradient bucketing (meshtf/lowering/bucketing.py): the pending sums of a
group go out as few fused allreduces, with the single-device numbers."""
import numpy as np
import pytest
import tensorflow as tf

import meshtf as mtf
from meshtf.models import optimize

import harness

B, IO, H = 16, 8, 12
LR = 0.1


def sgd_model(mesh, x):
  """The two-layer net with its weights as inputs; outputs the loss and the
  weights after one SGD update (which read the reduced gradients)."""
  w, bias, v = x["w"], x["bias"], x["v"]
  batch, hidden = x["x"].shape.dims[0], w.shape.dims[1]
  h = mtf.relu(mtf.einsum([x["x"], w], output_shape=[batch, hidden]) + bias)
  y = mtf.einsum([h, v], output_shape=x["x"].shape)
  loss = mtf.reduce_mean(mtf.square(y - x["target"]))
  gw, gb, gv = mtf.gradients([loss], [w, bias, v])
  return {"loss": loss, "w": w - LR * gw, "bias": bias - LR * gb,
          "v": v - LR * gv}


def sgd_inputs(b=B, io=IO, h=H):
  return {
      "x": (harness.random_array([b, io], 1), "batch:%d;io:%d" % (b, io)),
      "target": (harness.random_array([b, io], 2),
                 "batch:%d;io:%d" % (b, io)),
      "w": (harness.random_array([io, h], 3), "io:%d;hidden:%d" % (io, h)),
      "bias": (harness.random_array([h], 4), "hidden:%d" % h),
      "v": (harness.random_array([h, io], 5), "hidden:%d;io:%d" % (h, io)),
  }


def allreduces(lowering, axis):
  return [(s["elements_per_device"], s["count"])
          for s in lowering.collective_stats()
          if s["kind"] == "allreduce_sum" and s["mesh_axes"] == (axis,)]


def lower(backend, mesh_shape, layout, inputs, bucket_bytes=None):
  """The SGD model lowered with `bucket_bytes`: (Lowering, {name: value})."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  tensors = {n: mtf.import_tf_tensor(mesh, tf.constant(a), s)
             for n, (a, s) in sorted(inputs.items())}
  outputs = sgd_model(mesh, tensors)
  impl = harness.make_impl(backend, mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=list(outputs.values()),
                          bucket_bytes=bucket_bytes)
  return lowering, {n: lowering.export_to_tf_tensor(t).numpy()
                    for n, t in outputs.items()}


def test_bucketed_update_is_layout_invariant():
  """Data-parallel, 2-D and uneven layouts, both backends: the loss and
  the updated weights equal the 1-device run's, and the gradients' sums
  over the batch axis went out as one allreduce."""
  layouts = [("all:8", "batch:all"),
             ("rows:2;cols:4", "batch:rows;hidden:cols")]
  runs = harness.assert_layout_invariant(sgd_model, sgd_inputs(), layouts)
  runs.update(harness.assert_layout_invariant(
      sgd_model, sgd_inputs(b=12, h=6), [("rows:2;cols:4",
                                          "batch:cols;hidden:rows")]))
  for (backend, mesh_shape, layout), run in runs.items():
    batch_axis = "all" if mesh_shape == "all:8" else layout[6:10]
    grads = allreduces(run.lowering, batch_axis)
    # One bucket of the three gradients (+ the loss's own allreduce).
    assert sum(n for _, n in grads) == 2, (backend, layout, grads)


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
def test_one_allreduce_for_all_gradients(backend):
  """bucket_bytes=0 allreduces each gradient; the default fuses them into
  one collective of their total size, with the same values."""
  inputs = sgd_inputs()
  off, off_values = lower(backend, "all:8", "batch:all", inputs,
                          bucket_bytes=0)
  on, on_values = lower(backend, "all:8", "batch:all", inputs)
  gw, gb, gv = IO * H, H, H * IO   # elements per device: replicated weights
  assert sorted(allreduces(off, "all")) == sorted([(1, 1), (gw, 2), (gb, 1)])
  assert sorted(allreduces(on, "all")) == sorted([(1, 1), (gw + gb + gv, 1)])
  for n in off_values:
    np.testing.assert_allclose(on_values[n], off_values[n], rtol=1e-6,
                               atol=1e-6, err_msg=n)


def test_cap_splits_buckets_deterministically_in_backward_order():
  """A cap below the total gives ceil(total / cap)-ish buckets, formed in
  the order the backward pass produces the gradients (v's first: its
  layer is differentiated first), the same in every lowering."""
  inputs = sgd_inputs()
  cap = (H * IO + H) * 4   # v and bias fit, w does not join them
  stats = [lower("simd", "all:8", "batch:all", inputs, cap)[0]
           .collective_stats() for _ in range(2)]
  assert stats[0] == stats[1]
  grads = [s["elements_per_device"] for s in stats[0]
           if s["kind"] == "allreduce_sum" and s["elements_per_device"] > 1]
  assert grads == [H * IO + H, IO * H]


def test_weight_update_sharding_keeps_its_reduce_scatter():
  """A gradient whose variable is stored split over the summed axis is
  reduce-scattered where its update reads it, not bucketed."""

  def model(mesh, x):
    w = mtf.get_variable(mesh, "w", "io:8;hidden:16")
    u = mtf.get_variable(mesh, "u", "hidden:16;out:8")
    y = mtf.einsum([mtf.einsum([x["x"], w], "batch:16;hidden:16"), u],
                   "batch:16;out:8")
    grads = optimize.in_variable_layouts(
        mtf.gradients([mtf.reduce_sum(y)], [w, u]), [w, u])
    for var, g in zip([w, u], grads):
      mtf.assign_sub(var, g * LR)
    return {"y": y}

  run = harness.run_model(
      model, {"x": (harness.random_array([16, 8], 0), "batch:16;io:8")},
      "all:8", harness.annotated("batch:all", {"_variables": "hidden:all"}),
      backend="simd")
  kinds = [s["kind"] for s in run.lowering.collective_stats()]
  assert "reduce_scatter" in kinds, kinds


def test_train_step_and_mesh_function_take_the_switch():
  impl = harness.make_impl("simd", "all:8", "batch:all")
  with pytest.raises(ValueError, match="bucket_bytes must be"):
    mtf.MeshFunction(lambda mesh: None, impl, bucket_bytes=-1)
  graph = mtf.Graph()
  mtf.Mesh(graph, "m")
  with pytest.raises(ValueError, match="bucket_bytes must be"):
    mtf.Lowering(graph, {}, bucket_bytes="32MiB")


def test_reduce_together_groups_any_pending_sums():
  """Two independent einsums over a split dim: one allreduce for both."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.constant(harness.random_array([8, 4], 0)),
                           "batch:8;io:4")
  a = mtf.einsum([x, x], "io:4")
  b = mtf.reduce_sum(x, reduced_dim=x.shape.dims[0])
  a, b = mtf.reduce_together([a, b])
  outs = [a * 2.0, b * 3.0]
  impl = harness.make_impl("placement", "all:8", "batch:all")
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=outs)
  assert allreduces(lowering, "all") == [(8, 1)]
  xv = harness.random_array([8, 4], 0)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(outs[0]).numpy(),
                             2 * (xv * xv).sum(0), rtol=1e-5)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(outs[1]).numpy(),
                             3 * xv.sum(0), rtol=1e-5)
