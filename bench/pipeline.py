r"""Pipeline parallelism (GSPMD 3.3): step time and bubble fraction of a
small Transformer LM (8 blocks) trained with SGD on 8 virtual CPUs, with
2 and 4 pipeline stages, plain and circular (2 repeats), the stage dim on
mesh axis `pipe` and data parallelism on `data` (mesh pipe:S;data:8/S,
layout stage:pipe;batch:data); and the same model unpipelined, data
parallel on data:8, for reference.

Per configuration, one JSON object with:
  step_ms: the best mean step time (forward, backward, update) over
    `repeats` runs of `steps` steps, at num_microbatches = 2S (8 rows a
    microbatch);
  bubble_fraction_analytic: idle (stage, iteration) slots of the schedule,
    (S - 1) / (M*R + S - 1);
  bubble_fraction_measured: the step time the bubble iterations take, from
    two runs with M = S and M = 2S microbatches of the same size: a
    least-squares line step_ms = a + c * iterations gives the time of one
    iteration c, and (iterations - M*R) * c / step_ms is the share of the
    step spent on them (on 2 cores the "idle" stages compute on padding,
    so the bubble costs time like any iteration; the rest of the step --
    embedding, loss, update -- is outside the pipeline, so this share is
    below the analytic fraction of the pipeline loop);
  first_step_s: trace + lowering + first run; first_loss (equal across
    runs of the same batch: the pipelined weights start as the
    unpipelined ones).

Usage: python bench/pipeline.py [--steps=5] [--repeats=3]
"""
import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

import meshtf as mtf  # noqa: E402
from meshtf.models import pipeline  # noqa: E402
from meshtf.models import transformer  # noqa: E402

N = 8
MICROBATCH_ROWS = 8
SIZES = dict(length=16, vocab=64, d_model=32, num_layers=8, num_heads=4,
             d_kv=8, d_ff=128)
RUNS = [(2, 1), (2, 2), (4, 1), (4, 2)]   # (stages, circular repeats)


def make_lm(stages=1, micro=1, repeats=1):
  return transformer.make_unitransformer(
      vocab_size=SIZES["vocab"], d_model=SIZES["d_model"],
      num_layers=SIZES["num_layers"], num_heads=SIZES["num_heads"],
      d_kv=SIZES["d_kv"], d_ff=SIZES["d_ff"], max_length=SIZES["length"],
      vocab_divisor=1, pipeline_stages=stages, num_microbatches=micro,
      circular_repeats=repeats)


def measure(lm, mesh_shape, layout, batch_rows, devices, steps, repeats):
  """(best step seconds, first step seconds, first loss)."""
  impl = mtf.SimdMeshImpl(mesh_shape, layout, devices)
  step = mtf.training.TrainStep(transformer.loss_fn(lm), impl,
                                mtf.optimize.SgdOptimizer(0.01))
  rs = np.random.RandomState(0)
  batch = {"targets": rs.randint(2, SIZES["vocab"], size=[
      batch_rows, SIZES["length"]]).astype(np.int32)}
  t0 = time.time()
  first_loss = float(step(batch)["loss"])
  first_s = time.time() - t0
  times = []
  for _ in range(repeats):
    t0 = time.time()
    for _ in range(steps):
      out = step(batch)
    float(out["loss"])
    times.append((time.time() - t0) / steps)
  return min(times), first_s, first_loss


def record(**fields):
  fields.update(bench="pipeline", sizes=SIZES, backend="simd",
                host=platform.node(), cpus=os.cpu_count())
  print(json.dumps(fields), flush=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  devices = mtf.virtual_cpu_devices(N)
  for stages, repeats in RUNS:
    mesh_shape = "pipe:%d;data:%d" % (stages, N // stages)
    layout = "stage:pipe;batch:data"
    points = {}
    for micro in (stages, 2 * stages):
      best, first_s, loss = measure(
          make_lm(stages, micro, repeats), mesh_shape, layout,
          micro * MICROBATCH_ROWS, devices, args.steps, args.repeats)
      points[micro] = (pipeline.Schedule(stages, micro, repeats), best,
                       first_s, loss)
    # step = a + c * iterations through the two points.
    (s1, t1, _, _), (s2, t2, first_s, loss) = points[stages], points[
        2 * stages]
    per_iteration = (t2 - t1) / (s2.num_iterations - s1.num_iterations)
    micro = 2 * stages
    bubble_iterations = s2.num_iterations - micro * repeats
    record(stages=stages, circular_repeats=repeats, num_microbatches=micro,
           microbatch_rows=MICROBATCH_ROWS, mesh_shape=mesh_shape,
           layout=layout, iterations=s2.num_iterations,
           step_ms=round(t2 * 1e3, 2),
           step_ms_at_m_equal_s=round(t1 * 1e3, 2),
           iteration_ms=round(per_iteration * 1e3, 2),
           bubble_fraction_analytic=round(s2.bubble_fraction, 4),
           bubble_fraction_measured=round(
               bubble_iterations * per_iteration / t2, 4),
           first_step_s=round(first_s, 2), first_loss=round(loss, 6),
           steps=args.steps, repeats=args.repeats)
  # The unpipelined model at the 4-stage runs' batch (64 rows).
  best, first_s, loss = measure(make_lm(), "data:%d" % N, "batch:data",
                                2 * 4 * MICROBATCH_ROWS, devices, args.steps,
                                args.repeats)
  record(stages=1, circular_repeats=1, num_microbatches=1,
         mesh_shape="data:%d" % N, layout="batch:data",
         step_ms=round(best * 1e3, 2), bubble_fraction_analytic=0.0,
         first_step_s=round(first_s, 2), first_loss=round(loss, 6),
         steps=args.steps, repeats=args.repeats)


if __name__ == "__main__":
  main()
