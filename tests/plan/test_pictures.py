"""meshtf/plan/pictures.py: the PNG of every variable's layout, and the
description of what it drew, checked exactly on a 2x4 mesh with an uneven
split (b:10 over y:4 -> blocks of 3, the last holding 1 and 2 of padding)."""
import struct

import meshtf as mtf
from meshtf.plan import pictures


def _graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  a, b, c = (mtf.Dimension("a", 6), mtf.Dimension("b", 10),
             mtf.Dimension("c", 3))
  w0 = mtf.get_variable(mesh, "layer_0/w", [a, b])
  w1 = mtf.get_variable(mesh, "layer_1/w", [a, b])
  bias = mtf.get_variable(mesh, "bias", [b])
  scale = mtf.get_variable(mesh, "scale", [c])
  x = mtf.random_normal(mesh, [a, b])
  loss = mtf.reduce_sum(x * w0 * w1 * bias) + mtf.reduce_sum(scale)
  mtf.gradients([loss], [w0, w1, bias, scale])
  return graph


def _png_size(path):
  with open(path, "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
  return struct.unpack(">II", head[16:24])


def test_the_picture_and_what_it_drew(tmp_path):
  graph = _graph()
  layout = mtf.MeshLayout("x:2;y:4", "a:x;b:y")
  report = mtf.plan.plan(graph, layout, trace=False)
  path = tmp_path / "layouts.png"
  panels = mtf.plan.draw_variable_layouts(graph, report.graph_layout,
                                          str(path))
  width, height = _png_size(path)
  assert 800 <= width <= 2000 and 200 <= height <= 2000, (width, height)
  assert path.stat().st_size > 5000

  # Largest first; the two [a, b] variables share one panel.
  assert [p["variables"] for p in panels] == [
      ["layer_0/w", "layer_1/w"], ["bias"], ["scale"]]
  assert [p["title"] for p in panels] == [
      "2 variables: */w\n[a:6, b:10]  a:x; b:y",
      "bias\n[b:10]  b:y",
      "scale\n[c:3]  replicated"]
  w, bias, scale = panels
  assert (w["rows"], w["cols"], w["height"], w["width"]) == ("a", ["b"], 6, 12)
  assert [(b["label"], b["processors"], b["top"], b["left"],
           b["valid_width"]) for b in w["blocks"]] == [
               ("x=0,y=0", [0], 0, 0, 3), ("x=0,y=1", [1], 0, 3, 3),
               ("x=0,y=2", [2], 0, 6, 3), ("x=0,y=3", [3], 0, 9, 1),
               ("x=1,y=0", [4], 3, 0, 3), ("x=1,y=1", [5], 3, 3, 3),
               ("x=1,y=2", [6], 3, 6, 3), ("x=1,y=3", [7], 3, 9, 1)]
  assert {(b["height"], b["valid_height"], b["width"])
          for b in w["blocks"]} == {(3, 3, 3)}
  # A 1-D variable is one bar; a block held by several processors names
  # only the axes that split it.
  assert (bias["rows"], bias["height"], bias["width"]) == ("", 1, 12)
  assert [(b["label"], b["processors"], b["valid_width"])
          for b in bias["blocks"]] == [
              ("y=0", [0, 4], 3), ("y=1", [1, 5], 3), ("y=2", [2, 6], 3),
              ("y=3", [3, 7], 1)]
  assert [(b["label"], b["processors"]) for b in scale["blocks"]] == [
      ("all", list(range(8)))]
  assert [p["labels_drawn"] for p in panels] == [8, 4, 1]


def test_each_variable_in_its_own_stored_layout(tmp_path):
  """Variable rules (weight-update sharding) are what the picture shows,
  and max_panels keeps the largest."""
  graph = _graph()
  layout = mtf.MeshLayout("x:2;y:4", "b:y", variable_rules="a:x")
  report = mtf.plan.plan(graph, layout, trace=False)
  panels = mtf.plan.draw_variable_layouts(
      graph, report.graph_layout, str(tmp_path / "v.png"), max_panels=1)
  assert len(panels) == 1
  assert panels[0]["rules"] == "a:x; b:y"
  assert [b["label"] for b in panels[0]["blocks"]][:2] == ["x=0,y=0",
                                                           "x=0,y=1"]
  assert _png_size(tmp_path / "v.png")[0] > 0


def test_dims_after_the_first_are_drawn_split_ones_first():
  """[experts, d_model, hidden] with hidden split: the horizontal axis is
  hidden x d_model, so each block is one rectangle."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.get_variable(mesh, "experts_wi", [
      mtf.Dimension("experts", 4), mtf.Dimension("d_model", 8),
      mtf.Dimension("hidden", 6)])
  layout = mtf.MeshLayout("data:2;model:2", "experts:data;hidden:model")
  panel, = pictures.variable_panels(graph, layout.assign(graph.operations))
  assert (panel["rows"], panel["cols"], panel["width"]) == (
      "experts", ["hidden", "d_model"], 48)
  assert [(b["label"], b["top"], b["left"], b["width"])
          for b in panel["blocks"]] == [
              ("data=0,model=0", 0, 0, 24), ("data=0,model=1", 0, 24, 24),
              ("data=1,model=0", 2, 0, 24), ("data=1,model=1", 2, 24, 24)]
