"""The Mesh-TensorFlow paper's two-layer network (section 8), trained on a
mesh of virtual CPU devices with any mesh shape and layout.

    y = relu(x w + bias) v,   loss = mean((y - target)^2),   SGD

The target comes from a fixed random "teacher" network of the same form, so
the loss can go to zero. Every layout gives the same losses (layout
invariance, up to float rounding); the collective summary shows what the
layout costs.

Usage:
  python -m meshtf.examples.two_layer      # the paper's four layouts, compared
  python -m meshtf.examples.two_layer --mesh_shape=rows:2;cols:4 \
      --layout=batch:rows;hidden:cols --steps=20          # one layout
"""
import sys

from absl import app
from absl import flags

from meshtf.train import startup

# Quiet TensorFlow's start-up lines from before it loads (a no-op unless
# this is `python -m meshtf.examples.two_layer`).
startup.quiet_if_command_line()

FLAGS = flags.FLAGS
flags.DEFINE_string("mesh_shape", None,
                    "Mesh shape, e.g. 'all:8' or 'rows:2;cols:4' (default: "
                    "rows:2;cols:4; with no --layout either, the paper's four "
                    "layouts are compared).")
flags.DEFINE_string("layout", None,
                    "Layout rules dim:mesh_axis, e.g. 'batch:all' (default: "
                    "batch:rows;hidden:cols).")
flags.DEFINE_integer("batch_size", 64, "Global batch size b.")
flags.DEFINE_integer("d_io", 32, "Input/output width d_io.")
flags.DEFINE_integer("d_hidden", 128, "Hidden width d_h.")
flags.DEFINE_integer("steps", 20, "Training steps.")
flags.DEFINE_float("learning_rate", 0.5, "SGD learning rate.")
flags.DEFINE_integer("num_virtual_cpus", 8,
                     "Logical CPU devices to create (>= mesh size).")
flags.DEFINE_integer("seed", 0, "Seed for initialisation and data.")
flags.DEFINE_enum("backend", "simd", ["simd", "placement"],
                  "simd: one program for all devices (TF collectives); "
                  "placement: one TF tensor per device.")


def dims(batch_size, d_io, d_hidden):
  import meshtf as mtf
  return (mtf.Dimension("batch", batch_size), mtf.Dimension("io", d_io),
          mtf.Dimension("hidden", d_hidden))


def two_layer_loss(mesh, x_tf, target_tf, batch, io, hidden):
  """Builds the network; returns (loss, variables' tensors, x tensor).

  x_tf and target_tf are full tf.Tensors, or functions slice_fn(begin, size)
  giving one processor's slice (per-host input, see mtf.import_slices).
  """
  import meshtf as mtf
  def bring(value, name):
    if callable(value):
      return mtf.import_slices(mesh, [batch, io], value, name=name)
    return mtf.import_tf_tensor(mesh, value, [batch, io], name=name)
  x = bring(x_tf, "x")
  target = bring(target_tf, "target")
  init = mtf.random_normal_initializer(stddev=d_scale(io.size))
  w = mtf.get_variable(mesh, "w", [io, hidden], initializer=init)
  bias = mtf.get_variable(mesh, "bias", [hidden],
                          initializer=mtf.zeros_initializer())
  v = mtf.get_variable(mesh, "v", [hidden, io],
                       initializer=mtf.random_normal_initializer(
                           stddev=d_scale(hidden.size)))
  h = mtf.relu(mtf.einsum([x, w], output_shape=[batch, hidden]) + bias)
  y = mtf.einsum([h, v], output_shape=[batch, io])
  loss = mtf.reduce_mean(mtf.square(y - target))
  return loss, [w, bias, v], x


def d_scale(fan_in):
  return fan_in ** -0.5


def sgd_step_builder(batch, io, hidden, learning_rate):
  """build_fn for mtf.MeshFunction: one forward/backward/SGD step."""
  import meshtf as mtf
  def build(mesh, x_tf, target_tf):
    loss, variables, _ = two_layer_loss(mesh, x_tf, target_tf, batch, io,
                                        hidden)
    for var, grad in zip(variables, mtf.gradients([loss], variables)):
      mtf.assign_sub(var, grad * learning_rate)
    return loss
  return build


def make_data(batch_size, d_io, d_hidden, seed):
  """Inputs and targets of a random teacher network (numpy)."""
  import numpy as np
  rs = np.random.RandomState(seed)
  x = rs.normal(size=[batch_size, d_io]).astype(np.float32)
  w = rs.normal(size=[d_io, d_hidden]).astype(np.float32) / np.sqrt(d_io)
  v = rs.normal(size=[d_hidden, d_io]).astype(np.float32) / np.sqrt(d_hidden)
  target = np.maximum(x @ w, 0.0) @ v
  return x, target.astype(np.float32)


def train(mesh_shape, layout, batch_size, d_io, d_hidden, steps,
          learning_rate, devices, seed=0, log=print, backend="simd"):
  """Trains; returns (losses, MeshFunction). Raises LayoutError early."""
  import meshtf as mtf
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  impl_class = {"simd": mtf.SimdMeshImpl,
                "placement": mtf.PlacementMeshImpl}[backend]
  impl = impl_class(mesh_shape, layout, devices[:mesh_shape.size])
  batch, io, hidden = dims(batch_size, d_io, d_hidden)
  step = mtf.MeshFunction(sgd_step_builder(batch, io, hidden, learning_rate),
                          impl, seed=seed)
  x, target = make_data(batch_size, d_io, d_hidden, seed + 1)
  losses = []
  for i in range(steps):
    losses.append(float(step(x, target)))
    if i == 0:
      log("mesh %s  layout %s  backend %s" % (mesh_shape, impl.layout_rules,
                                              backend))
      log("collectives per step:\n" + step.lowering.collective_summary())
    log("step %3d  loss %.6f" % (i, losses[-1]))
  return losses, step


# The paper's layouts of the network on 8 processors (Table 1 and its 3-D
# extension): (name, mesh shape, layout rules).
PAPER_LAYOUTS = (
    ("data-parallel", "all:8", "batch:all"),
    ("model-parallel", "all:8", "hidden:all"),
    ("2-D: data x model", "rows:2;cols:4", "batch:rows;hidden:cols"),
    ("3-D: data x model x io", "rows:2;cols:2;planes:2",
     "batch:rows;hidden:cols;io:planes"),
)


def compare_layouts(layouts, batch_size, d_io, d_hidden, steps,
                    learning_rate, devices, seed=0, log=print,
                    backend="simd"):
  """Trains the network under each (name, mesh shape, layout rules) and
  prints a table: final loss, collectives per step and values each
  processor allreduces per step. Returns one dict per layout with its
  "losses" and "collectives" ({kind: count per step}).

  Example:
    >>> rows = compare_layouts(PAPER_LAYOUTS, 64, 32, 128, 5, 0.5, devices)
    >>> rows[0]["collectives"]
    {'allreduce_sum': 5}
  """
  rows = []
  for name, mesh_shape, layout in layouts:
    log("== %s: mesh %s, layout %s" % (name, mesh_shape, layout))
    losses, step = train(mesh_shape, layout, batch_size, d_io, d_hidden,
                         steps, learning_rate, devices, seed,
                         log=lambda line: None, backend=backend)
    counts, values = {}, 0
    for s in step.lowering.collective_stats():
      kind = s["kind"]   # a CollectiveKind
      counts[kind.value] = counts.get(kind.value, 0) + s["count"]
      if kind.is_allreduce:
        values += s["elements_per_device"] * s["count"]
    log(step.lowering.collective_summary())
    rows.append({"name": name, "mesh_shape": mesh_shape, "layout": layout,
                 "losses": losses, "collectives": counts,
                 "allreduced_per_device": values})
  log("")
  log("%-23s %-33s %-10s %-19s %s" % ("layout", "rules", "final loss",
                                      "collectives/step",
                                      "values allreduced/processor"))
  for r in rows:
    log("%-23s %-33s %-10.6f %-19s %d" % (
        r["name"], r["layout"], r["losses"][-1],
        ", ".join("%d %s" % (n, k) for k, n in sorted(
            r["collectives"].items())), r["allreduced_per_device"]))
  spread = max(abs(a - b) for r in rows
               for a, b in zip(r["losses"], rows[0]["losses"]))
  log("every layout: the same %d losses up to %.1e (float summation order)"
      % (steps, spread))
  return rows


def main(argv):
  del argv
  import meshtf as mtf
  if FLAGS.mesh_shape is None and FLAGS.layout is None:
    layouts = PAPER_LAYOUTS
  else:
    layouts = [("your layout", FLAGS.mesh_shape or "rows:2;cols:4",
                FLAGS.layout if FLAGS.layout is not None else
                "batch:rows;hidden:cols")]
  for _, mesh_shape, _ in layouts:
    size = mtf.convert_to_shape(mesh_shape).size
    if size > FLAGS.num_virtual_cpus:
      raise mtf.LayoutError(
          "mesh %s needs %d devices but --num_virtual_cpus=%d; raise "
          "--num_virtual_cpus or shrink the mesh" % (
              mesh_shape, size, FLAGS.num_virtual_cpus))
  devices = mtf.virtual_cpu_devices(FLAGS.num_virtual_cpus)
  startup.devices_ready()   # TensorFlow's start-up lines are over
  if len(layouts) > 1:
    compare_layouts(layouts, FLAGS.batch_size, FLAGS.d_io, FLAGS.d_hidden,
                    FLAGS.steps, FLAGS.learning_rate, devices, FLAGS.seed,
                    backend=FLAGS.backend)
    return
  _, mesh_shape, layout = layouts[0]
  losses, _ = train(mesh_shape, layout, FLAGS.batch_size, FLAGS.d_io,
                    FLAGS.d_hidden, FLAGS.steps, FLAGS.learning_rate,
                    devices, FLAGS.seed, backend=FLAGS.backend)
  print("final loss %.6f (first %.6f)" % (losses[-1], losses[0]))


def run():
  """Entry point: bad flags or layouts exit non-zero with one line."""
  try:
    app.run(main)
  except (ValueError, TypeError) as e:  # LayoutError is a ValueError
    print("error: %s" % e, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()
