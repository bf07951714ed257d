r"""Tokens/s and model-flops utilisation (MFU) of a Transformer LM training
step (forward, backward, optimizer update: mtf.training.TrainStep on the
SPMD backend) on GPUs: 1 GPU, then all GPUs data-parallel and with a
data + model parallel layout, each with the chosen XLA modes.

MFU = model flops per step / step time / (peak bf16 flops per GPU * GPUs),
model flops per step = 6 * params_matmul * tokens
                       + 12 * num_layers * num_heads * d_kv * length * tokens
(PaLM's count: fwd + bwd of every weight matmul, plus attention's q.k and
weights.v; the causal mask's skipped half is counted, as there;
params_matmul = the weights of matmuls: attention, feed-forward, logits --
not the input and position embeddings, which are lookups). Peak bf16
dense flops per GPU come from the table below by device name; another GPU
needs --peak_tflops.

Defaults (one 80 GB GPU, compute-bound matmuls): d_model 2048, 12 layers
(attention + feed-forward each), 16 heads of 128, d_ff 8192, length 1024,
vocab 32768, batch 8 sequences per GPU (so every layout does the same work
per GPU), bfloat16 activations with float32 variables, Adafactor. All runs'
variables live at once (runs are interleaved): lower --num_layers or
--batch if they do not fit.

Runs are built once (first step = trace + XLA compile, reported), then
--rounds rounds of --steps steps each, the runs' order rotating every round;
one JSON line per run (median, min, max seconds per step over the rounds,
tokens/s, flops, MFU and its config), a "skip" line for a run TF 2.21
cannot do (e.g. jit_compile=program with a model-parallel layout) or that
failed (TF may then abort later collectives of the process: rerun with
fewer --layouts / --jit_compile modes), and a summary line.

Usage:
  python bench/gpu_step.py [--jit_compile=program,segments] \
      [--communication_hint=nccl] [--layouts=1,data,model] [--steps=10]
  python bench/gpu_step.py --cpu_smoke     # tiny sizes on 2 virtual CPUs
                                           # (XLA modes off,program)

Measured once on one H100 80GB (bench/results/h100_2026-11-26.jsonl, the
README's table): with --jit_compile=program 42.1% MFU at the defaults,
52.2% at --d_model=4096 --d_ff=16384 --num_heads=32 --num_layers=8
--batch=16; 15.1% without XLA.
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

from meshtf.layouts import presets  # noqa: E402

# Dense bf16 peak flops per GPU (vendor datasheets, without sparsity),
# matched in order against the device name TensorFlow reports.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),      # SXM
    ("A100", 312e12),
)
FLOPS_FORMULA = ("6 * params_matmul * tokens + 12 * num_layers * num_heads"
                 " * d_kv * length * tokens")
SIZE_KEYS = ("vocab", "d_model", "num_layers", "num_heads", "d_kv", "d_ff",
             "length", "batch")
GPU_SIZES = dict(vocab=32768, d_model=2048, num_layers=12, num_heads=16,
                 d_kv=128, d_ff=8192, length=1024, batch=8)
SMOKE_SIZES = dict(vocab=64, d_model=32, num_layers=1, num_heads=4, d_kv=8,
                   d_ff=64, length=16, batch=2)
JIT_MODES = ("program", "segments", "off")
LAYOUTS = ("1", "data", "model")
SMOKE_DEVICES = 2
SMOKE_PEAK_FLOPS = 1e12   # nominal: a CPU smoke run's MFU means nothing


def peak_flops_for(device_name):
  """Dense bf16 peak flops of one GPU named device_name, or None.

  Example:
    >>> peak_flops_for("NVIDIA H100 80GB HBM3")
    989000000000000.0
  """
  for key, flops in PEAK_BF16_FLOPS:
    if key.lower() in device_name.lower():
      return flops
  return None


def matmul_params(s):
  """Weights that take part in matmuls: per layer q, k, v, o and the two
  feed-forward kernels; the (unshared) logits kernel."""
  d, h = s["d_model"], s["num_heads"] * s["d_kv"]
  return s["num_layers"] * (4 * d * h + 2 * d * s["d_ff"]) + d * s["vocab"]


def model_flops_per_step(s, tokens):
  """The model flops of one training step (FLOPS_FORMULA).

  Example:
    >>> model_flops_per_step(SMOKE_SIZES, 32) == 6 * matmul_params(
    ...     SMOKE_SIZES) * 32 + 12 * 1 * 4 * 8 * 16 * 32
    True
  """
  return (6 * matmul_params(s) * tokens + 12 * s["num_layers"] *
          s["num_heads"] * s["d_kv"] * s["length"] * tokens)


def fail(message):
  """One line on stderr, exit status 1."""
  print(message, file=sys.stderr, flush=True)
  sys.exit(1)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cpu_smoke", action="store_true",
                 help="tiny sizes on %d virtual CPU devices" % SMOKE_DEVICES)
  for key in SIZE_KEYS:
    p.add_argument("--" + key, type=int, default=None,
                   help="default %d (GPU), %d (--cpu_smoke)%s" % (
                       GPU_SIZES[key], SMOKE_SIZES[key],
                       "; sequences per device" if key == "batch" else ""))
  p.add_argument("--jit_compile", default=None,
                 help="comma-separated XLA modes: program, segments, off "
                      "(default program,segments; --cpu_smoke: off,program)")
  p.add_argument("--communication_hint", default="",
                 help="collectives' hint: nccl, ring, auto ('' = from the "
                      "devices: nccl on GPUs)")
  p.add_argument("--layouts", default="1,data,model",
                 help="1 (one device), data (data-parallel over all "
                      "devices), model (data:N/M;model:M)")
  p.add_argument("--model_parallel", type=int, default=2,
                 help="M, the model axis of the 'model' layout")
  p.add_argument("--activation_dtype", default="bfloat16",
                 choices=["bfloat16", "float32"])
  p.add_argument("--optimizer", default="adafactor",
                 choices=["adafactor", "adam", "sgd"])
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--warmup", type=int, default=2,
                 help="untimed steps after the first")
  p.add_argument("--peak_tflops", type=float, default=None,
                 help="peak bf16 TFLOP/s per device (needed for a GPU the "
                      "table lacks)")
  p.add_argument("--max_devices", type=int, default=0,
                 help="use at most this many devices (0: all)")
  args = p.parse_args(argv)
  base = SMOKE_SIZES if args.cpu_smoke else GPU_SIZES
  args.sizes = {k: getattr(args, k) if getattr(args, k) is not None
                else base[k] for k in SIZE_KEYS}
  for key, value in args.sizes.items():
    if value < 1:
      fail("--%s=%d: must be a positive integer" % (key, value))
  if args.jit_compile is None:
    args.jit_compile = "off,program" if args.cpu_smoke else "program,segments"
  args.jit_modes = [m for m in args.jit_compile.split(",") if m]
  for m in args.jit_modes:
    if m not in JIT_MODES:
      fail("--jit_compile=%s: %r is not one of %s (comma-separated)" % (
          args.jit_compile, m, ", ".join(JIT_MODES)))
  if not args.jit_modes:
    fail("--jit_compile is empty: pass e.g. --jit_compile=program,off")
  args.layout_names = [l for l in args.layouts.split(",") if l]
  for l in args.layout_names:
    if l not in LAYOUTS:
      fail("--layouts=%s: %r is not one of %s (comma-separated)" % (
          args.layouts, l, ", ".join(LAYOUTS)))
  if args.communication_hint not in ("", "auto", "ring", "nccl"):
    fail("--communication_hint=%s: use nccl, ring, auto or '' (from the "
         "devices)" % args.communication_hint)
  for key in ("steps", "rounds", "model_parallel"):
    if getattr(args, key) < 1:
      fail("--%s=%d: must be >= 1" % (key, getattr(args, key)))
  if args.warmup < 0 or args.max_devices < 0:
    fail("--warmup / --max_devices must be >= 0")
  if args.peak_tflops is not None and args.peak_tflops <= 0:
    fail("--peak_tflops=%g: must be > 0 (TFLOP/s per device, e.g. 989 for "
         "an H100 SXM)" % args.peak_tflops)
  return args


def find_devices(args):
  """(device names, device kind, peak flops per device, peak source);
  exits with one line when there is no GPU (and no --cpu_smoke) or the
  GPU's peak is unknown."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if args.cpu_smoke:
    import meshtf as mtf  # pylint: disable=g-import-not-at-top
    names = mtf.virtual_cpu_devices(SMOKE_DEVICES)
    peak = (args.peak_tflops * 1e12 if args.peak_tflops else
            SMOKE_PEAK_FLOPS)
    return names, "cpu (smoke)", peak, (
        "--peak_tflops" if args.peak_tflops else "nominal (cpu_smoke)")
  gpus = tf.config.list_physical_devices("GPU")
  if not gpus:
    fail("bench/gpu_step.py: no GPU visible to TensorFlow "
         "(tf.config.list_physical_devices('GPU') is empty); run it on a GPU "
         "machine, or pass --cpu_smoke for a tiny run on CPU devices")
  # Blocked collectives must not starve the inter-op pool (DESIGN.md).
  tf.config.threading.set_inter_op_parallelism_threads(
      max(16, 4 * len(gpus)))
  kind = tf.config.experimental.get_device_details(gpus[0]).get(
      "device_name", "unknown GPU")
  if args.peak_tflops:
    peak, source = args.peak_tflops * 1e12, "--peak_tflops"
  else:
    peak, source = peak_flops_for(kind), "table"
    if peak is None:
      fail("bench/gpu_step.py: no peak bf16 flops known for GPU %r: pass "
           "--peak_tflops=<dense bf16 TFLOP/s per GPU>" % kind)
  names = [d.name for d in tf.config.list_logical_devices("GPU")]
  return names, kind, peak, source


def plan_runs(args, devices):
  """[(name, mesh_shape, layout, devices, jit)] for the requested layouts
  and XLA modes; layouts needing more devices than there are are left
  out."""
  n = min(len(devices), args.max_devices or len(devices))
  m = args.model_parallel
  shapes = {"1": ("all:1", "", devices[:1])}
  if n > 1:
    shapes["data"] = ("all:%d" % n, "batch:all", devices[:n])
    if n % m == 0 and m > 1:
      shapes["model"] = ("data:%d;model:%d" % (n // m, m),
                         presets.STANDARD,
                         devices[:n])
  return [("%s/%s" % (l, jit), shapes[l][0], shapes[l][1], shapes[l][2], jit)
          for l in args.layout_names if l in shapes for jit in args.jit_modes]


def build_step(args, mesh_shape, layout, devices, jit):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.models import dtypes  # pylint: disable=g-import-not-at-top
  from meshtf.models import optimize  # pylint: disable=g-import-not-at-top
  from meshtf.models import transformer  # pylint: disable=g-import-not-at-top
  s = args.sizes
  lm = transformer.make_unitransformer(
      vocab_size=s["vocab"], d_model=s["d_model"],
      num_layers=s["num_layers"], num_heads=s["num_heads"], d_kv=s["d_kv"],
      d_ff=s["d_ff"], max_length=s["length"], vocab_divisor=1)
  vdt = dtypes.VariableDType(tf.float32, tf.float32,
                             tf.as_dtype(args.activation_dtype))
  impl = mtf.SimdMeshImpl(mesh_shape, layout, devices)
  opt = {"adafactor": lambda: optimize.AdafactorOptimizer(),
         "adam": lambda: optimize.AdamWeightDecayOptimizer(
             1e-4, bias_correction=True),
         "sgd": lambda: optimize.SgdOptimizer(1e-3)}[args.optimizer]()
  return mtf.training.TrainStep(
      transformer.loss_fn(lm, variable_dtype=vdt), impl, opt,
      jit_compile=False if jit == "off" else jit,
      communication_hint=args.communication_hint or None)


def skip(name, mesh_shape, layout, jit, error):
  """The JSON line of a run that could not be measured, and why (the
  error's first line)."""
  reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
  print(json.dumps(dict(bench="gpu_step", kind="skip", run=name,
                        mesh_shape=mesh_shape, layout=layout,
                        jit_compile=jit, reason=reason)), flush=True)


def main(argv=None):
  args = parse_args(argv)
  devices, kind, peak, peak_source = find_devices(args)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from meshtf.lowering import simd_collectives  # noqa: E402
  s = args.sizes
  planned = plan_runs(args, devices)
  # One set of token ids; each run takes its first rows (runs of the same
  # batch then start from the same loss, whatever their layout or mode).
  all_ids = np.random.RandomState(0).randint(1, s["vocab"], size=[
      s["batch"] * max([len(p[3]) for p in planned] or [1]),
      s["length"]]).astype(np.int32)
  runs, steps, first = [], [], []
  for name, mesh_shape, layout, devs, jit in planned:
    batch = s["batch"] * len(devs)   # the same work per device
    ids = all_ids[:batch]
    step = build_step(args, mesh_shape, layout, devs, jit)
    t0 = time.perf_counter()
    try:
      loss = float(step({"targets": ids})["loss"])
      for _ in range(args.warmup):
        step({"targets": ids})
    except (ValueError, tf.errors.OpError) as e:
      # ValueError: a mode TF 2.21 cannot compile here (refused when traced);
      # OpError: TF failed it while compiling or running.
      skip(name, mesh_shape, layout, jit, e)
      continue
    first.append((loss, time.perf_counter() - t0))
    runs.append((name, mesh_shape, layout, devs, jit, batch, ids))
    steps.append(step)
  times = [[] for _ in runs]
  failed = set()
  for r in range(args.rounds):
    order = list(range(len(runs)))
    for i in order[r % len(runs):] + order[:r % len(runs)] if runs else []:
      if i in failed:
        continue
      name, mesh_shape, layout, _, jit, _, ids = runs[i]
      t0 = time.perf_counter()
      try:
        for _ in range(args.steps):
          out = steps[i]({"targets": ids})
        float(out["loss"])   # waits for the last step
      except tf.errors.OpError as e:
        skip(name, mesh_shape, layout, jit, e)
        failed.add(i)
        continue
      times[i].append((time.perf_counter() - t0) / args.steps)
  summary = {}
  for i, ((name, mesh_shape, layout, devs, jit, batch, _), step, t, (
      loss, first_s)) in enumerate(zip(runs, steps, times, first)):
    if i in failed:
      continue
    median = statistics.median(t)
    tokens = batch * s["length"]
    flops = model_flops_per_step(s, tokens)
    params_total = int(sum(np.prod(v.outputs[0].shape.to_integer_list)
                           for v in step.graph.trainable_variables))
    mfu = flops / median / (peak * len(devs))
    summary[name] = round(mfu, 4)
    print(json.dumps(dict(
        bench="gpu_step", kind="run", run=name, devices=len(devs),
        device_kind=kind, mesh_shape=mesh_shape, layout=layout,
        jit_compile=jit,
        communication_hint=(args.communication_hint or
                            simd_collectives.default_communication_hint(devs)),
        activation_dtype=args.activation_dtype, optimizer=args.optimizer,
        sizes=s, batch=batch, tokens_per_step=tokens,
        params_total=params_total, params_matmul=matmul_params(s),
        flops_per_step=flops, flops_formula=FLOPS_FORMULA,
        peak_flops_per_device=peak, peak_source=peak_source,
        step_s=median, min_s=min(t), max_s=max(t), all_s=t,
        tokens_per_s=tokens / median, mfu=mfu, first_step_s=first_s,
        first_loss=loss, steps=args.steps, rounds=args.rounds,
        tf_version=tf.__version__, host=platform.node())), flush=True)
  print(json.dumps(dict(bench="gpu_step", kind="summary", device_kind=kind,
                        devices=len(devices), mfu=summary)), flush=True)


if __name__ == "__main__":
  main()
