"""One worker of the multi-worker test (run as a script, not collected).

Usage: python multi_worker_main.py TASK PORT0,PORT1 STEPS
Joins a 2-worker cluster on 127.0.0.1 with 4 virtual CPUs per worker,
trains the two-layer network on one 8-device mesh with per-host input, and
prints one JSON line: losses, the gathered weights (one by one and all at
once, VariableStore.full_values) and the input rows read.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import numpy as np  # noqa: E402

import meshtf as mtf  # noqa: E402
from meshtf.examples import two_layer  # noqa: E402

B, D_IO, D_H = 16, 8, 32


def main():
  task, ports, steps = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
  os.environ["TF_CONFIG"] = mtf.lowering.cluster.tf_config(
      ["127.0.0.1:%s" % p for p in ports], task)
  worker = mtf.start_multi_worker(num_virtual_cpus=4)
  impl = mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
                          worker.devices, collective_timeout_seconds=60)
  x, target = two_layer.make_data(B, D_IO, D_H, seed=1)
  rows_read = set()

  def reader(array):
    def slice_fn(begin, size):
      rows_read.add((begin[0], size[0]))
      return array[begin[0]:begin[0] + size[0], begin[1]:begin[1] + size[1]]
    return slice_fn

  batch, io, hidden = two_layer.dims(B, D_IO, D_H)

  def build(mesh):
    loss, variables, _ = two_layer.two_layer_loss(
        mesh, reader(x), reader(target), batch, io, hidden)
    for var, grad in zip(variables, mtf.gradients([loss], variables)):
      mtf.assign_sub(var, grad * 0.5)
    return loss

  step = mtf.MeshFunction(build, impl)
  losses = [float(step()) for _ in range(steps)]
  w = step.variable_value("w")
  # A checkpoint's gather: one program for all variables, traced at the
  # first call and run again at the second (after one more step).
  first = step.variable_store.full_values()
  losses.append(float(step()))
  again = {k: np.asarray(v).tolist()
           for k, v in step.variable_store.full_values().items()}
  print("RESULT " + json.dumps({
      "task": task, "local": impl.local_pnums(), "losses": losses,
      "w": np.asarray(w).tolist(), "rows_read": sorted(rows_read),
      "all_first_w": np.asarray(first["w"]).tolist(), "all_again": again,
      "w_again": np.asarray(step.variable_value("w")).tolist()}),
        flush=True)


if __name__ == "__main__":
  main()
