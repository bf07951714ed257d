r"""Is TensorFlow's GPU computing the right numbers, and does meshtf give the
same training losses on a GPU as on the CPU, on one device and on a mesh
of logical GPUs? Run before trusting bench/gpu_step.py's timings.

Prints JSON lines:
  kind=env      TF version, build info (CUDA/cuDNN it was built with),
                the GPUs TF sees.
  kind=matmul   relative error ||gpu - ref|| / ||ref|| of a 1024^3 matmul
                against float64 numpy on fresh random inputs: float32 with
                TF32 off (expect < 1e-5), with TF32 on (expect < 2e-3),
                bfloat16 inputs (expect < 1e-2); ok=false past that or NaN.
  kind=losses   a tiny Transformer LM's first --steps training losses
                (float32, TF32 off) on CPU:0, GPU:0 and, with
                --logical_gpus=N, data-parallel and data+model layouts on N
                logical GPUs carved from GPU 0 (ring collectives: NCCL
                refuses two ranks on one GPU); max relative difference to
                CPU:0, ok=false past 1e-4; and the data+model layout with
                bfloat16 activations against one GPU's bfloat16 run
                (ok=false past 2e-2).
  kind=summary  ok = every line above ok.

Usage:
  python bench/gpu_sanity.py [--logical_gpus=2] [--steps=3]
Exit status 1 when a check fails, 2 when there is no GPU.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from meshtf.layouts import presets  # noqa: E402

SIZES = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, d_kv=8,
             d_ff=64, max_length=16)
MATMUL_LIMITS = {"float32": 1e-5, "tf32": 2e-3, "bfloat16": 1e-2}
LOSS_LIMIT = 1e-4
BF16_LOSS_LIMIT = 2e-2
MODEL_LAYOUT = presets.STANDARD


def emit(**fields):
  print(json.dumps(fields), flush=True)
  return fields


def relative_error(got, ref):
  got = np.asarray(got, np.float64)
  return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def check_matmuls(tf, n=1024):
  """One line per precision; a fresh random draw each."""
  rng = np.random.default_rng()
  lines = []
  for mode in ("float32", "tf32", "bfloat16"):
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    tf.config.experimental.enable_tensor_float_32_execution(mode == "tf32")
    with tf.device("/GPU:0"):
      ta, tb = tf.constant(a), tf.constant(b)
      if mode == "bfloat16":
        ta, tb = tf.cast(ta, tf.bfloat16), tf.cast(tb, tf.bfloat16)
        a = np.asarray(ta.numpy().astype(np.float32))
        b = np.asarray(tb.numpy().astype(np.float32))
      got = tf.cast(tf.matmul(ta, tb), tf.float32).numpy()
    err = relative_error(got, a.astype(np.float64) @ b.astype(np.float64))
    lines.append(emit(kind="matmul", precision=mode, n=n, rel_error=err,
                      limit=MATMUL_LIMITS[mode],
                      ok=bool(err < MATMUL_LIMITS[mode])))
  tf.config.experimental.enable_tensor_float_32_execution(False)
  return lines


def compare_losses(name, mesh_shape, layout, limit, ref_name, run):
  """One kind=losses line: run() gives (reference losses, losses); ok when
  their max relative difference is under limit. A run that raises gives
  ok=false and the error's first line."""
  try:
    ref, got = run()
  except Exception as e:  # pylint: disable=broad-except
    return emit(kind="losses", run=name, ok=False,
                error=str(e).strip().splitlines()[0][:300])
  diff = max(abs(g - r) / abs(r) for g, r in zip(got, ref))
  return emit(kind="losses", run=name, mesh_shape=mesh_shape, layout=layout,
              **{ref_name: ref}, gpu=got, max_rel_diff=diff, limit=limit,
              ok=bool(diff < limit))


def losses_on(devices, mesh_shape, layout, steps, ids, hint=None,
              activation_dtype="float32"):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.models import dtypes  # pylint: disable=g-import-not-at-top
  from meshtf.models import optimize  # pylint: disable=g-import-not-at-top
  from meshtf.models import transformer  # pylint: disable=g-import-not-at-top
  lm = transformer.make_unitransformer(vocab_divisor=1, **SIZES)
  step = mtf.training.TrainStep(
      transformer.loss_fn(lm, variable_dtype=dtypes.VariableDType(
          tf.float32, tf.float32, tf.as_dtype(activation_dtype))),
      mtf.SimdMeshImpl(mesh_shape, layout, devices, communication_hint=hint),
      optimize.AdamWeightDecayOptimizer(1e-2, bias_correction=True))
  return [float(step({"targets": ids})["loss"]) for _ in range(steps)]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--logical_gpus", type=int, default=1)
  p.add_argument("--steps", type=int, default=3)
  args = p.parse_args(argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  info = tf.sysconfig.get_build_info()
  emit(kind="env", tf_version=tf.__version__,
       cuda_version=info.get("cuda_version"),
       cudnn_version=info.get("cudnn_version"),
       gpus=[tf.config.experimental.get_device_details(g).get("device_name")
             for g in gpus])
  if not gpus:
    print("bench/gpu_sanity.py: TensorFlow sees no GPU", file=sys.stderr)
    return 2
  if args.logical_gpus > 1:
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=4096)]
        * args.logical_gpus)
  tf.config.threading.set_inter_op_parallelism_threads(16)
  lines = check_matmuls(tf)
  ids = np.random.RandomState(0).randint(
      1, SIZES["vocab_size"], size=[4, SIZES["max_length"]]).astype(np.int32)
  ref = losses_on(["/job:localhost/replica:0/task:0/device:CPU:0"], "all:1",
                  "", args.steps, ids)
  gpu_names = [d.name for d in tf.config.list_logical_devices("GPU")]
  runs = [("1 gpu", gpu_names[:1], "all:1", "")]
  n = len(gpu_names)
  model = ("data:%d;model:2" % (n // 2), MODEL_LAYOUT)
  if n > 1:
    runs.append(("data:%d" % n, gpu_names, "all:%d" % n, "batch:all"))
    if n % 2 == 0:
      runs.append((model[0], gpu_names) + model)
  for name, devices, mesh_shape, layout in runs:
    # Logical GPUs share one chip: NCCL refuses that, TF's ring does not.
    hint = "ring" if len(devices) > 1 else None
    lines.append(compare_losses(
        name, mesh_shape, layout, LOSS_LIMIT, "cpu",
        lambda: (ref, losses_on(devices, mesh_shape, layout, args.steps, ids,
                                hint=hint))))
  if n > 1 and n % 2 == 0:
    # bfloat16 activations: the model axis's gathers and all-to-alls move
    # bfloat16 bits; against one GPU's bfloat16 run, within bfloat16.
    lines.append(compare_losses(
        model[0] + " bfloat16", model[0], model[1], BF16_LOSS_LIMIT,
        "one_gpu",
        lambda: (losses_on(gpu_names[:1], "all:1", "", args.steps, ids,
                           activation_dtype="bfloat16"),
                 losses_on(gpu_names, model[0], model[1], args.steps, ids,
                           hint="ring", activation_dtype="bfloat16"))))
  ok = all(l["ok"] for l in lines)
  emit(kind="summary", ok=ok)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
