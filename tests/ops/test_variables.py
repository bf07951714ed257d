"""Variables (meshtf/ops/variables.py): get_variable and assign / assign_add /
assign_sub on every layout. Values are read back with
VariableStore.full_value and must equal the single-device numbers.

Shapes: x [batch:8, io:4], w [io:4, hidden:8].
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import variables

X, W = "batch:8;io:4", "io:4;hidden:8"
BATCH = mtf.Dimension("batch", 8)
LAYOUTS = [
    ("all:8", "hidden:all"),
    ("rows:2;cols:4", "io:cols"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
    ("rows:2;cols:4", "io:rows;hidden:cols"),
]
X_NP = harness.random_array([8, 4], 0)
W0 = harness.random_array([4, 8], 1)


# --- get_variable ------------------------------------------------------------
def test_get_variable_in_a_model():
  def model(mesh, t):
    w = mtf.get_variable(mesh, "w", W,
                         initializer=mtf.random_normal_initializer(stddev=0.5))
    b = mtf.get_variable(mesh, "b", "hidden:8",
                         initializer=mtf.random_uniform_initializer(-0.1, 0.1))
    return {"y": mtf.tanh(mtf.einsum([t["x"], w], output_shape="batch:8;"
                                     "hidden:8") + b), "w": w}
  runs = harness.assert_layout_invariant(model, {"x": (X_NP, X)}, LAYOUTS,
                                         wrt=["x"])
  assert set(next(iter(runs.values())).grads) == {"x", "w", "b"}


def test_get_variable_with_known_value_matches_tensorflow():
  def model(mesh, t):
    w = mtf.get_variable(mesh, "w", W, initializer=mtf.constant_initializer(W0))
    return {"y": mtf.einsum([t["x"], w], output_shape="batch:8;hidden:8")}
  harness.assert_layout_invariant(
      model, {"x": (X_NP, X)}, LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": t["x"] @ W0})


def test_get_variable_activation_dtype_and_trainable():
  def model(mesh, t):
    w = mtf.get_variable(mesh, "w", W, dtype=tf.float64,
                         initializer=mtf.constant_initializer(W0),
                         activation_dtype=tf.float32)
    frozen = mtf.get_variable(mesh, "frozen", "hidden:8", trainable=False,
                              initializer=mtf.ones_initializer())
    assert w.dtype == tf.float32 and w.operation.inputs[0].dtype == tf.float64
    return {"y": mtf.einsum([t["x"], w], output_shape="batch:8;hidden:8")
                 * frozen}
  runs = harness.assert_layout_invariant(
      model, {"x": (X_NP, X)}, LAYOUTS, wrt=["x"],
      reference=lambda t: {"y": t["x"] @ W0})
  run = next(iter(runs.values()))
  assert set(run.grads) == {"x", "w"}     # frozen is not trainable
  assert run.grads["w"].dtype == np.float64


def test_variable_operation_properties():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", W)
  v = mtf.get_variable(mesh, "v", "hidden:8", dtype=tf.int32, trainable=False,
                       initializer=mtf.zeros_initializer())
  op = w.operation
  assert isinstance(op, mtf.Variable) and op.name == "w"
  assert op.shape == W and op.dtype == tf.float32 and op.trainable
  assert op.value is w
  assert graph.trainable_variables == [op]
  assert graph.all_variables == [op, v.operation]
  assert mtf.gradients([mtf.reduce_sum(w * 2.0)], [w])[0].shape == W


# --- assign ------------------------------------------------------------------
def _update_graph(mode, dtype=tf.float32):
  """w -= / += / = sum over batch of x[batch, io] * u[batch, hidden]: an
  einsum over batch, which is a pending sum when batch is split."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", W, initializer=mtf.constant_initializer(W0))
  x = mtf.import_tf_tensor(mesh, tf.constant(X_NP), X)
  u = mtf.import_tf_tensor(mesh, tf.constant(U_NP), "batch:8;hidden:8")
  value = mtf.einsum([x, u], output_shape=W)
  if dtype != tf.float32:
    value = mtf.cast(value, dtype)
  fn = {"assign": mtf.assign, "add": mtf.assign_add,
        "sub": mtf.assign_sub}[mode]
  op = fn(w, value)
  return graph, mesh, w, op


U_NP = harness.random_array([8, 8], 2)
DELTA = np.einsum("bi,bh->ih", X_NP, U_NP)
EXPECTED = {"assign": DELTA, "add": W0 + DELTA, "sub": W0 - DELTA}


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS + [
    ("all:8", "batch:all")])
@pytest.mark.parametrize("mode", ["assign", "add", "sub"])
def test_assign(mode, mesh_shape, layout):
  graph, mesh, w, op = _update_graph(mode)
  store = mtf.VariableStore()
  impl = harness.make_impl("placement", mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl}, variable_store=store)
  # The graph read w before the assignment ran.
  np.testing.assert_allclose(lowering.export_to_tf_tensor(w).numpy(), W0)
  assert len(lowering.lowered_operation(op)) == impl.size
  np.testing.assert_allclose(store.full_value("w"), EXPECTED[mode],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lowering.variable_value("w"), EXPECTED[mode],
                             rtol=1e-5, atol=1e-5)
  # A later lowering with the same store sees the new value, and the
  # assignment applies again.
  graph2, mesh2, w2, _ = _update_graph(mode)
  lowering2 = mtf.Lowering(graph2, {mesh2: impl}, variable_store=store)
  np.testing.assert_allclose(lowering2.export_to_tf_tensor(w2).numpy(),
                             EXPECTED[mode], rtol=1e-5, atol=1e-5)
  twice = {"assign": DELTA, "add": W0 + 2 * DELTA, "sub": W0 - 2 * DELTA}
  np.testing.assert_allclose(store.full_value("w"), twice[mode], rtol=1e-5,
                             atol=1e-5)


def test_assign_casts_the_value():
  graph, mesh, w, _ = _update_graph("add", dtype=tf.float64)
  store = mtf.VariableStore()
  mtf.Lowering(graph, {mesh: harness.make_impl("placement", *LAYOUTS[2])},
               variable_store=store)
  value = store.full_value("w")
  assert value.dtype == np.float32
  np.testing.assert_allclose(value, W0 + DELTA, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS)
def test_sgd_with_mesh_function(mesh_shape, layout):
  """Three SGD steps of loss = sum((x w)^2) in a traced MeshFunction."""
  def build(mesh, x_tf):
    w = mtf.get_variable(mesh, "w", W, initializer=mtf.constant_initializer(W0))
    x = mtf.import_tf_tensor(mesh, x_tf, X)
    loss = mtf.reduce_sum(mtf.square(mtf.einsum([x, w],
                                                output_shape="batch:8;hidden:8")))
    g, = mtf.gradients([loss], [w])
    mtf.assign_sub(w, g * 0.01)
    return loss
  step = mtf.MeshFunction(build, harness.make_impl("placement", mesh_shape,
                                                   layout))
  w = W0.astype(np.float64)
  for _ in range(3):
    y = X_NP @ w
    expected_loss = (y ** 2).sum()
    w = w - 0.01 * 2.0 * X_NP.T @ y
    np.testing.assert_allclose(float(step(tf.constant(X_NP))), expected_loss,
                               rtol=1e-4)
  np.testing.assert_allclose(step.variable_value("w"), w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(step.variable_store.full_value("w"), w,
                             rtol=1e-4, atol=1e-5)


# --- errors --------------------------------------------------------------------
def test_assign_shape_mismatch():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  w = mtf.get_variable(mesh, "w", W)
  with pytest.raises(ValueError, match="assign to 'w'.*shape"):
    mtf.assign(w, mtf.zeros(mesh, "hidden:8;io:4"))


def test_assign_to_non_variable():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  x = mtf.zeros(mesh, W)
  with pytest.raises(TypeError, match="not a variable"):
    mtf.assign_add(x, x)


def test_store_rejects_a_variable_with_another_shape():
  store = mtf.VariableStore()
  impl = harness.make_impl("placement", "all:1", "")
  for shape in (W, "io:4;hidden:4"):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    mtf.get_variable(mesh, "w", shape)
    if shape == W:
      mtf.Lowering(graph, {mesh: impl}, variable_store=store)
    else:
      with pytest.raises(ValueError, match="exists in the store with shape"):
        mtf.Lowering(graph, {mesh: impl}, variable_store=store)


def test_every_exported_variable_op_is_tested():
  exported = {n for n in dir(mtf) if getattr(getattr(mtf, n), "__module__",
                                              None) == variables.__name__}
  assert exported == {"Variable", "get_variable", "assign", "assign_add",
                      "assign_sub", "Assign", "assign_slice",
                      "assign_add_slice", "assign_sub_slice", "read_variable",
                      "VariableDType", "ReadVariable",
                      # tested with the pipeline that uses it:
                      # tests/models/test_pipeline.py
                      "custom_getter"}


# --- Mesh TensorFlow's dtype and naming conventions ---------------------------
def test_get_variable_takes_a_variable_dtype():
  """Every Mesh TF layer passes a VariableDType: stored in its slice dtype,
  returned in its activation dtype; Variable takes one too."""
  mesh = mtf.Mesh(mtf.Graph(), "m")
  vdt = mtf.VariableDType(tf.float32, activation_dtype=tf.bfloat16)
  w = mtf.get_variable(mesh, "w", W, dtype=vdt)
  assert w.dtype == tf.bfloat16
  assert mesh.graph.all_variables[0].dtype == tf.float32
  v = mtf.Variable(mesh, "v", W, mtf.VariableDType(tf.int32), None)
  assert v.dtype == tf.int32


def test_variable_scope_prefixes_names():
  """tf.compat.v1.variable_scope names variables as in Mesh TF (checkpoint
  names depend on it); the same scoped name returns the same variable."""
  mesh = mtf.Mesh(mtf.Graph(), "m")
  with tf.compat.v1.variable_scope("encoder"):
    w = mtf.get_variable(mesh, "w", W)
    assert mtf.get_variable(mesh, "w", W) is w
  assert w.operation.name == "encoder/w"
  assert mtf.get_variable(mesh, "w", W).operation.name == "w"


# --- assign_fn family and read_variable --------------------------------------
def _tf1_style_add(variable, slice_var, val):
  """An assign function written as in Mesh TensorFlow (tf.compat.v1)."""
  return tf.compat.v1.assign(slice_var,
                             slice_var + tf.cast(val, variable.slice_dtype))


def _assign_max(variable, slice_var, val):
  return slice_var.assign(tf.maximum(slice_var.read_value(),
                                     tf.cast(val, variable.slice_dtype)))


def test_assign_fns_and_read_variable_on_every_layout():
  """assign_slice and a custom assign_fn update their variables, and
  assign_sub reaches a variable through get_variable's activation-dtype
  cast; read_variable after an assign sees the new value, the variable's
  own output the old one."""
  u_np = harness.random_array([8, 8], 3)
  fns = {"set": variables.assign_slice, "max": _assign_max}

  def model(mesh, t):
    delta = mtf.einsum([t["x"], t["u"]], output_shape=W)  # pending if split
    ws = {n: mtf.get_variable(mesh, n, W,
                              initializer=mtf.constant_initializer(W0))
          for n in sorted(fns)}
    cast = mtf.get_variable(mesh, "cast", W, activation_dtype=tf.float64,
                            initializer=mtf.constant_initializer(W0))
    out = {"before": mtf.einsum([t["x"], ws["set"]],
                                output_shape="batch:8;hidden:8")}
    for n in sorted(fns):
      mtf.assign(ws[n], delta, assign_fn=fns[n])
      out["after_" + n] = variables.read_variable(ws[n]) * 1.0
    mtf.assign_sub(cast, delta)
    out["after_cast"] = variables.read_variable(cast)
    assert out["after_cast"].dtype == tf.float64
    return out

  def ref(t):
    d = tf.stop_gradient(tf.einsum("bi,bh->ih", t["x"], t["u"]))
    return {"before": t["x"] @ W0, "after_set": d,
            "after_max": tf.maximum(W0, d),
            "after_cast": tf.cast(W0 - d, tf.float64)}
  runs = harness.assert_layout_invariant(
      model, {"x": (X_NP, X), "u": (u_np, "batch:8;hidden:8")},
      [("all:2", "batch:all"), ("rows:2;cols:2", "io:rows;hidden:cols"),
       ("rows:2;cols:2", "batch:rows;hidden:cols")],
      wrt=["x"], reference=ref)
  # read_variable passes the gradient on to the variable.
  assert set(next(iter(runs.values())).grads) == {"x", "set", "max", "cast"}


def test_assign_fns_in_a_traced_mesh_function():
  """Three steps of a traced program on both backends: w = max(w, x) by a
  custom assign_fn and v += x by a Mesh TF-style tf.compat.v1 function,
  read back with read_variable in the same step."""
  def build(mesh, x_tf):
    zeros = mtf.constant_initializer(np.zeros([4, 8], np.float32))
    w = mtf.get_variable(mesh, "w", W, initializer=zeros)
    v = mtf.get_variable(mesh, "v", W, initializer=zeros)
    x = mtf.import_tf_tensor(mesh, x_tf, W)
    mtf.assign(w, x, assign_fn=_assign_max)
    mtf.assign(v, x, assign_fn=_tf1_style_add)
    return mtf.reduce_sum(variables.read_variable(w) +
                          variables.read_variable(v))
  for backend in ("placement", "simd"):
    step = mtf.MeshFunction(build, harness.make_impl(
        backend, "rows:2;cols:2", "io:rows;hidden:cols"))
    w = np.zeros([4, 8], np.float32)
    v = np.zeros([4, 8], np.float32)
    for i in range(3):
      x = harness.random_array([4, 8], 10 + i)
      w, v = np.maximum(w, x), v + x
      np.testing.assert_allclose(float(step(tf.constant(x))), (w + v).sum(),
                                 rtol=1e-5)
    np.testing.assert_allclose(step.variable_value("w"), w)
    np.testing.assert_allclose(step.variable_value("v"), v, rtol=1e-6)


def test_assign_operation_api_and_errors():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  w = mtf.get_variable(mesh, "w", W)
  op = variables.Assign([w], [mtf.zeros(mesh, W)], "add")
  assert isinstance(op, variables.AssignOperation)
  assert op.assign_fn is variables.assign_add_slice
  assert op.variables == [w.operation]
  assert mtf.assign(w, w * 2.0).assign_fn is variables.assign_slice
  assert w.operation.slice_dtype == tf.float32
  with pytest.raises(ValueError, match="mode 'mul'"):
    variables.Assign([w], [w], "mul")
  with pytest.raises(TypeError, match="assign_fn"):
    mtf.assign(w, w, assign_fn=3)
  with pytest.raises(TypeError, match="read_variable.*not a variable"):
    variables.read_variable(mtf.zeros(mesh, W))
  with pytest.raises(ValueError, match="2 variables but 1 values"):
    variables.Assign([w, w], [w])


def test_uneven_variables_train_save_and_restore_across_layouts():
  """A variable io:5 x hidden:7 split unevenly: three SGD steps in a traced
  MeshFunction equal numpy's, and its full value (padding cut) restores
  bit for bit into another uneven layout's slices and into an even one."""
  x_np = harness.random_array([6, 5], 3)
  w0 = harness.random_array([5, 7], 4)

  def build(mesh, x_tf):
    w = mtf.get_variable(mesh, "w", "io:5;hidden:7",
                         initializer=mtf.constant_initializer(w0))
    x = mtf.import_tf_tensor(mesh, x_tf, "batch:6;io:5")
    loss = mtf.reduce_sum(mtf.square(mtf.einsum(
        [x, w], output_shape="batch:6;hidden:7")))
    g, = mtf.gradients([loss], [w])
    mtf.assign_sub(w, g * 0.01)
    return loss

  w = w0.astype(np.float64)
  values = {}
  for backend, mesh_shape, layout in [
      ("placement", "rows:2;cols:4", "io:rows;hidden:cols"),
      ("simd", "all:8", "hidden:all"),
      ("simd", "a:3", "io:a")]:
    step = mtf.MeshFunction(build, harness.make_impl(backend, mesh_shape,
                                                     layout))
    w = w0.astype(np.float64)
    for _ in range(3):
      y = x_np @ w
      np.testing.assert_allclose(float(step(tf.constant(x_np))),
                                 (y ** 2).sum(), rtol=1e-4)
      w = w - 0.01 * 2.0 * x_np.T @ y
    values[layout] = step.variable_store.full_value("w")
    np.testing.assert_allclose(values[layout], w, rtol=1e-4, atol=1e-5)
  # Restore one layout's value into another's slices: bit for bit.
  saved = values["io:a"]
  for mesh_shape, layout in [("rows:2;cols:4", "io:rows;hidden:cols"),
                             ("all:8", "hidden:all")]:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    mtf.get_variable(mesh, "w", "io:5;hidden:7")
    store = mtf.VariableStore()
    store.restore_values({"w": saved})   # before creation
    mtf.Lowering(graph, {mesh: harness.make_impl("simd", mesh_shape, layout)},
                 variable_store=store)
    np.testing.assert_array_equal(store.full_value("w"), saved)
    store.restore_values({"w": saved * 2.0})   # into existing slices
    np.testing.assert_array_equal(store.full_value("w"), saved * 2.0)
