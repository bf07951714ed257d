"""Know before you run: what a (mesh, layout) needs per device -- memory,
flops, collectives and an estimated step time on a hardware model --
computed from the graph and its traced per-device program, without devices.

Example:
  >>> report = mtf.plan.plan(graph, mtf.MeshLayout("x:8", "batch:x"), "cpu")
  >>> print(report.text())
  >>> draw_variable_layouts(graph, report.graph_layout, "/tmp/layouts.png")

Importing meshtf.plan loads no TensorFlow: the hardware catalogue and the
pictures are pure Python; `plan` and `PlanReport` trace the per-device
program, so they load meshtf/plan/report.py (and TensorFlow) on first use.
"""
import importlib as _importlib

from meshtf.plan.hardware import HARDWARE
from meshtf.plan.pictures import draw_variable_layouts
from meshtf.plan.visualize import visualize_layout

# name -> the module that defines it, imported on first use (PEP 562).
_LAZY = {"plan": "meshtf.plan.report", "PlanReport": "meshtf.plan.report"}


def __getattr__(name):  # noqa: N807
  if name in _LAZY:
    return getattr(_importlib.import_module(_LAZY[name]), name)
  raise AttributeError("module 'meshtf.plan' has no attribute %r" % name)


__all__ = ["HARDWARE", "PlanReport", "draw_variable_layouts", "plan",
           "visualize_layout"]
