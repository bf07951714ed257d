"""The paper's two-layer network (section 8): four layouts on 8 devices give
the single-device numbers; the illegal layout fails clearly; Table 1's
communication volumes hold; the example binary runs."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.examples import two_layer

B, D_IO, D_H = 16, 8, 32

PAPER_LAYOUTS = [
    ("all:8", "batch:all"),                                  # data-parallel
    ("all:8", "hidden:all"),                                 # model-parallel
    ("rows:2;cols:4", "batch:rows;hidden:cols"),             # 2-D
    ("rows:2;cols:2;planes:2", "batch:rows;hidden:cols;io:planes"),  # 3-D
]


def harness_model(mesh, inputs):
  batch, io, hidden = two_layer.dims(B, D_IO, D_H)
  w = mtf.get_variable(mesh, "w", [io, hidden],
                       initializer=mtf.random_normal_initializer(stddev=0.3))
  bias = mtf.get_variable(mesh, "bias", [hidden],
                          initializer=mtf.random_uniform_initializer(-0.1, 0.1))
  v = mtf.get_variable(mesh, "v", [hidden, io],
                       initializer=mtf.random_normal_initializer(stddev=0.2))
  h = mtf.relu(mtf.einsum([inputs["x"], w], output_shape=[batch, hidden])
               + bias)
  y = mtf.einsum([h, v], output_shape=[batch, io])
  return {"y": y, "loss": mtf.reduce_mean(mtf.square(y - inputs["target"]))}


def test_four_paper_layouts_match_one_device():
  x, target = two_layer.make_data(B, D_IO, D_H, seed=3)
  inputs = {"x": (x, "batch:%d;io:%d" % (B, D_IO)),
            "target": (target, "batch:%d;io:%d" % (B, D_IO))}
  runs = harness.assert_layout_invariant(harness_model, inputs, PAPER_LAYOUTS,
                                         wrt=["x"])
  assert set(next(iter(runs.values())).grads) == {"x", "w", "bias", "v"}


def test_illegal_layout_batch_and_hidden_on_one_axis():
  x, target = two_layer.make_data(B, D_IO, D_H, seed=3)
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "mesh")
  batch, io, hidden = two_layer.dims(B, D_IO, D_H)
  loss, variables, _ = two_layer.two_layer_loss(mesh, x, target, batch, io,
                                                hidden)
  mtf.gradients([loss], variables)
  store = mtf.VariableStore()
  impl = harness.make_impl("placement", "all:8", "batch:all;hidden:all")
  with pytest.raises(mtf.LayoutError) as e:
    mtf.Lowering(graph, {mesh: impl}, variable_store=store)
  msg = str(e.value)
  assert "'batch'" in msg and "'hidden'" in msg and "'all'" in msg
  assert len(store) == 0, "no variable may be created before the error"


def allreduced_values_per_processor(mesh_shape, layout, b, d_io, d_h,
                                    backend):
  """Runs forward + backward (gradients for x and all variables, as in the
  middle of a network) and sums allreduced elements per processor."""
  x, target = two_layer.make_data(b, d_io, d_h, seed=0)
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "mesh")
  batch, io, hidden = two_layer.dims(b, d_io, d_h)
  loss, variables, x_t = two_layer.two_layer_loss(mesh, x, target, batch, io,
                                                  hidden)
  grads = mtf.gradients([loss], [x_t] + variables)
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      backend, mesh_shape, layout)}, outputs=[loss] + grads)
  for t in [loss] + grads:
    lowering.export_to_tf_tensor(t)
  return sum(s["elements_per_device"] * s["count"]
             for s in lowering.collective_stats()
             if s["kind"].startswith("allreduce"))


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
@pytest.mark.parametrize("mesh_shape,layout,formula", [
    ("all:8", "batch:all", lambda b, io, h, r, c: 2 * io * h),
    ("all:8", "hidden:all", lambda b, io, h, r, c: 2 * b * io),
    ("rows:2;cols:4", "batch:rows;hidden:cols",
     lambda b, io, h, r, c: 2 * b * io / r + 2 * io * h / c),
])
def test_table1_allreduce_volume(mesh_shape, layout, formula, backend):
  b, d_io, d_h = 128, 64, 256
  sizes = mtf.convert_to_shape(mesh_shape).to_integer_list + [1]
  expected = formula(b, d_io, d_h, sizes[0], sizes[1])
  measured = allreduced_values_per_processor(mesh_shape, layout, b, d_io, d_h,
                                             backend)
  assert abs(measured - expected) <= 0.02 * expected, (measured, expected)


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
def test_training_is_layout_invariant_and_learns(backend):
  devices = harness.DEVICES
  l1, _ = two_layer.train("all:1", "", 16, 8, 32, 5, 0.5, devices,
                          log=lambda s: None, backend="placement")
  l8, step = two_layer.train("rows:2;cols:4", "batch:rows;hidden:cols", 16, 8,
                             32, 5, 0.5, devices, log=lambda s: None,
                             backend=backend)
  np.testing.assert_allclose(l8, l1, rtol=1e-5)
  assert l1[-1] < 0.7 * l1[0]
  w = step.variable_value("w")
  assert w.shape == (8, 32)


def test_compare_layouts_runs_the_four_paper_layouts():
  """What `python -m meshtf.examples.two_layer` prints with no flags: the
  four layouts, each with its collectives, the same losses, one table."""
  lines = []
  rows = two_layer.compare_layouts(two_layer.PAPER_LAYOUTS, 16, 8, 32, 3,
                                   0.5, harness.DEVICES, log=lines.append)
  assert [r["layout"] for r in rows] == [l for _, l in PAPER_LAYOUTS]
  for r in rows:
    np.testing.assert_allclose(r["losses"], rows[0]["losses"], rtol=1e-5)
    assert r["collectives"]["allreduce_sum"] >= 1
  text = "\n".join(lines)
  assert text.count("== ") == 4 and "collectives/step" in text
  # Table 1: model-parallel allreduces fewer values than data-parallel
  # here (b * d_io < d_io * d_h), and its row says so.
  assert rows[1]["allreduced_per_device"] < rows[0]["allreduced_per_device"]
  assert "every layout: the same 3 losses up to" in text


def _run_cli(*flags):
  return subprocess.run([sys.executable, "-m", "meshtf.examples.two_layer"]
                        + list(flags), capture_output=True, text=True,
                        timeout=300)


def test_cli_trains_and_prints_collectives():
  r = _run_cli("--steps=3", "--mesh_shape=all:8", "--layout=batch:all",
               "--batch_size=16", "--d_io=8", "--d_hidden=16",
               "--backend=placement")
  assert r.returncode == 0, r.stderr
  assert "allreduce_sum" in r.stdout and "step   2" in r.stdout
  assert "final loss" in r.stdout


@pytest.mark.parametrize("flags,needle", [
    (["--layout=batch:all;hidden:all", "--mesh_shape=all:8"], "'hidden'"),
    (["--layout=batch:rowz"], "'rowz'"),
    (["--mesh_shape=rows:3;cols:4"], "12"),
    (["--mesh_shape=rows:2;cols:4", "--layout=batch:rows;io:rows"], "'io'"),
    (["--mesh_shape=rows:2;cols"], "name:size"),
])
def test_cli_bad_input_one_line_nonzero(flags, needle):
  r = _run_cli("--steps=1", *flags)
  assert r.returncode != 0
  lines = [l for l in r.stderr.splitlines() if l.strip()
           and not l.startswith(("I0000", "W0000", "E0000", "WARNING:"))]
  assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
  assert needle in lines[0], lines
