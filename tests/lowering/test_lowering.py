"""The Lowering engine: pending sums, validation before TF work, stats,
reshape communication rules."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf import layouts


def lower(graph, mesh, mesh_shape, layout, backend="placement", store=None):
  return mtf.Lowering(graph, {mesh: harness.make_impl(backend, mesh_shape,
                                                      layout)},
                      variable_store=store)


def allreduce_count(lowering):
  return sum(s["count"] for s in lowering.collective_stats()
             if s["kind"] == "allreduce_sum")


def test_sum_of_partial_einsums_costs_one_allreduce():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.import_tf_tensor(mesh, harness.random_array([8, 16], 0), "b:8;k:16")
  w1 = mtf.import_tf_tensor(mesh, harness.random_array([16, 4], 1), "k:16;o:4")
  w2 = mtf.import_tf_tensor(mesh, harness.random_array([16, 4], 2), "k:16;o:4")
  y = mtf.einsum([a, w1], output_shape="b:8;o:4") + mtf.einsum(
      [a, w2], output_shape="b:8;o:4") - mtf.einsum([a, w1],
                                                    output_shape="b:8;o:4")
  y = -(y * 2.0)
  lowering = lower(graph, mesh, "all:8", "k:all")
  got = lowering.export_to_tf_tensor(y).numpy()
  aa, ww2 = harness.random_array([8, 16], 0), harness.random_array([16, 4], 2)
  np.testing.assert_allclose(got, -2.0 * aa @ ww2, rtol=1e-5, atol=1e-5)
  assert allreduce_count(lowering) == 1


def test_nonlinear_use_forces_the_allreduce():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.import_tf_tensor(mesh, harness.random_array([8, 16], 0), "b:8;k:16")
  s = mtf.reduce_sum(a, reduced_dim=mtf.Dimension("k", 16))
  y = mtf.square(s) + mtf.exp(s)
  lowering = lower(graph, mesh, "all:8", "k:all")
  aa = harness.random_array([8, 16], 0).sum(1)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(),
                             aa ** 2 + np.exp(aa), rtol=1e-5)
  assert allreduce_count(lowering) == 1  # materialised once, reused


def test_layout_error_before_any_variable_is_created():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", "io:4;hidden:8")
  x = mtf.ones(mesh, "batch:8;io:4")
  mtf.einsum([x, w], output_shape="batch:8;hidden:8")
  store = mtf.VariableStore()
  with pytest.raises(mtf.LayoutError, match="'batch'.*'hidden'"):
    lower(graph, mesh, "all:8", "batch:all;hidden:all", store=store)
  assert len(store) == 0


def test_einsum_mixing_dims_on_one_axis_is_rejected():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "r:8")
  z = mtf.ones(mesh, "d:8")
  # Each tensor alone is fine, but r (reduced) and d (kept) share axis 'all'.
  mtf.einsum([x, z], output_shape="d:8")
  with pytest.raises(mtf.LayoutError, match="einsum"):
    lower(graph, mesh, "all:8", "r:all;d:all")


def test_mesh_size_must_match_devices():
  with pytest.raises(mtf.LayoutError, match="8 processors but 4 devices"):
    mtf.PlacementMeshImpl("rows:2;cols:4", "", harness.DEVICES[:4])


def test_unknown_mesh_axis_rejected_at_impl():
  with pytest.raises(mtf.LayoutError, match="'rowz'"):
    harness.make_impl("placement", "rows:2;cols:4", "batch:rowz")


def test_a_rule_misspelling_a_dim_of_the_graph_is_refused():
  """Issue 41: "batchh:rows;hiden:cols" lowered with 0 collectives, as if
  no rule were given. Now the Lowering refuses a rule whose dim misspells
  one of the graph's before any TF work, naming the closest dim; so do
  variable rules. A rule for a dim the graph lacks altogether (a layout
  written for several models) is one warning; a graph lowered after one
  that had the dim may lack it (an eval graph after the training graph);
  Mesh TF's inactive-mode rules keep their semantics (no check)."""
  import warnings

  def graph_of(dims):
    graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
    mtf.reduce_sum(mtf.ones(mesh, dims))
    return graph, mesh
  graph, mesh = graph_of("batch:4;hidden:8")
  store = mtf.VariableStore()
  for backend in ("simd", "placement"):
    with pytest.raises(mtf.LayoutError, match=(
        r"^layout rule 'batchh:rows' names dim 'batchh', which no tensor of "
        r"the graph has, so it would split nothing: did you mean 'batch'\? "
        r"\(the graph's dims: batch, hidden\): write 'batch:rows'$")):
      mtf.Lowering(graph, {mesh: harness.make_impl(
          backend, "rows:2;cols:4", "batchh:rows;hiden:cols")},
                   variable_store=store)
  assert len(store) == 0
  model, model_mesh = graph_of("batch:4;d_model:8")
  layout = mtf.MeshLayout("rows:2;cols:4", "batch:rows", "dmodel:cols")
  with pytest.raises(mtf.LayoutError, match=r"^variable layout rule "
                     r"'dmodel:cols' names dim 'dmodel'.*did you mean "
                     r"'d_model'\?"):
    mtf.Lowering(model, {model_mesh: mtf.PlacementMeshImpl(
        layout, None, harness.DEVICES)})
  with pytest.warns(layouts.UnusedLayoutRuleWarning, match=(
      r"^layout rule 'io:cols' names a dim no tensor of this graph has \(its"
      r" dims: batch, hidden\): unused here, it splits nothing$")):
    mtf.Lowering(graph, {mesh: harness.make_impl(
        "placement", "rows:2;cols:4", "batch:rows;io:cols")})
  impl = harness.make_impl("placement", "rows:2;cols:4",
                           "batch:rows;hidden:cols")
  mtf.Lowering(graph, {mesh: impl})
  eval_graph, eval_mesh = graph_of("batch:4")   # no 'hidden': seen before
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    mtf.Lowering(eval_graph, {eval_mesh: impl})
    mtf.Lowering(eval_graph, {eval_mesh: harness.make_impl(   # Mesh TF's
        "placement", "rows:2;cols:4",
        mtf.convert_to_layout_rules("batchh:rows"))})


@pytest.mark.parametrize("backend", ["simd", "placement"])
def test_a_tensor_the_lowering_never_saw_says_why(backend):
  """Issue 41: a tensor of another Graph, or one made after the Lowering,
  was answered "list it in Lowering(..., outputs=[...])", which cannot
  help either."""
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.reduce_sum(mtf.ones(mesh, "b:4"))
  other = mtf.Graph()
  y = mtf.reduce_sum(mtf.ones(mtf.Mesh(other, "m"), "b:4"))
  lowering = lower(graph, mesh, "all:2", "b:all", backend)
  later = x * 2.0
  with pytest.raises(ValueError, match=(
      r"^reduce_sum:0 has no lowered value here: it belongs to another "
      r"mtf.Graph than this Lowering's: lower its own graph")):
    lowering.export_to_tf_tensor(y)
  with pytest.raises(ValueError, match=(
      r"^scalar_multiply:0 has no lowered value here: it was made after this "
      r"Lowering \(which lowered the 2 operations its graph had then\): "
      r"build it before mtf.Lowering")):
    lowering.export_to_tf_tensor(later)
  assert float(lowering.export_to_tf_tensor(x)) == 4.0


def test_missing_impl_for_mesh():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  other = mtf.Mesh(graph, "other")
  mtf.ones(mesh, "a:2")
  with pytest.raises(ValueError, match="no MeshImpl"):
    mtf.Lowering(graph, {other: harness.make_impl("placement", "all:1", "")})


RESHAPE_CASES = [
    # (old shape, new shape, mesh, layout, expected collective kinds)
    ("b:8;h:8", "b:8;g:8", "all:8", "h:all", {"allconcat"}),   # split->unsplit
    ("b:8;h:8", "b:8;g:8", "all:8", "g:all", set()),           # unsplit->split
    ("b:8;h:8", "b:8;g:8", "rows:2;cols:4", "b:rows;g:cols", set()),
    ("b:8;h:8", "c:8;g:8", "all:8", "b:all;g:all", {"alltoall"}),  # b -> g
    ("b:8;h:8", "b:8;x:2;y:4", "rows:2;cols:4", "b:rows;h:cols;y:cols",
     {"allconcat"}),
    ("b:8;x:2;y:4", "b:8;h:8", "rows:2;cols:4", "b:rows;h:cols", set()),
    ("b:8;x:2;y:4", "b:8;h:8", "rows:2;cols:4", "b:rows;y:cols",
     {"allconcat"}),
    ("a:4;b:6", "c:24", "all:2", "a:all", {"allconcat"}),
    ("a:4;b:6", "a:4;c:2;d:3", "all:2", "a:all", set()),
    # GShard's groups -> experts over both axes of a 2-D mesh: one alltoall
    ("eu:8;g:8;m:3", "e:8;gu:8;m:3", "rows:2;cols:4", "g:rows+cols;"
     "e:rows+cols", {"alltoall"}),
]


@pytest.mark.parametrize("backend", list(harness.BACKENDS))
def test_multi_axis_alltoall_moves_n_minus_1_over_n(backend):
  """A split over both axes of a 2-D mesh moving to another dim (GShard's
  dispatched tokens, groups -> experts) is one alltoall over all 8
  processors: 7/8 of the slice per device, not 7x it (gather and split);
  the values are the reshape's."""
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  old_shape = mtf.convert_to_shape("eu:8;g:8;c:2;m:3")
  full = harness.random_array(old_shape.to_integer_list, 9)
  x = mtf.import_tf_tensor(mesh, tf.constant(full), old_shape)
  y = mtf.reshape(x, "e:8;gu:8;c:2;m:3")
  impl = harness.make_impl(backend, "rows:2;cols:4", "g:rows+cols;"
                           "e:rows+cols")
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[y])
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(), full)
  stats = lowering.collective_stats()
  slice_bytes = 8 * 2 * 3 * 4   # [eu:8, g:1, c:2, m:3] float32
  assert [(s["kind"], s["mesh_axes"], s["group_size"], s["bytes_per_device"])
          for s in stats] == [("alltoall", ("rows", "cols"), 8,
                               slice_bytes * 7 // 8)]


@pytest.mark.parametrize("old,new,mesh_shape,layout,kinds", RESHAPE_CASES)
def test_reshape_communication_and_values(old, new, mesh_shape, layout, kinds):
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  old_shape = mtf.convert_to_shape(old)
  full = harness.random_array(old_shape.to_integer_list, 7)
  x = mtf.import_tf_tensor(mesh, tf.constant(full), old_shape)
  y = mtf.reshape(x, new)
  lowering = lower(graph, mesh, mesh_shape, layout)
  got = lowering.export_to_tf_tensor(y).numpy()
  np.testing.assert_array_equal(
      got, full.reshape(mtf.convert_to_shape(new).to_integer_list))
  assert {s["kind"] for s in lowering.collective_stats()} == kinds


def test_collective_summary_text():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "b:8;k:8")
  s = mtf.reduce_sum(x)
  lowering = lower(graph, mesh, "rows:2;cols:4", "b:rows;k:cols")
  assert float(lowering.export_to_tf_tensor(s)) == 64.0
  stats = lowering.collective_stats()
  reasons = stats[0].pop("reasons")
  assert stats == [{"kind": "allreduce_sum", "mesh_axes": ("rows", "cols"),
                    "group_size": 8, "elements_per_device": 1,
                    "bytes_per_device": 7, "count": 1}]  # 2 * 7/8 * 4 bytes
  assert "allreduce_sum" in lowering.collective_summary()
  # Why: the sum's partial sums over both axes (b and k split by the
  # rules), reduced for the export.
  assert [(r.cause, r.op, r.tensor) for r in reasons] == [
      ("reduce", "(export)", s.name)]
  assert reasons[0].held == ("partial sums over rows+cols: reduce_sum sums "
                             "b:rows (rules b:rows), k:cols (rules k:cols)")


def test_every_collective_says_why_and_explain_ranks_them():
  """Provenance: a relayout names the reading operation, the tensor, the
  annotation behind the layout it was held in and the rule or annotation
  behind the layout wanted; partial sums name the summing operation and
  the split dims; explain() ranks them by bytes."""
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.shard(mtf.zeros(mesh, "b:8;k:16"), "k:cols", name="x_by_k")
  w = mtf.get_variable(mesh, "w", "k:16;h:8")
  y = mtf.einsum([x, w], output_shape="b:8;h:8", name="proj")
  z = mtf.shard(mtf.relu(y), "b:rows;h:cols", name="out")
  lowering = lower(graph, mesh, "rows:2;cols:4", "b:rows")
  lowering.export_to_tf_tensor(z)
  why = {(s["kind"], r.cause): r for s in lowering.collective_stats()
         for r in s["reasons"]}
  # proj contracts k, split over cols by the annotation x_by_k: partial
  # sums, scattered where out's annotation splits h over cols.
  rs = why[("reduce_scatter", "reduce_scatter")]
  assert rs.tensor == y.name and "proj sums k:cols" in rs.held
  assert "annotation mtf.shard 'x_by_k'" in rs.held
  assert "h:cols (annotation mtf.shard 'out'" in rs.wanted
  text = lowering.explain(top=3)
  assert text.splitlines()[0].startswith("collectives by bytes sent")
  assert "reduce_scatter over cols" in text and "x_by_k" in text


def test_pending_sum_with_two_consumers_is_reduced_once():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.import_tf_tensor(mesh, harness.random_array([8, 16], 0), "b:8;k:16")
  s = mtf.reduce_sum(a, reduced_dim=mtf.Dimension("k", 16))
  y = s * 2.0 + mtf.square(s)   # a linear and a non-linear consumer
  lowering = lower(graph, mesh, "all:8", "k:all")
  aa = harness.random_array([8, 16], 0).sum(1)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(),
                             2 * aa + aa ** 2, rtol=1e-5)
  assert allreduce_count(lowering) == 1
