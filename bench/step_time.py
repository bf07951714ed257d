r"""Training-step time on 8 virtual CPU devices: simd vs placement vs 1 device,
with gradient bucketing off and on, measured interleaved in one run.

Two models, forward + backward + SGD update, under tf.function:
* the paper's two-layer network (--two_layer=batch,io,hidden; default
  256,256,1024) on two layouts: data-parallel (all:8, batch:all) and 2-D
  (rows:2;cols:4, batch:rows;hidden:cols);
* a small Transformer-like block (self-attention with heads, then a
  relu feed-forward, residuals; batch 32, length 64, d_model 128, heads 8,
  d_kv 16, d_ff 512), layout batch:rows;heads:cols;d_ff:cols.

Each 8-device run is built once per --bucket_mb value (the Lowering's
bucket_bytes: 0 = one allreduce per gradient, else fused buckets of at most
that many MiB); the 1-device run uses the placement backend on one device.
The timed rounds alternate over every run of a model (the order rotates
each round), so the machine's load drifts equally over all of them: one
JSON object per run (median, min, max and all rounds' seconds per step,
collectives per step, first loss), then a summary of the ratios per model.

Usage: python bench/step_time.py [--steps=10] [--repeats=5] \
         [--bucket_mb=0,1] [--models=two_layer,transformer_block]
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
from meshtf.examples import two_layer  # noqa: E402


def two_layer_model(sizes):
  b, d_io, d_h = sizes
  batch, io, hidden = two_layer.dims(b, d_io, d_h)
  x, target = two_layer.make_data(b, d_io, d_h, seed=0)
  return (dict(batch=b, d_io=d_io, d_hidden=d_h),
          two_layer.sgd_step_builder(batch, io, hidden, 0.1), (x, target),
          [("data_parallel", "all:8", "batch:all"),
           ("2d", "rows:2;cols:4", "batch:rows;hidden:cols")])


def transformer_block_model(_):
  sizes = dict(batch=32, length=64, d_model=128, heads=8, d_kv=16, d_ff=512)
  batch = mtf.Dimension("batch", sizes["batch"])
  length = mtf.Dimension("length", sizes["length"])
  memory = mtf.Dimension("memory", sizes["length"])
  d_model = mtf.Dimension("d_model", sizes["d_model"])
  heads = mtf.Dimension("heads", sizes["heads"])
  d_kv = mtf.Dimension("d_kv", sizes["d_kv"])
  d_ff = mtf.Dimension("d_ff", sizes["d_ff"])

  def build(mesh, x_tf, target_tf):
    x = mtf.import_tf_tensor(mesh, x_tf, [batch, length, d_model])
    target = mtf.import_tf_tensor(mesh, target_tf, [batch, length, d_model])
    init = lambda fan: mtf.random_normal_initializer(stddev=fan ** -0.5)
    wq = mtf.get_variable(mesh, "wq", [d_model, heads, d_kv],
                          initializer=init(d_model.size))
    wk = mtf.get_variable(mesh, "wk", [d_model, heads, d_kv],
                          initializer=init(d_model.size))
    wv = mtf.get_variable(mesh, "wv", [d_model, heads, d_kv],
                          initializer=init(d_model.size))
    wo = mtf.get_variable(mesh, "wo", [heads, d_kv, d_model],
                          initializer=init(heads.size * d_kv.size))
    w1 = mtf.get_variable(mesh, "w1", [d_model, d_ff],
                          initializer=init(d_model.size))
    w2 = mtf.get_variable(mesh, "w2", [d_ff, d_model],
                          initializer=init(d_ff.size))
    variables = [wq, wk, wv, wo, w1, w2]
    q = mtf.einsum([x, wq], output_shape=[batch, heads, length, d_kv])
    memory_x = mtf.rename_dimension(x, "length", "memory")
    k = mtf.einsum([memory_x, wk], output_shape=[batch, heads, memory, d_kv])
    v = mtf.einsum([memory_x, wv], output_shape=[batch, heads, memory, d_kv])
    logits = mtf.einsum([q, k], output_shape=[batch, heads, length, memory])
    weights = mtf.softmax(logits * (d_kv.size ** -0.5), memory)
    att = mtf.einsum([weights, v], output_shape=[batch, heads, length, d_kv])
    x = x + mtf.einsum([att, wo], output_shape=[batch, length, d_model])
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, length, d_ff]))
    y = x + mtf.einsum([h, w2], output_shape=[batch, length, d_model])
    loss = mtf.reduce_mean(mtf.square(y - target))
    for var, grad in zip(variables, mtf.gradients([loss], variables)):
      mtf.assign_sub(var, grad * 0.01)
    return loss

  rs = np.random.RandomState(0)
  shape = [sizes["batch"], sizes["length"], sizes["d_model"]]
  x = rs.normal(size=shape).astype(np.float32)
  target = np.tanh(x).astype(np.float32)
  return sizes, build, (x, target), [
      ("2d", "rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols")]


def time_interleaved(steps, inputs, n_steps, repeats):
  """{name: (first loss, [seconds per step of each round])}: every step is
  traced and warmed first, then each round times n_steps of each, in an
  order rotated by one per round."""
  firsts = {}
  for name, step in steps.items():
    firsts[name] = float(step(*inputs))  # trace + variable creation
    for _ in range(3):
      step(*inputs)
  names = list(steps)
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      start = time.perf_counter()
      for _ in range(n_steps):
        loss = steps[name](*inputs)
      float(loss)
      times[name].append((time.perf_counter() - start) / n_steps)
  return {name: (firsts[name], times[name]) for name in names}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--bucket_mb", default="0,1",
                      help="comma-separated bucket caps in MiB (0: off)")
  parser.add_argument("--models", default="two_layer,transformer_block")
  parser.add_argument("--two_layer", default="256,256,1024",
                      help="batch,io,hidden of the two-layer net")
  args = parser.parse_args()
  buckets = [float(b) for b in args.bucket_mb.split(",")]
  devices = mtf.virtual_cpu_devices(8)
  import tensorflow as tf
  common = dict(tf_version=tf.__version__, python=platform.python_version(),
                cpu_count=os.cpu_count(), devices=8, steps=args.steps,
                repeats=args.repeats)
  models = {"two_layer": two_layer_model,
            "transformer_block": transformer_block_model}
  for name in args.models.split(","):
    sizes, build, inputs, layouts = models[name](
        [int(v) for v in args.two_layer.split(",")])
    configs = {"1-device": dict(backend="1-device", mesh="all:1", layout="",
                                bucket_mb=None)}
    impls = {"1-device": mtf.PlacementMeshImpl("all:1", "", devices[:1])}
    for layout_name, mesh, layout in layouts:
      for backend, cls in [("placement", mtf.PlacementMeshImpl),
                           ("simd", mtf.SimdMeshImpl)]:
        for mb in buckets:
          key = "%s/%s/bucket_mb=%g" % (layout_name, backend, mb)
          configs[key] = dict(backend=backend, mesh=mesh, layout=layout,
                              layout_name=layout_name, bucket_mb=mb)
          impls[key] = cls(mesh, layout, devices)
    steps = {key: mtf.MeshFunction(
        build, impls[key], bucket_bytes=int((configs[key]["bucket_mb"] or 0)
                                            * (1 << 20)))
             for key in configs}
    results = time_interleaved(steps, inputs, args.steps, args.repeats)
    medians = {}
    for key, (first, times) in results.items():
      medians[key] = statistics.median(times)
      print(json.dumps(dict(
          common, **configs[key], kind="step", model=name, sizes=sizes,
          step_s=medians[key], min_s=min(times), max_s=max(times),
          all_s=times, first_loss=first, collectives_per_step=sum(
              s["count"] for s in steps[key].collective_stats()))),
            flush=True)
    base = medians["1-device"]
    firsts = [r[0] for r in results.values()]
    ratios = {key + "/over_1_device": m / base for key, m in medians.items()
              if key != "1-device"}
    for layout_name, _, _ in layouts:
      for mb in buckets:
        tag = "%s/%%s/bucket_mb=%g" % (layout_name, mb)
        ratios[tag % "simd_over_placement"] = (medians[tag % "simd"] /
                                               medians[tag % "placement"])
      for backend in ("placement", "simd"):
        if len(buckets) > 1:
          ratios["%s/%s/bucket_mb=%g_over_%g" % (
              layout_name, backend, buckets[-1], buckets[0])] = (
                  medians["%s/%s/bucket_mb=%g" % (layout_name, backend,
                                                  buckets[-1])] /
                  medians["%s/%s/bucket_mb=%g" % (layout_name, backend,
                                                  buckets[0])])
    print(json.dumps(dict(
        common, kind="summary", model=name, sizes=sizes, ratios=ratios,
        first_loss_max_rel_diff=max(abs(f - firsts[0]) / abs(firsts[0])
                                    for f in firsts))), flush=True)


if __name__ == "__main__":
  main()
