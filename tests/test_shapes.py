"""Dimension and Shape parsing and arithmetic."""
import pytest

import meshtf as mtf


@pytest.mark.parametrize("text", ["x:4;y:8", "x:4,y:8", "x:4 y:8", "x:4.y:8",
                                  " x:4 ; y:8 "])
def test_shape_string_forms(text):
  s = mtf.convert_to_shape(text)
  assert s.dims == [mtf.Dimension("x", 4), mtf.Dimension("y", 8)]
  assert s.size == 32 and s.ndims == 2


def test_shape_from_pairs_and_dims():
  assert mtf.convert_to_shape([("x", 4), ("y", 8)]) == "x:4;y:8"
  assert mtf.Shape([mtf.Dimension("a", 2)]).to_integer_list == [2]
  assert mtf.convert_to_shape("") == mtf.Shape([])
  assert mtf.convert_to_dimension(("io", "32")) == mtf.Dimension("io", 32)


@pytest.mark.parametrize("bad", ["x:4;y", "x4", ":4", "x:four", "x:4:5"])
def test_bad_shape_string_names_the_item(bad):
  with pytest.raises(ValueError, match="name:size"):
    mtf.convert_to_shape(bad)


def test_a_decimal_size_names_the_pair():
  """'.' separates pairs too: "rows:2.5" used to be blamed on a '5'."""
  with pytest.raises(ValueError) as e:
    mtf.convert_to_shape("rows:2.5;cols:4")
  assert str(e.value) == (
      "Cannot parse 'rows:2.5' in shape string 'rows:2.5;cols:4': dimension "
      "'rows' has size 2.5, but a size is a whole number, e.g. 'rows:2'")


def test_repeated_name_rejected():
  with pytest.raises(ValueError, match="repeats dimension name"):
    mtf.convert_to_shape("x:4;x:4")


def test_shape_arithmetic():
  s = mtf.convert_to_shape("a:2;b:3;c:4")
  assert s - ["b"] == "a:2;c:4"
  assert s - mtf.Dimension("a", 2) == "b:3;c:4"
  assert mtf.convert_to_shape("a:2") + "c:4;d:5" == "a:2;c:4;d:5"
  assert s.rename_dimension("b", "z") == "a:2;z:3;c:4"
  assert s.get_dim_by_name("c").size == 4
  assert mtf.convert_to_shape("c:4;a:2").is_subshape_of(s)
  assert not mtf.convert_to_shape("a:3").is_compatible_with(s)
  assert s.cumprod() == [1, 2, 6]


def test_negative_size_rejected():
  with pytest.raises(ValueError, match="negative"):
    mtf.convert_to_dimension(("x", -1))


@pytest.mark.parametrize("name,size,expected", [
    ("d", -4, "Dimension 'd' has negative size -4: a size is an integer >= 0"),
    ("d", 4.0, "Dimension 'd' has size 4.0 (float): a size is an integer"),
    ("d", None, "Dimension 'd' has size None (NoneType)"),
    ("d", True, "Dimension 'd' has size True: a size is an integer >= 0, "
     "not a bool"),
    ("", 3, "Dimension name '' (size 3) must be a non-empty string"),
    (7, 3, "Dimension name 7 (size 3) must be a non-empty string"),
    # issue 41: accepted, then no layout or shape string could name them
    ("bat:ch", 4, "Dimension name 'bat:ch' contains ':', which shape and "
     "layout strings use as a separator ('batch:8;hidden:16', 'batch:rows')"
     ": a rule or shape naming it could not be parsed; use letters, digits, "
     "'_' or '-', e.g. mtf.Dimension('bat_ch', 4)"),
    ("a;b", 4, "Dimension name 'a;b' contains ';'"),
    ("a b", 4, "Dimension name 'a b' contains ' '"),
])
def test_bad_dimensions_are_refused_when_made(name, size, expected):
  """mtf.Dimension("d", -4) used to be accepted and fail deep in TF."""
  with pytest.raises(ValueError) as e:
    mtf.Dimension(name, size)
  assert expected in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(ValueError):
    mtf.convert_to_shape([(name, size)])


def test_sizes_are_plain_ints_and_zero_is_an_empty_dimension():
  import numpy as np
  import tensorflow as tf
  d = mtf.Dimension("x", np.int64(3))
  assert d == ("x", 3) and type(d.size) is int and repr(d) == \
      "Dimension(name='x', size=3)"
  # Size 0 is legal, as in TensorFlow: reductions over it give their
  # identity, and split over a mesh axis every processor holds nothing.
  batch, io = mtf.Dimension("batch", 0), mtf.Dimension("io", 4)
  for mesh_shape, layout in [("all:1", ""), ("all:4", "batch:all")]:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.zeros([0, 4]), mtf.Shape([batch, io]))
    total = mtf.reduce_sum(x, reduced_dim=batch)
    impl = mtf.SimdMeshImpl(mesh_shape, layout, mtf.virtual_cpu_devices(8)[
        :mtf.convert_to_shape(mesh_shape).size])
    lowering = mtf.Lowering(graph, {mesh: impl})
    assert lowering.export_to_tf_tensor(total).numpy().tolist() == [0.0] * 4
    assert lowering.export_to_tf_tensor(x).shape == (0, 4)


def test_mesh_tensorflow_conventions():
  """Mesh TF's forms: '.' between rules, TypeError for a non-pair dim,
  case-insensitive unique names, mesh_axis_to_tensor_axis as a tuple."""
  assert mtf.convert_to_layout_rules("d_ff:model.heads:model").pairs == [
      ("d_ff", "model"), ("heads", "model")]
  with pytest.raises(TypeError, match="Bad dimension 5"):
    mtf.convert_to_dimension(5)
  graph = mtf.Graph()
  assert [graph.unique_name(n) for n in ("a", "A", "a_1")] == [
      "a", "A_1", "a_1_1"]
  assert mtf.TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(2) == (0, 2)
