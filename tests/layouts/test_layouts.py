"""Layout rules, tensor layouts and their validation errors (pure Python)."""
import ast
import pathlib

import pytest

import meshtf as mtf
from meshtf.layouts import slice_shape
from meshtf.layouts import tensor_layout
from meshtf.layouts import validate_device_count
from meshtf.layouts import validate_layout_rules


def test_layouts_package_imports_no_tensorflow():
  root = pathlib.Path(mtf.__file__).parent / "layouts"
  for path in list(root.glob("*.py")) + [root.parent / "shapes.py"]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""]
      for n in names:
        assert not n.startswith("tensorflow"), "%s imports %s" % (path, n)


@pytest.mark.parametrize("text", ["batch:rows;hidden:cols",
                                  "batch:rows,hidden:cols",
                                  "batch:rows hidden:cols"])
def test_parse_layout_rules(text):
  rules = mtf.convert_to_layout_rules(text)
  assert rules.pairs == [("batch", "rows"), ("hidden", "cols")]
  assert rules == mtf.convert_to_layout_rules(
      [("batch", "rows"), ("hidden", "cols")])
  assert rules == mtf.convert_to_layout_rules({"batch": "rows",
                                               "hidden": "cols"})


def test_tensor_layout_from_rules():
  mesh = mtf.convert_to_shape("rows:2;cols:4")
  rules = mtf.convert_to_layout_rules("batch:rows;hidden:cols")
  assert tuple(tensor_layout(mtf.convert_to_shape("batch:8;hidden:8;io:3"),
                             mesh, rules)) == (0, 1, None)
  assert tensor_layout(mtf.convert_to_shape("io:3"), mesh,
                       rules).is_fully_replicated


def test_two_dims_on_one_axis_error_names_everything():
  mesh = mtf.convert_to_shape("all:8")
  rules = mtf.convert_to_layout_rules("batch:all;hidden:all")
  with pytest.raises(mtf.LayoutError) as e:
    tensor_layout(mtf.convert_to_shape("batch:64;hidden:128"), mesh, rules,
                  tensor_name="h")
  msg = str(e.value)
  for part in ["'h'", "'batch'", "'hidden'", "'all'", "size 8", "64", "128"]:
    assert part in msg, msg


def test_uneven_split_is_a_padded_layout_not_an_error():
  mesh = mtf.convert_to_shape("rows:2;cols:4")
  rules = mtf.convert_to_layout_rules("hidden:cols")
  shape = mtf.convert_to_shape("batch:8;hidden:6")
  layout = tensor_layout(shape, mesh, rules, tensor_name="w")
  assert tuple(layout) == (None, 1)
  assert slice_shape(shape, mesh, layout) == [8, 2]  # ceil(6 / 4)


def test_unknown_mesh_axis_error():
  with pytest.raises(mtf.LayoutError) as e:
    validate_layout_rules(mtf.convert_to_layout_rules("batch:rowz"),
                          mtf.convert_to_shape("rows:2;cols:4"))
  msg = str(e.value)
  assert "'rowz'" in msg and "rows" in msg and "cols" in msg


def test_one_dim_on_two_axes_rejected():
  with pytest.raises(mtf.LayoutError, match=r"over both with 'batch:rows\+cols'"):
    mtf.convert_to_layout_rules("batch:rows;batch:cols")


def test_device_count_error():
  with pytest.raises(mtf.LayoutError) as e:
    validate_device_count(mtf.convert_to_shape("rows:2;cols:4"), 4)
  assert "8 processors" in str(e.value) and "4 devices" in str(e.value)


@pytest.mark.parametrize("bad", ["batch", "batch:", ":rows", "a:b:c"])
def test_bad_layout_string(bad):
  with pytest.raises(mtf.LayoutError, match="dim:mesh_axis"):
    mtf.convert_to_layout_rules(bad)


# --- rules naming an axis the mesh lacks: strict, or inactive (Mesh TF) -------
T5_RULES = ("ensemble:ensemble,batch:batch,d_ff:model,heads:model,"
            "vocab:model,experts:batch")


def test_meshtf_rules_naming_an_absent_axis_are_an_error():
  with pytest.raises(mtf.LayoutError) as e:
    mtf.MeshLayout("batch:8", T5_RULES)
  msg = str(e.value)
  assert "'ensemble:ensemble'" in msg and "'batch:8'" in msg
  assert "\n" not in msg
  assert mtf.layouts.convert_to_layout_rules(T5_RULES).absent_axes == "error"


@pytest.mark.parametrize("mesh,active,split", [
    # split: the mesh axis of [batch, heads, d_model] under the rules left.
    ("batch:8", [("batch", "batch"), ("experts", "batch")], (0, None, None)),
    ("model:4;batch:2", [("batch", "batch"), ("d_ff", "model"),
                         ("heads", "model"), ("vocab", "model"),
                         ("experts", "batch")], (1, 0, None)),
    ("", [], (None, None, None)),
])
def test_inactive_rules_are_dropped_with_one_warning_naming_them(
    mesh, active, split):
  from meshtf.layouts import InactiveLayoutRuleWarning
  rules = mtf.layouts.convert_to_layout_rules(T5_RULES).with_absent_axes(
      "inactive")
  with pytest.warns(InactiveLayoutRuleWarning) as caught:
    layout = mtf.MeshLayout(mesh, rules)
  assert len(caught) == 1
  msg = str(caught[0].message)
  assert "'ensemble:ensemble'" in msg and "Mesh TensorFlow" in msg
  assert "\n" not in msg
  for dim, axis in active:
    assert "'%s:%s'" % (dim, axis) not in msg
  assert layout.layout_rules.pairs == active
  assert layout.layout_rules.absent_axes == "error"
  shape = mtf.convert_to_shape("batch:8;heads:4;d_model:6")
  assert tuple(layout.tensor_layout(shape)) == split


def test_inactive_rules_on_a_mesh_that_has_every_axis_warn_nothing():
  import warnings
  rules = mtf.layouts.convert_to_layout_rules(
      "batch:batch;heads:model").with_absent_axes("inactive")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    layout = mtf.MeshLayout("batch:2;model:4", rules)
  assert layout.layout_rules == rules


def test_split_by_mesh_and_policy_are_pure_data():
  rules = mtf.layouts.convert_to_layout_rules("batch:x+y;d_ff:z")
  active, inactive = rules.split_by_mesh(mtf.convert_to_shape("x:2;y:2"))
  assert active.pairs == [("batch", "x+y")] and inactive == [("d_ff", "z")]
  # A multi-axis rule is inactive if any of its axes is absent.
  active, inactive = rules.split_by_mesh(mtf.convert_to_shape("x:2;z:2"))
  assert active.pairs == [("d_ff", "z")] and inactive == [("batch", "x+y")]
  lenient = rules.with_absent_axes("inactive")
  assert lenient == rules and lenient.absent_axes == "inactive"
  assert "absent_axes='inactive'" in repr(lenient)
  with pytest.raises(ValueError, match="absent_axes"):
    mtf.LayoutRules([("batch", "x")], absent_axes="ignore")
