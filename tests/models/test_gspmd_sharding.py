"""GSPMD's "2D finalized" Transformer sharding (GSPMD 5.1, Table 1,
Figure 7) as t2t_configs/gspmd_dense.py expresses it: weights laid out by
the rules (M on X, H and N on Y), activations annotated (batch on X, M, H
and N on Y). The tiny config trains on 8 virtual CPUs with the 1-device
losses and variables, and its forward pass allgathers BSM over Y and the
weights over X and reduce-scatters the layers' outputs over Y, as Figure 7
draws.
"""
import collections
import os

import numpy as np
import tensorflow as tf

import harness
import meshtf as mtf
import meshtf.plan  # noqa: F401
from conftest import load_file
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.ops import annotations
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer
from meshtf.train import config as config_lib
from meshtf.train import experiment

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "t2t_configs",
                      "gspmd_dense.py")


def _config(arg):
  return load_file(CONFIG, "gspmd_dense").get_config(arg)


def _lm(c, annotated):
  return transformer.make_unitransformer(
      vocab_size=c.vocab_size, d_model=c.d_model, num_layers=c.num_layers,
      num_heads=c.num_heads, d_kv=c.d_kv, d_ff=c.d_ff, max_length=c.length,
      vocab_divisor=c.vocab_divisor, z_loss=1e-3,
      activation_layout=c.activation_layout if annotated else None)


def _train(c, backend, mesh_shape, layout, annotated, steps=2):
  step_fn = training.TrainStep(
      transformer.loss_fn(_lm(c, annotated)),
      harness.make_impl(backend, mesh_shape, layout,
                        c.variable_layout if annotated else None),
      optimize.AdafactorOptimizer(learning_rate=0.05))
  targets = np.random.RandomState(0).randint(
      2, c.vocab_size, size=[c.batch_size, c.length]).astype(np.int32)
  losses = []
  with mesh_impl_lib.poison_padding():
    for _ in range(steps):
      losses.append(float(step_fn({"targets": targets})["loss"]))
  store = step_fn.variable_store
  return (losses, {n: store.full_value(n) for n in store.names()},
          step_fn.mesh_function.lowering)


def test_tiny_2d_finalized_trains_like_one_device_with_figure_7():
  c = _config("tiny")
  assert c.activation_layout == "batch:x;d_model:y;d_ff:y;heads:y"
  base_losses, base_vars, _ = _train(c, "placement", "all:1", "", False)
  assert base_losses[-1] < base_losses[0]
  for backend in harness.BACKENDS:
    losses, variables, lowering = _train(c, backend, c.mesh_shape, c.layout,
                                         True)
    np.testing.assert_allclose(losses, base_losses, rtol=2e-5,
                               err_msg=backend)
    for name, value in base_vars.items():
      np.testing.assert_allclose(variables[name], value, rtol=1e-3,
                                 atol=1e-4, err_msg="%s %s" % (backend, name))
    kinds = {(s["kind"], s["mesh_axes"]) for s in lowering.collective_stats()}
    # Figure 7: AG-y of the activations, AG-x of the weights, RS-y of the
    # layers' outputs (and RS-x of the weights' gradients, backward).
    assert ("allconcat", ("y",)) in kinds and ("allconcat", ("x",)) in kinds
    assert ("reduce_scatter", ("y",)) in kinds, kinds
    assert ("reduce_scatter", ("x",)) in kinds, kinds
    # Every weight with two of d_model / d_ff / heads / vocab is stored
    # split over all 8 devices.
    layout_of = lowering.layout_of
    ruled = {"d_model", "d_ff", "heads", "vocab"}
    for op in lowering.graph.trainable_variables:
      value = op.outputs[0]
      if len(ruled & set(value.shape.dimension_names)) >= 2:
        assert layout_of(value).slice_size(value.shape) * 8 == \
            value.shape.size, (op.name, layout_of(value).tensor_layout(value))


B, S, M, H = 4, 2, 8, 16


def _figure_7_ffn(mesh, values):
  """GSPMD Table 1's 2D finalized feed-forward layer and a loss: BSM
  [batch:x, d_model:y], BSH [batch:x, d_ff:y], weights [d_model:x,
  d_ff:y]. Returns (loss, [dW_in, dW_out, dBSM]), the gradients in their
  tensors' layouts (the previous layer reads dBSM like BSM)."""
  def imported(name, shape):
    return mtf.import_tf_tensor(mesh, tf.constant(values[name]), shape,
                                name=name)
  x = mtf.shard(imported("x", "batch:%d;length:%d;d_model:%d" % (B, S, M)),
                "batch:x;d_model:y")
  w_in = mtf.get_variable(mesh, "w_in", "d_model:%d;d_ff:%d" % (M, H),
                          layout="d_model:x;d_ff:y",
                          initializer=mtf.constant_initializer(values["wi"]))
  w_out = mtf.get_variable(mesh, "w_out", "d_ff:%d;d_model:%d" % (H, M),
                           layout="d_ff:y;d_model:x",
                           initializer=mtf.constant_initializer(
                               values["wo"]))
  h = mtf.shard(mtf.relu(mtf.einsum([x, w_in], reduced_dims=["d_model"])),
                "batch:x;d_ff:y")
  y = mtf.shard(mtf.einsum([h, w_out], reduced_dims=["d_ff"]),
                "batch:x;d_model:y")
  c = mtf.shard(imported("c", y.shape), "batch:x;d_model:y")
  loss = mtf.reduce_sum(y * c)
  dw_in, dw_out, dx = mtf.gradients([loss], [w_in, w_out, x])
  grads = optimize.in_variable_layouts([dw_in, dw_out], [w_in, w_out])
  return loss, grads + [annotations.LayoutLikeOperation(dx, x).outputs[0]]


def test_2d_finalized_ffn_forward_and_backward_are_figure_7():
  """The completion lays out the backward pass as the forward transposed:
  forward AG-y of BSM, AG-x of W_in and W_out, RS-y of the output BSM;
  backward AG-y of dBSM, RS-x of dW_in and dW_out, RS-y of dBSM (the
  forward's gathered weights reused) -- exactly these kinds, axes and
  bytes and nothing else but the loss's scalar sum, on both backends,
  with the single-device numbers."""
  rs = np.random.RandomState(3)
  values = {"x": rs.randn(B, S, M).astype(np.float32),
            "c": rs.randn(B, S, M).astype(np.float32),
            "wi": rs.randn(M, H).astype(np.float32),
            "wo": rs.randn(H, M).astype(np.float32)}

  def run(backend, mesh_shape):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    loss, grads = _figure_7_ffn(mesh, values)
    impl = harness.make_impl(backend, mesh_shape, "")
    lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[loss] + grads)
    got = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
    return got, lowering.collective_stats()

  base, _ = run("placement", "x:1;y:1")
  bsm = B // 2 * S * M // 4 * 4          # bytes of a BSM slice [bx, S, my]
  w = M // 2 * H // 4 * 4                # bytes of a weight slice [mx, hy]
  figure_7 = collections.Counter({
      ("allconcat", ("y",), 3 * bsm): 2,        # AG-y of BSM and of dBSM
      ("reduce_scatter", ("y",), 3 * bsm): 2,   # RS-y of BSM and of dBSM
      ("allconcat", ("x",), w): 2,              # AG-x of W_in, W_out
      ("reduce_scatter", ("x",), w): 2})        # RS-x of dW_in, dW_out
  for backend in harness.BACKENDS:
    got, stats = run(backend, "x:2;y:4")
    for g, b in zip(got, base):
      np.testing.assert_allclose(g, b, rtol=1e-4, atol=1e-4, err_msg=backend)
    kinds = collections.Counter()
    for s in stats:
      if s["elements_per_device"] > 1:
        kinds[(s["kind"], s["mesh_axes"], s["bytes_per_device"])] += \
            s["count"]
      else:
        assert s["kind"] == "allreduce_sum", s   # the loss's sum
    assert kinds == figure_7, (backend, kinds)


def test_tiny_2d_finalized_step_gathers_and_scatters_bsm_once_per_pass():
  """The whole training step of the tiny config (2 layers: 4 sublayers),
  traced: each sublayer gathers BSM over y once forward and dBSM once
  backward -- the keys' and values' rename costs no extra gather (its
  relayout is its input's, shared with the queries') -- and scatters the
  partial sums once each way: the norms' backward reads the gradient
  split, so no BSM-sized allreduce is left."""
  c = _config("tiny")
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  report = mtf.plan.plan(graph, layout)
  tensors = {t.name: t for op in graph.operations for t in op.outputs}
  bsm = ["batch", "length", "d_model"]
  e = c.batch_size // 2 * c.length * c.d_model // 4   # [bx, S, my] slice
  gathers = scatters = 0
  for s in report.collectives:
    for r in s["reasons"]:
      dims = tensors[r.tensor].shape.dimension_names \
          if r.tensor in tensors else None
      if s["kind"] == "allconcat" and s["mesh_axes"] == ("y",) and \
          dims == bsm:
        gathers += 1
      if s["kind"] == "reduce_scatter" and s["mesh_axes"] == ("y",) and \
          dims == bsm:
        scatters += 1
    if s["kind"].startswith("allreduce"):
      assert s["elements_per_device"] < e, s
  sublayers = 2 * c.num_layers
  # + the logits' input, gathered forward and scattered backward.
  assert (gathers, scatters) == (2 * sublayers + 1, 2 * sublayers + 1)
