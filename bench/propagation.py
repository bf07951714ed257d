r"""Sharding completion on GSPMD's 64B dense Transformer (2D finalized,
bfloat16 activations as the paper): the planned collective bytes per device
of the forward and the backward pass, their total against Figure 7's
minimum (figure_7_records derives it from the figure), the step estimate
on TPU v3 (the report's, and compute + collectives one after another
against the same compute + Figure 7's collectives), the seconds the plan
took, and the seconds layout assignment takes on a small Transformer LM --
one JSON object per measurement.

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


def figure_7_records(config):
  """The collectives of one training step under GSPMD's 2D finalized
  sharding if every Transformer layer sent exactly Figure 7's pattern --
  the minimum the paper draws -- as collective_stats records.

  Derivation (mesh X x Y; batch B, length S, d_model M, d_ff H, heads N,
  d_kv D; L layers, each an attention and a feed-forward sublayer; a the
  activations' bytes per element, w the bytes of the weights as the
  einsums read them -- bfloat16 here, as the model casts them before
  use). Every sublayer reads BSM split [X, _, Y]: a slice of
  e = B/X * S * M/Y elements.
    forward, per sublayer: AG-y of BSM (an allgather over Y: (Y-1) e a
      bytes) and RS-y of its output (a reduce-scatter of the [B/X, S, M]
      partial sums: (Y-1)/Y * Y e a = (Y-1) e a); per weight matrix W
      (W_Q, W_K, W_V, W_O: M N D each; W_in, W_out: M H each), stored
      split over X and Y: AG-x, (X-1) * W/(XY) * w.
    backward, Figure 7 transposed: AG-y of dBSM and RS-y of dBSM per
      sublayer, RS-x of each dW ((X-1)/X * W/Y * w = (X-1) W/(XY) w);
      the forward's gathered weights and BSM are reused.
  So a step sends 2 L [4 (Y-1) e a + (X-1)/(XY) (4 M N D + 2 M H) w]
  bytes per device: 74.6 GB for 64B_16x32 (bfloat16).

  Example:
    >>> sum(r["bytes_per_device"] * r["count"]
    ...     for r in figure_7_records(config)) / 1e9
    74.6...
  """
  x, y = [int(p.split(":")[1]) for p in config.mesh_shape.split(";")]
  a = 2 if config.activation_dtype == "bfloat16" else 4
  w = a   # the einsums read the weights in the activations' dtype
  layers = config.num_layers
  e = (config.batch_size // x) * config.length * (config.d_model // y)
  weights = ([config.d_model * config.num_heads * config.d_kv] * 4 +
             [config.d_model * config.d_ff] * 2)
  out = []

  def record(kind, axis, group, elements, nbytes, count):
    out.append({"kind": kind, "mesh_axes": [axis], "group_size": group,
                "elements_per_device": elements, "bytes_per_device": nbytes,
                "count": count})
  # Per sublayer (2 per layer), forward and backward.
  record("allconcat", "y", y, e, (y - 1) * e * a, 2 * 2 * layers)
  record("reduce_scatter", "y", y, y * e, (y - 1) * e * a, 2 * 2 * layers)
  for size in weights:
    record("allconcat", "x", x, size // (x * y),
           (x - 1) * size // (x * y) * w, layers)
    record("reduce_scatter", "x", x, size // y,
           (x - 1) * size // (x * y) * w, layers)
  return out


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
  t0, c0 = time.time(), time.process_time()
  report = report_lib.plan(graph, layout, config.plan_hardware, trace=False)
  t_plan, c_plan = time.time() - t0, time.process_time() - c0
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
  minimum = figure_7_records(config)
  minimum_bytes = sum(r["bytes_per_device"] * r["count"] for r in minimum)
  from meshtf.plan import hardware as hardware_lib
  mesh = layout.mesh_shape
  # The same compute with Figure 7's traffic, the collectives one after
  # another (their positions in the step, which the overlapped timeline
  # needs, exist only for the planned ones): compared with the planned
  # step's serial sum.
  minimum_step = (s["compute_seconds"] + sum(
      r["count"] * hardware_lib.collective_seconds(report.hardware, mesh, r)
      for r in minimum))
  serial_step = s["compute_seconds"] + s["collective_seconds"]
  return {"row": row, "activation_dtype": "bfloat16",
          "figure_7_bytes": minimum_bytes,
          "total_over_figure_7": round(
              s["collective_bytes_per_device"] / minimum_bytes, 4),
          "serial_step_seconds": round(serial_step, 3),
          "figure_7_serial_step_seconds": round(minimum_step, 3),
          "step_over_figure_7": round(serial_step / minimum_step, 4),
          "forward_bytes": fwd, "backward_bytes": bwd,
          "total_bytes": s["collective_bytes_per_device"],
          "backward_over_forward": round(bwd / fwd, 3) if fwd else None,
          "by_kind": {k: v["bytes"] for k, v in
                      sorted(s["collectives_by_kind"].items())},
          "step_seconds": round(s["step_seconds"], 3),
          "compute_seconds": round(s["compute_seconds"], 3),
          "collective_seconds": round(s["collective_seconds"], 3),
          "build_seconds": round(t_build, 2),
          "memory_bytes_per_device": s["memory_bytes_per_device"],
          "plan_seconds": round(t_plan, 2),
          "plan_cpu_seconds": round(c_plan, 2)}


def assign_seconds(tree, repeats=5):
  """Seconds MeshLayout.assign takes on the Transformer LM's training
  graph (lm_tiny: without annotations, and with its activations annotated
  batch:data) and on gspmd_dense.py's tiny row (2D finalized on x:2;y:4),
  best of `repeats`, wall and CPU."""
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  out = []
  for name in ("lm_tiny", "lm_tiny_annotated", "gspmd_tiny"):
    if name == "gspmd_tiny":
      config = _load(os.path.join(tree, "t2t_configs",
                                  "gspmd_dense.py")).get_config("tiny")
    else:
      config = _load(os.path.join(tree, "t2t_configs",
                                  "lm_tiny.py")).get_config()
      if name == "lm_tiny_annotated":   # GSPMD-style: the batch over data
        config.activation_layout = "batch:data"
    layout = config_lib.mesh_layout(config)
    graph, _ = experiment.build_training_graph(config, layout)
    ops = list(lowering_lib.all_operations(graph.operations))
    best = best_cpu = None
    for _ in range(repeats):
      t0, c0 = time.time(), time.process_time()
      layout.assign(ops)
      dt, dc = time.time() - t0, time.process_time() - c0
      best = dt if best is None else min(best, dt)
      best_cpu = dc if best_cpu is None else min(best_cpu, dc)
    out.append({"measure": "assign_seconds", "config": name,
                "operations": len(ops), "seconds": round(best, 4),
                "cpu_seconds": round(best_cpu, 4)})
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
