"""meshtf/plan/search.py: the layout search -- its candidates counted by
hand, its screen equal to the plan report, weight-update-sharding
variants, the memory cap, and the Mesh-TF paper's finding (the 2-D
layout beats data- and model-parallelism for a large two-layer network)
reproduced by the search's own model."""
import pytest

import meshtf as mtf
import meshtf.plan  # noqa: F401
from meshtf.plan import search

from plan.test_plan import two_layer_step  # noqa: I100


def _graph():
  graph = mtf.Graph()
  two_layer_step(mtf.Mesh(graph, "m"))
  return graph


def test_candidates_by_hand():
  """batch, io and hidden meet in one einsum, so no two share an axis;
  every axis splits something; each dim has room for 8 shards. Over
  r:2;c:4: one dim on r+c (3 ways) or one on r and another on c (3 x 2):
  9 layouts, fewest splits first."""
  graph = _graph()
  assert search.layout_dims([graph]) == {"batch": 128, "io": 64,
                                         "hidden": 256}
  assert frozenset(["batch", "io", "hidden"]) in search.conflict_groups(
      [graph])
  candidates = [search.rules_text(r) for r in
                search.candidate_rules([graph], "r:2;c:4")]
  assert sorted(candidates[:3]) == ["batch:r+c", "hidden:r+c", "io:r+c"]
  assert sorted(candidates[3:]) == sorted([
      "hidden:r;batch:c", "hidden:c;batch:r", "hidden:r;io:c",
      "hidden:c;io:r", "batch:r;io:c", "batch:c;io:r"])
  # Only the named dims; a dim too small for an axis is never split on it.
  assert [search.rules_text(r) for r in search.candidate_rules(
      [graph], "x:128", dims=["batch", "io"])] == ["batch:x"]


def test_too_many_candidates_is_one_line():
  with pytest.raises(ValueError) as e:
    search.candidate_rules([_graph()], "r:2;c:4", max_candidates=3)
  assert len(str(e.value).splitlines()) == 1
  assert "more than 3 candidate layouts of dims hidden,batch,io" in str(
      e.value) and "auto_layout_dims" in str(e.value)


def test_screen_is_the_plan_report():
  """Each candidate's numbers are those of plan(trace=False) for its
  layout; the ranking is by step time."""
  graph = _graph()
  result = search.search([graph], "r:2;c:4", "tpuv3")
  assert result.evaluated == 9 + len(
      [c for c in result.ranked if c.variable_rules])
  steps = [c.step_seconds for c in result.ranked]
  assert steps == sorted(steps)
  for c in result.ranked[:4]:
    layout = mtf.MeshLayout("r:2;c:4", c.rules,
                            variable_rules=c.variable_rules or None)
    s = mtf.plan.plan(graph, layout, "tpuv3", trace=False).summary()
    assert c.step_seconds == pytest.approx(s["step_seconds"], rel=1e-9)
    assert c.peak_bytes == s["memory_bytes_per_device"]["peak"]
    assert c.collective_bytes == s["collective_bytes_per_device"]


def test_the_mesh_tf_papers_finding():
  """Mesh-TF section 5: for a large hidden layer on 2-D hardware, the
  2-D layout (batch over one axis, hidden over the other) moves less than
  pure data or pure model parallelism; the search ranks it first (the
  wider axis on hidden)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, io, hidden = (mtf.Dimension("batch", 4096),
                       mtf.Dimension("io", 4096),
                       mtf.Dimension("hidden", 16384))
  x = mtf.zeros(mesh, [batch, io])
  w = mtf.get_variable(mesh, "w", [io, hidden])
  v = mtf.get_variable(mesh, "v", [hidden, io])
  y = mtf.einsum([mtf.relu(mtf.einsum([x, w], output_shape=[batch, hidden])),
                  v], output_shape=[batch, io])
  loss = mtf.reduce_sum(mtf.square(y))
  for var, g in zip([w, v], mtf.gradients([loss], [w, v])):
    mtf.assign_sub(var, g * 0.1)
  result = search.search([graph], "rows:16;cols:32", "tpuv3",
                         weight_update_sharding=False)
  by_rules = {c.rules: c for c in result.ranked}
  best = result.best
  # In this network batch and io play the same part (x is an input), so
  # io:rows ties with the paper's batch:rows; both move the same bytes.
  assert {frozenset(c.rules.split(";")) for c in result.ranked[:2]} == {
      frozenset(["hidden:cols", "batch:rows"]),
      frozenset(["hidden:cols", "io:rows"])}
  paper = by_rules["hidden:cols;batch:rows"]
  assert paper.collective_bytes == best.collective_bytes
  assert best.collective_bytes < min(
      by_rules["batch:rows+cols"].collective_bytes,
      by_rules["hidden:rows+cols"].collective_bytes)


def test_weight_update_sharding_variants():
  """With the batch over x, the variables may be stored split over x on
  their largest free dim (GSPMD 3.2): less memory, and a layout the
  search ranks beside its plain form."""
  graph = _graph()
  assert search.weight_update_rules([("batch", ("x",))], [graph],
                                    "x:8") == "hidden:x;io:x"
  assert search.weight_update_rules([("hidden", ("x",))], [graph],
                                    "x:8") == ""
  result = search.search([graph], "x:8", "tpuv3")
  plain, = [c for c in result.ranked
            if c.rules == "batch:x" and not c.variable_rules]
  sharded, = [c for c in result.ranked
              if c.rules == "batch:x" and c.variable_rules]
  assert sharded.variable_rules == "hidden:x;io:x"
  assert sharded.peak_bytes < plain.peak_bytes
  # The variables' own rules, when given, are used for every candidate.
  fixed = search.search([graph], "x:8", "tpuv3", variable_rules="io:x")
  assert {c.variable_rules for c in fixed.ranked} == {"io:x"}


def test_memory_cap():
  """Candidates over the cap rank after those under it, smallest first;
  with none under it there is no best."""
  graph = _graph()
  free = search.search([graph], "r:2;c:4", "tpuv3", memory_cap=0)
  peaks = sorted(c.peak_bytes for c in free.ranked)
  cap = peaks[len(peaks) // 2]
  capped = search.search([graph], "r:2;c:4", "tpuv3", memory_cap=cap)
  fits = [c for c in capped.ranked if c.fits]
  assert fits and all(c.peak_bytes <= cap for c in fits)
  assert capped.ranked[:len(fits)] == fits
  rest = capped.ranked[len(fits):]
  assert rest and [c.peak_bytes for c in rest] == sorted(
      c.peak_bytes for c in rest)
  assert search.search([graph], "r:2;c:4", "tpuv3",
                       memory_cap=1).best is None
