r"""Time to the first training step, phase by phase, as the training binary
takes it (meshtf.train's Session and TrainStep: forward, gradients, clipping,
Adam update) on 8 virtual CPUs with the SPMD backend.

Each measurement is a fresh process (a first step is first only once per
process): TensorFlow's import and devices, then the trace of the step --
the model's meshtf graph, autodiff, the optimizer's graph, the layout
assignment (meshtf/layouts/assignment.py), the variables' creation, the
lowering into the per-device program (TF ops), the per-device
tf.function trace, the launch on every device and the outer tf.function
trace -- then the first call (TensorFlow instantiates the function:
Grappler, placement, kernels, one run) and a second call (the step's own
compute, for comparison). Phase times are exclusive: a phase inside
another is not counted twice.

Cases are a registry (CASES): each gives a meshtf.train config. Add one
with @case("name"). The cases are the binary's Transformer LM
(t2t_configs/lm_tiny.py), a T5-small-sized encoder-decoder (6+6 layers,
d_model 512, 8 heads of 64, d_ff 2048, T5's vocabulary of 32,128; batch 8 x
length 32 so the one step's compute stays seconds), and the same with T5's
dropout of 0.1.

  python bench/first_step.py                          # each case once
  python bench/first_step.py --cases=t5_small --rounds=3
  python bench/first_step.py --trees=before=/tmp/base,after=. --rounds=3
      # interleaved A/B: each round runs every case in every tree (a
      # checkout of another commit), in turn
  python bench/first_step.py --cases=t5_small --profile=30
      # + the trace's top functions by own time (cProfile)

One JSON object per measurement ({"bench": "first_step", ...}), then with
--rounds > 1 one summary object per case and tree (median, min, max).
"""
import argparse
import collections
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = {}


def case(name):
  """Registers a case: a function returning a meshtf.train config."""
  def register(fn):
    CASES[name] = fn
    return fn
  return register


@case("lm_tiny")
def lm_tiny():
  """The binary's tiny Transformer LM (t2t_configs/lm_tiny.py): 2 layers,
  d_model 32, data:4;model:2."""
  from meshtf.train import config as config_lib
  return config_lib.load_file(os.path.join(ROOT, "t2t_configs",
                                           "lm_tiny.py"))


@case("t5_small")
def t5_small():
  """A T5-small-sized encoder-decoder: 6 + 6 layers, d_model 512, 8 heads
  of d_kv 64, d_ff 2048, vocabulary 32,128 (190 variables with Adam's
  slots); data:4;model:2 as lm_tiny."""
  from meshtf.layouts import presets
  from meshtf.train import config as config_lib
  c = config_lib.load_file(os.path.join(ROOT, "t2t_configs",
                                        "translate_tiny.py"))
  c.num_layers = 6
  c.num_decoder_layers = 6
  c.d_model = 512
  c.num_heads = 8
  c.d_kv = 64
  c.d_ff = 2048
  c.vocab_size = 32128
  c.batch_size = 8
  c.length = 32
  c.mesh_shape = "data:4;model:2"
  c.layout = presets.STANDARD
  return c


@case("t5_small_dropout")
def t5_small_dropout():
  """t5_small as T5 trains it: dropout 0.1 (every dropout draws its mask
  with the layout-invariant Threefry generator, meshtf/lowering/rng.py)."""
  c = t5_small()
  c.dropout_rate = 0.1
  return c


# --- one measurement, in a fresh process ---------------------------------------
class _Phases(object):
  """Exclusive wall and process CPU time per phase: a timed function
  inside another charges its time to itself only."""

  def __init__(self):
    self.seconds = {}
    self.cpu_seconds = {}
    self.calls = {}
    self._stack = []   # [name, start, cpu start, child time, child cpu]
    self._patched = []   # (owner, attribute, original)

  def wrap(self, name, fn):
    phases = self

    def timed(*args, **kwargs):
      phases._stack.append([name, time.perf_counter(), time.process_time(),
                            0.0, 0.0])
      try:
        return fn(*args, **kwargs)
      finally:
        _, start, cpu_start, children, children_cpu = phases._stack.pop()
        total = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        phases.seconds[name] = phases.seconds.get(name, 0.0) + (
            total - children)
        phases.cpu_seconds[name] = phases.cpu_seconds.get(name, 0.0) + (
            cpu - children_cpu)
        phases.calls[name] = phases.calls.get(name, 0) + 1
        if phases._stack:
          phases._stack[-1][3] += total
          phases._stack[-1][4] += cpu
    return timed

  def patch(self, owner, attribute, name):
    # None: inherited (restore by deleting the override)
    self._patched.append((owner, attribute, owner.__dict__.get(attribute)))
    setattr(owner, attribute, self.wrap(name, getattr(owner, attribute)))

  def restore(self):
    """Puts back what patch() replaced (measure runs in a test process
    too)."""
    for owner, attribute, original in reversed(self._patched):
      if original is None:
        delattr(owner, attribute)
      else:
        setattr(owner, attribute, original)
    self._patched = []


def _instrument(phases, step_fn, loss_fn_holder):
  import meshtf
  from meshtf.layouts import mesh_layout
  from meshtf.lowering import lowering
  from meshtf.lowering import simd
  from meshtf.ops import variables
  optimizer = step_fn._optimizer   # pylint: disable=protected-access
  optimizer.apply_grads = phases.wrap("optimizer_graph",
                                      optimizer.apply_grads)
  step_fn._loss_fn = phases.wrap(   # pylint: disable=protected-access
      "model_graph", loss_fn_holder)
  phases.patch(meshtf, "gradients", "autodiff")
  phases.patch(mesh_layout.MeshLayout, "assign", "layout_assignment")
  phases.patch(variables.Variable, "create_slices", "variables")
  phases.patch(lowering.Lowering, "lower_top_level", "lowering")
  phases.patch(lowering.Lowering, "finish_buckets", "lowering")
  phases.patch(simd.SimdMeshImpl, "trace_program", "per_device_trace")
  phases.patch(simd.SimdMeshImpl, "launch", "launch")


def _grappler_options(text):
  """'disable_meta_optimizer=true,constant_folding=false' -> a dict for
  tf.config.optimizer.set_experimental_options."""
  out = {}
  for item in [t for t in text.split(",") if t]:
    key, _, value = item.partition("=")
    out[key] = value.lower() in ("1", "true", "on", "yes")
  return out


def measure(name, profile=0, grappler="", later_steps=3):
  """The first step of case `name` in this process: a dict. grappler:
  Grappler options to set first (to measure their share); later_steps:
  how many steps after the second to time (their median)."""
  t0 = time.perf_counter()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  if grappler:
    tf.config.optimizer.set_experimental_options(_grappler_options(grappler))
  import tempfile
  import meshtf  # noqa: F401
  from meshtf.models import training
  from meshtf.train import experiment
  from meshtf.train import session as session_lib
  t_import = time.perf_counter() - t0
  config = CASES[name]()
  t1 = time.perf_counter()
  session = session_lib.Session(config, tempfile.mkdtemp(), "train",
                                log=lambda *a: None)
  t_session = time.perf_counter() - t1
  loss_fn = experiment.loss_fn(session.model, session.sink,
                               variable_dtype=experiment.variable_dtype(
                                   config))
  step_fn = training.TrainStep(
      loss_fn, session.impl, experiment.make_optimizer(config),
      variable_store=session.store, seed=config.seed,
      clip_gradient_norm=config.clip_gradient_norm or None,
      bucket_bytes=int(config.collective_bucket_mb * (1 << 20)))
  phases = _Phases()
  try:
    _instrument(phases, step_fn, loss_fn)
    return _measure_step(name, config, step_fn, phases, session, profile,
                         grappler, t_import, t_session, later_steps)
  finally:
    phases.restore()


def _measure_step(name, config, step_fn, phases, session, profile,
                  grappler, t_import, t_session, later_steps):
  """Traces and runs step_fn twice; the measurement dict."""
  import tempfile
  import tensorflow as tf
  from meshtf.lowering import lowering as lowering_lib
  from meshtf.train import experiment
  data = experiment.make_data(config, tempfile.mkdtemp())
  batch = {k: tf.constant(v) for k, v in data.train_batch(0).items()}
  mf = step_fn.mesh_function
  profiler = None
  if profile:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
  t2, c2 = time.perf_counter(), time.process_time()
  mf._fn.get_concrete_function(batch)  # pylint: disable=protected-access
  t_trace, c_trace = time.perf_counter() - t2, time.process_time() - c2
  if profiler is not None:
    profiler.disable()
  t3, c3 = time.perf_counter(), time.process_time()
  out = step_fn(batch)
  float(out["loss"])
  t_first, c_first = time.perf_counter() - t3, time.process_time() - c3
  t4, c4 = time.perf_counter(), time.process_time()
  out = step_fn({k: tf.constant(v) for k, v in data.train_batch(1).items()})
  float(out["loss"])
  t_second, c_second = time.perf_counter() - t4, time.process_time() - c4
  # Later steps: the step's own compute once TensorFlow has warmed its
  # kernels and allocator (a median, so one slow step on a shared machine
  # does not count).
  later, later_cpu = [], []
  for i in range(later_steps):
    feed = {k: tf.constant(v) for k, v in data.train_batch(2 + i).items()}
    t5, c5 = time.perf_counter(), time.process_time()
    out = step_fn(feed)
    float(out["loss"])
    later.append(time.perf_counter() - t5)
    later_cpu.append(time.process_time() - c5)
  phase_s = {k: round(v, 4) for k, v in sorted(phases.seconds.items())}
  phase_s["outer_trace_other"] = round(t_trace - sum(phases.seconds.values()),
                                       4)
  phase_s["first_run"] = round(t_first, 4)
  phase_cpu_s = {k: round(v, 4) for k, v in sorted(
      phases.cpu_seconds.items())}
  phase_cpu_s["outer_trace_other"] = round(
      c_trace - sum(phases.cpu_seconds.values()), 4)
  phase_cpu_s["first_run"] = round(c_first, 4)
  graph = mf.graph
  result = {
      "bench": "first_step", "case": name,
      "config": {k: config[k] for k in (
          "model_type", "num_layers", "num_decoder_layers", "d_model",
          "num_heads", "d_kv", "d_ff", "vocab_size", "batch_size", "length",
          "mesh_shape", "layout", "backend", "optimizer")},
      "first_step_s": round(t_trace + t_first, 3),
      "trace_s": round(t_trace, 3), "first_run_s": round(t_first, 3),
      "second_step_s": round(t_second, 3),
      "later_step_s": (round(statistics.median(later), 3) if later
                       else None),
      "later_step_cpu_s": (round(statistics.median(later_cpu), 3) if later
                           else None),
      "later_steps": later_steps,
      # CPU seconds of every thread of the process: less sensitive than
      # wall time to other jobs on a shared machine.
      "first_step_cpu_s": round(c_trace + c_first, 3),
      "trace_cpu_s": round(c_trace, 3), "first_run_cpu_s": round(c_first, 3),
      "second_step_cpu_s": round(c_second, 3),
      "import_s": round(t_import, 3), "session_s": round(t_session, 3),
      "phases_s": phase_s, "phases_cpu_s": phase_cpu_s,
      "phase_calls": phases.calls,
      "meshtf_ops": len(list(lowering_lib.all_operations(graph.operations))),
      "variables": len(graph.all_variables),
      "tf_ops_per_device_program": len(
          mf.lowering.program.graph.get_operations()),
      "tf_op_types_top": collections.Counter(
          op.type for op in mf.lowering.program.graph.get_operations()
      ).most_common(12),
      "loss": float(out["loss"]), "grappler": grappler or "default",
      "host": platform.node(), "cpus": os.cpu_count(),
      "load_1min": round(os.getloadavg()[0], 2),
      # The process's peak resident memory (Linux: ru_maxrss in KiB).
      "peak_rss_mb": round(resource.getrusage(
          resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
  }
  if profiler is not None:
    result["profile_top_tottime"] = _top(profiler, profile)
  return result


def _top(profiler, n):
  import pstats
  stats = pstats.Stats(profiler)
  rows = []
  for (path, line, fn), (_, calls, own, cum, _) in stats.stats.items():
    rows.append((own, cum, calls, "%s:%d(%s)" % (
        os.path.relpath(path, ROOT) if path.startswith(ROOT) else
        path.rsplit("site-packages/", 1)[-1], line, fn)))
  rows.sort(reverse=True)
  return [{"function": f, "own_s": round(o, 3), "cum_s": round(c, 3),
           "calls": k} for o, c, k, f in rows[:n]]


# --- the driver ------------------------------------------------------------------
def _child(tree, name, profile, timeout, grappler="", later_steps=3):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
  cmd = [sys.executable, os.path.abspath(__file__), "--child=" + name,
         "--tree=" + tree, "--profile=%d" % profile,
         "--grappler=" + grappler, "--later-steps=%d" % later_steps]
  r = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True,
                     timeout=timeout)
  lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
  if r.returncode or not lines:
    # TensorFlow's own log lines (I0000..., E0000...) say nothing of why.
    said = [l for l in r.stderr.strip().splitlines()
            if not re.match(r"^[IWE]\d{4} ", l)]
    why = "exit %d" % r.returncode
    if r.returncode == -9:
      why += " (SIGKILL: the kernel's OOM killer, most likely)"
    return {"bench": "first_step", "case": name, "exit": r.returncode,
            "error": why + (": " + said[-1] if said else "")}
  return json.loads(lines[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--trees", default="",
                      help="label=path,... checkouts to compare (default: "
                      "this one)")
  parser.add_argument("--profile", type=int, default=0,
                      help="also the trace's top N functions by own time")
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--grappler", default="",
                      help="Grappler options for every run, e.g. "
                      "disable_meta_optimizer=true (to measure its share)")
  parser.add_argument("--later-steps", type=int, default=3,
                      help="steps after the second to time (median)")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  parser.add_argument("--tree", default=ROOT, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    sys.path.insert(0, args.tree)
    print(json.dumps(measure(args.child, args.profile, args.grappler,
                             args.later_steps)),
          flush=True)
    return 0
  names = [n for n in args.cases.split(",") if n]
  unknown = [n for n in names if n not in CASES]
  if unknown:
    parser.error("unknown case %s: the cases are %s" % (
        ", ".join(unknown), ", ".join(CASES)))
  trees = [(label, os.path.abspath(path)) for label, path in (
      t.split("=", 1) for t in args.trees.split(",") if t)] or [
          ("this", ROOT)]
  results = {}
  for r in range(args.rounds):
    for name in names:
      # Alternate which tree goes first, so neither always runs on a
      # machine the other has just warmed (or loaded).
      order = trees if r % 2 == 0 else trees[::-1]
      for label, tree in order:
        result = _child(tree, name, args.profile, args.timeout,
                        args.grappler, args.later_steps)
        result.update(tree=label, round=r)
        print(json.dumps(result, sort_keys=True), flush=True)
        results.setdefault((name, label), []).append(result)
  if args.rounds > 1:
    for (name, label), rs in sorted(results.items()):
      ok = [x for x in rs if "error" not in x]
      if not ok:
        continue
      summary = {"bench": "first_step_summary", "case": name, "tree": label,
                 "rounds": len(ok)}
      for key in ("first_step_s", "trace_s", "first_run_s",
                  "second_step_s", "later_step_s", "first_step_cpu_s", "trace_cpu_s",
                  "first_run_cpu_s"):
        values = [x[key] for x in ok if x.get(key) is not None]
        if not values:
          continue
        summary[key] = {"median": statistics.median(values),
                        "min": min(values), "max": max(values)}
      for key in ("phases_s", "phases_cpu_s"):
        summary[key + "_median"] = {
            k: statistics.median(x.get(key, {}).get(k, 0.0) for x in ok)
            for k in ok[0].get(key, {})}
      print(json.dumps(summary, sort_keys=True), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
