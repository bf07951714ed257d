r"""What a user waits for with --mode=plan: the training binary's plan of a
config (python -m meshtf.train --mode=plan), timed as a fresh process from
start to exit, on the papers' configs (the traced plan, its default).

Each measurement is one process: its wall seconds, the CPU seconds it used
(user + system, less noisy than the wall on a shared machine) and the
seconds the binary itself prints ("plan written to ... (X s"), from the end
of the preflight to the files written. With --trees the cases run in turn
in each tree (a checkout of another commit) per round: an interleaved A/B.

  python bench/plan_mode.py                       # each case once
  python bench/plan_mode.py --trees=before=/tmp/main,after=. --rounds=2
  python bench/plan_mode.py --cases=gspmd_64B_16x32 --rounds=3
  python bench/plan_mode.py --phases --rounds=2
      # in this process instead: the CPU seconds of one build of the
      # symbolic training graph and of one completion of its layouts (what
      # each call --mode=plan no longer makes saved; no binary started)

One JSON object per measurement ({"bench": "plan_mode", ...}), then one
summary object per case and tree (median, min, max) with --rounds > 1.
"""
import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# name -> the binary's --config (file:row, relative to the tree).
CASES = {
    "gspmd_64B_16x32": "t2t_configs/gspmd_dense.py:64B_16x32",
    "gshard_2048E_36L": "t2t_configs/gshard_moe.py:2048E_36L",
}
_PRINTED = re.compile(r"plan written to .* \(([0-9.]+) s, nothing run\)")


def measure(tree, config):
  """{"wall_s", "cpu_s", "printed_s", "rc"} of one --mode=plan process of
  `config` run from `tree`."""
  model_dir = tempfile.mkdtemp(prefix="plan_mode_")
  env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2")
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.time()
  proc = subprocess.run(
      [sys.executable, "-m", "meshtf.train", "--config=" + config,
       "--mode=plan", "--model_dir=" + model_dir], cwd=tree, env=env,
      capture_output=True, text=True)
  wall = time.time() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  shutil.rmtree(model_dir, ignore_errors=True)
  printed = _PRINTED.search(proc.stdout)
  return {"wall_s": round(wall, 2),
          "cpu_s": round(after.ru_utime - before.ru_utime +
                         after.ru_stime - before.ru_stime, 2),
          "printed_s": float(printed.group(1)) if printed else None,
          "rc": proc.returncode,
          "error": proc.stderr.strip().splitlines()[-1:]
                   if proc.returncode else None}


def phases(config_spec):
  """{"build_cpu_s", "complete_cpu_s"}: process CPU seconds of one build of
  the config's symbolic training graph (experiment.build_training_graph)
  and of one completion of its layouts (MeshLayout.assign), here."""
  sys.path.insert(0, ROOT)
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  path, row = config_spec.split(":")
  config = config_lib.load_file(os.path.join(ROOT, path), row)
  layout = config_lib.mesh_layout(config)
  t = time.process_time()
  graph, _ = experiment.build_training_graph(config, layout)
  build = time.process_time() - t
  operations = list(lowering_lib.all_operations(graph.operations))
  t = time.process_time()
  layout.assign(operations)
  return {"build_cpu_s": round(build, 3),
          "complete_cpu_s": round(time.process_time() - t, 3),
          "operations": len(operations)}


def _commit(tree):
  try:
    return subprocess.run(["git", "-C", tree, "rev-parse", "--short",
                           "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None   # an exported tree (git archive) has no repository


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--trees", default="this=.",
                      help="label=path,...: the checkouts to compare")
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--phases", action="store_true",
                      help="time one build and one completion in-process")
  args = parser.parse_args()
  if args.phases:
    for r in range(args.rounds):
      for name in args.cases.split(","):
        m = phases(CASES[name])
        m.update(bench="plan_mode", phases=True, case=name, round=r,
                 config=CASES[name], commit=_commit(ROOT),
                 cpus=os.cpu_count(), host=platform.node())
        print(json.dumps(m, sort_keys=True), flush=True)
    return
  trees = [t.split("=", 1) for t in args.trees.split(",")]
  trees = [(label, os.path.abspath(path)) for label, path in trees]
  cases = args.cases.split(",")
  runs = {}
  for r in range(args.rounds):
    for name in cases:
      for label, tree in trees:
        m = measure(tree, CASES[name])
        m.update(bench="plan_mode", case=name, config=CASES[name],
                 tree=label, commit=_commit(tree), round=r,
                 cpus=os.cpu_count(), host=platform.node())
        runs.setdefault((name, label), []).append(m)
        print(json.dumps(m, sort_keys=True), flush=True)
  if args.rounds > 1:
    for (name, label), ms in runs.items():
      out = {"bench": "plan_mode", "summary": True, "case": name,
             "tree": label, "rounds": len(ms)}
      for key in ("wall_s", "cpu_s", "printed_s"):
        values = [m[key] for m in ms if m[key] is not None]
        if values:
          out[key] = {"median": statistics.median(values),
                      "min": min(values), "max": max(values)}
      print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
  main()
