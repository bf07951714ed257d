"""The layout-equivalence harness.

`assert_layout_invariant` builds a model on a 1-device mesh and on many
(mesh shape, layout) pairs on 8 virtual CPU devices, on every backend, and
checks that forward values and gradients agree. Gradients are of the scalar
sum_k <output_k, cotangent_k> with fixed random cotangents, with respect to
the chosen inputs and every trainable variable. An optional TensorFlow
reference checks the single-device values and input gradients against
TensorFlow's own math and autodiff.

Example (in a test):
    def model(mesh, x):
      return {"y": mtf.relu(x["x"])}
    assert_layout_invariant(model, {"x": (np.ones([8, 4]), "batch:8;io:4")},
                            [("all:8", "batch:all")], wrt=["x"],
                            reference=lambda x: {"y": tf.nn.relu(x["x"])})
"""
import contextlib

import numpy as np
import tensorflow as tf

import meshtf as mtf
from meshtf.lowering import mesh_impl as mesh_impl_lib

from conftest import DEVICES

# name -> constructor(mesh_shape, layout, devices): every test of the harness
# runs on each.
BACKENDS = {
    "placement": mtf.PlacementMeshImpl,
    "simd": mtf.SimdMeshImpl,
}

TWO_D = ("rows:2;cols:4",)


def make_impl(backend, mesh_shape, layout, variable_layout=None):
  shape = mtf.convert_to_shape(mesh_shape)
  mesh_layout = mtf.MeshLayout(shape, layout, variable_layout)
  return BACKENDS[backend](mesh_layout, None, DEVICES[:shape.size])


def annotated(layout, annotations):
  """A layout entry of assert_layout_invariant with per-tensor layouts:
  `annotations` maps input names to mtf.shard layouts, and "_variables" to
  the MeshLayout's variable_rules.

  Example:
    >>> annotated("vocab:rows", {"x": "batch:cols;vocab:rows+cols"})
  """
  return (layout, tuple(sorted(annotations.items())))


def _layout_parts(layout):
  """(rules, {input: annotation}, variable rules) of a layout entry."""
  if isinstance(layout, tuple):
    rules, annotations = layout
    annotations = dict(annotations)
    return rules, annotations, annotations.pop("_variables", None)
  return layout, {}, None


def random_array(shape, seed, dtype=np.float32, low=-1.0, high=1.0):
  rs = np.random.RandomState(seed)
  return rs.uniform(low, high, size=shape).astype(dtype)


class RunResult(object):
  def __init__(self, outputs, grads, lowering, graph):
    self.outputs = outputs
    self.grads = grads
    self.lowering = lowering
    self.graph = graph


def run_model(model_fn, inputs, mesh_shape, layout, backend="placement",
              wrt=(), seed=0, cotangent_seed=1234):
  """Builds and lowers model_fn on one mesh; returns numpy values.

  inputs: {name: (numpy array, meshtf shape string)}.
  model_fn(mesh, {name: meshtf Tensor}) -> {name: meshtf Tensor}.
  """
  rules, annotations, variable_layout = _layout_parts(layout)
  graph = mtf.Graph(seed=seed)
  mesh = mtf.Mesh(graph, "mesh")
  mtf_inputs = {name: mtf.import_tf_tensor(mesh, tf.constant(arr), shape,
                                           name="input_" + name)
                for name, (arr, shape) in sorted(inputs.items())}
  imported = dict(mtf_inputs)
  for name, spec in sorted(annotations.items()):
    if name in mtf_inputs:   # one layout list may serve several tests
      mtf_inputs[name] = mtf.shard(mtf_inputs[name], spec)
  outputs = model_fn(mesh, mtf_inputs)
  terms = []
  for i, (name, t) in enumerate(sorted(outputs.items())):
    if t.dtype.is_floating:
      c = mtf.import_tf_tensor(mesh, tf.constant(random_array(
          t.shape.to_integer_list, cotangent_seed + i,
          t.dtype.as_numpy_dtype)), t.shape, name="cotangent_" + name)
      # One dtype for the objective, whatever the outputs' float types.
      terms.append(mtf.cast(mtf.reduce_sum(t * c), tf.float32))
  wrt_tensors = [imported[n] for n in wrt] + [
      v.outputs[0] for v in graph.trainable_variables]
  wrt_names = list(wrt) + [v.name for v in graph.trainable_variables]
  grads = {}
  if terms and wrt_tensors:
    objective = mtf.add_n(terms)
    for n, g in zip(wrt_names, mtf.gradients([objective], wrt_tensors)):
      grads[n] = g
  impl = make_impl(backend, mesh_shape, rules, variable_layout)
  # Only what is compared leaves the SPMD program (returning every tensor
  # would keep every intermediate alive and copy it out).
  wanted = list(outputs.values()) + [g for g in grads.values() if g is not None]
  # Padding of uneven splits holds NaN / huge values: an op that reads
  # padding it should ignore corrupts the compared numbers.
  with graph_optimizer_off(), mesh_impl_lib.poison_padding():
    lowering = mtf.Lowering(graph, {mesh: impl}, outputs=wanted)
    out_np = {n: lowering.export_to_tf_tensor(t).numpy()
              for n, t in outputs.items()}
    grad_np = {n: (None if g is None
                   else lowering.export_to_tf_tensor(g).numpy())
               for n, g in grads.items()}
  return RunResult(out_np, grad_np, lowering, graph)


@contextlib.contextmanager
def graph_optimizer_off():
  """Grappler off while the harness runs a model once: optimising the eager
  launch graph (8 copies of the program) is ~a third of an SPMD run and
  changes no value compared here. Graphs that run many times (MeshFunction,
  TrainStep, the example binary and bench/) are tested with it on."""
  saved = tf.config.optimizer.get_experimental_options()
  tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
  try:
    yield
  finally:
    tf.config.optimizer.set_experimental_options(
        dict(saved, disable_meta_optimizer=saved.get("disable_meta_optimizer",
                                                     False)))


def _splits_something(result, mesh_shape, layout, backend):
  lowering = result.lowering
  return any(s.is_split for op in result.graph.operations for t in op.outputs
             for s in lowering.layout_of(t).dim_splits(t))


def assert_close(actual, expected, rtol, atol, what):
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol,
                             err_msg=what)


def assert_layout_invariant(model_fn, inputs, layouts, wrt=(), reference=None,
                            backends=None, rtol=1e-5, atol=1e-5, seed=0):
  """Asserts that every (mesh_shape, layout) in `layouts`, on every backend,
  gives the single-device outputs and gradients. Returns the runs."""
  backends = backends or list(BACKENDS)
  base = run_model(model_fn, inputs, "all:1", "", backends[0], wrt, seed)
  if reference is not None:
    _check_reference(reference, inputs, base, wrt, rtol, atol)
  runs = {}
  for backend in backends:
    for mesh_shape, layout in layouts:
      label = "%s mesh=%s layout=%s" % (backend, mesh_shape, layout)
      run = run_model(model_fn, inputs, mesh_shape, layout, backend, wrt, seed)
      assert _splits_something(run, mesh_shape, layout, backend), (
          "%s splits no tensor: the test would prove nothing" % label)
      for n, v in base.outputs.items():
        if np.issubdtype(v.dtype, np.floating):
          assert_close(run.outputs[n], v, rtol, atol, "%s output %s" % (label, n))
        else:
          np.testing.assert_array_equal(run.outputs[n], v,
                                        err_msg="%s output %s" % (label, n))
      for n, g in base.grads.items():
        if g is None:
          assert run.grads[n] is None, "%s grad %s" % (label, n)
        else:
          assert_close(run.grads[n], g, rtol, atol, "%s grad %s" % (label, n))
      runs[(backend, mesh_shape, layout)] = run
  return runs


def _check_reference(reference, inputs, base, wrt, rtol, atol):
  tf_inputs = {n: tf.constant(arr) for n, (arr, _) in inputs.items()}
  with tf.GradientTape() as tape:
    for n in wrt:
      tape.watch(tf_inputs[n])
    ref = reference(tf_inputs)
    objective = 0.0
    for i, (name, t) in enumerate(sorted(base.outputs.items())):
      if np.issubdtype(t.dtype, np.floating):
        c = random_array(list(t.shape), 1234 + i, t.dtype)
        objective += tf.cast(
            tf.reduce_sum(tf.cast(ref[name], t.dtype) * c), tf.float32)
  for n, v in base.outputs.items():
    r = np.asarray(ref[n])
    if np.issubdtype(v.dtype, np.floating):
      assert_close(v, r, rtol, atol, "reference output %s" % n)
    else:
      np.testing.assert_array_equal(v, r, err_msg="reference output %s" % n)
  if wrt and not isinstance(objective, float):
    ref_grads = tape.gradient(objective, [tf_inputs[n] for n in wrt])
    for n, g in zip(wrt, ref_grads):
      expected = (np.zeros_like(inputs[n][0]) if g is None
                  else tf.convert_to_tensor(g).numpy())  # IndexedSlices too
      got = base.grads[n]
      got = np.zeros_like(expected) if got is None else got
      assert_close(got, expected, rtol, atol, "reference grad %s" % n)
