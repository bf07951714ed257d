"""The package's import structure, read from the code (tests/import_graph.py:
module- and function-level imports, the facade meshtf/__init__.py left out):
no import circles but the gradient pair, the Mesh TensorFlow wing imported by
no core module, layouts/ importing nothing but itself and shapes."""
import import_graph

GRAPH = import_graph.import_graph()

# A broadcast's gradient is a reduction and a reduction's gradient is a
# broadcast: the two op families call each other, lazily.
GRADIENT_PAIR = ["meshtf.ops.elementwise", "meshtf.ops.reductions"]


def test_no_import_circles_but_the_gradient_pair():
  found = import_graph.circles(GRAPH)
  assert [c for c in found if c != GRADIENT_PAIR] == []


def test_the_model_wiring_does_not_import_the_config_schema():
  # config.validate checks the layout on the symbolic training graph that
  # experiment builds; experiment reads the MoE layer indices and
  # ConfigError from preflight.py and errors.py, which sit below the schema.
  for module in ("meshtf.train.experiment", "meshtf.train.preflight",
                 "meshtf.train.errors"):
    assert "meshtf.train.config" not in GRAPH[module], module


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
