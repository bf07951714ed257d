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
  git archive main | tar -x -C /tmp/base && \
    python bench/plan_scaling.py --trees=before=/tmp/base,after=. --rounds=2

One JSON object per measurement ({"bench": "plan_scaling", ...}); with
several trees, one {"kind": "numbers"} object per case saying whether
every tree planned the same numbers.
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
CASES = {"8_layers": 8, "64_layers": 64, "512B_32x64": None}
# The summary's numbers a plan is compared by (bench/papers.py prints
# these and what derives from them).
NUMBERS = ("step_seconds", "compute_seconds", "collective_seconds",
           "exposed_collective_seconds", "flops_per_device",
           "flops_by_family", "memory_bytes_per_device",
           "collective_bytes_per_device", "collectives_by_kind",
           "collectives", "fits_in_memory", "flops_utilization")


def one(tree, layers):
  """The timings and numbers of one plan of the row (in this process)."""
  sys.path.insert(0, tree)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from meshtf.plan import report as report_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import experiment  # pylint: disable=g-import-not-at-top
  config = config_lib.load_file(
      os.path.join(tree, "t2t_configs", "gspmd_dense.py"), ROW)
  config.activation_dtype = "bfloat16"   # bench/papers.py's GSPMD_DENSE
  if layers:
    config.num_layers = layers
  layout = config_lib.mesh_layout(config)
  out = {"layers": config.num_layers}
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
  out["numbers"] = {k: summary[k] for k in NUMBERS}
  return out


def measure(tree, layers):
  """one() in a fresh process started from `tree`."""
  env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--one", "--tree=" + tree,
       "--layers=%d" % (layers or 0)], cwd=tree, env=env,
      capture_output=True, text=True)
  if proc.returncode:
    return {"rc": proc.returncode,
            "error": proc.stderr.strip().splitlines()[-1:]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--trees", default="this=" + ROOT,
                      help="LABEL=DIR,...: the trees to plan in, in turn")
  parser.add_argument("--cases", default=",".join(CASES),
                      help="comma-separated: " + ", ".join(CASES))
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--one", action="store_true",
                      help="(internal) plan once in this process")
  parser.add_argument("--tree", default=ROOT)
  parser.add_argument("--layers", type=int, default=0)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(one(args.tree, args.layers)))
    return
  trees = [t.split("=", 1) for t in args.trees.split(",")]
  cases = args.cases.split(",")
  numbers = {}
  for r in range(args.rounds):
    for case in cases:
      for label, tree in trees:
        m = measure(os.path.abspath(tree), CASES[case])
        plan_numbers = m.pop("numbers", None)
        numbers.setdefault(case, {})[label] = plan_numbers
        print(json.dumps(dict({"bench": "plan_scaling", "kind": "run",
                               "case": case, "row": ROW, "tree": label,
                               "round": r}, **m)), flush=True)
  if len(trees) > 1:
    for case, by_tree in numbers.items():
      values = [json.dumps(v, sort_keys=True) for v in by_tree.values()]
      print(json.dumps({"bench": "plan_scaling", "kind": "numbers",
                        "case": case, "trees": list(by_tree),
                        "equal": len(set(values)) == 1,
                        "step_seconds": {t: v and v["step_seconds"]
                                         for t, v in by_tree.items()}}))


if __name__ == "__main__":
  main()
