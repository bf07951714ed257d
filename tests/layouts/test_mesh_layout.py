"""MeshLayout: the pure mesh geometry (slices, padding of uneven splits,
processor groups, reduced axes) and relayout plans as data."""
import pytest

import meshtf as mtf
from meshtf.layouts import LayoutError
from meshtf.layouts import MeshLayout
from meshtf.layouts import relayout


def _brute_force_slices(layout, shape):
  """Which global positions of each dim every processor holds, computed
  from the definition (stripe i of ceil(size / n) positions, cut at size)."""
  out = {}
  for p in range(layout.size):
    begin = layout.slice_begin(shape, p)
    valid = layout.valid_slice_shape(shape, p)
    out[p] = [list(range(b, b + v)) for b, v in zip(begin, valid)]
  return out


def test_uneven_slices_cover_every_position_once():
  layout = MeshLayout("rows:2;cols:4", "batch:rows;vocab:cols")
  shape = mtf.convert_to_shape("batch:5;vocab:250;io:3")
  assert layout.slice_shape(shape) == [3, 63, 3]
  slices = _brute_force_slices(layout, shape)
  for axis, (dim, mesh_axis) in enumerate([(5, 0), (250, 1)]):
    seen = []
    for group in layout.processor_groups([mesh_axis])[:1]:
      for p in group:
        seen += slices[p][axis]
    assert seen == list(range(dim))
  # The padding sits on the last processors of each axis.
  assert layout.valid_slice_shape(shape, 7) == [2, 61, 3]
  assert layout.valid_slice_shape(shape, 0) == [3, 63, 3]


def test_dim_split_padding_and_shards_with_no_data():
  s = MeshLayout("x:4", "heads:x").dim_split("heads:6;d:2", "heads")
  assert (s.shard_size, s.padded_size, s.padding, s.is_even) == (2, 8, 2,
                                                                  False)
  assert [s.valid_size(i) for i in range(4)] == [2, 2, 2, 0]
  even = MeshLayout("x:4", "heads:x").dim_split("heads:8", 0)
  assert even.is_even and even.shard_size == 2


def test_padding_report_says_what_uneven_costs():
  layout = MeshLayout("x:8", "vocab:x")
  report = layout.padding_report("vocab:250;d_model:4")
  assert report["elements"] == 1000 and report["padded_elements"] == 1024
  assert report["padding_fraction"] == pytest.approx(24 / 1024, abs=1e-4)
  assert layout.padding_report("vocab:256")["padded_elements"] == 256


def test_processor_coordinates_and_groups():
  layout = MeshLayout("rows:2;cols:4")
  for p in range(8):
    assert layout.processor_coordinates_to_pnum(
        layout.pnum_to_processor_coordinates(p)) == p
  assert layout.processor_groups([0]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert layout.processor_groups([1]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert layout.processor_groups([0, 1]) == [list(range(8))]


def test_reduced_axes_skip_size_one_axes():
  layout = MeshLayout("a:1;b:4", "io:a;hidden:b")
  assert layout.reduced_mesh_axes("batch:2;io:4;hidden:8", "batch:2") == [1]
  assert layout.split_axis(mtf.Dimension("io", 4)) is None
  assert layout.tensor_dimension_to_mesh_axis(mtf.Dimension("io", 4)) == 0


def test_mesh_layout_accepts_itself_and_rejects_bad_meshes():
  layout = MeshLayout("x:4", "batch:x")
  assert MeshLayout.convert(layout) is layout
  assert MeshLayout.convert("x:4", "batch:x") == layout
  with pytest.raises(mtf.LayoutError, match="'data' has size 0"):
    MeshLayout("data:0;model:2")
  with pytest.raises(mtf.LayoutError, match="'rowz'"):
    MeshLayout("rows:2", "batch:rowz")


def test_activation_rules_are_parsed_and_checked_once():
  layout = MeshLayout("x:2;y:4", "batch:x", None, "batch:x;d_model:y")
  assert layout.activation_rules.pairs == [("batch", "x"), ("d_model", "y")]
  assert MeshLayout("x:2").activation_rules is None
  with pytest.raises(LayoutError, match="names mesh axis 'z'"):
    MeshLayout("x:2", "", None, "batch:z")


def test_two_dims_on_one_axis_still_one_clear_error():
  layout = MeshLayout("x:4", "batch:x;vocab:x")
  with pytest.raises(mtf.LayoutError) as e:
    layout.tensor_layout(mtf.convert_to_shape("batch:8;vocab:250"), "logits")
  for part in ["'logits'", "'batch'", "'vocab'", "'x'", "size 4"]:
    assert part in str(e.value)


# --- relayout plans ----------------------------------------------------------
def _kinds(plan):
  return [s.kind for s in plan.steps]


def test_plan_keeps_a_split_that_selects_the_same_elements():
  layout = MeshLayout("x:4", "batch:x;group:x")
  plan = layout.relayout_plan("batch:8;io:6", "group:4;size:2;io:6")
  assert _kinds(plan) == ["reshape"] and plan.bytes_per_device == 0
  assert plan.steps[-1].local_shape == (1, 2, 6)


def test_plan_uses_alltoall_when_an_unsplit_dim_slices_like_the_new_one():
  layout = MeshLayout("x:4", "group:x;experts:x")
  plan = layout.relayout_plan("group:4;e:8;c:3", "g2:4;experts:8;c:3")
  assert _kinds(plan) == ["alltoall"]
  step = plan.steps[0]
  # Sends [group 1, e 8, c 3] = 24 floats, 3/4 of it leaves.
  assert step.elements_per_device == 24
  assert step.bytes_per_device == relayout.collective_bytes(
      "alltoall", 4, 24, 4) == 72


def test_plan_uneven_gather_then_split():
  layout = MeshLayout("x:4", "vocab:x;v2:x")
  plan = layout.relayout_plan("vocab:250", "a:2;v2:125")
  assert _kinds(plan) == ["allconcat", "reshape", "allsplit"]
  gather = plan.steps[0]
  assert gather.concat_size == 250 and gather.elements_per_device == 63
  assert gather.bytes_per_device == 3 * 63 * 4
  assert plan.steps[-1].local_shape == (2, 32)


def test_plan_uneven_alltoall_pads_the_split_dim():
  layout = MeshLayout("x:4", "heads:x")
  plan = layout.relayout_plan("vocab:10;heads:6", "vocab:10;heads:6")
  assert _kinds(plan) == []
  layout2 = MeshLayout("x:4", "v:x;h:x")
  plan = layout2.relayout_plan("h:6;vocab:10", "v:10;h2:6")
  assert _kinds(plan) == ["allconcat", "reshape", "allsplit"]
  # The split moves from h to the unsplit vocab's twin v: an alltoall.
  layout3 = MeshLayout("x:4", "h:x;v:x")
  plan = layout3.relayout_plan("h:6;vocab:10", "h2:6;v:10")
  step = plan.steps[0]
  assert step.kind == "alltoall" and step.concat_size == 6
  # vocab:10 padded to 12 before the alltoall: [2 (heads stripe), 12].
  assert step.elements_per_device == 24
  assert _kinds(plan) == ["alltoall"] and step.local_shape == (6, 3)
