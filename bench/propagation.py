r"""Sharding completion on GSPMD's 64B dense Transformer (2D finalized,
bfloat16 activations as the paper): the planned collective bytes per device
of the forward and the backward pass, their total, the step estimate on
TPU v3, the seconds the plan took, and the seconds layout assignment takes
on a small Transformer LM -- one JSON object per measurement.

Run it on two trees to compare commits (the numbers come from the
estimate path, plan(trace=False), which the search ranks by):

  python bench/propagation.py                       # this tree
  git archive main | tar -x -C /tmp/base && \
    PYTHONPATH=/tmp/base python bench/propagation.py --tree=/tmp/base

The forward is the graph's operations before graph.backward_start, the
backward everything from there (gradients, clipping, the optimizer). A
collective is charged to the operation whose lowering emits it: its
reason's operation where the tree records reasons (layouts/reasons.py),
else the operation the estimate was visiting when it recorded it.

Usage: python bench/propagation.py [--rows=64B_8x16,...] [--tree=DIR]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _setup(tree):
  sys.path.insert(0, tree)
  import meshtf  # noqa: F401
  return meshtf


def _load(path):
  """The config file at path as a fresh module."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _op_charges(estimate, operations):
  """Wraps the estimate so each record is charged to an operation index
  (older trees record no provenance): returns a list the wrapper fills
  with (op index, bytes)."""
  charges = []
  current = [0]
  index = {op: i for i, op in enumerate(operations)}
  original_op = estimate._estimate_op
  recorder = estimate._Recorder
  original_add, original_plan = recorder.add, recorder.add_plan

  def estimate_op(op, *args, **kwargs):
    current[0] = index.get(op, current[0])
    return original_op(op, *args, **kwargs)

  def add(self, kind, mesh_axes, elements, itemsize, *args, **kwargs):
    before = dict(self.counts)
    out = original_add(self, kind, mesh_axes, elements, itemsize, *args,
                       **kwargs)
    _charge(self, before)
    return out

  def add_plan(self, plan, *args, **kwargs):
    before = dict(self.counts)
    out = original_plan(self, plan, *args, **kwargs)
    _charge(self, before)
    return out

  def _charge(self, before):
    for key, n in self.counts.items():
      extra = n - before.get(key, 0)
      if extra:
        charges.append((current[0], key[4] * extra))

  estimate._estimate_op = estimate_op
  recorder.add, recorder.add_plan = add, add_plan
  return charges


def plan_row(config_file, row, tree):
  from meshtf.plan import estimate
  from meshtf.plan import report as report_lib
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  config = _load(config_file).get_config(row)
  config.activation_dtype = "bfloat16"
  layout = config_lib.mesh_layout(config)
  t0 = time.time()
  graph, _ = experiment.build_training_graph(config, layout)
  t_build = time.time() - t0
  operations = list(graph.operations)
  backward = graph.backward_start
  charges = None
  if not hasattr(estimate, "reasons_lib"):   # a tree without provenance
    charges = _op_charges(estimate, operations)
  t0 = time.time()
  report = report_lib.plan(graph, layout, config.plan_hardware, trace=False)
  t_plan = time.time() - t0
  s = report.summary()
  fwd = bwd = 0
  if charges is None:
    position = {op.name: i for i, op in enumerate(operations)}
    for r in report.collectives:
      for reason in r["reasons"]:
        if position.get(reason.op, len(operations)) < backward:
          fwd += r["bytes_per_device"]
        else:
          bwd += r["bytes_per_device"]
  else:
    for i, b in charges:
      if i < backward:
        fwd += b
      else:
        bwd += b
  return {"row": row, "activation_dtype": "bfloat16",
          "forward_bytes": fwd, "backward_bytes": bwd,
          "total_bytes": s["collective_bytes_per_device"],
          "backward_over_forward": round(bwd / fwd, 3) if fwd else None,
          "by_kind": {k: v["bytes"] for k, v in
                      sorted(s["collectives_by_kind"].items())},
          "step_seconds": round(s["step_seconds"], 3),
          "compute_seconds": round(s["compute_seconds"], 3),
          "collective_seconds": round(s["collective_seconds"], 3),
          "build_seconds": round(t_build, 2),
          "plan_seconds": round(t_plan, 2)}


def assign_seconds(tree, repeats=5):
  """Seconds MeshLayout.assign takes on a 2-layer Transformer LM's
  training graph (lm_tiny, annotated with GSPMD's activation layout on
  x:2;y:4), best of `repeats`."""
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  out = []
  for name, annotated in (("lm_tiny", False), ("gspmd_tiny", True)):
    if annotated:
      config = _load(os.path.join(tree, "t2t_configs",
                                  "gspmd_dense.py")).get_config("tiny")
    else:
      config = _load(os.path.join(tree, "t2t_configs",
                                  "lm_tiny.py")).get_config()
    layout = config_lib.mesh_layout(config)
    graph, _ = experiment.build_training_graph(config, layout)
    ops = list(lowering_lib.all_operations(graph.operations))
    best = None
    for _ in range(repeats):
      t0 = time.time()
      layout.assign(ops)
      dt = time.time() - t0
      best = dt if best is None else min(best, dt)
    out.append({"measure": "assign_seconds", "config": name,
                "operations": len(ops), "seconds": round(best, 4)})
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rows", default="64B_8x16,64B_16x32,64B_32x64")
  parser.add_argument("--label", default="")
  parser.add_argument("--tree", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), ".."))
  args = parser.parse_args()
  tree = os.path.abspath(args.tree)
  _setup(tree)
  import subprocess
  try:
    commit = subprocess.check_output(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"],
        stderr=subprocess.DEVNULL).decode().strip()
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  commit = args.label or commit
  config_file = os.path.join(tree, "t2t_configs", "gspmd_dense.py")
  for row in [r for r in args.rows.split(",") if r]:
    result = plan_row(config_file, row, tree)
    result.update(tree=tree, commit=commit)
    print(json.dumps(result, sort_keys=True), flush=True)
  for result in assign_seconds(tree):
    result.update(tree=tree, commit=commit)
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
  main()
