r"""Where the SPMD backend's step time goes beyond its kernels: the two-layer
step of bench/peers.py in one process, each variant built once, then
--rounds timed rounds of --steps steps, the variants' order rotated each
round, wall and CPU seconds (the process's user + system time: on a shared
machine CPU time is what moves least with others' load).

Variants, per (devices, layout):
  simd               the SPMD backend as it runs (mtf.SimdMeshImpl)
  simd_no_collective the same program with every allreduce replaced by its
                     input (wrong numbers: the cost of everything else)
  simd_tf_function   the MeshFunction's tf.function called directly,
                     without MeshFunction.__call__'s Python (the collective
                     watchdog, the Grappler call options)
  placement          mtf.PlacementMeshImpl
  placement_no_collective  placement with every allreduce its input
So simd - simd_no_collective is what the collectives cost the SPMD step,
the same for placement, and simd_no_collective - placement_no_collective
what the per-device programs cost beyond placement's one graph.

Output: one JSON line per (variant, devices, layout): median, min and max
wall and CPU ms per step over the rounds, and the first loss (equal for
every variant that keeps its collectives).

Usage:
  python bench/spmd_overhead.py                    # 256,512,2048 on 8 devices
  python bench/spmd_overhead.py --sizes=16,8,32 --configs=1/all:1/,8/all:8/batch:all
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("simd", "simd_no_collective", "simd_tf_function", "placement",
            "placement_no_collective")
CONFIGS = "8/all:8/batch:all,8/rows:2;cols:4/batch:rows;hidden:cols"


def parse_configs(text):
  """"8/all:8/batch:all,..." -> [(devices, mesh, layout)].

  Example:
    >>> parse_configs("8/rows:2;cols:4/batch:rows;hidden:cols,1/all:1/")
    [(8, 'rows:2;cols:4', 'batch:rows;hidden:cols'), (1, 'all:1', '')]
  """
  out = []
  for part in [p for p in text.split(",") if p]:
    fields = part.split("/")
    if len(fields) != 3 or not fields[0].isdigit():
      sys.exit("--configs: %r is not DEVICES/MESH/LAYOUT (e.g. "
               "8/all:8/batch:all)" % part)
    out.append((int(fields[0]), fields[1], fields[2]))
  return out


def build(variant, sizes, devices, mesh, layout):
  """A zero-argument step for the variant, and the MeshFunction (or None)."""
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.lowering import placement  # pylint: disable=g-import-not-at-top
  from meshtf.lowering import simd_collectives  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(ROOT, "bench"))
  import peers  # pylint: disable=g-import-not-at-top
  saved = (simd_collectives.all_reduce,
           placement.PlacementMeshImpl._allreduce)  # pylint: disable=protected-access
  made = []
  real = mtf.MeshFunction

  def keep(*args, **kwargs):
    made.append(real(*args, **kwargs))
    return made[-1]
  run = dict(devices=devices, mesh=mesh, layout=layout)
  try:
    mtf.MeshFunction = keep
    if variant.endswith("no_collective"):
      simd_collectives.all_reduce = lambda t, reduction, args: t
      placement.PlacementMeshImpl._allreduce = (  # pylint: disable=protected-access
          lambda self, x, mesh_axes, reduction: x)
    if variant.startswith("placement"):
      step = peers.meshtf_placement_step(sizes, run)
    else:
      step = peers.meshtf_step(sizes, run)
    first = step()  # traced here, while the collectives are replaced
  finally:
    mtf.MeshFunction = real
    (simd_collectives.all_reduce,
     placement.PlacementMeshImpl._allreduce) = saved  # pylint: disable=protected-access
  if variant == "simd_tf_function":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    x, target = [tf.constant(a) for a in peers.initial_values(*sizes)[:2]]
    fn = made[-1]._fn  # pylint: disable=protected-access
    step = lambda: fn(x, target).numpy()
  return step, first


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="256,512,2048", help="batch,io,hidden")
  p.add_argument("--configs", default=CONFIGS,
                 help="DEVICES/MESH/LAYOUT,... (at most 8 devices)")
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--steps", type=int, default=10, help="timed steps a round")
  args = p.parse_args(argv)
  variants = args.variants.split(",")
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    sys.exit("--variants=%s: unknown %s; use %s" % (
        args.variants, unknown, ", ".join(VARIANTS)))
  configs = parse_configs(args.configs)
  if any(not 1 <= n <= 8 for n, _, _ in configs):
    sys.exit("--configs=%s: each device count must be 1..8" % args.configs)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.path.insert(0, ROOT)
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  mtf.virtual_cpu_devices(8)
  sizes = [int(s) for s in args.sizes.split(",")]
  runs = []
  for devices, mesh, layout in configs:
    for variant in variants:
      step, first = build(variant, sizes, devices, mesh, layout)
      for _ in range(3):
        step()
      runs.append(dict(variant=variant, devices=devices, mesh=mesh,
                       layout=layout, step=step, first=first, wall=[],
                       cpu=[]))
  for r in range(args.rounds):
    for run in runs[r % len(runs):] + runs[:r % len(runs)]:
      t0, c0 = time.perf_counter(), time.process_time()
      for _ in range(args.steps):
        run["step"]()
      run["wall"].append((time.perf_counter() - t0) * 1e3 / args.steps)
      run["cpu"].append((time.process_time() - c0) * 1e3 / args.steps)
  for run in runs:
    print(json.dumps(dict(
        bench="spmd_overhead", variant=run["variant"],
        devices=run["devices"], mesh=run["mesh"], layout=run["layout"],
        sizes=dict(zip(("batch", "io", "hidden"), sizes)),
        rounds=args.rounds, steps=args.steps,
        wall_ms=round(statistics.median(run["wall"]), 3),
        wall_min_ms=round(min(run["wall"]), 3),
        wall_max_ms=round(max(run["wall"]), 3),
        cpu_ms=round(statistics.median(run["cpu"]), 3),
        cpu_min_ms=round(min(run["cpu"]), 3),
        cpu_max_ms=round(max(run["cpu"]), 3),
        first_loss=float(run["first"]), host=platform.node(),
        cpus=os.cpu_count())), flush=True)


if __name__ == "__main__":
  main()
