"""The sharding completion (meshtf/layouts/completion/): GSPMD 3.5's
propagation over forward and backward operations, with priorities, merged
dims, inferred weights and an origin for every dim -- and, without
annotations, exactly the rules' layouts.

The layout-invariance checks run through the equivalence harness on both
backends (values and gradients equal one device's)."""
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
import meshtf.plan  # noqa: F401
from meshtf.layouts import TensorLayout
from meshtf.layouts import assignment
from meshtf.layouts import completion
from meshtf.lowering import lowering as lowering_lib
from meshtf.train import config as config_lib
from meshtf.train import experiment

from plan.test_plan import _config, two_layer_step  # noqa: I100

TWO = "x:2;y:4"
RA = harness.random_array


def _assert_invariant(model_fn, inputs, layout, wrt=()):
  """Values and gradients of model_fn (which may annotate over axes x, y)
  on TWO under `layout`, on both backends, equal those on one device (a
  1x1 mesh with the same axis names). Returns the runs by backend."""
  base = harness.run_model(model_fn, inputs, "x:1;y:1", "", "placement",
                           wrt)
  runs = {}
  for backend in harness.BACKENDS:
    run = harness.run_model(model_fn, inputs, TWO, layout, backend, wrt)
    for name, value in base.outputs.items():
      harness.assert_close(run.outputs[name], value, 1e-5, 1e-5,
                           "%s output %s" % (backend, name))
    for name, value in base.grads.items():
      harness.assert_close(run.grads[name], value, 1e-5, 1e-5,
                           "%s grad %s" % (backend, name))
    runs[backend] = run
  return runs


def _numbers(records):
  """Collective records without their reasons (whose origins name the
  completion's paths)."""
  return [{k: v for k, v in r.items() if k != "reasons"} for r in records]


def _layout_of(graph_layout, t):
  return graph_layout.tensor_layout(t)


def _assign(graph, mesh_shape=TWO, rules="", variable_rules=None):
  layout = mtf.MeshLayout(mesh_shape, rules, variable_rules)
  return layout.assign(lowering_lib.all_operations(graph.operations))


# --- no annotations: the rules, exactly ------------------------------------
@pytest.mark.parametrize("name,mesh_shape,rules", [
    ("two_layer", "r:2;c:4", "batch:r;hidden:c"),
    ("two_layer", "r:3", "hidden:r"),
    ("lm_tiny", "data:4;model:2",
     "batch:data;d_ff:model;heads:model;vocab:model"),
    ("lm_tiny", "a:4;b:2", "d_ff:a+b;heads:b;vocab:a"),
    ("moe_tiny", "data:4;model:2", "batch:data;experts:data;d_ff:model"),
])
def test_without_annotations_the_completion_is_the_rules(
    name, mesh_shape, rules, monkeypatch):
  """Run through the whole completion (not its shortcut), a program
  without annotations and variable rules gets the rules' layout for every
  operation, forward and backward, and plans the same collectives, record
  for record."""
  if name == "two_layer":
    graph = mtf.Graph()
    two_layer_step(mtf.Mesh(graph, "m"))
    layout = mtf.MeshLayout(mesh_shape, rules)
  else:
    config = _config(name)
    config.mesh_shape, config.layout = mesh_shape, rules
    layout = config_lib.mesh_layout(config)
    graph, _ = experiment.build_training_graph(config, layout)
  ops = list(lowering_lib.all_operations(graph.operations))
  assert assignment.complete_layouts(layout, ops).is_trivial
  before = _numbers(mtf.plan.plan(graph, layout, trace=False).collectives)
  monkeypatch.setattr(assignment, "assign_layouts",
                      assignment.complete_layouts)
  after = _numbers(mtf.plan.plan(graph, layout, trace=False).collectives)
  assert before == after and before


def test_without_annotations_a_lowering_is_the_same_program(monkeypatch):
  """The same numbers and the same collectives, traced, on 8 devices."""
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    loss = two_layer_step(mesh)
    impl = harness.make_impl("simd", "rows:2;cols:4", "batch:rows;hidden:cols")
    lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[loss])
    return (float(lowering.export_to_tf_tensor(loss)),
            _numbers(lowering.collective_stats()))
  loss, stats = run()
  monkeypatch.setattr(assignment, "assign_layouts",
                      assignment.complete_layouts)
  assert run() == (loss, stats)


# --- propagation ------------------------------------------------------------
def test_dims_on_different_axes_merge():
  """GSPMD Figure 3: A_y B from one input, B C_x from the other: the
  result is A_y C_x (the two partial tilings combine)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a = mtf.shard(mtf.zeros(mesh, "a:8;b:4"), "a:y")
  b = mtf.shard(mtf.zeros(mesh, "b:4;c:6"), "c:x")
  out = mtf.einsum([a, b], output_shape="a:8;c:6")
  graph_layout = _assign(graph)
  assert _layout_of(graph_layout, out) == TensorLayout([1, 0])
  origins = graph_layout.origins(out.operation)
  assert origins["a"].root.label.startswith("mtf.shard 'shard'")
  assert origins["c"].root.label.startswith("mtf.shard 'shard_1'")


def _figure_4(mesh, t):
  """GSPMD Figure 4: Dot(x[B, F], w[F, D]) + bias[D] -> max(., 0), with
  x, w and the result annotated."""
  h = mtf.einsum([t["x"], t["w"]], output_shape="b:8;d:12")
  a = h + t["bias"]
  r = mtf.shard(mtf.relu(a), "b:x;d:y")
  return {"h": h, "a": a, "r": r}


FIGURE_4_INPUTS = {"x": (RA([8, 6], 0), "b:8;f:6"),
                   "w": (RA([6, 12], 1), "f:6;d:12"),
                   "bias": (RA([12], 2), "d:12")}


def test_figure_4_priorities_give_every_bd_tensor_one_layout():
  """With priorities, the elementwise Add and Max propagate the result's
  annotation B_x D_y back to the Dot before the Dot's inputs can pull it
  to B_x D or B D_x (the "without priorities" result, a relayout at the
  Add): every BD-shaped tensor is read as B_x D_y, the bias as D_y. The Dot
  itself sums over F, split over y like both its inputs, and its partial
  sums are reduce-scattered into B_x D_y (GSPMD's dot partitioner's choice
  too: cheaper than gathering F). Values and gradients as one device."""
  layout = harness.annotated("", {"x": "b:x;f:y", "w": "f:y;d:x"})
  runs = _assert_invariant(_figure_4, FIGURE_4_INPUTS, layout,
                           wrt=["x", "w", "bias"])
  for backend, run in runs.items():
    lowering = run.lowering
    figure = [op for op in run.graph.operations
              if op.name in ("add", "relu", "shard_2")]
    assert len(figure) == 3
    for op in figure:
      for t in op.inputs:
        if t.shape.dimension_names == ["b", "d"]:
          assert lowering.op_layout(op).tensor_layout(t.shape) == \
              TensorLayout([0, 1]), (backend, op.name, t.name)
        if t.shape.dimension_names == ["d"] and op.name == "add":
          assert lowering.op_layout(op).tensor_layout(t.shape) == \
              TensorLayout([1]), (backend, op.name, t.name)
    dot = [op for op in run.graph.operations
           if type(op).__name__ == "EinsumOperation"][0]
    assert str(lowering.op_layout(dot).layout_rules) == \
        "LayoutRules('b:x;f:y')"
    kinds = {(s["kind"], s["mesh_axes"]) for s in lowering.collective_stats()}
    assert ("reduce_scatter", ("y",)) in kinds, kinds


def _mlp(mesh, t, annotate_w_in=True, late=False):
  w_in = mtf.get_variable(mesh, "w_in", "io:6;hidden:16",
                          layout="hidden:y" if annotate_w_in else None)
  w_out = mtf.get_variable(mesh, "w_out", "hidden:16;io:6")
  h = mtf.relu(mtf.einsum([t["x"], w_in], output_shape="batch:8;hidden:16"))
  y = mtf.einsum([h, w_out], output_shape="batch:8;io:6")
  if late:
    y = mtf.shard(mtf.tanh(y), "batch:x")
  return {"y": y}


def test_input_and_w_in_annotated_infer_w_out():
  """Only the input (batch on x) and W_in (hidden on y) annotated: W_out is
  inferred from its reader -- hidden on y, so stored, updated and reduced
  split -- and the gradients take the weights' layouts."""
  inputs = {"x": (RA([8, 6], 3), "batch:8;io:6")}
  runs = _assert_invariant(_mlp, inputs, harness.annotated(
      "", {"x": "batch:x"}), wrt=["x"])
  for run in runs.values():
    graph = run.graph
    w_out = [v for v in graph.trainable_variables if v.name == "w_out"][0]
    layout = run.lowering.layout_of(w_out.outputs[0])
    assert layout.tensor_layout(w_out.shape) == TensorLayout([1, None])
    origin = run.lowering.graph_layout.origins(w_out)["hidden"]
    assert "get_variable 'w_in' layout" in origin.describe()


def test_a_late_annotation_propagates_backward():
  """One annotation at the end (batch on x, rules empty): every operation
  upstream computes on its half of the batch -- half the flops of the
  replicated program -- and the weights' gradients are summed over x."""
  inputs = {"x": (RA([8, 6], 4), "batch:8;io:6")}
  runs = _assert_invariant(
      lambda m, t: _mlp(m, t, annotate_w_in=False, late=True), inputs, "",
      wrt=["x"])
  for run in runs.values():
    for op in run.graph.operations:
      for t in op.outputs:
        if "batch" in t.shape.dimension_names and \
            not op.imports_host_slices:
          assert run.lowering.layout_of(t).dim_split(
              t.shape, "batch").mesh_axes == (0,), op.name
  graph = runs["placement"].graph
  layout = mtf.MeshLayout(TWO, "")
  annotated = mtf.plan.plan(graph, layout, trace=False)
  graph_layout = layout.assign(graph.operations)
  flops = annotated.summary()["flops_by_family"]["einsum"]
  replicated = sum(
      mtf.plan.accounting.op_cost(op, layout).flops
      for op in graph.operations if type(op).__name__ == "EinsumOperation")
  assert flops == pytest.approx(replicated / 2, rel=0.01)
  assert not graph_layout.is_trivial


def test_the_completion_is_deterministic_and_records_origins():
  """Two runs give the same layouts and the same explanations; a dim that
  cannot take its rule says which dim holds the axis, and why."""
  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.shard(mtf.zeros(mesh, "batch:8;io:6"), "batch:x;io:y")
    w = mtf.get_variable(mesh, "w", "io:6;hidden:4")
    mtf.einsum([x, w], output_shape="batch:8;hidden:4")
    return graph
  texts = []
  for _ in range(2):
    graph = build()
    graph_layout = _assign(graph, rules="hidden:y")
    texts.append([(op.name, str(graph_layout.op_layout(op)),
                   sorted((n, o.describe())
                          for n, o in graph_layout.origins(op).items()))
                  for op in graph.operations])
  assert texts[0] == texts[1]
  einsum = dict(texts[0][-1][2])
  # hidden's rule wants y, which io (contracted, from the annotation) holds.
  assert einsum["hidden"].startswith(completion.CONFLICT)
  assert "io holds y" in einsum["hidden"] and "mtf.shard" in einsum["hidden"]
  assert einsum["batch"].startswith("annotation mtf.shard 'shard'")


def test_replicated_dims_propagate_forward_only_and_keep_imports():
  """mtf.replicate: readers stay whole; the imported input keeps the
  rules' layout, and its gradient is laid out like it."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.constant(RA([8, 4], 5)), "batch:8;io:4")
  y = mtf.square(mtf.replicate(x))
  dx, = mtf.gradients([mtf.reduce_sum(y)], [x])
  graph_layout = _assign(graph, rules="batch:x;io:y")
  assert _layout_of(graph_layout, y) == TensorLayout([None, None])
  assert _layout_of(graph_layout, dx) == TensorLayout([0, 1])
