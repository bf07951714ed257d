r"""The paper's two-layer train step in plain TensorFlow, meshtf and JAX, on
the same virtual CPU devices, in fresh processes, interleaved.

The step: y = relu(x w + bias) v, loss = mean((y - target)^2), gradients,
SGD (w -= lr * dw, ...), with x [batch, io], w [io, hidden], bias
[hidden], v [hidden, io]; inputs and weights are the same numpy arrays in
every framework, so the first losses agree (kind=run reports them).

Runs (framework, devices, layout):
  tf       1 device: tf.Variables, tf.GradientTape, under tf.function.
           n devices, data-parallel, written by hand: a replica of the
           weights and a batch shard per device, the gradients summed by
           tf.add_n on the first device, every replica updated with the
           sum (what a TF user writes for devices of one process). And
           "data_parallel_nosync": the same without the gradient sum (each
           replica steps on its own shard: not the same math) -- the
           floor any data-parallel step on these devices pays for its
           per-device compute and replicated updates.
  meshtf   the step of meshtf/examples/two_layer.py in an mtf.MeshFunction
           on the SPMD backend over mtf.virtual_cpu_devices(n).
  meshtf_placement  the same step on the placement backend
           (mtf.PlacementMeshImpl: one TF tensor per device, collectives
           as add_n / concat on the devices involved).
  jax      jax.jit with NamedSharding over n host devices
           (XLA_FLAGS=--xla_force_host_platform_device_count=8), the
           weights donated; same mesh and layout as meshtf's.
Layouts (for n > 1): data-parallel (mesh all:n, batch:all) and 2-D (mesh
rows:2;cols:n/2, batch:rows;hidden:cols).

Each round starts one process per run, in an order rotated by one each
round, so drifts of the machine's load fall on every run alike. A process
builds its step, runs --warmup steps, then times --steps steps and prints
seconds per step (wall, and the process's CPU seconds per step: on a
shared machine the wall time swings with others' load). Output, JSON
lines with their config:
  kind=run      one per run: median, min, max and every round's s/step,
                the median CPU s/step, first loss, loss after the last
                step (of the last round)
  kind=skip     a framework that cannot run here (e.g. jax not installed:
                pip install "jax[cpu]", or pip install -e ".[peers]")
  kind=summary  ratios of medians: each run over plain TF's 1-device step,
                meshtf over JAX, over plain TF and over meshtf_placement
                on the same devices and layout, and each multi-device run
                over its own framework's 1-device run.
Then, on stderr, the medians as a markdown table (ms/step, median
[min-max] over the rounds), one row per (devices, layout);
`--table=FILE` prints that table from a saved run's JSON lines.

Usage:
  python bench/peers.py                       # 256,512,2048; 1, 4, 8 devices
  python bench/peers.py --sizes=64,64,256 --devices=1,2 --rounds=1
  python bench/peers.py --frameworks=meshtf,meshtf_placement \
      --trees=before=/tmp/main,after=.      # two checkouts, interleaved
  python bench/peers.py --table=bench/results/cpu2_peers_2026-12-02.jsonl
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEARNING_RATE = 0.1


def layouts(n):
  """[(layout name, mesh shape, layout rules)] of n devices."""
  if n == 1:
    return [("1-device", "all:1", "")]
  out = [("data_parallel", "all:%d" % n, "batch:all")]
  if n % 2 == 0 and n >= 4:
    out.append(("2d", "rows:2;cols:%d" % (n // 2), "batch:rows;hidden:cols"))
  return out


def initial_values(batch, d_io, d_hidden, seed=0):
  """x, target (a random teacher's), w, bias, v as float32 numpy arrays."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  f32 = lambda a: np.asarray(a, np.float32)
  x = f32(rs.normal(size=[batch, d_io]))
  teacher_w = f32(rs.normal(size=[d_io, d_hidden]) / np.sqrt(d_io))
  teacher_v = f32(rs.normal(size=[d_hidden, d_io]) / np.sqrt(d_hidden))
  target = f32(np.maximum(x @ teacher_w, 0.0) @ teacher_v)
  w = f32(rs.normal(size=[d_io, d_hidden]) / np.sqrt(d_io))
  v = f32(rs.normal(size=[d_hidden, d_io]) / np.sqrt(d_hidden))
  return x, target, w, np.zeros([d_hidden], np.float32), v


# --- one run per process -----------------------------------------------------
def tf_step(sizes, run):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if run["devices"] > 1:
    return tf_data_parallel_step(sizes, run)
  x, target, w0, b0, v0 = initial_values(*sizes)
  x, target = tf.constant(x), tf.constant(target)
  w, b, v = tf.Variable(w0), tf.Variable(b0), tf.Variable(v0)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      y = tf.matmul(tf.nn.relu(tf.matmul(x, w) + b), v)
      loss = tf.reduce_mean(tf.square(y - target))
    for var, g in zip((w, b, v), tape.gradient(loss, [w, b, v])):
      var.assign_sub(LEARNING_RATE * g)
    return loss
  return lambda: step().numpy()


def tf_data_parallel_step(sizes, run):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  x, target, w0, b0, v0 = initial_values(*sizes)
  n = run["devices"]
  devices = mtf.virtual_cpu_devices(n)
  rows = x.shape[0] // n
  replicas = []
  for i, d in enumerate(devices):
    with tf.device(d):
      part = slice(i * rows, (i + 1) * rows)
      replicas.append((d, tf.constant(x[part]), tf.constant(target[part]),
                       tf.Variable(w0), tf.Variable(b0), tf.Variable(v0)))
  sync = run["layout_name"] == "data_parallel"

  @tf.function
  def step():
    losses, grads = [], []
    for d, xs, ts, w, b, v in replicas:
      with tf.device(d), tf.GradientTape() as tape:
        y = tf.matmul(tf.nn.relu(tf.matmul(xs, w) + b), v)
        # The shard's share of the full batch's mean.
        loss = tf.reduce_mean(tf.square(y - ts)) / n
      losses.append(loss)
      grads.append(tape.gradient(loss, [w, b, v]))
    if sync:
      with tf.device(devices[0]):
        total = [tf.add_n(list(g)) for g in zip(*grads)]
      grads = [total] * n
    for (d, _, _, w, b, v), g in zip(replicas, grads):
      with tf.device(d):
        for var, gi in zip((w, b, v), g):
          var.assign_sub(LEARNING_RATE * gi)
    with tf.device(devices[0]):
      return tf.add_n(losses)
  return lambda: step().numpy()


def meshtf_placement_step(sizes, run):
  return meshtf_step(sizes, run, backend="placement")


def meshtf_step(sizes, run, backend="simd"):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.examples import two_layer  # pylint: disable=g-import-not-at-top
  batch, io, hidden = two_layer.dims(*sizes)
  x, target, w0, b0, v0 = initial_values(*sizes)
  start = {"w": w0, "bias": b0, "v": v0}

  def build(mesh, x_tf, target_tf):
    x_m = mtf.import_tf_tensor(mesh, x_tf, [batch, io], name="x")
    t_m = mtf.import_tf_tensor(mesh, target_tf, [batch, io], name="target")
    init = lambda name: mtf.constant_initializer(start[name])
    w = mtf.get_variable(mesh, "w", [io, hidden], initializer=init("w"))
    b = mtf.get_variable(mesh, "bias", [hidden], initializer=init("bias"))
    v = mtf.get_variable(mesh, "v", [hidden, io], initializer=init("v"))
    h = mtf.relu(mtf.einsum([x_m, w], output_shape=[batch, hidden]) + b)
    y = mtf.einsum([h, v], output_shape=[batch, io])
    loss = mtf.reduce_mean(mtf.square(y - t_m))
    for var, g in zip((w, b, v), mtf.gradients([loss], [w, b, v])):
      mtf.assign_sub(var, g * LEARNING_RATE)
    return loss
  devices = mtf.virtual_cpu_devices(run["devices"])
  impl = {"simd": mtf.SimdMeshImpl, "placement": mtf.PlacementMeshImpl}[
      backend](run["mesh"], run["layout"], devices)
  step = mtf.MeshFunction(build, impl)
  x, target = tf.constant(x), tf.constant(target)
  return lambda: step(x, target).numpy()


def jax_step(sizes, run):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec  # pylint: disable=g-import-not-at-top
  shape = [(part.split(":")[0], int(part.split(":")[1]))
           for part in run["mesh"].split(";")]
  devices = np.array(jax.devices()[:run["devices"]]).reshape(
      [s for _, s in shape])
  mesh = Mesh(devices, [n for n, _ in shape])
  rules = dict(r.split(":") for r in run["layout"].split(";") if r)
  spec = lambda *dims: NamedSharding(
      mesh, PartitionSpec(*[rules.get(d) for d in dims]))
  x, target, w0, b0, v0 = initial_values(*sizes)
  x = jax.device_put(x, spec("batch", "io"))
  target = jax.device_put(target, spec("batch", "io"))
  params = (jax.device_put(w0, spec("io", "hidden")),
            jax.device_put(b0, spec("hidden")),
            jax.device_put(v0, spec("hidden", "io")))

  def loss_fn(p, x, target):
    w, b, v = p
    y = jnp.maximum(x @ w + b, 0.0) @ v
    return jnp.mean(jnp.square(y - target))

  shardings = tuple(a.sharding for a in params)

  def step(p, x, target):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, target)
    new = tuple(a - LEARNING_RATE * g for a, g in zip(p, grads))
    new = tuple(jax.lax.with_sharding_constraint(a, s)
                for a, s in zip(new, shardings))
    return new, loss
  step = jax.jit(step, donate_argnums=(0,))
  state = {"params": params}

  def run_once():
    state["params"], loss = step(state["params"], x, target)
    return float(loss)
  return run_once


STEPS = {"tf": tf_step, "meshtf": meshtf_step,
         "meshtf_placement": meshtf_placement_step, "jax": jax_step}


def child(spec):
  """Runs one (framework, devices, layout) and prints its seconds per step."""
  run = json.loads(spec)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.path.insert(0, run.get("tree_dir") or ROOT)
  step = STEPS[run["framework"]](run["sizes"], run)
  first = step()  # traces / compiles
  for _ in range(run["warmup"]):
    step()
  start, cpu_start = time.perf_counter(), time.process_time()
  for _ in range(run["steps"]):
    last = step()
  seconds = (time.perf_counter() - start) / run["steps"]
  cpu = (time.process_time() - cpu_start) / run["steps"]
  print(json.dumps({"step_s": seconds, "cpu_s": cpu,
                    "first_loss": float(first),
                    "last_loss": float(last)}), flush=True)


# --- the parent: rounds of fresh processes ------------------------------------
def _has_jax():
  try:
    subprocess.run([sys.executable, "-c", "import jax"], check=True,
                   capture_output=True, timeout=120)
    return True
  except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
    return False


def runs_of(frameworks, device_counts, trees=()):
  """One dict per run; with trees [(label, dir)], the meshtf (SPMD) runs
  once per tree (the compared backend; the others run from this one)."""
  out = []
  for fw in frameworks:
    for n in device_counts:
      named = layouts(n)
      if fw == "tf" and n != 1:
        # Hand-written TF: data-parallel, and its floor without the sum.
        named = [l for l in named if l[0] == "data_parallel"]
        named += [("data_parallel_nosync",) + named[0][1:]]
      for name, mesh, layout in named:
        run = dict(framework=fw, devices=n, layout_name=name, mesh=mesh,
                   layout=layout)
        if trees and fw == "meshtf":
          out.extend(dict(run, tree=label, tree_dir=path)
                     for label, path in trees)
        else:
          out.append(run)
  return out


def _column(run):
  """The framework, and the tree after an @ when runs name one."""
  return run["framework"] + ("@" + run["tree"] if run.get("tree") else "")


def _key(run):
  return "%s/%d/%s" % (_column(run), run["devices"], run["layout_name"])


def _child_path(run):
  """The child's PYTHONPATH: its tree first (its meshtf), then the
  caller's (e.g. a directory holding jax: PYTHONPATH=/tmp/jaxsite)."""
  return os.pathsep.join([run.get("tree_dir") or ROOT] + [
      p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def parse_trees(text):
  """--trees=before=DIR,after=. -> [(label, absolute dir)]; exits with one
  line when a dir has no meshtf package.

  Example:
    >>> parse_trees("") == []
    True
  """
  out = []
  for part in [p for p in text.split(",") if p]:
    label, _, path = part.partition("=")
    path = os.path.abspath(path or ".")
    if not label or not os.path.isdir(os.path.join(path, "meshtf")):
      sys.exit("--trees=%s: %r must be LABEL=DIR with DIR a meshtf checkout "
               "(no %s)" % (text, part, os.path.join(path, "meshtf")))
    out.append((label, path))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="256,512,2048", help="batch,io,hidden")
  p.add_argument("--devices", default="1,4,8",
                 help="comma-separated device counts (at most 8)")
  p.add_argument("--frameworks", default="tf,meshtf,meshtf_placement,jax")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--steps", type=int, default=20, help="timed steps per run")
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--trees", default="",
                 help="LABEL=DIR,...: the meshtf (SPMD) runs once per "
                 "checkout, "
                 "interleaved (e.g. before=/tmp/main,after=.)")
  p.add_argument("--table", help="print the markdown table of a saved run "
                 "(its JSON lines) and exit")
  p.add_argument("--child", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    return child(args.child)
  if args.table:
    with open(args.table) as f:
      rows = [json.loads(l) for l in f if l.startswith("{")]
    print(markdown_table([r for r in rows if r.get("kind") == "run"]))
    return None
  sizes = [int(s) for s in args.sizes.split(",")]
  device_counts = [int(n) for n in args.devices.split(",")]
  if any(n < 1 or n > 8 for n in device_counts):
    sys.exit("--devices=%s: each count must be 1..8 (8 virtual CPU devices)"
             % args.devices)
  frameworks = args.frameworks.split(",")
  unknown = [f for f in frameworks if f not in STEPS]
  if unknown:
    sys.exit("--frameworks=%s: unknown %s; use tf, meshtf, "
             "meshtf_placement, jax" % (
        args.frameworks, unknown))
  common = dict(sizes=dict(zip(("batch", "io", "hidden"), sizes)),
                steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                python=platform.python_version(), cpu_count=os.cpu_count())
  if "jax" in frameworks and not _has_jax():
    print(json.dumps(dict(common, kind="skip", framework="jax", reason=(
        "jax is not installed: pip install \"jax[cpu]\""))), flush=True)
    frameworks.remove("jax")
  runs = runs_of(frameworks, device_counts, parse_trees(args.trees))
  times = {_key(r): [] for r in runs}
  cpu_times = {_key(r): [] for r in runs}
  losses = {}
  for rnd in range(args.rounds):
    order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
    for run in order:
      spec = json.dumps(dict(run, sizes=sizes, steps=args.steps,
                             warmup=args.warmup))
      proc = subprocess.run(
          [sys.executable, os.path.abspath(__file__), "--child=" + spec],
          capture_output=True, text=True, cwd=run.get("tree_dir") or ROOT,
          env=dict(os.environ, PYTHONPATH=_child_path(run)))
      lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
      if proc.returncode != 0 or not lines:
        sys.exit("%s failed (exit %d): %s" % (
            _key(run), proc.returncode, proc.stderr.strip()[-2000:]))
      result = json.loads(lines[-1])
      times[_key(run)].append(result["step_s"])
      cpu_times[_key(run)].append(result["cpu_s"])
      losses[_key(run)] = (result["first_loss"], result["last_loss"])
  medians = {}
  printed = []
  for run in runs:
    key = _key(run)
    medians[key] = statistics.median(times[key])
    printed.append(dict(common, kind="run", **run,
                        step_s=medians[key], min_s=min(times[key]),
                        max_s=max(times[key]), all_s=times[key],
                        cpu_s=statistics.median(cpu_times[key]),
                        first_loss=losses[key][0],
                        last_loss=losses[key][1]))
    print(json.dumps(printed[-1]), flush=True)
  _print_summary(common, runs, medians)
  print(markdown_table(printed), file=sys.stderr, flush=True)
  return None


def _print_summary(common, runs, medians):
  """The kind=summary line: ratios of medians."""
  ratios = {}
  base = medians.get("tf/1/1-device")
  for run in runs:
    key = _key(run)
    if base and key != "tf/1/1-device":
      ratios[key + "/over_tf_1_device"] = medians[key] / base
    own = medians.get("%s/1/1-device" % _column(run))
    if own and run["devices"] > 1:
      ratios[key + "/over_own_1_device"] = medians[key] / own
    if run["framework"] == "meshtf":
      for fw in ("jax", "tf", "meshtf_placement"):
        peer = medians.get(key.replace(_column(run) + "/", fw + "/", 1))
        if peer and run["devices"] > 1:
          ratios[key + "/meshtf_over_" + fw] = medians[key] / peer
  print(json.dumps(dict(common, kind="summary", ratios=ratios)), flush=True)


TABLE_COLUMNS = (("meshtf", "meshtf simd"),
                 ("meshtf_placement", "meshtf placement"),
                 ("tf", "TF (hand-written)"),
                 ("tf:data_parallel_nosync", "TF without the sum"),
                 ("jax", "JAX"))


def markdown_table(run_lines):
  """kind=run lines -> a markdown table, ms/step median [min-max], one row
  per (devices, layout); "—" where a framework has no such run.

  Example:
    >>> print(markdown_table([dict(framework="tf", devices=1,
    ...     layout_name="1-device", step_s=0.01, min_s=0.009,
    ...     max_s=0.011)]).splitlines()[2])
    | 1 device | 10.00 [9.00-11.00] |
  """
  cells = {}
  titles = dict(TABLE_COLUMNS)
  columns = []
  for c, _ in TABLE_COLUMNS:
    for r in run_lines:
      col = _column(r)
      if r["layout_name"] == "data_parallel_nosync":
        col = "tf:data_parallel_nosync"
      if col.split("@")[0] == c and col not in columns:
        columns.append(col)
  for r in run_lines:
    column = _column(r)
    layout = r["layout_name"]
    if layout == "data_parallel_nosync":
      column, layout = "tf:data_parallel_nosync", "data_parallel"
    cells[(r["devices"], layout, column)] = "%.2f [%.2f-%.2f]" % (
        r["step_s"] * 1e3, r["min_s"] * 1e3, r["max_s"] * 1e3)
  rows = sorted({(n, l) for n, l, _ in cells},
                key=lambda nl: (nl[0], nl[1] != "1-device", nl[1] != "2d"))
  names = {"1-device": "", "2d": " 2-D", "data_parallel": " data-parallel"}
  columns = columns or [c for c, _ in TABLE_COLUMNS]
  title = lambda c: titles[c.split("@")[0]] + (
      " (%s)" % c.split("@")[1] if "@" in c else "")
  out = ["| config (ms/step) | " + " | ".join(title(c) for c in columns) +
         " |", "|---" * (len(columns) + 1) + "|"]
  for n, layout in rows:
    label = "%d device%s%s" % (n, "s" if n > 1 else "", names[layout])
    out.append("| %s | %s |" % (label, " | ".join(
        cells.get((n, layout, c), "—") for c in columns)))
  return "\n".join(out)


if __name__ == "__main__":
  main()
