"""The plan report (meshtf/plan/): per-device memory, flops and
collectives of a graph under a mesh layout, without devices -- exact
against hand counts on the paper's two-layer network, equal to what a run
emits, and the papers' scaling claims on their own configs."""
import os

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from conftest import load_file
import meshtf.plan  # noqa: F401
from meshtf.plan import hardware
from meshtf.train import config as config_lib
from meshtf.train import experiment

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIGS = os.path.join(ROOT, "t2t_configs")
B, IO, H = 128, 64, 256


def _config(name, row=None):
  return config_lib.load_file(os.path.join(CONFIGS, name + ".py"), row)


def two_layer_step(mesh):
  """The Mesh-TF paper's network in the middle of a model: forward,
  gradients of the weights and of x (passed to the previous layer, here a
  variable), SGD on the weights."""
  batch, io, hidden = (mtf.Dimension("batch", B), mtf.Dimension("io", IO),
                       mtf.Dimension("hidden", H))
  x = mtf.zeros(mesh, [batch, io])
  w = mtf.get_variable(mesh, "w", [io, hidden])
  bias = mtf.get_variable(mesh, "bias", [hidden])
  v = mtf.get_variable(mesh, "v", [hidden, io])
  h = mtf.relu(mtf.einsum([x, w], output_shape=[batch, hidden]) + bias)
  y = mtf.einsum([h, v], output_shape=[batch, io])
  loss = mtf.reduce_sum(mtf.square(y))
  dx, *grads = mtf.gradients([loss], [x, w, bias, v])
  sink = mtf.get_variable(mesh, "previous_layer_grad", [batch, io],
                          trainable=False)
  mtf.assign(sink, dx)
  for var, g in zip([w, bias, v], grads):
    mtf.assign_sub(var, g * 0.1)
  return loss


def _plan(mesh_shape, layout, **kwargs):
  graph = mtf.Graph()
  two_layer_step(mtf.Mesh(graph, "m"))
  return mtf.plan.plan(graph, mtf.MeshLayout(mesh_shape, layout), **kwargs)


@pytest.mark.parametrize("mesh_shape,layout,r,c", [
    ("all:8", "batch:all", 8, 1),
    ("all:8", "hidden:all", 1, 8),
    ("rows:2;cols:4", "batch:rows;hidden:cols", 2, 4)])
def test_two_layer_counts_are_exact(mesh_shape, layout, r, c):
  """Mesh-TF Table 1, exactly: allreduced values per processor are
  2 b io / r (y forward, dx backward, over the hidden split) + 2 io h / c
  (the w and v gradients over the batch split) + h / c (the bias gradient)
  + 1 (the exported loss); flops and memory by hand."""
  report = _plan(mesh_shape, layout)
  s = report.summary()
  allreduced = sum(x["elements_per_device"] * x["count"]
                   for x in s["collectives"] if x["kind"] == "allreduce_sum")
  b, h = B // r, H // c
  batch_split, hidden_split = r > 1, c > 1
  expected = (2 * b * IO if hidden_split else 0) + (
      (2 * IO * h + h) if batch_split else 0)
  # Plus the loss, which nothing in the step reads: a run exports it, so
  # the plan sums it over the batch split as the export would.
  expected += 1 if batch_split else 0
  assert allreduced == expected, (allreduced, expected)
  # Six einsums of b x io x h per device: 2 forward, dh, dv, dw, dx.
  assert s["flops_by_family"]["einsum"] == 6 * 2 * b * IO * h
  mem = s["memory_bytes_per_device"]
  assert mem["parameters"] == (2 * IO * h + h) * 4
  assert mem["optimizer_state"] == b * IO * 4      # the sink variable
  # Kept for the backward pass: x (read by dw), relu's output h (read by
  # dv and by relu's gradient) and y (read by the square's gradient).
  assert mem["activations_saved"] == (2 * b * IO + b * h) * 4
  assert mem["peak"] >= mem["parameters"] + mem["activations_saved"]


def test_the_plan_traces_what_a_run_emits():
  """The traced program's collectives equal a real run's on 8 CPUs that
  exports the loss; a gradient nothing applies still costs its allreduce
  (a run that exports it pays it)."""
  mesh_shape, layout = "rows:2;cols:4", "batch:rows;hidden:cols"
  planned = _plan(mesh_shape, layout).collectives
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  loss = two_layer_step(mesh)
  impl = harness.make_impl("simd", mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[loss])
  lowering.export_to_tf_tensor(loss)
  assert planned == lowering.collective_stats() and planned
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", "io:64;hidden:256")
  x = mtf.zeros(mesh, "batch:128;io:64")
  loss = mtf.reduce_sum(mtf.einsum([x, w], "batch:128;hidden:256"))
  grad_w, = mtf.gradients([loss], [w])   # nothing applies it
  kinds = [(r["kind"], r["elements_per_device"]) for r in mtf.plan.plan(
      graph, mtf.MeshLayout(mesh_shape, layout)).collectives]
  assert ("allreduce_sum", 64 * 256 // 4) in kinds, kinds


def test_step_time_model_and_screen():
  report = _plan("rows:2;cols:4", "batch:rows;hidden:cols",
                 hardware="h100_8x_node")
  s = report.summary()
  # NCCL's stream: the collectives run beside the compute that does not
  # need them, so the step is between the longer one and their sum.
  assert (max(s["compute_seconds"], s["collective_seconds"]) <=
          s["step_seconds"] <= s["compute_seconds"] +
          s["collective_seconds"] + 1e-12)
  assert s["step_seconds"] == pytest.approx(
      s["compute_seconds"] + s["exposed_collective_seconds"])
  # 8 GPUs of one node: NVLink bandwidth; the compute is the einsums'.
  assert 0 < s["compute_seconds"] < 1e-3 and s["fits_in_memory"]
  text = report.text()
  for part in ("memory per device", "flops per device",
               "collectives per step", "step time estimate",
               "NVLink", "beside the compute", "not hidden by compute",
               "NVIDIA H100 SXM datasheet"):
    assert part in text, text
  # Without overlap (this machine's calibrated model): the sum.
  s = _plan("rows:2;cols:4", "batch:rows;hidden:cols").summary()
  assert s["step_seconds"] == pytest.approx(s["compute_seconds"] +
                                            s["collective_seconds"])
  assert '"step_seconds"' in report.to_json()
  with pytest.raises(ValueError, match="unknown hardware model 'tpu9'"):
    _plan("all:8", "batch:all", hardware="tpu9")


def _paper_memory(name, row, exclude=None):
  """Per-device memory of a paper config's training step (without
  variables whose name contains `exclude`, if given)."""
  c = _config(name, row)
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  memory = mtf.plan.plan(graph, layout, "tpuv3", trace=False).summary()[
      "memory_bytes_per_device"]
  if exclude:
    graph_layout = layout.assign(graph.operations)
    for v in graph.all_variables:
      if exclude in v.name:
        key = ("parameters" if v in graph.trainable_variables
               else "optimizer_state")
        memory[key] -= graph_layout.tensor_mesh_layout(
            v.outputs[0]).slice_size(v.shape) * v.dtype.size
  return memory


def test_gshard_moe_memory_per_device_stays_flat():
  """GShard: experts grow with devices (one expert per core), so each
  core's weights and optimizer state stay the same from 128 to 2048
  experts (12 layers) -- all but the routers' [d_model, experts] weights,
  which every core holds whole (2.5% of its bytes at 2048 experts)."""
  mems = [_paper_memory("gshard_moe", row, exclude="top_2_gating")
          for row in ("128E_12L", "512E_12L", "2048E_12L")]
  for m in mems[1:]:
    assert m["parameters"] == pytest.approx(mems[0]["parameters"], rel=0.01)
    assert m["optimizer_state"] == pytest.approx(mems[0]["optimizer_state"],
                                                 rel=0.01)


def test_gspmd_2d_finalized_long_lived_memory_scales_with_devices():
  """GSPMD 5.1: with the 2D finalized sharding every weight matrix splits
  over all X * Y devices: 4x the devices, 1/4 the bytes (the vectors --
  norm scales, Adafactor's factored accumulators -- split over one axis,
  and are under 1% of the bytes); the activations kept per device stay
  flat (the batch grows with X, d_model splits over Y)."""
  mems = [_paper_memory("gspmd_dense", row)
          for row in ("64B_8x16", "64B_16x32", "64B_32x64")]
  for small, big in zip(mems, mems[1:]):
    assert big["parameters"] == pytest.approx(small["parameters"] / 4,
                                              rel=0.005)
    long_lived = lambda m: m["parameters"] + m["optimizer_state"]  # noqa
    assert long_lived(big) == pytest.approx(long_lived(small) / 4, rel=0.02)
    assert big["activations_saved"] == pytest.approx(
        small["activations_saved"], rel=0.05)


def test_hardware_models_say_their_assumptions():
  for hw in hardware.HARDWARE.values():
    lines = hw.describe()
    assert len(lines) >= 3 and lines[0].startswith(hw.name)


def test_visualize_layout_shows_each_processors_slice():
  from meshtf.plan import visualize_layout
  text = visualize_layout("batch:64;hidden:128", mtf.MeshLayout(
      "rows:2;cols:4", "batch:rows;hidden:cols"))
  lines = text.splitlines()
  assert lines[0] == "[batch:64, hidden:128] on rows:2 x cols:4"
  assert lines[2].split() == ["rows=0", "b[0:32]", "h[0:32]", "b[0:32]",
                              "h[32:64]", "b[0:32]", "h[64:96]", "b[0:32]",
                              "h[96:128]"]
  # Uneven and over two axes: the last processors hold only padding.
  text = visualize_layout("heads:6", mtf.MeshLayout("x:2;y:4", "heads:x+y"))
  assert text.splitlines()[-1].split() == ["x=1", "h[4:5]", "h[5:6]",
                                           "h[-]", "h[-]"]
  # A tensor with an annotated layout, through its lowering.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  t = mtf.shard(mtf.zeros(mesh, "batch:8;io:4"), "io:y")
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "placement", "x:2;y:4", "batch:x")}, outputs=[t])
  text = visualize_layout(t, lowering.mesh_impl(t), lowering)
  assert "i[0:1]" in text and "b[" not in text
  # Dims sharing a prefix get prefixes that start only their own name.
  text = visualize_layout("d_model:8;d_ff:16", mtf.MeshLayout(
      "x:2;y:2", "d_model:x;d_ff:y"))
  assert text.splitlines()[-1].split() == [
      "x=1", "d_m[4:8]", "d_f[0:8]", "d_m[4:8]", "d_f[8:16]"]


def test_the_plan_says_why_each_collective_exists():
  """report.explain(), traced or estimated, ranks the collectives by bytes
  and gives each its reason: the two-layer step's weight gradients are
  partial sums over rows because the rule splits batch over rows, reduced
  together; the forward's partial sums over cols come from the rule
  splitting hidden over cols."""
  mesh_shape, layout = "rows:2;cols:4", "batch:rows;hidden:cols"
  for trace in (True, False):
    report = _plan(mesh_shape, layout, trace=trace)
    reasons = [r for c in report.collectives for r in c["reasons"]]
    assert len(reasons) == sum(c["count"] for c in report.collectives)
    assert all(r is not None for r in reasons), trace
    causes = {r.cause for r in reasons}
    assert {"bucket", "reduce"} <= causes, causes
    bucket = [r for r in reasons if r.cause == "bucket"][0]
    assert "sums batch:rows (rules batch:rows)" in bucket.held
    y_sum = [r for r in reasons if r.cause == "reduce" and
             "hidden:cols (rules hidden:cols)" in r.held]
    assert y_sum, reasons
    text = report.explain(top=2)
    assert text.count("held:") == 2 and "rules batch:rows" in text
    top = report.summary()["top_collectives"]
    assert top[0]["reason"]["cause"] in causes
    assert top[0]["bytes_per_device"] * top[0]["count"] >= \
        top[-1]["bytes_per_device"] * top[-1]["count"]


def test_gspmd_64b_finalized_plans_figure_7s_traffic():
  """GSPMD 64B, 2D finalized, bfloat16 activations (as the paper), on the
  estimate path: the sharding completion lays out the backward pass as
  Figure 7's forward transposed, so on 8x16, 16x32 and 32x64 the backward
  sends at most 1.1x the forward's bytes, the step's total is within 10%
  of Figure 7's pattern summed over the layers (bench/propagation.py's
  figure_7_records, derived from the figure: 74.6 GB on 16x32), and the
  planned step within 5% of the same compute with that traffic (both with
  the collectives one after another; the overlapped step is shorter)."""
  bench = load_file("bench/propagation.py", "propagation")
  config = os.path.join(CONFIGS, "gspmd_dense.py")
  c = _config("gspmd_dense", "64B_16x32")
  c.activation_dtype = "bfloat16"
  minimum = sum(r["bytes_per_device"] * r["count"]
                for r in bench.figure_7_records(c))
  # 2 L [4 (Y-1) e a + (X-1)/(XY) (4 M N D + 2 M H) w], e = B/X S M/Y.
  e = 256 // 16 * 1024 * 8192 // 32
  assert minimum == 2 * 32 * (4 * 31 * e * 2 + 15 * (
      4 * 8192 * 128 * 256 + 2 * 8192 * 65536) // 512 * 2) == 74625056768
  for row in ("64B_8x16", "64B_16x32", "64B_32x64"):
    r = bench.plan_row(config, row, ROOT)
    assert r["backward_bytes"] <= 1.1 * r["forward_bytes"], r
    assert abs(r["total_over_figure_7"] - 1) <= 0.10, r
    assert abs(r["step_over_figure_7"] - 1) <= 0.05, r
