"""The package's import structure, read from the code (tests/import_graph.py:
module- and function-level imports, the facade meshtf/__init__.py left out):
no import circles but the gradient pair, the Mesh TensorFlow wing imported by
no core module, layouts/ importing nothing but itself and shapes."""
import import_graph

GRAPH = import_graph.import_graph()

# A broadcast's gradient is a reduction and a reduction's gradient is a
# broadcast: the two op families call each other, lazily.
GRADIENT_PAIR = ["meshtf.ops.elementwise", "meshtf.ops.reductions"]
# Left to undo: config.validate builds the training graph (layout_problem ->
# experiment.build_training_graph) and experiment reads
# config.moe_layer_indices; the layout check belongs in train/preflight.py.
NOT_YET = [["meshtf.train.config", "meshtf.train.experiment"]]


def test_no_import_circles_but_the_gradient_pair():
  found = import_graph.circles(GRAPH)
  assert [c for c in found if c != GRADIENT_PAIR and c not in NOT_YET] == []


def test_no_core_module_imports_the_mesh_tf_wing():
  assert import_graph.core_to_compat(GRAPH) == []
  assert any(import_graph.is_compat(m) for m in GRAPH)   # the wing is there


def test_layouts_import_only_layouts_and_shapes():
  for module, targets in GRAPH.items():
    if module.startswith("meshtf.layouts"):
      others = {t for t in targets if not t.startswith("meshtf.layouts")}
      assert others <= {"meshtf.shapes"}, (module, others)


def test_op_families_do_not_import_the_lowering_engine():
  # An op makes its pending sums from lowering/pending.py; the engine
  # (lowering/lowering.py) calls the ops, not the reverse.
  for module, targets in GRAPH.items():
    if module.startswith("meshtf.ops") or module == "meshtf.graph":
      assert "meshtf.lowering.lowering" not in targets, module
