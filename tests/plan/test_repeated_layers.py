"""Planning a stack of identical layers: the plan (estimate path, on TPU v3,
where XLA fuses) asks each distinct question of the layouts once, so the
relayout plans, summed axes and collective prices it computes are as many
for 64 identical layers as for 8, and every number it gives is the one
asking each op's question afresh gives (plan/estimate.py's _Memo,
plan/report.py's timeline prices, plan/fusion.py's union-find found once).
GSPMD's 2D-finalized dense Transformer (gspmd_dense.py:tiny) at 8 and 64
layers."""
import collections
import os

import pytest

from meshtf.lowering import lowering as lowering_lib
from meshtf.plan import estimate
from meshtf.plan import fusion
from meshtf.plan import hardware as hardware_lib
from meshtf.plan import report as report_lib
from meshtf.plan import timeline as timeline_lib
from meshtf.train import config as config_lib
from meshtf.train import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class _AskEachTime(estimate._Memo):  # pylint: disable=protected-access
  """The estimate's questions answered afresh every time (no memo)."""

  def relayout_plan(self, *args):
    self._plans.clear()  # pylint: disable=protected-access
    return super().relayout_plan(*args)

  def summed_axes(self, *args):
    self._axes.clear()  # pylint: disable=protected-access
    return super().summed_axes(*args)


def _plan(layers):
  """(graph, layout, its plan on tpuv3, collectives priced, the estimate's
  answers computed) of gspmd_dense.py:tiny with `layers` layers."""
  config = config_lib.load_file(
      os.path.join(ROOT, "t2t_configs", "gspmd_dense.py"), "tiny")
  config.num_layers = layers
  layout = config_lib.mesh_layout(config)
  graph, _ = experiment.build_training_graph(config, layout)
  priced = collections.Counter()
  price = hardware_lib.collective_seconds

  def counting(hw, mesh_shape, record):
    priced["collectives"] += 1
    return price(hw, mesh_shape, record)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(hardware_lib, "collective_seconds", counting)
    report = report_lib.plan(graph, layout, "tpuv3", trace=False)
    report.summary()
  ops = list(graph.operations)
  memo = estimate._Memo(layout)  # pylint: disable=protected-access
  assert estimate.estimate_collectives(
      ops, report.graph_layout, report_lib.step_outputs(ops),
      memo=memo) == report.collectives
  return graph, layout, report, priced["collectives"], memo.misses


@pytest.fixture(scope="module")
def plans():
  return {n: _plan(n) for n in (8, 64)}


def test_64_identical_layers_ask_what_8_ask(plans):
  g8, _, r8, priced8, answers8 = plans[8]
  g64, _, r64, priced64, answers64 = plans[64]
  assert len(g64.operations) > 6 * len(g8.operations)   # layers repeat
  assert answers8 and priced8
  assert (answers64, priced64) == (answers8, priced8)
  # ... while what they price grows with the layers.
  bytes8, bytes64 = (r.summary()["collective_bytes_per_device"]
                     for r in (r8, r64))
  assert bytes64 > 6 * bytes8


def test_every_number_is_the_one_asked_afresh(plans):
  graph, layout, report, _, _ = plans[64]
  ops = list(graph.operations)
  graph_layout = report.graph_layout
  afresh_events = []
  afresh = estimate.estimate_collectives(
      ops, graph_layout, report_lib.step_outputs(ops),
      timeline=afresh_events, memo=_AskEachTime(layout))
  assert afresh == report.collectives
  assert afresh_events == report.timeline_events
  # The fused kernels' time with a union-find of its own ...
  costs = {c.op: c for c in report.accounting.costs}
  hw = report.hardware
  own = fusion.op_seconds(ops, graph_layout, hw, costs)
  by_op = [own[c.op] for c in report.accounting.costs]
  assert by_op == report.op_seconds()
  # ... and the timeline pricing every collective afresh.
  mesh = layout.mesh_shape
  step = timeline_lib.simulate(
      by_op, afresh_events,
      lambda r: hardware_lib.collective_seconds(hw, mesh, r)).step
  assert step + hw.step_overhead == report.step_seconds()
