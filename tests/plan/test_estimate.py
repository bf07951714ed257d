"""meshtf/plan/estimate.py: the collectives of a training step estimated
from the layouts alone equal, record for record, what the traced per-device
program emits -- for the Mesh-TF paper's two-layer step, lm_tiny and
moe_tiny under data, model, 2-D, multi-axis, uneven and weight-update-
sharding layouts."""
import collections
import os

import pytest

import meshtf as mtf
import meshtf.plan  # noqa: F401
from meshtf.plan import estimate
from meshtf.train import config as config_lib
from meshtf.train import experiment

from plan.test_plan import _config, two_layer_step  # noqa: I100


def _multiset(records):
  """Records as a comparable multiset (count folded in)."""
  out = collections.Counter()
  for r in records:
    key = (r["kind"], tuple(r["mesh_axes"]), r["group_size"],
           r["bytes_per_device"])
    out[key] += r["count"]
  return out


def _both(graph, layout):
  traced = mtf.plan.plan(graph, layout).collectives
  estimated = mtf.plan.plan(graph, layout, trace=False)
  assert estimated.collectives_source == "estimated"
  return _multiset(traced), _multiset(estimated.collectives)


@pytest.mark.parametrize("mesh_shape,rules", [
    ("all:8", "batch:all"),
    ("all:8", "hidden:all"),
    ("r:2;c:4", "batch:r;hidden:c"),
    ("r:2;c:4", "batch:r;io:c"),
    ("r:2;c:4", "hidden:r+c"),
    ("r:3", "batch:r"),              # uneven
    ("r:3", "hidden:r"),
])
def test_two_layer_step(mesh_shape, rules):
  graph = mtf.Graph()
  two_layer_step(mtf.Mesh(graph, "m"))
  traced, estimated = _both(graph, mtf.MeshLayout(mesh_shape, rules))
  assert traced and estimated == traced


def _model_graph(config_name, mesh_shape, rules, variable_rules=""):
  config = _config(config_name)
  config.mesh_shape, config.layout = mesh_shape, rules
  config.variable_layout = variable_rules
  layout = config_lib.mesh_layout(config)
  graph, _ = experiment.build_training_graph(config, layout)
  return graph, layout


@pytest.mark.parametrize("config_file,mesh_shape,rules,variable_rules", [
    ("lm_tiny", "data:4;model:2", "batch:data;d_ff:model;heads:model;"
     "vocab:model", ""),
    ("lm_tiny", "data:8", "batch:data", ""),
    ("lm_tiny", "data:8", "batch:data", "d_model:data"),     # WUS
    ("lm_tiny", "data:2;model:4", "batch:data;d_model:model", ""),
    ("lm_tiny", "a:4;b:2", "d_ff:a+b;heads:b;vocab:a", ""),  # multi-axis
    ("lm_tiny", "data:3", "batch:data", ""),                    # uneven
    ("moe_tiny", "data:4;model:2", "batch:data;experts:data;d_ff:model",
     ""),
])
def test_models(config_file, mesh_shape, rules, variable_rules):
  graph, layout = _model_graph(config_file, mesh_shape, rules,
                               variable_rules)
  traced, estimated = _both(graph, layout)
  assert traced
  assert estimated == traced, (
      "estimated-only %s\ntraced-only %s" % (estimated - traced,
                                             traced - estimated))


def test_unread_outputs_are_reduced_as_exported():
  """A dangling pending sum (the loss) is allreduced once, as its export
  would be; passing outputs=[] leaves it pending."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch = mtf.Dimension("batch", 8)
  mtf.reduce_sum(mtf.zeros(mesh, [batch]))
  layout = mtf.MeshLayout("x:4", "batch:x")
  graph_layout = layout.assign(graph.operations)
  records = estimate.estimate_collectives(graph.operations, graph_layout)
  assert [(r["kind"], r["mesh_axes"], r["count"]) for r in records] == [
      ("allreduce_sum", ["x"], 1)]
  assert estimate.estimate_collectives(graph.operations, graph_layout,
                                       outputs=[]) == []


def test_gspmd_2d_finalized_tiny_annotated():
  """The annotated program (the completion's layouts: mirrored backward
  operations, reduce-scatters into mirrored readers, a rename's relayout
  shared with its input's, partial sums passing a local rename): the
  estimate equals the traced program, record for record."""
  config = config_lib.load_file(os.path.join(
      os.path.dirname(__file__), "..", "..", "t2t_configs",
      "gspmd_dense.py"), "tiny")
  layout = config_lib.mesh_layout(config)
  graph, _ = experiment.build_training_graph(config, layout)
  traced, estimated = _both(graph, layout)
  assert traced and estimated == traced, (
      "estimated-only %s\ntraced-only %s" % (estimated - traced,
                                             traced - estimated))


@pytest.mark.parametrize("reader,mesh_shape,allreduces", [
    (lambda t: mtf.negative(t), "x:2", 1),
    (lambda t: mtf.cumsum(t, "e"), "x:2", 1),
    (lambda t: mtf.shard(t, ""), "x:2", 1),   # t's own layout: not relaid
    # Relaid (b split over y, the sum pending over x): reduced first.
    (lambda t: mtf.shard(mtf.shard(t, ""), "b:y"), "x:2;y:2", 2),
], ids=["negative", "cumsum", "shard", "shard_relaid"])
def test_linear_readers_keep_sums_pending_as_lowered(reader, mesh_shape,
                                                     allreduces):
  """Operation.keeps_pending, which the lowering and the estimate both
  ask: two partial sums read by linear ops and added stay pending, one
  allreduce at the export, unless a relayout reduces each first; the
  estimate equals the traced program."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "b:4;d:8")
  parts = [mtf.einsum([x, mtf.zeros(mesh, "d:8;e:6")],
                      output_shape="b:4;e:6") for _ in range(2)]
  reader(parts[0]) + reader(parts[1])  # pylint: disable=expression-not-assigned
  traced, estimated = _both(graph, mtf.MeshLayout(mesh_shape, "d:x"))
  assert sum(traced.values()) == allreduces
  assert estimated == traced
