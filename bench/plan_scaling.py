r"""How planning time grows with repeated layers: GSPMD Table 2's dense
512B row (gspmd_dense.py:table2_512B_32x64, 256 layers, 2D finalized,
bfloat16 activations as bench/papers.py plans it) on the estimate path
(plan(trace=False), what bench/papers.py and --layout=auto run), at 8 and
64 layers and at its own 256.

Each measurement is one fresh process (no cache carried over): the
seconds (wall and CPU) of building the symbolic training graph, of
plan() (layout completion, fused kernels, accounting, estimated
collectives) and of summary() (the fused kernels' time, the timeline),
and every number of the summary, so that two trees' plans can be checked
equal. With --trees the cases run in turn in each tree (a checkout of
another commit) per round: an interleaved A/B on a shared machine.

  python bench/plan_scaling.py                          # this tree
  python bench/plan_scaling.py --paths=full,counted     # and counted
  python bench/plan_scaling.py --row=tiny --paths=full,counted \
      --cases=8_layers,64_layers,256_layers
  git archive main | tar -x -C /tmp/base && \
    python bench/plan_scaling.py --trees=before=/tmp/base,after=. --rounds=2

One JSON object per measurement ({"bench": "plan_scaling", ...}); with
several trees or paths, one {"kind": "numbers"} object per case saying
whether every tree and path planned the same numbers (floats to 1e-9).
--paths=counted plans as --mode=plan does (plan_mode.plan_report): where
the layers are identical and every number affine in the depth, four small
plans counted (meshtf/plan/repeated.py); otherwise all layers, with the
reason in "how". Its "total_s" (and the full path's) is graph building,
plan and summary together.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ROW = "table2_512B_32x64"
# name -> layers (None: the row's own 256)
CASES = {"8_layers": 8, "64_layers": 64, "512B_32x64": None,
         "256_layers": 256}
DEFAULT_CASES = ("8_layers", "64_layers", "512B_32x64")
# The summary's numbers a plan is compared by (bench/papers.py prints
# these and what derives from them).
NUMBERS = ("step_seconds", "compute_seconds", "collective_seconds",
           "exposed_collective_seconds", "flops_per_device",
           "flops_by_family", "memory_bytes_per_device",
           "collective_bytes_per_device", "collectives_by_kind",
           "collectives", "fits_in_memory", "flops_utilization")


def one(tree, layers, path="full", row=ROW):
  """The timings and numbers of one plan of the row (in this process).
  path "counted": plan_mode.plan_report, which counts identical layers
  from small plans where it can (meshtf/plan/repeated.py) and plans all
  of them otherwise; its "how" says which."""
  sys.path.insert(0, tree)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from meshtf.plan import report as report_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import experiment  # pylint: disable=g-import-not-at-top
  config = config_lib.load_file(
      os.path.join(tree, "t2t_configs", "gspmd_dense.py"), row)
  config.activation_dtype = "bfloat16"   # bench/papers.py's GSPMD_DENSE
  config.plan_hardware = "tpuv3"         # (the tiny row's is cpu)
  if layers:
    config.num_layers = layers
  layout = config_lib.mesh_layout(config)
  out = {"layers": config.num_layers, "path": path}
  if path == "counted":
    return dict(out, **_counted(config, layout))
  clocks = [(time.time(), time.process_time())]

  def lap(name):
    clocks.append((time.time(), time.process_time()))
    (w0, c0), (w1, c1) = clocks[-2:]
    out[name + "_s"], out[name + "_cpu_s"] = round(w1 - w0, 2), round(
        c1 - c0, 2)

  graph, _ = experiment.build_training_graph(config, layout)
  lap("build")
  report = report_lib.plan(graph, layout, config.plan_hardware, trace=False)
  lap("plan")
  summary = report.summary()
  lap("summary")
  out["operations"] = len(graph.operations)
  out["plan_total_s"] = round(out["plan_s"] + out["summary_s"], 2)
  out["plan_total_cpu_s"] = round(out["plan_cpu_s"] + out["summary_cpu_s"],
                                  2)
  out["total_s"] = round(out["build_s"] + out["plan_total_s"], 2)
  out["total_cpu_s"] = round(out["build_cpu_s"] + out["plan_total_cpu_s"],
                             2)
  out["numbers"] = {k: summary[k] for k in NUMBERS}
  return out


def _counted(config, layout):
  """The counted path's timings (graph builds included: the small ones,
  or the full one where it falls back) and numbers."""
  from meshtf.train import experiment  # pylint: disable=g-import-not-at-top
  from meshtf.train import plan_mode  # pylint: disable=g-import-not-at-top
  w0, c0 = time.time(), time.process_time()
  exp = experiment.Experiment(config, layout)
  report, depth = plan_mode.plan_report(config, layout, exp)
  summary = report.summary()
  samples = getattr(report, "samples", None)
  return {"how": depth["how"],
          "operations": (sum(len(r.operations) for r in samples) if samples
                         else len(exp.training_graph()[0].operations)),
          "total_s": round(time.time() - w0, 2),
          "total_cpu_s": round(time.process_time() - c0, 2),
          "numbers": {k: summary[k] for k in NUMBERS}}


def measure(tree, layers, path="full", row=ROW):
  """one() in a fresh process started from `tree`."""
  env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--one", "--tree=" + tree,
       "--layers=%d" % (layers or 0), "--path=" + path, "--row=" + row],
      cwd=tree, env=env, capture_output=True, text=True)
  if proc.returncode:
    return {"rc": proc.returncode,
            "error": proc.stderr.strip().splitlines()[-1:]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--trees", default="this=" + ROOT,
                      help="LABEL=DIR,...: the trees to plan in, in turn")
  parser.add_argument("--cases", default=",".join(DEFAULT_CASES),
                      help="comma-separated: " + ", ".join(CASES))
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--paths", default="full",
                      help="comma-separated: full (build, plan and "
                      "summary of every layer), counted (plan_mode."
                      "plan_report: identical layers counted from small "
                      "plans where exact)")
  parser.add_argument("--row", default=ROW,
                      help="the gspmd_dense.py row (tiny: the 2-D model "
                      "scaled down)")
  parser.add_argument("--path", default="full",
                      help="(internal) with --one")
  parser.add_argument("--one", action="store_true",
                      help="(internal) plan once in this process")
  parser.add_argument("--tree", default=ROOT)
  parser.add_argument("--layers", type=int, default=0)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(one(args.tree, args.layers, args.path, args.row)))
    return
  trees = [t.split("=", 1) for t in args.trees.split(",")]
  cases = args.cases.split(",")
  paths = args.paths.split(",")
  numbers = {}
  for r in range(args.rounds):
    for case in cases:
      for label, tree in trees:
        for path in paths:
          m = measure(os.path.abspath(tree), CASES[case], path, args.row)
          plan_numbers = m.pop("numbers", None)
          numbers.setdefault(case, {})[label + "/" + path] = plan_numbers
          print(json.dumps(dict({"bench": "plan_scaling", "kind": "run",
                                 "case": case, "row": args.row,
                                 "tree": label, "round": r}, **m)),
                flush=True)
  if len(trees) * len(paths) > 1:
    for case, by_tree in numbers.items():
      print(json.dumps({"bench": "plan_scaling", "kind": "numbers",
                        "case": case, "row": args.row,
                        "trees": list(by_tree),
                        "equal": _equal(list(by_tree.values())),
                        "step_seconds": {t: v and v["step_seconds"]
                                         for t, v in by_tree.items()}}))


def _equal(plans, rel=1e-9):
  """Whether the plans' numbers are equal (floats to rel: a counted plan
  adds the increments in another order than a full one)."""
  def same(a, b):
    if isinstance(a, dict):
      return (isinstance(b, dict) and list(a) == list(b) and
              all(same(a[k], b[k]) for k in a))
    if isinstance(a, list):
      return (isinstance(b, list) and len(a) == len(b) and
              all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, float) and isinstance(b, float):
      return abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b
  return all(p is not None for p in plans) and all(
      same(plans[0], p) for p in plans[1:])


if __name__ == "__main__":
  main()
