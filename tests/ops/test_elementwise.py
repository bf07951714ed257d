"""Elementwise ops (meshtf/ops/elementwise.py): every layout gives the
single-device values and gradients, and those match TensorFlow.

Shapes: x is [batch:8, hidden:4]; the broadcasting partner y is
[hidden:4, io:2], so x op y is [batch, hidden, io]. Every layout below runs on
all 8 devices and splits at least one of the dims the op touches.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import elementwise

X_SHAPE = "batch:8;hidden:4"
Y_SHAPE = "hidden:4;io:2"

# [batch, hidden]: split batch, split hidden, split both.
XY_LAYOUTS = [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "hidden:cols"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
]
# [batch, hidden, io]: each dim split somewhere, and two at once.
BROADCAST_LAYOUTS = [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "hidden:cols"),
    ("rows:2;cols:4", "batch:cols;io:rows"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
]


def uniform(shape, seed, low=-1.0, high=1.0):
  return harness.random_array(shape, seed, low=low, high=high)


def positive(shape, seed):
  return uniform(shape, seed, 0.5, 2.0)


def collective_kinds(run):
  return {s["kind"] for s in run.lowering.collective_stats()}


def forward_run(model_fn, inputs, mesh_shape, layout):
  """Forward pass only (no gradient ops), so its collectives are the op's."""
  return harness.run_model(model_fn, inputs, mesh_shape, layout)


# --- unary -------------------------------------------------------------------
# name -> (meshtf fn, TensorFlow fn, input generator)
UNARY = {
    "exp": (mtf.exp, tf.exp, uniform),
    "log": (mtf.log, tf.math.log, positive),
    "sqrt": (mtf.sqrt, tf.sqrt, positive),
    "rsqrt": (mtf.rsqrt, tf.math.rsqrt, positive),
    "square": (mtf.square, tf.square, uniform),
    "tanh": (mtf.tanh, tf.tanh, uniform),
    "sigmoid": (mtf.sigmoid, tf.sigmoid, uniform),
    "relu": (mtf.relu, tf.nn.relu, uniform),
    "gelu": (mtf.gelu, lambda x: tf.nn.gelu(x, approximate=True), uniform),
    "abs": (mtf.abs, tf.abs, uniform),
    "sign": (mtf.sign, tf.sign, uniform),
    "negative": (mtf.negative, tf.negative, uniform),
    "reciprocal": (mtf.reciprocal, tf.math.reciprocal, positive),
    "sin": (mtf.sin, tf.sin, uniform),
    "cos": (mtf.cos, tf.cos, uniform),
    "identity": (mtf.identity, tf.identity, uniform),
    "squared_relu": (mtf.squared_relu, lambda x: tf.square(tf.nn.relu(x)),
                     uniform),
    "leaky_relu": (mtf.leaky_relu, lambda x: tf.nn.leaky_relu(x, 0.2),
                   uniform),
    "elu": (mtf.elu, tf.nn.elu, uniform),
    "selu": (mtf.selu, tf.nn.selu, uniform),
    "swish": (mtf.swish, tf.nn.silu, uniform),
    "softplus": (mtf.softplus, tf.nn.softplus, uniform),
    "to_bfloat16": (lambda x: mtf.to_float(mtf.to_bfloat16(x)),
                    lambda x: tf.cast(tf.cast(x, tf.bfloat16), tf.float32),
                    uniform),
    "to_float": (lambda x: mtf.to_float(mtf.cast(x, tf.float64)),
                 lambda x: tf.cast(tf.cast(x, tf.float64), tf.float32),
                 uniform),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
  mtf_fn, tf_fn, gen = UNARY[name]
  x = gen([8, 4], 0)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf_fn(t["x"])}, {"x": (x, X_SHAPE)},
      XY_LAYOUTS, wrt=["x"], reference=lambda t: {"y": tf_fn(t["x"])})


def test_sign_has_no_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, X_SHAPE)
  assert mtf.gradients([mtf.reduce_sum(mtf.sign(x))], [x]) == [None]


# --- binary, with broadcasting by name ------------------------------------------
# name -> (meshtf fn, TensorFlow fn, x generator, y generator)
BINARY = {
    "add": (mtf.add, tf.add, uniform, uniform),
    "sub": (mtf.sub, tf.subtract, uniform, uniform),
    "subtract": (mtf.subtract, tf.subtract, uniform, uniform),
    "multiply": (mtf.multiply, tf.multiply, uniform, uniform),
    "divide": (mtf.divide, tf.divide, uniform, positive),
    "maximum": (mtf.maximum, tf.maximum, uniform, uniform),
    "minimum": (mtf.minimum, tf.minimum, uniform, uniform),
    "pow": (mtf.pow, tf.pow, positive, uniform),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(name):
  mtf_fn, tf_fn, gen_x, gen_y = BINARY[name]
  x, y = gen_x([8, 4], 0), gen_y([4, 2], 1)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf_fn(t["x"], t["y"])},
      {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      wrt=["x", "y"],
      reference=lambda t: {"z": tf_fn(t["x"][:, :, None], t["y"][None])})


@pytest.mark.parametrize("name", ["add", "multiply", "maximum", "pow"])
def test_binary_same_shape(name):
  mtf_fn, tf_fn, gen_x, gen_y = BINARY[name]
  x, y = gen_x([8, 4], 2), gen_y([8, 4], 3)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf_fn(t["x"], t["y"])},
      {"x": (x, X_SHAPE), "y": (y, X_SHAPE)}, XY_LAYOUTS, wrt=["x", "y"],
      reference=lambda t: {"z": tf_fn(t["x"], t["y"])})


def test_binary_output_shape_reorders():
  x, y = uniform([8, 4], 4), uniform([4, 2], 5)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf.multiply(t["x"], t["y"],
                                         output_shape="io:2;batch:8;hidden:4")},
      {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      wrt=["x", "y"],
      reference=lambda t: {"z": tf.einsum("bh,hi->ibh", t["x"], t["y"])})


# Python numbers on either side: expression -> (fn, input generator). The
# same fn runs on meshtf and on TensorFlow tensors.
SCALAR_ARITHMETIC = {
    "x*2": (lambda x: x * 2.0, uniform),
    "2*x": (lambda x: 2.0 * x, uniform),
    "2-x": (lambda x: 2.0 - x, uniform),
    "x-2": (lambda x: x - 2.0, uniform),
    "x+1": (lambda x: x + 1.0, uniform),
    "1+x": (lambda x: 1.0 + x, uniform),
    "x/3": (lambda x: x / 3.0, uniform),
    "3/x": (lambda x: 3.0 / x, positive),
    "-x": (lambda x: -x, uniform),
    "x**2": (lambda x: x ** 2.0, positive),
    "x**0.5": (lambda x: x ** 0.5, positive),
    "(x*2-1)/4+x": (lambda x: (x * 2.0 - 1.0) / 4.0 + x, uniform),
}


@pytest.mark.parametrize("expr", sorted(SCALAR_ARITHMETIC))
def test_python_scalar_arithmetic(expr):
  fn, gen = SCALAR_ARITHMETIC[expr]
  x = gen([8, 4], 6)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": fn(t["x"])}, {"x": (x, X_SHAPE)}, XY_LAYOUTS,
      wrt=["x"], reference=lambda t: {"y": fn(t["x"])})


def test_binary_op_with_number():
  x = uniform([8, 4], 6)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.maximum(t["x"], 0.0) + mtf.minimum(0.5, t["x"])},
      {"x": (x, X_SHAPE)}, XY_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.maximum(t["x"], 0.0)
                                + tf.minimum(0.5, t["x"])})


def test_scalar_multiply_keeps_its_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, X_SHAPE)
  for y in (x * 2.0, 2.0 - x, x / 3.0, 1.0 + x):
    assert y.shape == x.shape and y.dtype == tf.float32


# --- comparisons and logical ops (bool outputs, checked exactly) ---------------
COMPARISONS = {
    "equal": (mtf.equal, tf.equal),
    "not_equal": (mtf.not_equal, tf.not_equal),
    "less": (mtf.less, tf.less),
    "less_equal": (mtf.less_equal, tf.less_equal),
    "greater": (mtf.greater, tf.greater),
    "greater_equal": (mtf.greater_equal, tf.greater_equal),
}


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_comparison(name):
  mtf_fn, tf_fn = COMPARISONS[name]
  # Small integers, so that equal elements occur.
  rs = np.random.RandomState(7)
  x = rs.randint(0, 3, size=[8, 4]).astype(np.float32)
  y = rs.randint(0, 3, size=[4, 2]).astype(np.float32)
  runs = harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf_fn(t["x"], t["y"])},
      {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      reference=lambda t: {"z": tf_fn(t["x"][:, :, None], t["y"][None])})
  z = next(iter(runs.values())).outputs["z"]
  assert z.dtype == np.bool_ and z.any() and not z.all()


LOGICAL = {
    "logical_and": (mtf.logical_and, tf.logical_and),
    "logical_or": (mtf.logical_or, tf.logical_or),
    "logical_xor": (mtf.logical_xor, tf.math.logical_xor),
}


@pytest.mark.parametrize("name", sorted(LOGICAL))
def test_logical_binary(name):
  mtf_fn, tf_fn = LOGICAL[name]
  rs = np.random.RandomState(8)
  x = rs.randint(0, 2, size=[8, 4]).astype(bool)
  y = rs.randint(0, 2, size=[4, 2]).astype(bool)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf_fn(t["x"], t["y"])},
      {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      reference=lambda t: {"z": tf_fn(t["x"][:, :, None], t["y"][None])})


def test_logical_not():
  x = np.random.RandomState(9).randint(0, 2, size=[8, 4]).astype(bool)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": mtf.logical_not(t["x"])}, {"x": (x, X_SHAPE)},
      XY_LAYOUTS, reference=lambda t: {"z": tf.logical_not(t["x"])})


# --- where ---------------------------------------------------------------------
def test_where_broadcasts_all_three():
  # condition [batch, hidden], x [hidden], y [batch] -> [hidden, batch].
  c = uniform([8, 4], 10)
  x, y = uniform([4], 11), uniform([8], 12)
  def model(mesh, t):
    return {"z": mtf.where(mtf.greater(t["c"], 0.0), t["x"], t["y"])}
  def reference(t):
    cond = tf.transpose(t["c"] > 0.0)
    return {"z": tf.where(cond, t["x"][:, None], t["y"][None, :])}
  runs = harness.assert_layout_invariant(
      model, {"c": (c, X_SHAPE), "x": (x, "hidden:4"), "y": (y, "batch:8")},
      XY_LAYOUTS, wrt=["c", "x", "y"], reference=reference)
  run = next(iter(runs.values()))
  assert run.outputs["z"].shape == (4, 8)
  assert run.grads["c"] is None  # no gradient through the condition


def test_where_with_number_and_partial_broadcast():
  x, y = uniform([8, 4], 13), uniform([4, 2], 14)
  def model(mesh, t):
    return {"a": mtf.where(mtf.greater(t["x"], 0.0), t["x"], 0.0),
            "b": mtf.where(mtf.less(t["x"], 0.25), t["x"], t["y"])}
  def reference(t):
    xb = t["x"][:, :, None]
    return {"a": tf.where(t["x"] > 0.0, t["x"], 0.0),
            "b": tf.where(tf.broadcast_to(xb < 0.25, [8, 4, 2]), xb,
                          t["y"][None])}
  harness.assert_layout_invariant(
      model, {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      wrt=["x", "y"], reference=reference)


# --- cast, broadcast, stop_gradient, add_n -----------------------------------
def test_cast():
  x = uniform([8, 4], 15)
  def model(mesh, t):
    return {"i32": mtf.cast(t["x"] * 4.0, tf.int32),
            "bool": mtf.cast(t["x"] * 4.0, tf.bool),
            "mask": mtf.cast(mtf.greater(t["x"], 0.0), tf.float32) * t["x"],
            "same": mtf.cast(t["x"], tf.float32)}
  def reference(t):
    return {"i32": tf.cast(t["x"] * 4.0, tf.int32),
            "bool": tf.cast(t["x"] * 4.0, tf.bool),
            "mask": tf.cast(t["x"] > 0.0, tf.float32) * t["x"],
            "same": t["x"]}
  runs = harness.assert_layout_invariant(
      model, {"x": (x, X_SHAPE)}, XY_LAYOUTS, wrt=["x"], reference=reference)
  out = next(iter(runs.values())).outputs
  assert out["i32"].dtype == np.int32 and out["bool"].dtype == np.bool_


def test_cast_to_float64():
  # Alone: the harness sums one objective, so outputs share a float dtype.
  x = uniform([8, 4], 15)
  runs = harness.assert_layout_invariant(
      lambda mesh, t: {"f64": mtf.cast(t["x"], tf.float64) * 3.0},
      {"x": (x, X_SHAPE)}, XY_LAYOUTS, wrt=["x"],
      reference=lambda t: {"f64": tf.cast(t["x"], tf.float64) * 3.0})
  run = next(iter(runs.values()))
  assert run.outputs["f64"].dtype == np.float64
  assert run.grads["x"].dtype == np.float32


@pytest.mark.parametrize("new_shape,einsum_out", [
    ("batch:8;hidden:4", "bh"),
    ("hidden:4;batch:8", "hb"),
    ("batch:8;hidden:4;io:2", "bhi"),
    ("io:2;hidden:4;batch:8", "ihb"),
])
def test_broadcast(new_shape, einsum_out):
  x = uniform([4], 16)
  def reference(t):
    full = tf.broadcast_to(t["x"][None, :, None], [8, 4, 2])
    if "i" not in einsum_out:
      return {"y": tf.einsum("bh->" + einsum_out, full[:, :, 0])}
    return {"y": tf.einsum("bhi->" + einsum_out, full)}
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.broadcast(t["x"], new_shape)},
      {"x": (x, "hidden:4")}, BROADCAST_LAYOUTS, wrt=["x"],
      reference=reference)


def test_broadcast_reorders_own_dims():
  x = uniform([8, 4], 16)
  harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.broadcast(t["x"], "hidden:4;io:2;batch:8")},
      {"x": (x, X_SHAPE)}, BROADCAST_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.broadcast_to(
          tf.transpose(t["x"])[:, None, :], [4, 2, 8])})


def test_stop_gradient():
  x = uniform([8, 4], 17)
  def model(mesh, t):
    return {"y": t["x"] * mtf.stop_gradient(t["x"])}
  harness.assert_layout_invariant(
      model, {"x": (x, X_SHAPE)}, XY_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": t["x"] * tf.stop_gradient(t["x"])})


def test_stop_gradient_passes_no_gradient():
  x = uniform([8, 4], 18)
  runs = harness.assert_layout_invariant(
      lambda mesh, t: {"y": mtf.stop_gradient(t["x"])}, {"x": (x, X_SHAPE)},
      XY_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": tf.stop_gradient(t["x"])})
  for run in runs.values():
    np.testing.assert_array_equal(run.outputs["y"], x)
    assert run.grads["x"] is None


def test_add_n():
  a, b, c = uniform([8, 4], 19), uniform([8, 4], 20), uniform([4, 2], 21)
  def model(mesh, t):
    return {"s": mtf.add_n([t["a"], t["b"], t["c"]]),
            "one": mtf.add_n([t["a"]])}
  def reference(t):
    return {"s": (t["a"] + t["b"])[:, :, None] + t["c"][None],
            "one": t["a"]}
  harness.assert_layout_invariant(
      model, {"a": (a, X_SHAPE), "b": (b, X_SHAPE), "c": (c, Y_SHAPE)},
      BROADCAST_LAYOUTS, wrt=["a", "b", "c"], reference=reference)


def test_add_n_of_nothing_is_zero_as_in_mesh_tf():
  """Mesh TF's add_n([]) is 0, so `loss + mtf.add_n(extra_losses)` works
  for a model without extra losses (its transformer's call_simple sums an
  empty list): the sum is then loss itself, on every layout."""
  assert mtf.add_n([]) == 0 and mtf.add_n(iter([])) == 0
  x = uniform([8, 4], 23)
  def model(mesh, t):
    return {"y": t["x"] + mtf.add_n([]), "z": mtf.add_n([]) * t["x"]}
  runs = harness.assert_layout_invariant(
      model, {"x": (x, X_SHAPE)}, XY_LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": t["x"], "z": 0.0 * t["x"]})
  for run in runs.values():
    np.testing.assert_array_equal(run.outputs["y"], x)


# --- a scalar tf.Tensor in meshtf arithmetic ----------------------------------
# Mesh TF's optimizers multiply Tensors by a learning rate and a decay rate
# that are tf.Tensors computed from the step; Mesh TF allowed it.
def test_scalar_tf_tensors_mix_with_meshtf_tensors_eagerly():
  x = uniform([8, 4], 30)
  lr, var = tf.constant(0.5), tf.Variable(3.0)
  f64, half = tf.constant(0.25, tf.float64), tf.constant(-0.5, tf.bfloat16)

  def model(mesh, t):
    x = t["x"]
    return {"mul": x * lr, "rmul": lr * x, "sub": x - lr, "rsub": lr - x,
            "div": x / var, "rdiv": var / (x * x + 1.0),
            "max": mtf.maximum(x, lr), "f64": x * f64,
            "where": mtf.where(mtf.greater(x, 0.0), lr, x),
            "bf16": mtf.cast(mtf.cast(x, tf.bfloat16) * half, tf.float32)}

  def reference(t):
    x = t["x"]
    return {"mul": x * 0.5, "rmul": 0.5 * x, "sub": x - 0.5, "rsub": 0.5 - x,
            "div": x / 3.0, "rdiv": 3.0 / (x * x + 1.0),
            "max": tf.maximum(x, 0.5), "f64": x * 0.25,
            "where": tf.where(x > 0.0, 0.5, x),
            "bf16": tf.cast(tf.cast(x, tf.bfloat16) * tf.constant(
                -0.5, tf.bfloat16), tf.float32)}
  harness.assert_layout_invariant(model, {"x": (x, X_SHAPE)}, XY_LAYOUTS,
                                  wrt=["x"], reference=reference)


@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
def test_symbolic_tf_scalars_are_read_when_the_program_runs(backend):
  """Inside a MeshFunction the scalar is a symbolic tf.Tensor (e.g. a
  schedule of the step): it is a program input, never a numpy constant, so
  each call sees its value; a tf.Variable is read on every call too."""
  x = uniform([8, 4], 31)
  var = tf.Variable(2.0)
  builds = []

  def build(mesh, x_tf, lr_tf):
    builds.append(1)
    xm = mtf.import_tf_tensor(mesh, x_tf, X_SHAPE)
    lr = tf.math.sqrt(lr_tf)          # computed in the traced function
    w = mtf.get_variable(mesh, "w", "hidden:4",
                         initializer=mtf.ones_initializer())
    loss = mtf.reduce_sum(xm * w * lr) + var - mtf.reduce_sum(w) * 0.0
    g, = mtf.gradients([loss], [w])
    mtf.assign_sub(w, g * lr)         # Mesh TF's update: grad * rate
    return [loss, w * 1.0]

  impl = harness.make_impl(backend, "rows:2;cols:4", "batch:rows;hidden:cols")
  step = mtf.MeshFunction(build, impl)
  w = np.ones([4], np.float32)
  for lr, v in [(0.25, 2.0), (4.0, -1.0), (1.0, 0.5)]:
    var.assign(v)
    loss, w_out = step(tf.constant(x), tf.constant(lr))
    rate = np.sqrt(lr)
    np.testing.assert_allclose(float(loss), (x * w).sum() * rate + v,
                               rtol=1e-5)
    np.testing.assert_allclose(w_out.numpy(), w, rtol=1e-5)  # before update
    w = w - x.sum(0) * rate * rate
  assert len(builds) <= 2     # traced once (twice when creating variables)


def test_tf_scalar_is_imported_once_per_mesh_and_dtype():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, X_SHAPE)
  lr = tf.constant(0.5)
  y = x * lr + x * lr - lr * x + mtf.cast(mtf.cast(x, tf.bfloat16) * lr,
                                          tf.float32)
  imports = [op for op in graph.operations if op.name.startswith(
      "import_tf_scalar")]
  assert len(imports) == 2, imports     # float32 and bfloat16
  assert {op.outputs[0].dtype for op in imports} == {tf.float32, tf.bfloat16}
  assert y.shape == X_SHAPE


def test_tf_tensor_operands_that_cannot_mix_fail_clearly():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, X_SHAPE)
  with pytest.raises(ValueError, match=r"shape \(8,\).*import_tf_tensor"):
    x * tf.ones([8])
  with pytest.raises(TypeError, match=r"int32 tf.Tensor.*float32.*tf.cast"):
    x * tf.constant(2)
  with pytest.raises(TypeError, match=r"float32 tf.Tensor.*int32"):
    mtf.ones(mesh, X_SHAPE, dtype=tf.int32) * tf.constant(2.0)


def _sum_of_partial_sums(mesh, t):
  """Three einsums reduced over io, combined linearly: one pending sum."""
  x = t["x"]
  parts = [mtf.einsum([x, t[w]], output_shape="batch:8;hidden:4")
           for w in ("w1", "w2", "w3")]
  return {"y": mtf.add_n([parts[0], -parts[1]]) - parts[2] * 2.0}


PARTIAL_SUM_INPUTS = {
    "x": (uniform([8, 4], 22), "batch:8;io:4"),
    "w1": (uniform([4, 4], 23), "io:4;hidden:4"),
    "w2": (uniform([4, 4], 24), "io:4;hidden:4"),
    "w3": (uniform([4, 4], 25), "io:4;hidden:4"),
}


def test_linear_ops_keep_sums_pending():
  harness.assert_layout_invariant(
      _sum_of_partial_sums, PARTIAL_SUM_INPUTS,
      [("rows:2;cols:4", "io:cols"), ("rows:2;cols:4", "batch:rows;io:cols"),
       ("all:8", "batch:all")],
      wrt=["x", "w1"],
      reference=lambda t: {"y": (t["x"] @ t["w1"] - t["x"] @ t["w2"]
                                 - 2.0 * (t["x"] @ t["w3"]))})
  run = forward_run(_sum_of_partial_sums, PARTIAL_SUM_INPUTS,
                    "rows:2;cols:4", "batch:rows;io:cols")
  stats = run.lowering.collective_stats()
  assert [(s["kind"], s["mesh_axes"], s["count"]) for s in stats] == [
      ("allreduce_sum", ("cols",), 1)]


def test_elementwise_ops_are_local():
  x, y = uniform([8, 4], 26), uniform([4, 2], 27)
  def model(mesh, t):
    z = mtf.exp(t["x"]) * t["y"] + 1.0
    return {"z": mtf.where(mtf.greater(z, 1.0), z, -z)}
  for mesh_shape, layout in BROADCAST_LAYOUTS:
    run = forward_run(model, {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)},
                      mesh_shape, layout)
    assert collective_kinds(run) == set(), layout


# --- errors --------------------------------------------------------------------
def _mesh():
  graph = mtf.Graph()
  return mtf.Mesh(graph, "m")


def test_binary_dtype_mismatch():
  mesh = _mesh()
  a = mtf.ones(mesh, X_SHAPE)
  b = mtf.ones(mesh, X_SHAPE, dtype=tf.int32)
  with pytest.raises(TypeError, match="differ in dtype"):
    mtf.add(a, b)
  with pytest.raises(TypeError, match="differ in dtype"):
    mtf.where(mtf.greater(a, 0.0), a, b)


def test_binary_dimension_size_conflict():
  mesh = _mesh()
  with pytest.raises(ValueError, match="'hidden' has size 4 .* and 5"):
    mtf.ones(mesh, X_SHAPE) + mtf.ones(mesh, "hidden:5")


def test_binary_bad_output_shape():
  mesh = _mesh()
  with pytest.raises(ValueError, match="must hold exactly the dims"):
    mtf.add(mtf.ones(mesh, X_SHAPE), mtf.ones(mesh, X_SHAPE),
            output_shape="batch:8")


def test_where_condition_must_be_bool():
  mesh = _mesh()
  a = mtf.ones(mesh, X_SHAPE)
  with pytest.raises(TypeError, match="must be bool"):
    mtf.where(a, a, a)


def test_broadcast_to_shape_missing_a_dim():
  mesh = _mesh()
  with pytest.raises(ValueError, match="not all in new shape"):
    mtf.broadcast(mtf.ones(mesh, X_SHAPE), "batch:8;io:2")


def test_two_numbers_rejected():
  with pytest.raises(TypeError, match="at least one meshtf Tensor"):
    mtf.add(1.0, 2.0)


@pytest.mark.parametrize("name,tf_fn", [("floordiv", tf.math.floordiv),
                                         ("mod", tf.math.floormod)])
def test_integer_division_ops(name, tf_fn):
  rs = np.random.RandomState(0)
  x = rs.randint(-20, 20, size=[8, 4]).astype(np.int32)
  y = rs.randint(1, 6, size=[4, 2]).astype(np.int32)
  fn = getattr(mtf, name)
  harness.assert_layout_invariant(
      lambda mesh, t: {"z": fn(t["x"], t["y"]),
                       "i": mtf.to_int32(mtf.to_float(t["x"]) * 0.5)},
      {"x": (x, X_SHAPE), "y": (y, Y_SHAPE)}, BROADCAST_LAYOUTS,
      reference=lambda t: {"z": tf_fn(t["x"][:, :, None], t["y"][None]),
                           "i": tf.cast(tf.cast(t["x"], tf.float32) * 0.5,
                                        tf.int32)})


# --- every exported elementwise op is covered above ---------------------------
TESTED = (set(UNARY) | set(BINARY) | set(COMPARISONS) | set(LOGICAL) | {
    "logical_not", "where", "cast", "to_float", "broadcast", "stop_gradient",
    "add_n", "floordiv", "mod", "to_int32"})


def test_every_exported_elementwise_op_is_tested():
  exported = {n for n in elementwise.__all__ if hasattr(mtf, n)}
  assert exported == set(elementwise.__all__)
  assert exported - TESTED == set()


# --- uneven splits -----------------------------------------------------------
def test_elementwise_uneven_broadcast_where_cast():
  """Elementwise ops are local on padded stripes too: broadcasting by name,
  where, cast and a linear op after a pending sum, with batch:5 / hidden:3
  split unevenly."""
  x = uniform([5, 3], 0)
  y = uniform([3, 2], 1)

  def model(mesh, t):
    h = t["x"] * t["y"] + mtf.exp(t["x"])        # [batch, hidden, io]
    cond = mtf.greater(t["x"], 0.0)
    return {"h": h,
            "where": mtf.where(cond, t["x"], -t["x"] * 2.0),
            "cast": mtf.cast(mtf.cast(t["x"] * 10.0, tf.int32), tf.float32),
            "bcast": mtf.broadcast(t["y"], "batch:5;hidden:3;io:2") + 1.0}
  harness.assert_layout_invariant(
      model, {"x": (x, "batch:5;hidden:3"), "y": (y, "hidden:3;io:2")},
      [("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;hidden:cols"),
       ("a:2", "hidden:a"), ("a:2;b:2", "batch:a+b"),
       ("a:2;b:2", harness.annotated("hidden:a", {"x": "batch:b",
                                                  "y": "io:b+a"}))],
      wrt=["x", "y"],
      reference=lambda t: {
          "h": t["x"][:, :, None] * t["y"][None] + tf.exp(t["x"])[:, :, None],
          "where": tf.where(t["x"] > 0, t["x"], -t["x"] * 2.0),
          "cast": tf.cast(tf.cast(t["x"] * 10.0, tf.int32), tf.float32),
          "bcast": tf.broadcast_to(t["y"], [5, 3, 2]) + 1.0})
