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
