"""Checkpoints stay layout-free under weight-update sharding: a run whose
variables (and Adam's slots) are stored split over the data axis saves
full values; they restore bit-equal into plain data parallelism and into
another variable layout, and training continues with the same losses."""
import numpy as np
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import optimize
from meshtf.train import checkpoint

X = harness.random_array([8, 4], 0)
Y = harness.random_array([8, 6], 1)
MESH = "data:8"


def train_fn(variable_layout, store):
  """One Adam step of a 2-layer model per call; batch split over data."""
  def build(mesh, x, y):
    x = mtf.import_tf_tensor(mesh, x, "batch:8;io:4")
    y = mtf.import_tf_tensor(mesh, y, "batch:8;out:6")
    w1 = mtf.get_variable(mesh, "w1", "io:4;hidden:16")
    w2 = mtf.get_variable(mesh, "w2", "hidden:16;out:6")
    h = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8;hidden:16"))
    loss = mtf.reduce_mean(mtf.square(
        mtf.einsum([h, w2], output_shape="batch:8;out:6") - y))
    optimize.AdamWeightDecayOptimizer(
        0.05, bias_correction=True).apply_grads(
        mtf.gradients([loss], [w1, w2]), [w1, w2])
    return loss
  impl = harness.make_impl("simd", MESH, "batch:data", variable_layout)
  return mtf.MeshFunction(build, impl, variable_store=store)


def steps(fn, n):
  return [float(fn(tf.constant(X), tf.constant(Y))) for _ in range(n)]


def test_save_sharded_restore_under_other_variable_layouts(tmp_path):
  sharded = train_fn("hidden:data", mtf.VariableStore())
  first = steps(sharded, 2)
  manager = checkpoint.CheckpointManager(str(tmp_path))
  manager.save(sharded.variable_store, 2)
  saved = {n: sharded.variable_store.full_value(n)
           for n in sharded.variable_store.names()}
  assert "w1/slot_m" in saved
  entry = sharded.variable_store.entry("w1/slot_m")
  assert entry.mesh_layout.slice_size(entry.shape) * 8 == entry.shape.size
  later = steps(sharded, 2)
  for variable_layout in (None, "io:data;out:data"):
    store = mtf.VariableStore()
    fn = train_fn(variable_layout, store)
    manager.restore(store)
    resumed = steps(fn, 2)
    np.testing.assert_allclose(resumed, later, rtol=1e-5,
                               err_msg=str(variable_layout))
  assert later[-1] < first[0]
  # Bit for bit: restored into variables stored split another way.
  store = mtf.VariableStore()
  manager.restore(store)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  for name, value in saved.items():
    mtf.get_variable(mesh, name, sharded.variable_store.entry(name).shape,
                     dtype=sharded.variable_store.entry(name).dtype)
  mtf.Lowering(graph, {mesh: harness.make_impl("simd", MESH, "",
                                               "out:data;io:data")},
               variable_store=store)
  for name, value in saved.items():
    np.testing.assert_array_equal(store.full_value(name), value, name)
