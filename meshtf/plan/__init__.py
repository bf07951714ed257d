"""Know before you run: what a (mesh, layout) needs per device -- memory,
flops, collectives and an estimated step time on a hardware model --
computed from the graph and its traced per-device program, without devices.

Example:
  >>> report = mtf.plan.plan(graph, mtf.MeshLayout("x:8", "batch:x"), "cpu")
  >>> print(report.text())
  >>> draw_variable_layouts(graph, report.graph_layout, "/tmp/layouts.png")
"""
from meshtf.plan.hardware import HARDWARE
from meshtf.plan.pictures import draw_variable_layouts
from meshtf.plan.report import PlanReport
from meshtf.plan.report import plan
from meshtf.plan.visualize import visualize_layout
