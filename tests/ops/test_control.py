"""Control ops (meshtf/ops/control.py): while_loop with gradients (also with
collectives in the body, nested loops, accumulators and data-dependent trip
counts), custom_gradient, recompute_grad, depend, Print and
serialize_training_step. Every layout -- splitting the dims the body
contracts -- gives the single-device values and gradients, on both backends,
and these match TensorFlow's loops and autodiff.
"""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import control
from meshtf.ops import microbatch
from meshtf.ops import elementwise

MESH = "rows:2;cols:4"
BATCH, H2 = mtf.Dimension("batch", 4), mtf.Dimension("h2", 4)


def arr(*shape, seed=0, scale=1.0):
  return harness.random_array(list(shape), seed) * np.float32(scale)


def counter(mesh):
  return mtf.constant(mesh, 0, dtype=tf.int32)


# --- while_loop --------------------------------------------------------------
def _layer(h, w1, w2):
  """tanh(h w1) w2: two einsums, contracting hidden then h2."""
  a = mtf.tanh(mtf.einsum([h, w1], output_shape=[BATCH, H2]))
  return a, mtf.einsum([a, w2], output_shape=h.shape)


def _tf_layer(h, w1, w2):
  a = tf.tanh(h @ w1)
  return a, a @ w2


LOOP_INPUTS = {
    "h0": (arr(4, 8, seed=0), "batch:4;hidden:8"),
    "w1": (arr(8, 4, seed=1, scale=0.5), "hidden:8;h2:4"),
    "w2": (arr(4, 8, seed=2, scale=0.5), "h2:4;hidden:8"),
}
# The body contracts hidden and h2 (an allreduce inside the loop when
# split): split hidden alone, with the batch, or both on different axes.
LOOP_LAYOUTS = [
    ("all:8", "hidden:all"),
    (MESH, "batch:rows;hidden:cols"),
    (MESH, "hidden:rows;h2:cols"),
]


def loop_model(mesh, t):
  w1, w2 = t["w1"], t["w2"]

  # A trip count that depends on the data (a scalar reduced over split
  # dims, the same on every processor), an accumulator of a pending sum
  # (reduced over h2, which may be split: one allreduce after the loop) and
  # num_loop_vars (the counter is not returned).
  def body(h, s, j):
    a, y = _layer(h, w1, w2)
    h = y + h * 0.5
    return [h, s + mtf.reduce_mean(mtf.square(h)), j + 1,
            mtf.reduce_sum(a, reduced_dim=H2)]

  def cond(h, s, j):
    return mtf.logical_and(mtf.less(s, THRESHOLD), mtf.less(j, 6))
  h, s, acc = control.while_loop(
      cond, body, [t["h0"], mtf.reduce_mean(t["h0"] * 0.0), counter(mesh)],
      num_loop_vars=2, has_accumulators=True)
  return {"h": h, "s": s, "acc": acc}


THRESHOLD = 0.28  # the loop stops after 3 iterations (s: .14, .24, .31)


def loop_reference(t):
  w1, w2 = t["w1"], t["w2"]
  h, s, acc, j = t["h0"], 0.0, 0.0, 0
  while float(s) < THRESHOLD and j < 6:
    a, y = _tf_layer(h, w1, w2)
    h = y + h * 0.5
    s += tf.reduce_mean(tf.square(h))
    acc += tf.reduce_sum(a, axis=1)
    j += 1
  assert j == 3, j
  return {"h": h, "s": s, "acc": acc}


def test_while_loop_collectives_in_body_and_gradients():
  runs = harness.assert_layout_invariant(
      loop_model, LOOP_INPUTS, LOOP_LAYOUTS, wrt=["h0", "w1", "w2"],
      reference=loop_reference)
  # The SPMD program's loop bodies hold the einsums' allreduces.
  run = runs[("simd", "all:8", "hidden:all")]
  assert any(s["kind"] == "allreduce_sum"
             for s in run.lowering.collective_stats())
  # Per iteration the forward loop records only the state the backward
  # loop reads: h (not the sum s, nor the counter).
  grad_op, = [op for op in run.graph.operations
              if isinstance(op, control.WhileLoopGradOperation)]
  assert grad_op.state_used == [0]


def test_nested_while_loops_gradients():
  def model(mesh, t):
    w1, w2 = t["w1"], t["w2"]

    def outer(i, h):
      def inner(k, g):
        return [k + 1, _layer(g, w1, w2)[1] + g * 0.5]
      _, h = control.while_loop(lambda k, g: mtf.less(k, 2), inner,
                                [counter(mesh), h])
      return [i + 1, mtf.tanh(h)]
    _, h = control.while_loop(lambda i, h: mtf.less(i, 2), outer,
                              [counter(mesh), t["h0"]])
    return {"h": h}

  def reference(t):
    h = t["h0"]
    for _ in range(2):
      for _ in range(2):
        h = _tf_layer(h, t["w1"], t["w2"])[1] + h * 0.5
      h = tf.tanh(h)
    return {"h": h}
  # Inside the SPMD program: loops in loops, each with allreduces, forward
  # and backward (the backward re-runs the inner loop per outer iteration).
  harness.assert_layout_invariant(model, LOOP_INPUTS,
                                  [(MESH, "hidden:rows;h2:cols")],
                                  wrt=["h0", "w1", "w2"], reference=reference,
                                  backends=["simd"])


def test_while_loop_in_a_mesh_function():
  # Placement backend in graph mode (tf.function): a lowered tf.while_loop
  # over every device's slices, and TensorArrays for the gradient; also a
  # loop that runs zero times (its gradient passes the cotangent through).
  impl = harness.make_impl("placement", "rows:2;cols:2",
                           "batch:rows;hidden:cols")
  names = ("h0", "w1", "w2")

  def build(mesh, *values):
    t = {n: mtf.import_tf_tensor(mesh, v, LOOP_INPUTS[n][1])
         for n, v in zip(names, values)}
    out = loop_model(mesh, t)
    _, never = control.while_loop(lambda i, x: mtf.less(i, 0),
                                  lambda i, x: [i + 1, x * 3.0],
                                  [counter(mesh), t["h0"]])
    loss = (mtf.reduce_sum(out["h"]) + mtf.reduce_sum(out["acc"]) + out["s"]
            + mtf.reduce_sum(never * 2.0))
    return [loss] + mtf.gradients([loss], [t[n] for n in names])
  args = [tf.constant(LOOP_INPUTS[n][0]) for n in names]
  got = mtf.MeshFunction(build, impl)(*args)
  with tf.GradientTape() as tape:
    tape.watch(args)
    ref = loop_reference(dict(zip(names, args)))
    loss = (tf.reduce_sum(ref["h"]) + tf.reduce_sum(ref["acc"]) + ref["s"]
            + tf.reduce_sum(args[0] * 2.0))
  for a, b in zip(got, [loss] + tape.gradient(loss, args)):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_while_loop_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "batch:4")
  i = counter(mesh)
  with pytest.raises(ValueError, match="scalar bool"):
    control.while_loop(lambda i, x: mtf.less(x, 1.0), lambda i, x: [i, x],
                       [i, x])
  with pytest.raises(ValueError, match="returned 1 tensors for 2 loop"):
    control.while_loop(lambda i, x: mtf.less(i, 2), lambda i, x: [i + 1],
                       [i, x])
  with pytest.raises(ValueError, match="loop variable 1 enters as"):
    control.while_loop(lambda i, x: mtf.less(i, 2),
                       lambda i, x: [i + 1, mtf.reduce_sum(x)], [i, x])
  with pytest.raises(ValueError, match="num_loop_vars"):
    control.while_loop(lambda i, x: mtf.less(i, 2), lambda i, x: [i + 1, x],
                       [i, x], num_loop_vars=3)
  with pytest.raises(ValueError, match="unsupported tf.while_loop"):
    control.while_loop(lambda i, x: mtf.less(i, 2), lambda i, x: [i + 1, x],
                       [i, x], shape_invariants=None)
  _, y = control.while_loop(lambda i, x: mtf.less(i, 2),
                            lambda i, x: [i + 1, x * 2.0], [i, x],
                            back_prop=False, name="no_grad_loop")
  with pytest.raises(ValueError, match="'no_grad_loop' was built with "
                     "back_prop=False"):
    mtf.gradients([mtf.reduce_sum(y)], [x])
  v = mtf.get_variable(mesh, "v", "batch:4")

  def body(i, x):  # x * x, computed after an assignment in the body
    return [i + 1, control.depend(x, [mtf.assign(v, x)]) * x]
  _, y = control.while_loop(lambda i, x: mtf.less(i, 2), body, [i, x],
                            name="side_effect_loop")
  with pytest.raises(ValueError, match="'side_effect_loop' has no gradient"):
    mtf.gradients([mtf.reduce_sum(y)], [x])


# --- custom_gradient and recompute_grad --------------------------------------
GRAD_INPUTS = {
    "x": (arr(4, 8, seed=3), "batch:4;hidden:8"),
    "w": (arr(8, 4, seed=4), "hidden:8;h2:4"),
}
GRAD_LAYOUTS = [
    ("all:8", "hidden:all"),
    (MESH, "batch:rows;hidden:cols"),
    (MESH, "hidden:rows;h2:cols"),
]


def _scaled_grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
                    output_grads):
  """Half the true gradient for x, twice it for w (read from outside)."""
  del explicit_inputs, forward_operations, outputs
  x, w = all_inputs
  dy = output_grads[0]
  return [mtf.einsum([dy, w], output_shape=x.shape) * 0.5,
          mtf.einsum([x, dy], output_shape=w.shape) * 2.0]


def _grad_model(log):
  def model(mesh, t):
    x, w = t["x"], t["w"]
    y = control.custom_gradient(
        lambda x: mtf.einsum([x, w], output_shape=[BATCH, H2]),
        _scaled_grad_fn, [x])
    z = control.recompute_grad(
        lambda x: mtf.tanh(mtf.einsum([x, w], output_shape=[BATCH, H2])) * x,
        [x])
    p = control.Print(x * 2.0, [mtf.reduce_sum(x), x], "PRINTED",
                      summarize=-1, output_stream="file://%s" % log)
    d = control.depend(p + 1.0, [mtf.reduce_sum(p), w])
    return {"y": y, "z": z, "d": d}
  return model


def _grad_reference(t):
  @tf.custom_gradient
  def scaled(x, w):
    def grad(dy):
      return 0.5 * dy @ tf.transpose(w), 2.0 * tf.transpose(x) @ dy
    return x @ w, grad
  x, w = t["x"], t["w"]
  return {"y": scaled(x, w), "d": x * 2.0 + 1.0,
          "z": tf.tanh(x @ w)[:, :, None] * x[:, None, :]}


def test_custom_gradient_recompute_grad_print_and_depend(tmp_path):
  log = tmp_path / "print.log"
  harness.assert_layout_invariant(_grad_model(log), GRAD_INPUTS, GRAD_LAYOUTS,
                                  wrt=["x", "w"], reference=_grad_reference)
  lines = [l for l in log.read_text().splitlines() if "PRINTED" in l]
  # Once per run (1 device + 3 layouts x 2 backends), on the first
  # processor only, with the full value of the (split) data.
  assert len(lines) == 7, lines
  total = "%.4f" % GRAD_INPUTS["x"][0].sum()
  assert all("%.4f" % float(l.split("]", 1)[1].split()[0]) == total
             for l in lines), lines


def test_custom_gradient_recompute_grad_print_uneven(tmp_path):
  """hidden:8 and h2:4 split 3 ways (padded): the custom gradient, the
  recomputed forward and Print's gathered data ignore the padding."""
  log = tmp_path / "print.log"
  harness.assert_layout_invariant(
      _grad_model(log), GRAD_INPUTS, [("a:3", "hidden:a"),
                                      ("a:3;b:2", "h2:a;hidden:b"),
                                      ("a:3;b:2", harness.annotated(
                                          "hidden:b+a", {"x": "batch:a",
                                                         "w": "h2:b"}))],
      wrt=["x", "w"], reference=_grad_reference)
  total = "%.4f" % GRAD_INPUTS["x"][0].sum()
  lines = [l for l in log.read_text().splitlines() if "PRINTED" in l]
  assert len(lines) == 7 and all(
      "%.4f" % float(l.split("]", 1)[1].split()[0]) == total for l in lines)


def _runs_without_and_with_recompute(monkeypatch, block):
  """(plain, again): the model z = block(t)(x), without and with
  recompute_grad, through the harness on all:8, each with .tanh_count
  (the tanh ops its lowering lowered); the two give the same values and
  gradients."""
  lowered = []
  original = elementwise.UnaryOperation.lower

  def counting_lower(op, lowering):
    lowered.append(op._kind)  # pylint: disable=protected-access
    return original(op, lowering)
  monkeypatch.setattr(elementwise.UnaryOperation, "lower", counting_lower)

  def model(recompute):
    def fn(mesh, t):
      f = block(t)
      return {"z": control.recompute_grad(f, [t["x"]]) if recompute
              else f(t["x"])}
    return fn
  runs = {}
  for recompute in (False, True):
    del lowered[:]
    runs[recompute] = harness.run_model(model(recompute), GRAD_INPUTS,
                                        "all:8", "hidden:all", wrt=["x", "w"])
    runs[recompute].tanh_count = lowered.count("tanh")
  plain, again = runs[False], runs[True]
  np.testing.assert_allclose(again.outputs["z"], plain.outputs["z"])
  for n in ("x", "w"):
    np.testing.assert_allclose(again.grads[n], plain.grads[n], rtol=1e-6)
  return plain, again


def test_recompute_grad_recomputes_and_matches(monkeypatch):
  def block(t):
    def f(x):
      h = mtf.tanh(mtf.einsum([x, t["w"]], output_shape=[BATCH, H2]))
      return mtf.dropout(h, rate=0.5) * 2.0
    return f
  # The same values and gradients (dropout's mask too: a copied random op
  # keeps its name, hence its numbers; checked in the helper)...
  plain, again = _runs_without_and_with_recompute(monkeypatch, block)
  # ...but the forward tanh is lowered a second time for the backward pass,
  # and no backward op reads the first forward's activations.
  assert (plain.tanh_count, again.tanh_count) == (1, 2)
  ops = again.graph.operations
  custom, = [op for op in ops
             if isinstance(op, control.CustomGradientOperation)]
  forward = custom._forward_operations  # pylint: disable=protected-access
  inner = set(t for op in forward for t in op.outputs) - set(custom.inputs)
  assert len(forward) >= 5 and inner
  after = ops[ops.index(custom) + 1:]
  assert not [op.name for op in after if set(op.inputs) & inner]


def test_recompute_grad_runs_a_nested_custom_gradient_forward_once(
    monkeypatch):
  """A custom gradient inside a recomputed block (a norm's or softmax's,
  whose gradient reads its outputs): the block's recomputation copies the
  custom gradient's forward ops once, and its gradient reads those copies
  -- it does not re-create them a second time."""
  def tanh_grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
                   output_grads):
    del explicit_inputs, forward_operations
    y = outputs[0]
    return [output_grads[0] * (1.0 - y * y)] + [None] * (len(all_inputs) - 1)

  def block(t):
    def f(x):
      h = mtf.einsum([x, t["w"]], output_shape=[BATCH, H2])
      # The product's gradient reads the recomputed tanh.
      return control.custom_gradient(mtf.tanh, tanh_grad_fn, [h]) * h
    return f
  # Same values and gradients (checked in the helper).
  plain, again = _runs_without_and_with_recompute(monkeypatch, block)
  # The forward's tanh, and one recomputed copy (not two).
  assert (plain.tanh_count, again.tanh_count) == (1, 2)
  ops = again.graph.operations
  tanh_copies = [op for op in ops[again.graph.backward_start:]
                 if isinstance(op, elementwise.UnaryOperation) and
                 op._kind == "tanh"]  # pylint: disable=protected-access
  assert len(tanh_copies) == 1


def test_custom_gradient_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "batch:4")
  y = control.custom_gradient(lambda x: x * 2.0,
                              lambda **kw: [kw["output_grads"][0]] * 2, [x])
  with pytest.raises(ValueError, match="returned 2 gradients for 1 inputs"):
    mtf.gradients([mtf.reduce_sum(y)], [x])
  inner = []

  def fn(x):
    inner.append(mtf.exp(x))
    return inner[0] * 2.0
  y2 = control.custom_gradient(fn, lambda **kw: [kw["output_grads"][0]], [x])
  leak = mtf.reduce_sum(y2 + inner[0])
  with pytest.raises(ValueError, match="intermediate tensor of its function"):
    mtf.gradients([leak], [x])


# --- depend ------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["placement", "simd"])
def test_depend_orders_after_an_assign(backend):
  impl = harness.make_impl(backend, MESH, "batch:rows")
  seen = {}

  def build(mesh, x):
    v = mtf.get_variable(mesh, "v", "batch:4",
                         initializer=mtf.zeros_initializer())
    x = mtf.import_tf_tensor(mesh, x, "batch:4")
    update = mtf.assign(v, x)
    y = control.depend(x * 3.0, [update])
    seen["y"] = y
    return y
  fn = mtf.MeshFunction(build, impl)
  np.testing.assert_allclose(fn(tf.ones([4])).numpy(), [3.0] * 4)
  np.testing.assert_allclose(fn.variable_value("v"), [1.0] * 4)
  def waits_for_assign(op):
    return any("Assign" in c.type for c in op.control_inputs)
  if backend == "placement":  # every slice of y waits for the assignment
    assert all(waits_for_assign(t.op)
               for t in fn.lowering.tensors[seen["y"]].tensor_list)
  else:  # y's identity in the per-device program
    assert any(op.type == "Identity" and waits_for_assign(op)
               for op in fn.lowering.program.graph.get_operations())


# --- serialize_training_step -------------------------------------------------
def test_serialize_training_step_matches_the_full_batch():
  batch = mtf.Dimension("batch", 16)
  hidden, h2 = mtf.Dimension("hidden", 4), mtf.Dimension("h2", 2)

  def model(mesh, t):
    def model_fn(features):
      v = mtf.get_variable(mesh, "v", [hidden, h2],
                           initializer=mtf.zeros_initializer())
      w = v + t["w"]
      h = mtf.tanh(mtf.einsum([features["x"], w],
                              output_shape=[features["x"].shape.dims[0], h2]))
      per_example = mtf.reduce_sum(mtf.square(h), reduced_dim=h2)
      return {"loss": mtf.reduce_sum(per_example), "per_example": per_example}
    grads, outputs = microbatch.serialize_training_step(
        {"x": t["x"]}, model_fn, batch, num_splits=2)
    return {k: mtf.stop_gradient(v) for k, v in
            [("loss", outputs["loss"]), ("per", outputs["per_example"]),
             ("grad", grads[0])]}

  def reference(t):
    w = t["w"]
    with tf.GradientTape() as tape:
      tape.watch(w)
      per = tf.reduce_sum(tf.square(tf.tanh(t["x"] @ w)), axis=1)
      loss = tf.reduce_sum(per)
    return {"loss": loss, "per": per, "grad": tape.gradient(loss, w)}
  harness.assert_layout_invariant(
      model, {"x": (arr(16, 4, seed=6), "batch:16;hidden:4"),
              "w": (arr(4, 2, seed=7), "hidden:4;h2:2")},
      [("all:8", "batch:all"), (MESH, "batch:rows;hidden:cols"),
       (MESH, "batch:cols;h2:rows"), ("a:3", "batch:a")],
      reference=reference)


def test_serialize_training_step_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.ones(mesh, "batch:6;io:2")
  with pytest.raises(ValueError, match="num_splits=4 must divide"):
    microbatch.serialize_training_step({"x": x}, None, mtf.Dimension("batch", 6),
                                     4)
  with pytest.raises(ValueError, match="without the batch dim"):
    microbatch.serialize_training_step({"x": x}, None, mtf.Dimension("b", 6), 2)


def test_while_loop_uneven_layouts():
  """The loop body contracts hidden:8 and h2:4 split 3 ways (stripes of 3
  and 2, padded): the loop state carries the padded slices, the body's
  contractions and the gradients' backward loop ignore the padding."""
  harness.assert_layout_invariant(
      loop_model, LOOP_INPUTS, [("a:3", "hidden:a"), ("a:3;b:2",
                                                       "h2:a;batch:b"),
                                ("a:3;b:2", "hidden:b+a"),
                                ("a:3;b:2", harness.annotated(
                                    "hidden:a", {"h0": "hidden:a+b",
                                                 "w1": "h2:b"}))],
      wrt=sorted(LOOP_INPUTS), reference=loop_reference, rtol=1e-4,
      atol=1e-5)
