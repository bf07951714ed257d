r"""The plan report against runs on 8 virtual CPUs: predicted per-device peak
bytes vs TensorFlow's allocator, and the predicted step-time ranking of
several layouts of lm_tiny and moe_tiny vs the measured one (Spearman).

Per (config, layout), one JSON object: predicted and measured step time
(median of --steps steps after a warm-up, simd backend) and memory:

  predicted_peak_bytes_per_device: the plan's peak (parameters, optimizer
    state, and the traced program under TF's executor:
    plan/program_memory.py), beside predicted_peak_sequential (the
    meshtf graph's liveness in graph order, the plan's model before);
  measured_peak_bytes_per_device: the allocator's peak during a step,
    less what it held before this run's variables were created, divided
    by the devices (one allocator serves every virtual device): the
    median of --memory_steps steps, with their min and max;
    measured_held_bytes_per_device: what it held between steps (variables,
    the programs' constants) on the same footing.

The CPU allocator is TF's BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=true,
set here before TensorFlow starts): TF 2.21's default CPU allocator counts
only allocations of 256 KiB or more. BFC's peak counts whole blocks (it
may hand out a block up to twice the request rather than split it).

--attribute profiles one more step (TF's profiler records every
allocation with the TF op that made it; the SPMD lowering puts each
meshtf op's TF ops in a name scope of its name): at the allocator's peak,
the bytes requested by each meshtf op's allocations still live, on the
device holding most, beside the plan's own list (memory_model.at_peak),
and the step's peak of requested bytes per device
(measured_step_requested_per_device: the allocations the step made,
without the allocator's block rounding), to compare with
predicted_step_bytes_per_device (the executor's activation peak and the
program's inputs) and measured_step_bytes_per_device (the allocator's
peak less what it held); measured_requested_peak_per_device (what it
held plus the step's requested peak: the live bytes the runtime asked
for, without the block rounding of the step's allocations) and
requested_ratio (that over the predicted peak), beside the allocator's
peak and peak_ratio.

A last object per config gives the Spearman rank correlation of predicted
vs measured step times and the range of the memory ratios.

--remat=none,full runs every layout with each rematerialization policy
(meshtf/models/remat.py; config.remat) and adds, per layout, how the
measured peak and the plan's changed from the first policy to each other
one ("remat_peak_change": measured and predicted).

Usage: python bench/plan_validation.py [--steps=5] [--memory_steps=5]
    [--configs=lm_tiny,moe_tiny] [--layouts=0,3] [--attribute]
    [--one_op_at_a_time] [--remat=none,full]
"""
import argparse
import collections
import gc
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every allocation counted in the allocator's peak (see the docstring).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import meshtf as mtf  # noqa: E402
import meshtf.plan  # noqa: E402,F401
from meshtf.layouts import presets  # noqa: E402
from meshtf.models import training  # noqa: E402
from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import experiment  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
WIDE = dict(d_model=128, d_ff=512, d_kv=32, vocab_size=512, batch_size=32,
            length=32)
LAYOUTS = {  # config: [(mesh_shape, layout, variable_layout)]
    "lm_tiny": [
        ("data:8", presets.DATA_PARALLEL, ""),
        ("data:8", presets.DATA_PARALLEL, "d_model:data"),
        ("data:4;model:2", presets.STANDARD, ""),
        ("data:2;model:4", presets.STANDARD, ""),
        ("model:8", presets.model_parallel(), ""),
        ("data:2;model:4", "batch:data;d_model:model", ""),
        ("data:4;model:2", "batch:data+model", ""),
    ],
    "moe_tiny": [
        ("data:8", presets.expert_parallel(), ""),
        ("data:8", presets.expert_parallel(), "experts:data;d_model:data"),
        ("data:4;model:2", presets.MOE_STANDARD, ""),
        ("data:2;model:4", presets.MOE_STANDARD, ""),
        ("data:8", "batch:data;group:data", ""),
        ("model:8", "heads:model;d_ff:model;vocab:model;expert_hidden:model",
         ""),
    ],
}


def load_config(name, mesh_shape, layout, variable_layout, remat="none"):
  c = config_lib.load_file(os.path.join(CONFIGS, name + ".py"))
  c.mesh_shape, c.layout, c.variable_layout = mesh_shape, layout, \
      variable_layout
  c.remat = remat
  c.dropout_rate = 0.0
  for key, value in WIDE.items():
    c[key] = value
  if c.moe.num_experts:
    c.moe.num_experts, c.moe.hidden_size = 8, WIDE["d_ff"]
  return c


def _allocator_peaks(step_fn, batch, steps, baseline, n):
  """Per-device allocator peaks of `steps` steps (see the docstring)."""
  peaks = []
  for _ in range(steps):
    tf.config.experimental.reset_memory_stats("CPU:0")
    float(step_fn(batch)["loss"])
    peaks.append((tf.config.experimental.get_memory_info("CPU:0")["peak"] -
                  baseline) / n)
  return peaks


def _allocation_events(logdir):
  """(time, "alloc" / "free", stats) of every allocation in a profile."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                   recursive=True)[0]
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  kinds = {"MemoryAllocation": "alloc", "MemoryDeallocation": "free"}
  events = []
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    for line in plane.lines:
      for e in line.events:
        kind = kinds.get(names.get(e.metadata_id))
        if kind is None:
          continue
        stats = {}
        for st in e.stats:
          which = st.WhichOneof("value")
          value = getattr(st, which) if which else None
          if which == "ref_value":
            value = plane.stat_metadata[st.ref_value].name
          stats[stat_names[st.metadata_id]] = value
        events.append((line.timestamp_ns * 1000 + e.offset_ps, kind, stats))
  events.sort(key=lambda e: e[0])
  return events


def attribute(step_fn, batch, top=10):
  """Profiles one step; at the allocator's peak, the requested bytes still
  live by (device's call op, meshtf op scope). Returns {"device": the
  call op holding most, "at_peak": [[scope, bytes]], "requested_peak":
  the peak of requested bytes, all devices}."""
  logdir = tempfile.mkdtemp(prefix="plan_validation_")
  try:
    tf.profiler.experimental.start(logdir)
    float(step_fn(batch)["loss"])
    tf.profiler.experimental.stop()
    events = _allocation_events(logdir)
  finally:
    shutil.rmtree(logdir, ignore_errors=True)
  live, at_peak, peak, requested, requested_peak = {}, {}, -1, 0, 0
  for _, kind, st in events:
    if kind == "alloc":
      live[st["addr"]] = st
      requested += st.get("requested_bytes", 0)
    else:
      gone = live.pop(st["addr"], None)
      if gone:
        requested -= gone.get("requested_bytes", 0)
    requested_peak = max(requested_peak, requested)
    if st["bytes_allocated"] > peak:
      peak, at_peak = st["bytes_allocated"], dict(live)
  by_device = collections.defaultdict(collections.Counter)
  for st in at_peak.values():
    match = re.match(r"(StatefulPartitionedCall[_0-9]*)/([^/]+)/",
                     st.get("tf_op") or "")
    if match:
      scope = re.sub(r"^allreduce_buckets_\d+$", "allreduce_buckets",
                     match.group(2))
      by_device[match.group(1)][scope] += st["requested_bytes"]
  if not by_device:
    return {"device": None, "at_peak": [], "requested_peak": requested_peak}
  device = max(by_device, key=lambda d: sum(by_device[d].values()))
  return {"device": device, "requested_peak": requested_peak,
          "at_peak": [list(kv) for kv in by_device[device].most_common(top)]}


def measure(name, mesh_shape, layout, variable_layout, devices, steps,
            memory_steps=5, threads=None, profile=False, remat="none"):
  # What earlier runs left in the allocator (their variables live until
  # the collector frees them) is not this run's: measured from here.
  gc.collect()
  baseline = tf.config.experimental.get_memory_info("CPU:0")["current"]
  c = load_config(name, mesh_shape, layout, variable_layout, remat)
  mesh_layout = config_lib.mesh_layout(c)
  n = mesh_layout.size
  graph, _ = experiment.build_training_graph(c, mesh_layout)
  report = mtf.plan.plan(graph, mesh_layout, "cpu", executor_threads=threads)
  predicted = report.summary()
  sink = experiment.MoeMetrics()
  step_fn = training.TrainStep(
      experiment.loss_fn(experiment.build_model(c, sink, mesh_layout), sink),
      mtf.SimdMeshImpl(mesh_layout, None, devices),
      experiment.make_optimizer(c), clip_gradient_norm=c.clip_gradient_norm)
  rs = np.random.RandomState(0)
  shape = [c.batch_size, c.length]
  batch = {"targets": rs.randint(2, c.vocab_size, size=shape).astype(np.int32),
           "targets_weights": np.ones(shape, np.float32),
           "targets_segmentation": np.ones(shape, np.int32),
           "targets_position": np.tile(np.arange(c.length, dtype=np.int32),
                                       [c.batch_size, 1])}
  float(step_fn(batch)["loss"])   # trace, create, run
  float(step_fn(batch)["loss"])
  held = (tf.config.experimental.get_memory_info("CPU:0")["current"] -
          baseline) / n
  peaks = _allocator_peaks(step_fn, batch, memory_steps, baseline, n)
  peak = float(np.median(peaks))
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    float(step_fn(batch)["loss"])
    times.append(time.perf_counter() - t0)
  memory = predicted["memory_bytes_per_device"]
  row = {"bench": "plan_validation", "config": name, "mesh": mesh_shape,
         "layout": layout, "variable_layout": variable_layout,
         "remat": remat,
         "predicted_step_s": round(predicted["step_seconds"], 5),
         "measured_step_s": round(float(np.median(times)), 5),
         "measured_step_spread_s": round(float(np.ptp(times)), 5),
         "predicted_peak_bytes_per_device": int(memory["peak"]),
         "predicted_peak_sequential": int(memory["peak_sequential"]),
         "memory_model": predicted["memory_model"]["kind"],
         "executor_threads": predicted["memory_model"].get("threads"),
         "measured_peak_bytes_per_device": int(peak),
         "measured_peak_min_max": [int(min(peaks)), int(max(peaks))],
         "measured_held_bytes_per_device": int(held),
         "predicted_held": int(memory["parameters"] +
                               memory["optimizer_state"] +
                               memory.get("program_constants", 0)),
         # What the step adds to what is held: measured at the allocator's
         # peak (its blocks); predicted, the executor's activation peak and
         # the program's inputs.
         "measured_step_bytes_per_device": int(peak - held),
         "predicted_step_bytes_per_device": int(
             memory.get("activations_peak_executor",
                        memory["activations_peak"]) +
             memory.get("program_inputs", 0)),
         "peak_ratio": round(peak / memory["peak"], 3),
         "peak_ratio_sequential": round(peak / memory["peak_sequential"], 3),
         "predicted_collectives": sum(
             r["count"] for r in predicted["collectives"])}
  if profile:
    found = attribute(step_fn, batch)
    # The step's allocations without the allocator's block rounding.
    row["measured_step_requested_per_device"] = int(
        found["requested_peak"] / n)
    # The live bytes the runtime requested at the step's peak: what is held
    # between steps and the step's requested peak; against the prediction,
    # beside peak_ratio (the allocator's peak, its blocks' rounding
    # included).
    requested = held + found["requested_peak"] / n
    row["measured_requested_peak_per_device"] = int(requested)
    row["requested_ratio"] = round(requested / memory["peak"], 3)
    row["measured_at_peak"] = found["at_peak"]
    row["predicted_at_peak"] = predicted["memory_model"].get("at_peak")
  return row


def spearman(a, b):
  ra = np.argsort(np.argsort(a))
  rb = np.argsort(np.argsort(b))
  return float(np.corrcoef(ra, rb)[0, 1])


def _ratios(rows, key):
  values = [r[key] for r in rows]
  return [min(values), max(values)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--memory_steps", type=int, default=5,
                      help="steps whose allocator peaks give the median")
  parser.add_argument("--configs", default=",".join(LAYOUTS),
                      help="comma-separated configs to run")
  parser.add_argument("--layouts", default="",
                      help="comma-separated layout indices (default all)")
  parser.add_argument("--attribute", action="store_true",
                      help="profile a step: the measured live bytes at the "
                      "peak by meshtf op, beside the plan's")
  parser.add_argument(
      "--remat", default="none",
      help="comma-separated rematerialization policies to run each layout "
      "with (none, full, einsum_outputs, weight_einsum_outputs)")
  parser.add_argument(
      "--one_op_at_a_time", action="store_true",
      help="memory only: each config on a 1-device mesh with one inter-op "
      "thread, so TensorFlow runs one op at a time (collectives on 8 "
      "devices need more threads); predicted with one executor thread")
  args = parser.parse_args()
  configs = [c for c in args.configs.split(",") if c]
  chosen = {int(i) for i in args.layouts.split(",") if i}
  policies = [p for p in args.remat.split(",") if p]
  if args.one_op_at_a_time:
    devices = mtf.virtual_cpu_devices(1, inter_op_threads=1)
    tf.zeros([1])
    for name in configs:
      for policy in policies:
        row = measure(name, "all:1", "", "", devices, 1, args.memory_steps,
                      threads=1, profile=args.attribute, remat=policy)
        row["schedule"] = "one op at a time"
        print(json.dumps(row), flush=True)
    return
  devices = mtf.virtual_cpu_devices(8)
  tf.zeros([1])   # see bench/memory.py: allocator statistics on CPU
  for name in configs:
    rows = []
    for i, (mesh_shape, layout, variable_layout) in enumerate(
        LAYOUTS[name]):
      if chosen and i not in chosen:
        continue
      first = None
      for policy in policies:
        row = measure(name, mesh_shape, layout, variable_layout, devices,
                      args.steps, args.memory_steps, profile=args.attribute,
                      remat=policy)
        if first is None:
          first = row
        else:
          # How the peak moved from the first policy: measured vs planned.
          row["remat_peak_change"] = {
              "from": first["remat"],
              "measured": round(row["measured_peak_bytes_per_device"] /
                                first["measured_peak_bytes_per_device"], 3),
              "predicted": round(row["predicted_peak_bytes_per_device"] /
                                 first["predicted_peak_bytes_per_device"],
                                 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({
        "bench": "plan_validation", "config": name, "layouts": len(rows),
        "spearman_step_time": round(spearman(
            [r["predicted_step_s"] for r in rows],
            [r["measured_step_s"] for r in rows]), 3) if len(rows) > 1
        else None,
        "peak_ratio_range": _ratios(rows, "peak_ratio"),
        "requested_ratio_range": _ratios(rows, "requested_ratio")
        if args.attribute and rows else None,
        "peak_ratio_sequential_range": _ratios(
            rows, "peak_ratio_sequential")}), flush=True)


if __name__ == "__main__":
  main()
