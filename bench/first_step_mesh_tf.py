r"""Time to the first training step of Mesh TF's own code on meshtf (way 2):
Mesh TensorFlow 0.1.21's Bitransformer from its shipped defaults.gin, tiny
sizes, Adafactor and the Noam schedule (tests/compat/mtf_bitransformer.py,
the compat test's model), per mesh, on 8 virtual CPUs, SPMD backend.

Phases of the first step, one JSON line per mesh:
  trace_seconds       MeshFunction's tf.function trace (get_concrete_function):
                      Mesh TF's model code building the meshtf graph
                      (build_seconds, summed over traces), autodiff, layout
                      assignment and lowering into the SPMD program (TF ops),
                      variable creation and initialization
  traces              how many times the build function ran in that trace
                      (2: tf.function traces again after a first trace that
                      created variables; retrace_seconds is the second)
  first_call_seconds  the first call of the traced function: TensorFlow's
                      graph optimization and instantiation of the program on
                      each device, then the step itself
  *_cpu_seconds       the same phases in CPU seconds of the process (all
                      threads): steadier than wall time on a shared machine
  second_step_seconds a later step, for scale
  meshtf_ops, program_tf_ops  size of the meshtf graph and of the SPMD
                      per-device program (TF graph nodes)

--profile=DIR also writes a cProfile of the first step (trace + first call)
per mesh under DIR and prints its top functions by cumulative time.

Usage:
  python bench/first_step_mesh_tf.py [--meshes='batch:8;model:4,batch:2']
      [--dropout=0.0] [--profile=/tmp/prof]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "compat"))
import mtf_bitransformer  # noqa: E402  pylint: disable=g-import-not-at-top


def measure(runner, mesh_shape, profile_dir=None):
  """One JSON-able dict of the first step's phases on mesh_shape."""
  tf = runner.tf
  global_step = tf.compat.v1.train.get_or_create_global_step()
  global_step.assign(0)
  step = runner.train_step(mesh_shape)
  builds = []
  build = step._build_fn  # pylint: disable=protected-access

  def timed_build(*args):
    start = time.time()
    out = build(*args)
    builds.append((start, time.time() - start))
    return out
  step._build_fn = timed_build  # pylint: disable=protected-access
  inputs = [tf.constant(runner.inputs[0]), tf.constant(runner.targets[0])]
  profiler = cProfile.Profile() if profile_dir else None
  if profiler:
    profiler.enable()
  start, cpu = time.time(), time.process_time()
  concrete = step._fn.get_concrete_function(*inputs)  # pylint: disable=protected-access
  trace, trace_cpu = time.time() - start, time.process_time() - cpu
  # tf.function traces again when the first trace created variables (the
  # per-slice tf.Variables): the time from the second build's start.
  retrace = (start + trace - builds[1][0]) if len(builds) > 1 else 0.0
  start, cpu = time.time(), time.process_time()
  loss = float(step(*inputs))
  first, first_cpu = time.time() - start, time.process_time() - cpu
  if profiler:
    profiler.disable()
  global_step.assign_add(1)
  start = time.time()
  step(tf.constant(runner.inputs[1]), tf.constant(runner.targets[1]))
  second = time.time() - start
  program = step.lowering.program
  line = {
      "bench": "first_step_mesh_tf", "model": "mesh_tf_bitransformer",
      "mesh": mesh_shape, "rules": runner.settings["layout_rules"],
      "backend": "simd", "trace_seconds": round(trace, 2),
      "build_seconds": round(sum(b for _, b in builds), 2),
      "traces": len(builds), "retrace_seconds": round(retrace, 2),
      "first_call_seconds": round(first, 2),
      "first_step_seconds": round(trace + first, 2),
      # CPU seconds of this process (all threads): steadier than wall time
      # on a shared machine.
      "trace_cpu_seconds": round(trace_cpu, 2),
      "first_call_cpu_seconds": round(first_cpu, 2),
      "second_step_seconds": round(second, 3), "loss": loss,
      "meshtf_ops": len(step.graph.operations),
      "tf_scalar_imports": sum("import_tf_scalar" in op.name
                               for op in step.graph.operations),
      "program_tf_ops": (len(program.graph.get_operations())
                         if hasattr(program, "graph") else None),
      "outer_tf_ops": len(concrete.graph.get_operations())}
  if profiler:
    path = os.path.join(profile_dir, "first_step_%s.prof" % (
        mesh_shape.replace(":", "").replace(",", "_") or "one_device"))
    profiler.dump_stats(path)
    out = io.StringIO()
    pstats.Stats(path, stream=out).sort_stats("cumulative").print_stats(40)
    line["profile"] = path
    print(out.getvalue(), file=sys.stderr)
  return line


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--meshes", default="batch:8;model:4,batch:2")
  parser.add_argument("--dropout", type=float, default=None,
                      help="dropout_rate (the test's 0.0; defaults.gin "
                      "ships 0.1)")
  parser.add_argument("--num_layers", type=int, default=None,
                      help="layers per stack (the test's 1)")
  parser.add_argument("--grappler", default="on", choices=["on", "off"],
                      help="off: TensorFlow's graph optimizer disabled "
                      "(disable_meta_optimizer)")
  parser.add_argument("--profile", default=None)
  args = parser.parse_args(argv)
  bindings = ""
  if args.dropout is not None:
    bindings += "\ndropout_rate = %r\n" % args.dropout
  if args.num_layers is not None:
    bindings += "\nnum_layers = %d\n" % args.num_layers
  if args.profile:
    os.makedirs(args.profile, exist_ok=True)
  start = time.time()
  runner = mtf_bitransformer.Runner(bindings, args.grappler == "on")
  config = {"dropout_rate": 0.0 if args.dropout is None else args.dropout,
            "num_layers": args.num_layers or 1, "grappler": args.grappler}
  print(json.dumps(dict({"bench": "first_step_mesh_tf", "setup_seconds":
                         round(time.time() - start, 1)}, **config)),
        flush=True)
  for mesh_shape in args.meshes.split(";"):
    line = measure(runner, mesh_shape, args.profile)
    line.update(config)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
