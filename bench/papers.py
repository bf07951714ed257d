r"""Every number of the papers' tables and figures that meshtf's plan can
predict, planned from t2t_configs on the plan's estimate path (collectives
estimated from the layouts, plan(trace=False)), without devices.

One JSON object per (row, quantity): the table it comes from ("GSPMD
Table 2"), the row named as in the table, the quantity (step_seconds,
parameters, ...), the paper's value, the plan's, plan / paper, the config
it was planned from, and the seconds the planning took. Rows that need a
model meshtf does not have say so (paper value, plan null, a note).

The hardware is the paper's (tpuv2 for Mesh-TensorFlow, tpuv3 for GShard
and GSPMD: meshtf/plan/hardware, constants from specifications, printed
with their sources by --describe). Nothing here is fitted to these rows.

Usage: python bench/papers.py [--only=gshard_fig9,gspmd_t2] [--describe]
       python bench/papers.py > out.jsonl && \
         python bench/papers.py --table=out.jsonl   # the README's table
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MB = 1 << 20


def _row(table, row, quantity, paper, plan, config="", unit="", note="",
         seconds=None, **extra):
  out = {"bench": "papers", "table": table, "row": row,
         "quantity": quantity, "unit": unit, "paper": paper, "plan": plan,
         "ratio": (plan / paper if plan is not None and paper else None),
         "config": config}
  if note:
    out["note"] = note
  if seconds is not None:
    out["seconds"] = round(seconds, 2)
  out.update(extra)
  return out


def gshard_figure_9():
  """GShard Figure 9: allreduce and alltoall of 8 MB and 32 MB per
  partition from 16 to 2,048 partitions on TPU v3 (the time at 2,048 over
  the time at 16; the paper: allreduce about flat, alltoall ~9x)."""
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
  hw = hardware.get("tpuv3")
  net = hw.interconnect
  rows = []
  for mb in (8, 32):
    times = {}
    for kind in ("allreduce_sum", "alltoall"):
      for n in (16, 2048):
        shape = mtf.convert_to_shape("all:%d" % n)
        times[kind, n] = net.collective_seconds(
            kind, net.place(shape, [0]), mb * MB)
    for kind, paper, note in (
        ("allreduce_sum", 1.0, "'execution time independent from the number"
         " of devices'; done when <= 2x"),
        ("alltoall", 9.0, "'only increases by 9 times'")):
      rows.append(_row(
          "GShard Figure 9", "%s_%dMB" % (kind.split("_")[0], mb),
          "seconds_2048_over_16", paper, times[kind, 2048] / times[kind, 16],
          config="tpuv3 all:16 / all:2048", unit="x", note=note,
          plan_us_16=round(times[kind, 16] * 1e6, 1),
          plan_us_2048=round(times[kind, 2048] * 1e6, 1)))
  return rows


SECTIONS = [
    ("gshard_fig9", gshard_figure_9),
]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="",
                      help="comma-separated section prefixes")
  parser.add_argument("--describe", action="store_true",
                      help="print the hardware models with their sources")
  args = parser.parse_args()
  only = [p for p in args.only.split(",") if p]
  if args.describe:
    from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
    for name in ("tpuv2", "tpuv3"):
      print("\n".join(hardware.get(name).describe()))
    return
  for name, section in SECTIONS:
    if only and not any(name.startswith(p) for p in only):
      continue
    t0 = time.time()
    for row in section():
      row.setdefault("seconds", round(time.time() - t0, 2))
      print(json.dumps(row), flush=True)
      t0 = time.time()


if __name__ == "__main__":
  main()
