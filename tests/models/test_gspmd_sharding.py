"""GSPMD's "2D finalized" Transformer sharding (GSPMD 5.1, Table 1,
Figure 7) as t2t_configs/gspmd_dense.py expresses it: weights laid out by
the rules (M on X, H and N on Y), activations annotated (batch on X, M, H
and N on Y). The tiny config trains on 8 virtual CPUs with the 1-device
losses and variables, and its forward pass allgathers BSM over Y and the
weights over X and reduce-scatters the layers' outputs over Y, as Figure 7
draws.
"""
import os

import numpy as np

import harness
from conftest import load_file
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer

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
