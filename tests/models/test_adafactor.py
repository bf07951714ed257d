"""Adafactor's factor_dims_together (meshtf/models/adafactor.py).

A weight [io:8, heads:4, d_kv:4] with ("heads", "d_kv") factored together
takes the same steps as the same values held as [io:8, hk:16] (Mesh TF's
combined attention variables): equal weights and accumulators (reshaped)
after a step, on one device and on layouts splitting io, heads, hk and
d_kv, on both backends, for the input projections' order ([io, heads,
d_kv]) and the output projection's ([heads, d_kv, io]).
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import adafactor

W = harness.random_array([8, 16], 0)
X = harness.random_array([6, 8], 1)


def _steps(mesh_shape, layout, backend, order):
  """Weights and slots after a step (at step 5) of the two twins; order "io_first"
  ([io, heads, d_kv] vs [io, hk]) or "io_last" (the output projection's
  [heads, d_kv, io] vs [hk, io])."""
  graph = mtf.Graph(seed=0)
  mesh = mtf.Mesh(graph, "m")
  opt = adafactor.AdafactorOptimizer(
      min_dim_size_to_factor=4, factor_dims_together=[("heads", "d_kv")])
  w_np = W if order == "io_first" else W.T
  three = "io:8;heads:4;d_kv:4" if order == "io_first" else (
      "heads:4;d_kv:4;io:8")
  two = "io:8;hk:16" if order == "io_first" else "hk:16;io:8"
  w3 = mtf.get_variable(mesh, "w3", three, initializer=mtf.constant_initializer(
      w_np.reshape(mtf.convert_to_shape(three).to_integer_list)))
  w2 = mtf.get_variable(mesh, "w2", two, initializer=mtf.constant_initializer(
      w_np))
  x = mtf.import_tf_tensor(mesh, tf.constant(X), "batch:6;io:8")
  y3 = mtf.reshape(mtf.einsum([x, w3], output_shape="batch:6;heads:4;d_kv:4"),
                   "batch:6;hk:16")
  y2 = mtf.einsum([x, w2], output_shape="batch:6;hk:16")
  loss = mtf.reduce_sum(mtf.square(y3 - 0.5)) + mtf.reduce_sum(
      mtf.square(y2 - 0.5))
  grads = mtf.gradients([loss], [w3, w2])
  opt.apply_grads(grads, [w3, w2], step=mtf.constant(mesh, 5, dtype=tf.int32))
  store = mtf.VariableStore()
  mtf.Lowering(graph, {mesh: harness.make_impl(backend, mesh_shape, layout)},
               variable_store=store)
  return {n: np.asarray(store.full_value(n)) for n in store.names()}


@pytest.mark.parametrize("order", ["io_first", "io_last"])
def test_grouped_dims_factor_as_the_combined_dim(order):
  base = _steps("all:1", "", "simd", order)
  # Both twins factored, on the same dims: vr without the largest unit
  # (hk / heads*d_kv, 16), vc without the second (io).
  assert sorted(base) == ["w2", "w2/slot_vc", "w2/slot_vr", "w3",
                          "w3/slot_vc", "w3/slot_vr"]
  assert base["w3/slot_vr"].shape == (8,) and base["w3/slot_vc"].shape == (
      4, 4)
  runs = [base, _steps("rows:2;cols:4", "io:rows;heads:cols", "simd", order),
          _steps("rows:2;cols:2", "hk:rows;d_kv:cols", "placement", order)]
  for got in runs:
    for name in ("", "/slot_vr", "/slot_vc"):
      np.testing.assert_allclose(
          got["w3" + name].reshape(got["w2" + name].shape), got["w2" + name],
          rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(got["w3"], base["w3"], rtol=1e-5, atol=1e-6)
  assert not np.allclose(base["w2"], W if order == "io_first" else W.T)


def test_groups_must_be_factorable_dims():
  with pytest.raises(ValueError, match="factor_dims_together.*experts"):
    adafactor.AdafactorOptimizer(factor_dims_together=[("experts", "d_ff")])
  with pytest.raises(ValueError, match="two or more dims"):
    adafactor.AdafactorOptimizer(factor_dims_together=[("heads",)])
