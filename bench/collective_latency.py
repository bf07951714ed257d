r"""Cost of one allreduce on each backend: a chain of dependent allreduces
over every device (x <- x + 1e-3 * sum_over_devices(x), `--chain` times,
so none can overlap another), per allreduce, for each slice size.

Why: every collective the SPMD backend saves (gradient buckets, Adafactor's
fused phases, the loss's fused sums) is worth what one costs. On virtual
CPU devices the SPMD backend runs TF's CollectiveReduceV2 (a ring: 2(n-1)
hops, each handed between threads); placement adds the slices with one
add_n on one device and copies the sum back.

One process; both backends built first, then --rounds timed rounds
alternating between them (order rotated each round), --steps calls per
round. One JSON object per (backend, size): the median wall ms and the
median process CPU ms per allreduce with min and max over the rounds, and
the result's first value (the same on both backends), then a summary with
SPMD over placement per size (wall and CPU medians).

Usage: python bench/collective_latency.py [--devices=8] [--sizes=16,16384] \
         [--chain=20] [--steps=10] [--rounds=7]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

BACKENDS = ("simd", "placement")


def chain_fn(devices, size, chain):
  """build_fn: `chain` dependent sums over the split batch dim."""
  import meshtf as mtf  # pylint: disable=g-import-not-at-top

  def build(mesh, x_tf):
    x = mtf.import_tf_tensor(mesh, x_tf, "batch:%d;d:%d" % (devices, size))
    for _ in range(chain):
      x = x + mtf.reduce_sum(x, output_shape="d:%d" % size) * 1e-3
    return mtf.reduce_sum(x, output_shape="d:%d" % size)
  return build


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--sizes", default="16,16384",
                      help="comma-separated floats per device slice")
  parser.add_argument("--chain", type=int, default=20)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  if not 2 <= args.devices <= 8:
    sys.exit("--devices=%d: use 2..8 (virtual CPU devices)" % args.devices)
  # Imported after the flags are checked: a bad flag gets one line, no TF
  # start-up noise.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  impls = {"simd": mtf.SimdMeshImpl, "placement": mtf.PlacementMeshImpl}
  devices = mtf.virtual_cpu_devices(args.devices)
  sizes = [int(s) for s in args.sizes.split(",")]
  runs = []
  for size in sizes:
    x = tf.constant(np.random.RandomState(size).rand(
        args.devices, size).astype(np.float32))
    for backend in BACKENDS:
      fn = mtf.MeshFunction(chain_fn(args.devices, size, args.chain),
                            impls[backend]("all:%d" % args.devices,
                                           "batch:all", devices))
      first = float(np.asarray(fn(x))[0])
      runs.append(dict(backend=backend, size=size, fn=fn, x=x, first=first,
                       ms=[], cpu_ms=[]))
  for r in range(args.rounds):
    for run in runs[r % len(runs):] + runs[:r % len(runs)]:
      t0, c0 = time.time(), time.process_time()
      for _ in range(args.steps):
        out = run["fn"](run["x"])
      np.asarray(out)
      per = args.steps * args.chain
      run["ms"].append((time.time() - t0) * 1e3 / per)
      # CPU time moves much less than wall time with other jobs' load.
      run["cpu_ms"].append((time.process_time() - c0) * 1e3 / per)
  medians = {}
  for run in runs:
    medians[(run["backend"], run["size"])] = (
        statistics.median(run["ms"]), statistics.median(run["cpu_ms"]))
    print(json.dumps(dict(
        bench="collective_latency", kind="run", backend=run["backend"],
        devices=args.devices, floats_per_device=run["size"],
        chain=args.chain, steps=args.steps, rounds=args.rounds,
        ms_per_allreduce=round(statistics.median(run["ms"]), 4),
        min_ms=round(min(run["ms"]), 4), max_ms=round(max(run["ms"]), 4),
        cpu_ms_per_allreduce=round(statistics.median(run["cpu_ms"]), 4),
        min_cpu_ms=round(min(run["cpu_ms"]), 4),
        max_cpu_ms=round(max(run["cpu_ms"]), 4),
        first_value=run["first"], host=platform.node(),
        cpus=os.cpu_count(), load_avg=os.getloadavg()[0])), flush=True)
  summary = dict(bench="collective_latency", kind="summary")
  for i, clock in enumerate(("", "_cpu")):
    summary["simd_over_placement" + clock] = {
        str(s): round(medians[("simd", s)][i] / medians[("placement", s)][i],
                      3) for s in sizes}
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  main()
