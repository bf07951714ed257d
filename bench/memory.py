r"""Memory and communication of weight-update sharding (GSPMD 3.2, ZeRO):
lm_tiny and moe_tiny (t2t_configs/) trained with Adam on a data:8 mesh of
8 virtual CPUs, data parallel vs the same with the variables (and so
Adam's slots) stored split over the data axis (MeshLayout variable_rules).

Per run, one JSON object with:
  params_bytes / optimizer_bytes per device: the variables' slices on
    processor 0 (tf.Variable shapes), beside the analytic expectation
    (parameters x 4 bytes: divided by 8 when sharded; data parallel: the
    replicated ones whole, the experts split; Adam: 2 slots each);
  peak_step_bytes_per_device: TensorFlow's CPU allocator peak during one
    step (after warm-up), divided by the 8 devices -- the allocator is one
    per process, and the SPMD devices run the same program. TF 2.21 counts
    only allocations of 256 KiB or more there, so the models are widened
    (WIDE: d_model 256, d_ff 1024, ...) to make the big tensors count;
  collective_bytes_per_device: what each device sends per step (the
    lowering's collective_stats, bytes on ring algorithms), by kind, beside
    the analytic minimum of the gradient traffic: 2 (n-1)/n x parameter
    bytes, as one allreduce (data parallel) or a reduce-scatter of the
    gradients plus an allgather of the weights (sharded); the excess is
    the rest (loss and metric scalars, the MoE alltoalls, any repeat).

Usage: python bench/memory.py [--steps=3]
"""
import argparse
import json
import os
import platform
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import meshtf as mtf  # noqa: E402
from meshtf.layouts import presets  # noqa: E402
from meshtf.models import training  # noqa: E402
from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import experiment  # noqa: E402

N = 8
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
RUNS = {  # config: (layout, variable layout of the sharded run)
    "lm_tiny": (presets.DATA_PARALLEL, "d_model:data"),
    "moe_tiny": (presets.expert_parallel(),
                 "experts:data;d_model:data"),
}


# The tiny configs widened so their large tensors reach the allocator's
# statistics (see the module docstring).
WIDE = dict(d_model=256, d_ff=1024, d_kv=64, vocab_size=1024, batch_size=64,
            length=64)


def load_config(name, layout, variable_layout):
  c = config_lib.load_file(os.path.join(CONFIGS, name + ".py"))
  c.mesh_shape, c.layout = "data:%d" % N, layout
  c.variable_layout = variable_layout
  c.dropout_rate = 0.0
  for key, value in WIDE.items():
    c[key] = value
  if c.moe.num_experts:
    c.moe.num_experts = N    # one expert per device, as GShard
    c.moe.hidden_size = WIDE["d_ff"]
  return c


def slice_bytes(store, names):
  """Bytes of processor 0's slices of the named variables."""
  return sum(store.entry(n).slices[0].shape.num_elements() *
             store.entry(n).dtype.size for n in names)


def measure(name, sharded, devices, steps):
  layout, variable_layout = RUNS[name]
  c = load_config(name, layout, variable_layout if sharded else "")
  mesh_layout = config_lib.mesh_layout(c)
  sink = experiment.MoeMetrics()
  model = experiment.build_model(c, sink, mesh_layout)
  step_fn = training.TrainStep(
      experiment.loss_fn(model, sink),
      mtf.SimdMeshImpl(mesh_layout, None, devices),
      experiment.make_optimizer(c), clip_gradient_norm=c.clip_gradient_norm)
  rs = np.random.RandomState(0)
  shape = [c.batch_size, c.length]
  batch = {"targets": rs.randint(2, c.vocab_size, size=shape).astype(np.int32),
           "targets_weights": np.ones(shape, np.float32),
           "targets_segmentation": np.ones(shape, np.int32),
           "targets_position": np.tile(np.arange(c.length, dtype=np.int32),
                                       [c.batch_size, 1])}
  for _ in range(steps):    # warm-up: trace, create, run
    loss = float(step_fn(batch)["loss"])
  tf.config.experimental.reset_memory_stats("CPU:0")
  step_fn(batch)
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  store = step_fn.variable_store
  graph = step_fn.graph
  trainable = [v.name for v in graph.trainable_variables]
  others = [n for n in store.names() if n not in trainable]
  params = sum(store.entry(n).shape.size for n in trainable)
  # The parameters the data-parallel layout replicates; the others (the
  # experts, split over the data axis) need no gradient sum.
  dp_layout = mtf.MeshLayout(c.mesh_shape, layout)
  replicated = sum(v.shape.size for v in graph.trainable_variables
                   if dp_layout.slice_size(v.shape) == v.shape.size)
  expected = (params if sharded else replicated * N + params - replicated
              ) * 4 // N
  by_kind = {}
  for s in step_fn.mesh_function.lowering.collective_stats():
    by_kind[s["kind"]] = by_kind.get(s["kind"], 0) + (
        s["bytes_per_device"] * s["count"])
  total = sum(by_kind.values())
  minimum = 2.0 * (N - 1) / N * replicated * 4
  # The MoE dispatch and combine are activation traffic, not gradients.
  gradient_traffic = total - by_kind.get("alltoall", 0)
  return {
      "bench": "memory", "config": name, "mesh": c.mesh_shape,
      "layout": c.layout, "variable_layout": c.variable_layout,
      "sharded": sharded, "optimizer": c.optimizer, "parameters": params,
      "params_bytes_per_device": slice_bytes(store, trainable),
      "params_bytes_expected": expected,
      "optimizer_bytes_per_device": slice_bytes(store, others),
      "optimizer_bytes_expected": 2 * expected,
      "peak_step_bytes_per_device": peak // N,
      "collective_bytes_per_device": int(total),
      "collective_bytes_by_kind": {k: int(v) for k, v in sorted(
          by_kind.items())},
      "gradient_bytes_minimum": int(minimum),
      "excess_over_minimum": round(gradient_traffic / minimum - 1.0, 4),
      "loss_after_warmup": round(loss, 6),
      "machine": platform.machine(), "cpus": os.cpu_count()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3)
  args = parser.parse_args()
  devices = mtf.virtual_cpu_devices(N)
  # An eager allocation before the first get_memory_info: TensorFlow's CPU
  # allocator statistics (seen on 2.21) stay at 0 when queried first.
  tf.zeros([1])
  for name in RUNS:
    for sharded in (False, True):
      print(json.dumps(measure(name, sharded, devices, args.steps)),
            flush=True)


if __name__ == "__main__":
  main()
