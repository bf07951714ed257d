"""Per-tensor layouts (meshtf/ops/annotations.py, meshtf/layouts/
assignment.py): mtf.shard / mtf.replicate, variable layouts and forward
propagation. Annotated layouts give the single-device numbers (forward and
gradients, both backends); the relayouts are the MeshLayout's plans; the
GSPMD "2D finalized" feed-forward layer emits Figure 7's allgathers; bad
annotations get one line naming the tensor, dims, axes and the fix.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.layouts import TensorLayout

TWO = "x:2;y:4"
RA = harness.random_array


def _lower(build, layout="", mesh_shape=TWO, backend="placement",
           variable_layout=None):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  out = build(mesh)
  impl = harness.make_impl(backend, mesh_shape, layout, variable_layout)
  outputs = list(out.values()) if isinstance(out, dict) else [out]
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=outputs)
  return lowering, out


def _kinds(lowering):
  return [(s["kind"], s["mesh_axes"], s["count"])
          for s in lowering.collective_stats()]


def test_shard_relays_and_propagates_forward():
  """x is laid out by the rules (batch on y); shard moves batch to x and
  splits d_model over y; the consumers inherit that layout."""
  x_np = RA([8, 12], 0)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), "batch:8;d_model:12")
    s = mtf.shard(x, "batch:x;d_model:y")
    r = mtf.relu(s) * 2.0
    return {"s": s, "r": r, "sum": mtf.reduce_sum(r, reduced_dim="d_model")}
  lowering, out = _lower(build, "batch:y")
  assert lowering.layout_of(out["s"]).tensor_layout(
      out["s"].shape) == TensorLayout([0, 1])
  assert lowering.layout_of(out["r"]).tensor_layout(
      out["r"].shape) == TensorLayout([0, 1])
  # Only the shard itself communicates: axis y moves from batch to d_model
  # (one alltoall), batch splits over x locally; then the reduction over
  # d_model (on y), when the pending sum is exported.
  assert _kinds(lowering) == [("alltoall", ("y",), 1)]
  np.testing.assert_allclose(lowering.export_to_tf_tensor(out["sum"]),
                             (np.maximum(x_np, 0) * 2).sum(1), rtol=1e-5)
  assert _kinds(lowering)[1:] == [("allreduce_sum", ("y",), 1)]


def test_replicate_propagates_and_the_gradient_is_laid_out_like_x():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(RA([8, 4], 1)), "batch:8;io:4")
    r = mtf.replicate(x)
    y = mtf.square(r)
    dx, = mtf.gradients([mtf.reduce_sum(y)], [x])
    return {"r": r, "y": y, "dx": dx, "x": x}
  lowering, out = _lower(build, "batch:x;io:y")
  rep = TensorLayout([None, None])
  assert lowering.layout_of(out["y"]).tensor_layout(out["y"].shape) == rep
  assert lowering.layout_of(out["dx"]).tensor_layout(
      out["dx"].shape) == TensorLayout([0, 1])


def test_annotated_layouts_are_layout_invariant():
  """An MLP whose input is annotated several ways (a dim over two axes,
  replicated, moved to another axis), on both backends, values and
  gradients; the weights follow the rules."""
  x_np, w_np, v_np = RA([8, 6], 2), RA([6, 10], 3), RA([10, 6], 4)

  def model(mesh, t):
    h = mtf.relu(mtf.einsum([t["x"], t["w"]], output_shape="batch:8;h:10"))
    return {"y": mtf.einsum([h, t["v"]], output_shape="batch:8;io:6")}
  harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;io:6"), "w": (w_np, "io:6;h:10"),
              "v": (v_np, "h:10;io:6")},
      [(TWO, harness.annotated("h:y", {"x": "batch:x+y"})),
       (TWO, harness.annotated("io:y;h:x", {"x": "batch:y;io:x",
                                            "w": ""})),
       ("all:8", harness.annotated("batch:all", {"w": "h:all",
                                                 "v": "io:all"}))],
      wrt=["x", "w", "v"],
      reference=lambda t: {"y": tf.nn.relu(t["x"] @ t["w"]) @ t["v"]})


def test_variable_layouts_gathered_on_read_train_like_one_device():
  """Weights stored split over the data axis (variable_rules, GSPMD's
  weight-update sharding) or with their own layout: read whole where the
  computation wants them, updated in their stored layout; three SGD steps
  equal numpy's and the checkpointed value restores into plain rules."""
  x_np, w0 = RA([8, 6], 5), RA([6, 4], 6)

  def build(mesh, x_tf):
    w = mtf.get_variable(mesh, "w", "io:6;hidden:4",
                         initializer=mtf.constant_initializer(w0))
    u = mtf.get_variable(mesh, "u", "hidden:4", layout="hidden:y",
                         initializer=mtf.zeros_initializer())
    x = mtf.import_tf_tensor(mesh, x_tf, "batch:8;io:6")
    h = mtf.einsum([x, w], output_shape="batch:8;hidden:4") + u
    loss = mtf.reduce_sum(mtf.square(h))
    gw, gu = mtf.gradients([loss], [w, u])
    mtf.assign_sub(w, gw * 0.01)
    mtf.assign_sub(u, gu * 0.01)
    return loss

  for backend in harness.BACKENDS:
    impl = harness.make_impl(backend, TWO, "batch:x", variable_layout="io:x")
    step = mtf.MeshFunction(build, impl)
    w, u = w0.astype(np.float64), np.zeros(4)
    for _ in range(3):
      h = x_np @ w + u
      np.testing.assert_allclose(float(step(tf.constant(x_np))),
                                 (h ** 2).sum(), rtol=1e-4)
      w, u = w - 0.02 * x_np.T @ h, u - 0.02 * h.sum(0)
    np.testing.assert_allclose(step.variable_value("w"), w, rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(step.variable_value("u"), u, rtol=1e-4,
                               atol=1e-6)
    entry = step.variable_store.entry("w")
    assert entry.mesh_layout.tensor_layout(entry.shape) == TensorLayout(
        [0, None])
    assert step.variable_store.entry("u").mesh_layout.tensor_layout(
        mtf.convert_to_shape("hidden:4")) == TensorLayout([1])
    # Layout-free values: restored into a store that lays w out by the
    # rules alone (split over x by hidden), bit for bit.
    saved = step.variable_store.full_value("w")
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    mtf.get_variable(mesh, "w", "io:6;hidden:4")
    store = mtf.VariableStore()
    store.restore_values({"w": saved})
    mtf.Lowering(graph, {mesh: harness.make_impl(backend, TWO, "hidden:x")},
                 variable_store=store)
    np.testing.assert_array_equal(store.full_value("w"), saved)


def test_gspmd_2d_finalized_feed_forward_emits_figure_7():
  """GSPMD Table 1 / Figure 7: weights W_in[M:x, H:y], W_out[H:y, M:x];
  activations BSM (batch:x, d_model:y) and BSH (batch:x, d_ff:y). The
  forward pass allgathers BSM over y and each weight over x, and the output
  BSM, a partial sum over y, is reduce-scattered over y (RS-y)."""
  def build(mesh):
    x = mtf.shard(mtf.zeros(mesh, "batch:8;length:2;d_model:8"),
                  "batch:x;d_model:y")
    w_in = mtf.get_variable(mesh, "w_in", "d_model:8;d_ff:16")
    w_out = mtf.get_variable(mesh, "w_out", "d_ff:16;d_model:8")
    h = mtf.shard(mtf.relu(mtf.einsum([x, w_in], reduced_dims=["d_model"])),
                  "batch:x;d_ff:y")
    y = mtf.einsum([h, w_out], reduced_dims=["d_ff"])
    return {"h": h, "y": mtf.shard(y, "batch:x;d_model:y")}
  lowering, out = _lower(build, "d_model:x;d_ff:y")
  assert lowering.layout_of(out["h"]).tensor_layout(
      out["h"].shape) == TensorLayout([0, None, 1])
  kinds = _kinds(lowering)
  assert ("allconcat", ("y",), 1) in kinds            # AG-y on BSM
  assert ("allconcat", ("x",), 2) in kinds            # AG-x on both weights
  assert ("reduce_scatter", ("y",), 1) in kinds       # RS-y on the output
  assert not any(k[0].startswith("allreduce") for k in kinds), kinds
  summary = lowering.collective_summary()
  assert "allconcat" in summary


@pytest.mark.parametrize("build,words", [
    (lambda m: mtf.shard(mtf.zeros(m, "batch:8;io:4"), "batch:z"),
     ["mtf.shard", "'z'", "batch:8", "'x:2;y:4'", "use one of"]),
    (lambda m: mtf.shard(mtf.zeros(m, "batch:8;io:4"), "batch:x;io:x"),
     ["mtf.shard", "'batch'", "'io'", "'x' (size 2)",
      "in the annotation, map one of"]),
    (lambda m: mtf.get_variable(m, "w", "io:4;h:2", layout="io:y;h:y"),
     ["get_variable 'w' layout", "'io'", "'h'", "'y' (size 4)"]),
])
def test_unplaceable_annotations_name_everything(build, words):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  build(mesh)
  with pytest.raises(mtf.LayoutError) as e:
    mtf.Lowering(graph, {mesh: harness.make_impl("placement", TWO, "")})
  assert len(str(e.value).splitlines()) == 1
  for w in words:
    assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("layout,words", [
    ("batch:x+", ["mtf.shard", "batch:8", "malformed", "'batch:x+y'"]),
    ("batch:x+x", ["name an axis twice"]),
    ("depth:x", ["'depth'", "does not have", "['batch', 'io']"]),
    # issue 41: a TypeError from iterating the int
    (42, ["Layout 42 (a int) is not layout rules", "'batch:rows;hidden:cols'",
          "a dict {'batch': 'rows'}"]),
])
def test_malformed_annotations_fail_when_written(layout, words):
  mesh = mtf.Mesh(mtf.Graph(), "m")
  x = mtf.zeros(mesh, "batch:8;io:4", name="features")
  with pytest.raises(mtf.LayoutError) as e:
    mtf.shard(x, layout)
  assert "'features:0'" in str(e.value)
  for w in words:
    assert w in str(e.value), (w, str(e.value))


def test_partial_sums_annotated_split_over_the_summed_axis_reduce_scatter():
  """y = x w contracts io (split over cols): partial sums over cols; the
  annotation splits hidden over cols, so y is reduce-scattered (no
  allreduce), forward; the gradients are exact too, on both backends."""
  x_np, w_np, c_np = RA([8, 12], 7), RA([12, 10], 8), RA([8, 10], 9)
  for backend in harness.BACKENDS:
    def build(mesh):
      x = mtf.import_tf_tensor(mesh, tf.constant(x_np), "batch:8;io:12")
      w = mtf.import_tf_tensor(mesh, tf.constant(w_np), "io:12;hidden:10")
      y = mtf.shard(mtf.einsum([x, w], output_shape="batch:8;hidden:10"),
                    "batch:rows;hidden:cols")
      c = mtf.import_tf_tensor(mesh, tf.constant(c_np), "batch:8;hidden:10")
      dx, dw = mtf.gradients([mtf.reduce_sum(y * c)], [x, w])
      return {"y": y, "dx": dx, "dw": dw}
    lowering, out = _lower(build, "io:cols", "rows:2;cols:4", backend)
    stats = lowering.collective_stats()
    first = [(s["kind"], s["mesh_axes"]) for s in stats][:1]
    assert first == [("reduce_scatter", ("cols",))], stats
    np.testing.assert_allclose(lowering.export_to_tf_tensor(out["y"]),
                               x_np @ w_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lowering.export_to_tf_tensor(out["dx"]),
                               c_np @ w_np.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lowering.export_to_tf_tensor(out["dw"]),
                               x_np.T @ c_np, rtol=1e-5, atol=1e-5)
