r"""The plan report against runs on 8 virtual CPUs: predicted per-device peak
bytes vs TensorFlow's allocator, and the predicted step-time ranking of
several layouts of lm_tiny and moe_tiny vs the measured one (Spearman).

Per (config, layout), one JSON object: predicted and measured step time
(median of --steps steps after a warm-up, simd backend), predicted peak
bytes per device (parameters + optimizer state + activation peak) and the
allocator's peak during one step, less what it held before the run's
variables were created, divided by the 8 devices (one allocator serves
every virtual device). The CPU allocator is TF's BFC allocator
(TF_CPU_ALLOCATOR_USE_BFC=true, set here before TensorFlow starts): TF
2.21's default CPU allocator counts only allocations of 256 KiB or more.
A last object per config gives the Spearman rank correlation of predicted
vs measured step times.

Usage: python bench/plan_validation.py [--steps=5]
"""
import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every allocation counted in the allocator's peak (see the docstring).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import meshtf as mtf  # noqa: E402
import meshtf.plan  # noqa: E402,F401
from meshtf.models import training  # noqa: E402
from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import experiment  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
WIDE = dict(d_model=128, d_ff=512, d_kv=32, vocab_size=512, batch_size=32,
            length=32)
LAYOUTS = {  # config: [(mesh_shape, layout, variable_layout)]
    "lm_tiny": [
        ("data:8", "batch:data", ""),
        ("data:8", "batch:data", "d_model:data"),
        ("data:4;model:2", "batch:data;heads:model;d_ff:model;vocab:model",
         ""),
        ("data:2;model:4", "batch:data;heads:model;d_ff:model;vocab:model",
         ""),
        ("model:8", "heads:model;d_ff:model;vocab:model", ""),
        ("data:2;model:4", "batch:data;d_model:model", ""),
        ("data:4;model:2", "batch:data+model", ""),
    ],
    "moe_tiny": [
        ("data:8", "batch:data;group:data;experts:data", ""),
        ("data:8", "batch:data;group:data;experts:data",
         "experts:data;d_model:data"),
        ("data:4;model:2", "batch:data;group:data;experts:data;heads:model;"
         "d_ff:model;vocab:model;expert_hidden:model", ""),
        ("data:2;model:4", "batch:data;group:data;experts:data;heads:model;"
         "d_ff:model;vocab:model;expert_hidden:model", ""),
        ("data:8", "batch:data;group:data", ""),
        ("model:8", "heads:model;d_ff:model;vocab:model;expert_hidden:model",
         ""),
    ],
}


def load_config(name, mesh_shape, layout, variable_layout):
  c = config_lib.load_file(os.path.join(CONFIGS, name + ".py"))
  c.mesh_shape, c.layout, c.variable_layout = mesh_shape, layout, \
      variable_layout
  c.dropout_rate = 0.0
  for key, value in WIDE.items():
    c[key] = value
  if c.moe.num_experts:
    c.moe.num_experts, c.moe.hidden_size = 8, WIDE["d_ff"]
  return c


def measure(name, mesh_shape, layout, variable_layout, devices, steps):
  # What earlier runs left in the allocator (their variables live until
  # the collector frees them) is not this run's: measured from here.
  gc.collect()
  baseline = tf.config.experimental.get_memory_info("CPU:0")["current"]
  c = load_config(name, mesh_shape, layout, variable_layout)
  mesh_layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, mesh_layout)
  predicted = mtf.plan.plan(graph, mesh_layout, "cpu").summary()
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
  tf.config.experimental.reset_memory_stats("CPU:0")
  float(step_fn(batch)["loss"])
  peak = (tf.config.experimental.get_memory_info("CPU:0")["peak"] -
          baseline) / len(devices[:mesh_layout.size])
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    float(step_fn(batch)["loss"])
    times.append(time.perf_counter() - t0)
  memory = predicted["memory_bytes_per_device"]
  return {"bench": "plan_validation", "config": name, "mesh": mesh_shape,
          "layout": layout, "variable_layout": variable_layout,
          "predicted_step_s": round(predicted["step_seconds"], 5),
          "measured_step_s": round(float(np.median(times)), 5),
          "measured_step_spread_s": round(float(np.ptp(times)), 5),
          "predicted_peak_bytes_per_device": int(memory["peak"]),
          "measured_peak_bytes_per_device": int(peak),
          "peak_ratio": round(peak / memory["peak"], 3),
          "predicted_collectives": sum(
              r["count"] for r in predicted["collectives"])}


def spearman(a, b):
  ra = np.argsort(np.argsort(a))
  rb = np.argsort(np.argsort(b))
  return float(np.corrcoef(ra, rb)[0, 1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument(
      "--one_op_at_a_time", action="store_true",
      help="memory only: each config on a 1-device mesh with one inter-op "
      "thread, so TensorFlow runs one op at a time as the plan's liveness "
      "assumes (collectives on 8 devices need more threads)")
  args = parser.parse_args()
  if args.one_op_at_a_time:
    devices = mtf.virtual_cpu_devices(1, inter_op_threads=1)
    tf.zeros([1])
    for name in LAYOUTS:
      row = measure(name, "all:1", "", "", devices, 1)
      row["schedule"] = "one op at a time"
      print(json.dumps(row), flush=True)
    return
  devices = mtf.virtual_cpu_devices(8)
  tf.zeros([1])   # see bench/memory.py: allocator statistics on CPU
  for name, layouts in LAYOUTS.items():
    rows = []
    for mesh_shape, layout, variable_layout in layouts:
      row = measure(name, mesh_shape, layout, variable_layout, devices,
                    args.steps)
      rows.append(row)
      print(json.dumps(row), flush=True)
    print(json.dumps({
        "bench": "plan_validation", "config": name, "layouts": len(rows),
        "spearman_step_time": round(spearman(
            [r["predicted_step_s"] for r in rows],
            [r["measured_step_s"] for r in rows]), 3)}), flush=True)


if __name__ == "__main__":
  main()
