r"""Tokens/s of a small Transformer LM training step (forward, backward,
Adafactor update, under tf.function via mtf.training.TrainStep): 1 device vs
8 virtual CPU devices on each backend, and the same with an MoE layer.

Layouts on rows:2;cols:4: dense LM -> the Mesh-TensorFlow paper's
batch:rows;vocab:cols;d_ff:cols;heads:cols; MoE LM -> data + expert parallel
batch:cols;group:cols;experts:cols;d_ff:rows;heads:rows. Every run of a model
starts from the same weights (layout-invariant initializers); first losses
are printed so they can be compared. One JSON object per measurement.

Usage: python bench/transformer_step.py [--steps=10] [--repeats=3]
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


def measure(kind, backend, mesh_shape, layout, devices, steps, repeats):
  impl_cls = {"placement": mtf.PlacementMeshImpl,
              "simd": mtf.SimdMeshImpl}[backend]
  impl = impl_cls(mesh_shape, layout, devices)
  step = mtf.training.TrainStep(transformer.loss_fn(make_lm(kind)), impl,
                                mtf.optimize.AdafactorOptimizer(0.01))
  rs = np.random.RandomState(0)
  batch = {"targets": rs.randint(2, SIZES["vocab"], size=[
      SIZES["batch"], SIZES["length"]]).astype(np.int32)}
  t0 = time.time()
  first_loss = float(step(batch)["loss"])
  compile_s = time.time() - t0
  times = []
  for _ in range(repeats):
    t0 = time.time()
    for _ in range(steps):
      out = step(batch)
    float(out["loss"])
    times.append((time.time() - t0) / steps)
  best = min(times)
  tokens = SIZES["batch"] * SIZES["length"]
  return dict(bench="transformer_step", model=kind, backend=backend,
              mesh_shape=mesh_shape, layout=layout, sizes=SIZES,
              moe_experts=MOE.moe_num_experts if kind == "moe" else 0,
              step_ms=round(best * 1e3, 2), tokens_per_s=round(tokens / best),
              first_step_s=round(compile_s, 2),
              first_loss=round(first_loss, 6), steps=steps, repeats=repeats,
              host=platform.node(), cpus=os.cpu_count())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  devices = mtf.virtual_cpu_devices(8)
  for kind in ("dense", "moe"):
    runs = [("placement", "all:1", "", devices[:1]),
            ("placement", "rows:2;cols:4", LAYOUTS[kind], devices),
            ("simd", "rows:2;cols:4", LAYOUTS[kind], devices)]
    for backend, mesh_shape, layout, devs in runs:
      print(json.dumps(measure(kind, backend, mesh_shape, layout, devs,
                               args.steps, args.repeats)), flush=True)


if __name__ == "__main__":
  main()
