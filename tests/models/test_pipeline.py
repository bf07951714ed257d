"""Pipeline parallelism as sharding (meshtf/models/pipeline.py).

The schedule (plain and circular) is checked against its definition; the
vectorised pipeline of a small residual MLP gives the layers applied in
order (one device), and the same numbers on a mesh with the stage dim
split (the shift a collective permute) on both backends; stacked
variables start as the unpipelined layers' variables.
"""
import numpy as np
import pytest

import harness
import meshtf as mtf
from meshtf.models import pipeline

NUM_LAYERS = 4


# --- the schedule -------------------------------------------------------------
@pytest.mark.parametrize("stages,micro,repeats", [
    (2, 4, 1), (4, 2, 1), (2, 4, 2), (4, 8, 2), (3, 4, 2), (4, 2, 3)])
def test_schedule_runs_every_chunk_once_in_order(stages, micro, repeats):
  """Each (microbatch, chunk) exactly once; chunk c + 1 of a microbatch
  the iteration after chunk c (so the shift by one stage delivers it)."""
  s = pipeline.Schedule(stages, micro, repeats)
  when = {}
  for t in range(s.num_iterations):
    for st in range(stages):
      slot = s.slot(t, st)
      if slot is not None:
        m, r = slot
        key = (m, r * stages + st)
        assert key not in when, (key, t)
        when[key] = t
  chunks = stages * repeats
  assert sorted(when) == [(m, c) for m in range(micro) for c in range(chunks)]
  for m in range(micro):
    for c in range(chunks - 1):
      assert when[(m, c + 1)] == when[(m, c)] + 1
  assert s.num_iterations == max(when.values()) + 1
  if repeats == 1 or micro % stages == 0:
    assert s.num_iterations == micro * repeats + stages - 1
    assert s.bubble_fraction == pytest.approx(
        (stages - 1) / (micro * repeats + stages - 1))


def test_schedule_tables_and_bubble_fractions():
  assert pipeline.Schedule(2, 3).table() == [
      ["m0", "-"], ["m1", "m0"], ["m2", "m1"], ["-", "m2"]]
  assert pipeline.Schedule(2, 2, 2).table() == [
      ["m0.r0", "-"], ["m1.r0", "m0.r0"], ["m0.r1", "m1.r0"],
      ["m1.r1", "m0.r1"], ["-", "m1.r1"]]
  assert pipeline.bubble_fraction(4, 4) == pytest.approx(3 / 7)
  assert pipeline.bubble_fraction(4, 4, 2) == pytest.approx(3 / 11)
  assert pipeline.bubble_fraction(1, 4) == 0.0


def test_bad_pipeline_arguments_raise_one_clear_line():
  with pytest.raises(ValueError, match=r"stages=0 must be a positive"):
    pipeline.Schedule(0, 4)
  with pytest.raises(ValueError, match=r"num_microbatches=2\.5"):
    pipeline.Schedule(2, 2.5)
  with pytest.raises(ValueError, match=r"batch size 6 is not divisible by "
                     r"num_microbatches=4: use a batch size that is a "
                     r"multiple of 4"):
    pipeline.check_batch(mtf.Dimension("batch", 6), 4)


# --- the vectorised loop on a residual MLP ------------------------------------
def _layer(mesh, h, name):
  w = mtf.get_variable(mesh, name, "io:4;io2:4",
                       initializer=mtf.random_normal_initializer())
  y = mtf.einsum([h, w], output_shape=mtf.Shape(
      [d for d in h.shape.dims if d.name != "io"] + [mtf.Dimension("io2", 4)]))
  return h + mtf.tanh(mtf.rename_dimension(y, "io2", "io"))


def _sequential(mesh, x):
  h = x["x"]
  for i in range(NUM_LAYERS):
    h = _layer(mesh, h, "layer_%d/w" % i)
  return {"y": h}


def _pipelined(stages, micro, repeats):
  per_chunk = NUM_LAYERS // (stages * repeats)

  def model(mesh, x):
    def stage_fn(h, carried):
      for k in range(per_chunk):
        h = _layer(mesh, h, "pipe/w%d" % k)
      return h
    return {"y": pipeline.pipeline(
        stage_fn, x["x"], stages, micro, repeats,
        original_name=lambda name, c: "layer_%d/w" % (
            c * per_chunk + int(name[len("pipe/w"):])))}
  return model


X = harness.random_array([8, 4], 0)
INPUTS = {"x": (X, "batch:8;io:4")}


@pytest.mark.parametrize("stages,micro,repeats", [(2, 4, 1), (2, 2, 2),
                                                  (4, 2, 1)])
def test_pipeline_equals_the_layers_in_order_on_one_device(stages, micro,
                                                           repeats):
  """Outputs and input gradients equal; each stacked weight's [s, r]
  gradient is its layer's gradient."""
  seq = harness.run_model(_sequential, INPUTS, "all:1", "", wrt=["x"])
  pipe = harness.run_model(_pipelined(stages, micro, repeats), INPUTS,
                           "all:1", "", wrt=["x"])
  np.testing.assert_allclose(pipe.outputs["y"], seq.outputs["y"], 1e-6, 1e-6)
  np.testing.assert_allclose(pipe.grads["x"], seq.grads["x"], 1e-5, 1e-5)
  per_chunk = NUM_LAYERS // (stages * repeats)
  for k in range(per_chunk):
    g = pipe.grads["pipe/w%d" % k]
    assert g.shape == ((stages, repeats, 4, 4) if repeats > 1
                       else (stages, 4, 4))
    for s in range(stages):
      for r in range(repeats):
        layer = (r * stages + s) * per_chunk + k
        np.testing.assert_allclose(
            g[s, r] if repeats > 1 else g[s],
            seq.grads["layer_%d/w" % layer], 1e-5, 1e-5)


def test_pipeline_is_layout_invariant_and_shifts_by_collective_permute():
  """Stage over one axis, batch over the other (uneven: 2 rows a
  microbatch on 4 processors); both backends."""
  runs = harness.assert_layout_invariant(
      _pipelined(2, 4, 1), INPUTS,
      [("pipe:2;data:4", "stage:pipe;batch:data")], wrt=["x"])
  for (backend, mesh_shape, _), run in runs.items():
    kinds = {s["kind"] for s in run.lowering.collective_stats()}
    assert "permute" in kinds, (backend, mesh_shape, kinds)


def test_custom_getter_wraps_get_variable_and_nests():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  seen = []

  def outer(base, mesh_, name, shape, **kwargs):
    seen.append("outer " + name)
    return base(mesh_, name + "_o", shape, **kwargs)

  def inner(base, mesh_, name, shape, **kwargs):
    seen.append("inner " + name)
    return base(mesh_, name + "_i", shape, **kwargs) * 2.0
  with mtf.custom_getter(outer):
    with mtf.custom_getter(inner):
      w = mtf.get_variable(mesh, "w", "io:4")
    v = mtf.get_variable(mesh, "v", "io:4")
  u = mtf.get_variable(mesh, "u", "io:4")
  assert seen == ["inner w", "outer w_i", "outer v"]
  assert [x.name for x in graph.trainable_variables] == ["w_i_o", "v_o", "u"]
  assert w.shape == v.shape == u.shape
