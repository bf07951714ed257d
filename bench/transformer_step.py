r"""Tokens/s of a small Transformer LM training step (forward, backward,
Adafactor update, under tf.function via mtf.training.TrainStep): 1 device vs
8 virtual CPU devices on each backend, and the same with an MoE layer.

Layouts on rows:2;cols:4: dense LM -> the Mesh-TensorFlow paper's
batch:rows;vocab:cols;d_ff:cols;heads:cols; MoE LM -> data + expert parallel
batch:cols;group:cols;experts:cols;d_ff:rows;heads:rows. Every run of a model
starts from the same weights (layout-invariant initializers); first losses
are printed so they can be compared. Each 8-device run is built once per
--bucket_mb value (TrainStep's gradient bucket cap; 0 = one allreduce per
gradient) and --adafactor value (fused: AdafactorOptimizer's apply_grads,
each phase's reductions over all variables fused; per_variable: the same
updates built one variable at a time, one allreduce per reduction), and
the timed rounds alternate over all runs of a model (order rotated each
round), so before/after are measured in one run. One JSON object per run
(median, min and max over the rounds), then the ratios.

Usage: python bench/transformer_step.py [--steps=10] [--repeats=3] \
         [--bucket_mb=0,1] [--adafactor=fused] [--models=dense,moe]
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

import meshtf as mtf  # noqa: E402
from meshtf.models import moe  # noqa: E402
from meshtf.models import transformer  # noqa: E402

SIZES = dict(batch=16, length=64, vocab=256, d_model=128, num_layers=2,
             num_heads=8, d_kv=16, d_ff=512)
MOE = moe.MoeParams(moe_num_experts=8, moe_group_size=64, moe_hidden_size=256)
LAYOUTS = {
    "dense": "batch:rows;vocab:cols;d_ff:cols;heads:cols",
    "moe": "batch:cols;group:cols;experts:cols;d_ff:rows;heads:rows",
}


def make_lm(kind):
  ffn = None
  if kind == "moe":
    ffn = lambda i: moe.MoeFeedForward(MOE) if i % 2 else None  # noqa: E731
  return transformer.make_unitransformer(
      vocab_size=SIZES["vocab"], d_model=SIZES["d_model"],
      num_layers=SIZES["num_layers"], num_heads=SIZES["num_heads"],
      d_kv=SIZES["d_kv"], d_ff=SIZES["d_ff"], max_length=SIZES["length"],
      vocab_divisor=1, feedforward_layer_fn=ffn)


class PerVariableAdafactor(mtf.optimize.AdafactorOptimizer):
  """Adafactor built one variable at a time (apply_grad per variable): the
  same arithmetic, each reduction its own allreduce."""

  def apply_grads(self, grads, variables, step=None):
    return [op for g, v in zip(grads, variables)
            for op in self.apply_grad(g, v)]


def build(kind, backend, mesh_shape, layout, devices, bucket_mb,
          adafactor="fused"):
  impl_cls = {"placement": mtf.PlacementMeshImpl,
              "simd": mtf.SimdMeshImpl}[backend]
  impl = impl_cls(mesh_shape, layout, devices)
  optimizer = {"fused": mtf.optimize.AdafactorOptimizer,
               "per_variable": PerVariableAdafactor}[adafactor](
                   learning_rate=0.01)
  return mtf.training.TrainStep(transformer.loss_fn(make_lm(kind)), impl,
                                optimizer,
                                bucket_bytes=int(bucket_mb * (1 << 20)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--bucket_mb", default="0,1",
                      help="comma-separated bucket caps in MiB (0: off)")
  parser.add_argument("--adafactor", default="fused",
                      help="comma-separated: fused, per_variable")
  parser.add_argument("--models", default="dense,moe")
  args = parser.parse_args()
  buckets = [float(b) for b in args.bucket_mb.split(",")]
  modes = args.adafactor.split(",")
  devices = mtf.virtual_cpu_devices(8)
  rs = np.random.RandomState(0)
  batch = {"targets": rs.randint(2, SIZES["vocab"], size=[
      SIZES["batch"], SIZES["length"]]).astype(np.int32)}
  tokens = SIZES["batch"] * SIZES["length"]
  for kind in args.models.split(","):
    runs = [("placement", "all:1", "", devices[:1], 0.0, modes[0])]
    runs += [(backend, "rows:2;cols:4", LAYOUTS[kind], devices, mb, mode)
             for backend in ("placement", "simd") for mb in buckets
             for mode in modes]
    steps, first = [], []
    for backend, mesh_shape, layout, devs, mb, mode in runs:
      step = build(kind, backend, mesh_shape, layout, devs, mb, mode)
      t0 = time.time()
      first.append((float(step(batch)["loss"]), time.time() - t0))
      step(batch)
      steps.append(step)
    times = [[] for _ in runs]
    for r in range(args.repeats):
      order = list(range(len(runs)))
      for i in order[r % len(runs):] + order[:r % len(runs)]:
        t0 = time.time()
        for _ in range(args.steps):
          out = steps[i](batch)
        float(out["loss"])
        times[i].append((time.time() - t0) / args.steps)
    tps = []
    for (backend, mesh_shape, layout, _, mb, mode), step, t, (
        loss, compile_s) in \
        zip(runs, steps, times, first):
      median = statistics.median(t)
      tps.append(tokens / median)
      print(json.dumps(dict(
          bench="transformer_step", model=kind, backend=backend,
          mesh_shape=mesh_shape, layout=layout, sizes=SIZES,
          bucket_mb=mb if mesh_shape != "all:1" else None, adafactor=mode,
          moe_experts=MOE.moe_num_experts if kind == "moe" else 0,
          step_ms=round(median * 1e3, 2), min_ms=round(min(t) * 1e3, 2),
          max_ms=round(max(t) * 1e3, 2), tokens_per_s=round(tokens / median),
          collectives_per_step=sum(
              s["count"] for s in step.mesh_function.collective_stats()),
          first_step_s=round(compile_s, 2), first_loss=round(loss, 6),
          steps=args.steps, repeats=args.repeats, host=platform.node(),
          cpus=os.cpu_count())), flush=True)
    print(json.dumps(dict(
        bench="transformer_step", kind="summary", model=kind,
        tokens_per_s_over_1_device={
            "%s/bucket_mb=%g/%s" % (r[0], r[4], r[5]): round(v / tps[0], 3)
            for r, v in zip(runs[1:], tps[1:])})), flush=True)


if __name__ == "__main__":
  main()
