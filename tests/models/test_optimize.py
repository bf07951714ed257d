"""Optimizers, schedules, clipping and mixed precision (meshtf/models/).

Every optimizer trains a tiny model for STEPS steps inside a MeshFunction,
on the 1-device mesh and on 8 virtual devices with layouts that split the
parameter dims, on both backends. Losses, final weights and slot variables
must match a numpy (float64) reference of the same update rule, and every
layout must match the single-device run.

Model: y = x w + b, loss = mean((y - target)^2);
x [batch:8, io:8], w [io:8, hidden:16], b [hidden:16],
target [batch:8, hidden:16].
"""
import functools
import math
import types

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import optimize

STEPS = 4
X_SHAPE, W_SHAPE, B_SHAPE, T_SHAPE = ("batch:8;io:8", "io:8;hidden:16",
                                      "hidden:16", "batch:8;hidden:16")
X_NP = harness.random_array([8, 8], 0)
T_NP = harness.random_array([8, 16], 1)
W0 = harness.random_array([8, 16], 2)
B0 = harness.random_array([16], 3) * 0.1
# Both split parameter dims; the second splits w over both mesh axes.
LAYOUTS = [("all:8", "hidden:all"), ("rows:2;cols:4", "io:rows;hidden:cols")]
RTOL, ATOL = 1e-5, 1e-6


# --- the model and its numpy reference ----------------------------------------
def build_step(make_optimizer, activation_dtype=None, use_global_step=False,
               master_dtype=tf.float32):
  """build_fn for MeshFunction: loss, gradients, optimizer update."""
  optimizer = make_optimizer()   # one object serves every trace

  def build(mesh, x_tf, t_tf):
    vdt = dtypes.VariableDType(master_dtype, activation_dtype=activation_dtype)
    w = dtypes.get_variable(mesh, "w", W_SHAPE, dtype=vdt,
                            initializer=mtf.constant_initializer(W0))
    b = dtypes.get_variable(mesh, "b", B_SHAPE, dtype=vdt,
                            initializer=mtf.constant_initializer(B0))
    x = mtf.cast(mtf.import_tf_tensor(mesh, x_tf, X_SHAPE), w.dtype)
    t = mtf.cast(mtf.import_tf_tensor(mesh, t_tf, T_SHAPE), w.dtype)
    y = mtf.einsum([x, w], output_shape=T_SHAPE) + b
    loss = mtf.cast(mtf.reduce_mean(mtf.square(y - t)), tf.float32)
    grads = mtf.gradients([loss], [w, b])
    step = None
    if use_global_step:
      step, _ = optimize.get_global_step(mesh)
    ops = optimizer.apply_grads(grads, [w, b], step=step)
    assert all(isinstance(op, mtf.Operation) for op in ops)
    return loss
  return build


def train(make_optimizer, backend="simd", mesh_shape="all:1", layout="",
          steps=STEPS, variable_layout=None, **kwargs):
  """Returns (losses, {variable name: final value}, MeshFunction)."""
  fn = mtf.MeshFunction(build_step(make_optimizer, **kwargs),
                        harness.make_impl(backend, mesh_shape, layout,
                                          variable_layout))
  x, t = tf.constant(X_NP), tf.constant(T_NP)
  losses = np.array([float(fn(x, t)) for _ in range(steps)])
  values = {n: fn.variable_value(n) for n in fn.variable_store.names()}
  return losses, values, fn


def loss_and_grads(p):
  r = X_NP.astype(np.float64) @ p["w"] + p["b"] - T_NP
  dr = 2.0 * r / r.size
  return (r ** 2).mean(), {"w": X_NP.T @ dr, "b": dr.sum(axis=0)}


def reference(update, steps=STEPS):
  """Numpy training: update(name, param, grad, slots, step) -> new param,
  mutating slots ({slot name: array}). Returns (losses, values) with values
  named like the meshtf variables ("w", "w/slot_m", ...)."""
  p = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
  slots = {"w": {}, "b": {}}
  losses = []
  for step in range(steps):
    loss, g = loss_and_grads(p)
    losses.append(loss)
    p = {n: update(n, p[n], g[n], slots[n], step) for n in p}
  values = dict(p)
  for n in slots:
    values.update({"%s/slot_%s" % (n, k): v for k, v in slots[n].items()})
  return np.array(losses), values


def rms(a):
  return math.sqrt(np.mean(np.square(a)))


def sgd_ref(lr):
  return lambda n, p, g, s, step: p - lr * g


def momentum_ref(lr, mu):
  def update(n, p, g, s, step):
    s["velocity"] = mu * s.get("velocity", 0.0) - lr * g
    return p + s["velocity"]
  return update


def adam_ref(lr, wd=0.0, b1=0.9, b2=0.999, eps=1e-6, exclude=(),
             bias_correction=False):
  def update(n, p, g, s, step):
    s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
    m, v = s["m"], s["v"]
    if bias_correction:
      m, v = m / (1 - b1 ** (step + 1)), v / (1 - b2 ** (step + 1))
    u = m / (np.sqrt(v) + eps)
    if wd and n not in exclude:
      u = u + wd * p
    return p - (lr(step) if callable(lr) else lr) * u
  return update


def adafactor_ref(lr=None, decay=None, beta1=0.0, clip=1.0, scale=True,
                  factor_w=False, eps1=1e-30, eps2=1e-3, stacked=None,
                  exclude=()):
  """stacked: {name: its axes in stacked_dim_names} (one parameter scale per
  index on them); exclude: names updated without parameter scale."""
  def update(n, p, g, s, step):
    d = 1 - (step + 1.0) ** -0.8 if decay is None else decay(step)
    if lr is None:
      rate = min(0.01, (step + 1.0) ** -0.5) * (1 if scale else 0.05)
    else:   # a schedule, on Python floats (checked against closed forms)
      rate = lr(float(step))
    g2 = g * g + eps1
    if n == "w" and factor_w:
      # Largest dims: d0 = hidden (axis 1), d1 = io (axis 0).
      s["vr"] = d * s.get("vr", 0.0) + (1 - d) * g2.mean(axis=1)   # [io]
      s["vc"] = d * s.get("vc", 0.0) + (1 - d) * g2.mean(axis=0)   # [hidden]
      x = (g / np.sqrt(s["vr"] / s["vr"].mean())[:, None]
           / np.sqrt(s["vc"])[None, :])
    else:
      s["v"] = d * s.get("v", 0.0) + (1 - d) * g2
      x = g / np.sqrt(s["v"])
    if clip is not None:
      x = x / max(1.0, rms(x) / clip)
    if not scale or n in exclude:
      sub = x * rate
    else:
      keep = (stacked or {}).get(n, ())
      axes = tuple(a for a in range(p.ndim) if a not in keep)
      per_member = np.sqrt(np.mean(np.square(p), axis=axes, keepdims=True))
      sub = x * np.maximum(per_member, eps2) * rate
    if beta1:
      s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * sub
      sub = s["m"]
    return p - sub
  return update


# name -> (optimizer factory, numpy update rule)
CASES = {
    "sgd": (lambda: optimize.SgdOptimizer(0.1), sgd_ref(0.1)),
    "momentum": (lambda: optimize.MomentumOptimizer(0.1, 0.9),
                 momentum_ref(0.1, 0.9)),
    "adam": (lambda: optimize.AdamWeightDecayOptimizer(
        0.01, weight_decay_rate=0.1, exclude_from_weight_decay=["^b$"],
        bias_correction=True),
             adam_ref(0.01, wd=0.1, exclude=("b",), bias_correction=True)),
    "adafactor_factored_beta1": (
        lambda: optimize.AdafactorOptimizer(beta1=0.5,
                                            min_dim_size_to_factor=8),
        adafactor_ref(beta1=0.5, factor_w=True)),
    "adafactor_default": (lambda: optimize.AdafactorOptimizer(),
                          adafactor_ref()),
    # Mesh TF's stacked_dim_names: w (big enough to factor at 8) is neither
    # factored nor given one scale: one per io row. b: no parameter scale.
    "adafactor_stacked_excluded": (
        lambda: optimize.AdafactorOptimizer(
            min_dim_size_to_factor=8, stacked_dim_names=["io"],
            exclude_from_parameter_scale=["b"]),
        adafactor_ref(stacked={"w": (0,)}, exclude=("b",))),
}
# Single-device only: variants of the rules above.
SINGLE_DEVICE_CASES = {
    # Mesh TF's AdamWeightDecayOptimizer: no bias correction (the default).
    "adam_mesh_tf_default": (
        lambda: optimize.AdamWeightDecayOptimizer(0.01),
        adam_ref(0.01, bias_correction=False)),
    "adafactor_no_scale_adam_decay": (
        lambda: optimize.AdafactorOptimizer(
            multiply_by_parameter_scale=False, clipping_threshold=None,
            decay_rate=optimize.adafactor_decay_rate_adam(0.99),
            min_dim_size_to_factor=8),
        adafactor_ref(scale=False, clip=None, factor_w=True,
                      decay=lambda s: 0.99 * (1 - 0.99 ** s) /
                      (1 - 0.99 ** (s + 1)))),
    "adafactor_schedule_lr_tight_clip": (
        lambda: optimize.AdafactorOptimizer(
            learning_rate=optimize.warmup_then_decay(0.05, 2),
            decay_rate=0.5, clipping_threshold=0.5),
        adafactor_ref(lr=optimize.warmup_then_decay(0.05, 2),
                      decay=lambda s: 0.5, clip=0.5)),
}


def by_name(**rules):
  """A numpy update rule per variable: by_name(w=rule_w, b=rule_b)."""
  return lambda n, p, g, s, step: rules[n](n, p, g, s, step)


def hparams(**kwargs):
  """Mesh TF (tensor2tensor) style Adafactor hparams."""
  values = dict(optimizer="Adafactor", optimizer_adafactor_decay_type="pow",
                optimizer_adafactor_memory_exponent=0.5,
                optimizer_adafactor_beta2=0.99,
                optimizer_adafactor_multiply_by_parameter_scale=False,
                optimizer_adafactor_beta1=0.5,
                optimizer_adafactor_clipping_threshold=2.0,
                optimizer_adafactor_factored=True)
  values.update(kwargs)
  return types.SimpleNamespace(**values)


def _warm(s, total):   # a Mesh TF style factor: f(step, total_train_steps)
  return (s + 1.0) / total


# Mesh TF's several-schedule optimizers: w and b learn at different rates.
# Adafactor's patterns both match b: the last one's schedule wins.
MULTI_LR_CASES = {
    "adam_multi_lr": (
        lambda: optimize.AdamWithMultiLRSchedule(
            variable_search=["^w$"], alt_lr_schedules=[[0.02, _warm]],
            train_steps=4, learning_rate=0.01),
        by_name(w=adam_ref(lambda s: 0.02 * (s + 1.0) / 4), b=adam_ref(0.01))),
    "adafactor_multi_lr_stacked": (   # passes Adafactor's options through
        lambda: optimize.AdafactorWithMultiLRSchedule(
            variable_search=["^b$"], alt_lr_schedules=[[0.002, _warm]],
            train_steps=8, learning_rate=0.01, decay_rate=0.9,
            stacked_dim_names=["hidden"], exclude_from_parameter_scale=["w"],
            min_dim_size_to_factor=8),
        by_name(w=adafactor_ref(lr=lambda s: 0.01, decay=lambda s: 0.9,
                                exclude=("w",)),
                b=adafactor_ref(lr=lambda s: 0.002 * (s + 1.0) / 8,
                                decay=lambda s: 0.9, stacked={"b": (0,)}))),
    "adafactor_multi_lr": (
        lambda: optimize.AdafactorWithMultiLRSchedule(
            variable_search=["w|b", "^b$"],
            alt_lr_schedules=[[0.03], [0.002, _warm]], train_steps=8,
            learning_rate=0.5, decay_rate=0.9),
        by_name(w=adafactor_ref(lr=lambda s: 0.03, decay=lambda s: 0.9),
                b=adafactor_ref(lr=lambda s: 0.002 * (s + 1.0) / 8,
                                decay=lambda s: 0.9))),
    # from_hparams: pow decay 1 - (s + 1)^-0.5, no parameter scale, beta1,
    # clipping at 2; w is too small to factor (128 is the default).
    "adafactor_from_hparams": (
        lambda: optimize.adafactor_optimizer_from_hparams(hparams(), 0.02),
        adafactor_ref(lr=lambda s: 0.02, decay=lambda s: 1 - (s + 1.0) ** -0.5,
                      beta1=0.5, clip=2.0, scale=False)),
    "make_optimizer_hparams_adam_decay": (
        lambda: optimize.make_optimizer(hparams(
            optimizer_adafactor_decay_type="Adam",
            optimizer_adafactor_multiply_by_parameter_scale=True,
            optimizer_adafactor_beta1=0.0), 0.02),
        adafactor_ref(lr=lambda s: 0.02, clip=2.0,
                      decay=lambda s: 0.99 * (1 - 0.99 ** s) /
                      (1 - 0.99 ** (s + 1)))),
}
SINGLE_DEVICE_CASES.update(MULTI_LR_CASES)


def check_against(losses, values, ref_losses, ref_values, what):
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL,
                             err_msg=what + " losses")
  for n, v in ref_values.items():
    assert n in values, "%s: no variable %r in %s" % (what, n, sorted(values))
    np.testing.assert_allclose(values[n], v, rtol=RTOL, atol=ATOL,
                               err_msg="%s variable %s" % (what, n))


@functools.lru_cache(maxsize=None)
def single_device(case):
  make, update = {**CASES, **SINGLE_DEVICE_CASES}[case]
  losses, values, _ = train(make)
  ref_losses, ref_values = reference(update)
  check_against(losses, values, ref_losses, ref_values, case + " 1 device")
  return losses, values


# --- optimizers vs numpy, on every layout and backend -------------------------
@pytest.mark.parametrize("case", sorted({**CASES, **SINGLE_DEVICE_CASES}))
def test_single_device_matches_numpy(case):
  losses, _ = single_device(case)
  assert losses[-1] < losses[0]


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS)
@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_invariant_and_matches_numpy(case, backend, mesh_shape, layout):
  base_losses, base_values = single_device(case)
  losses, values, _ = train(CASES[case][0], backend, mesh_shape, layout)
  what = "%s %s mesh=%s layout=%s" % (case, backend, mesh_shape, layout)
  check_against(losses, values, base_losses, base_values, what)
  assert sorted(values) == sorted(base_values)
  check_against(losses, values, *reference(CASES[case][1]), what=what)


# Weight-update sharding: the batch split for the computation, the
# parameters and their slots stored split over the same processors.
WUS_LAYOUTS = [("all:8", "batch:all", "hidden:all"),
               ("rows:2;cols:4", "batch:rows+cols", "io:rows;hidden:cols")]


@pytest.mark.parametrize("mesh_shape,layout,variable_layout", WUS_LAYOUTS)
@pytest.mark.parametrize("backend", sorted(harness.BACKENDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_weight_update_sharding_matches_numpy(case, backend, mesh_shape,
                                              layout, variable_layout):
  """Gradients reduce-scattered into the parameters' layout (no allreduce
  of a parameter-sized tensor), the update and every full-size slot on
  1/8 of each tensor, the numbers of one device and of numpy."""
  base_losses, base_values = single_device(case)
  losses, values, fn = train(CASES[case][0], backend, mesh_shape, layout,
                             variable_layout=variable_layout)
  what = "%s %s %s vars=%s" % (case, backend, layout, variable_layout)
  check_against(losses, values, base_losses, base_values, what)
  check_against(losses, values, *reference(CASES[case][1]), what=what)
  store = fn.variable_store
  full_size = [n for n in store.names()
               if store.entry(n).shape == store.entry("w").shape]
  assert len(full_size) >= 1 + ("slot" in " ".join(full_size))
  for name in full_size:   # w and its full-size slots: 1/8 per device
    entry = store.entry(name)
    assert entry.mesh_layout.slice_size(entry.shape) * 8 == \
        entry.shape.size, (name, what)
  stats = fn.lowering.collective_stats()
  assert any(s["kind"] == "reduce_scatter" for s in stats), stats
  assert all(s["elements_per_device"] < 8 * 16 for s in stats
             if s["kind"].startswith("allreduce")), stats


def test_slots_share_the_parameter_layout():
  impl = harness.make_impl("simd", *LAYOUTS[1])
  _, values, fn = train(CASES["adafactor_factored_beta1"][0], "simd",
                        *LAYOUTS[1], steps=1)
  store = fn.variable_store
  layout_of = lambda n: impl.tensor_layout(store.entry(n).shape)
  for slot in ("w/slot_m",):
    assert store.entry(slot).shape == store.entry("w").shape
    assert layout_of(slot) == layout_of("w")
  # Factored: row accumulator drops hidden (d0), column drops io (d1), and
  # each keeps the layout of the dims it keeps.
  assert store.entry("w/slot_vr").shape == mtf.convert_to_shape("io:8")
  assert store.entry("w/slot_vc").shape == mtf.convert_to_shape("hidden:16")
  assert layout_of("w/slot_vc") == layout_of("b")
  assert store.entry("b/slot_v").shape == store.entry("b").shape
  assert store.entry("optimizer_step").dtype == tf.int64
  assert int(values["optimizer_step"]) == 1


@pytest.mark.parametrize("case", ["momentum", "adam"])
def test_update_adds_no_communication(case):
  """The same collectives as plain SGD: the update itself is slicewise."""
  layout = ("rows:2;cols:4", "batch:rows;hidden:cols")
  sgd = train(CASES["sgd"][0], "simd", *layout, steps=1)[2].collective_stats()
  other = train(CASES[case][0], "simd", *layout, steps=1)[2]
  assert sgd and other.collective_stats() == sgd


def test_adafactor_fuses_small_allreduces_across_variables():
  """Adafactor adds only row/column means and RMS scalars (at most a row
  per variable); built phase by phase, the variables' reductions of a
  phase go out fused: fewer collectives, the same elements, the same
  numbers as one allreduce per reduction (bucket_bytes=0)."""
  layout = ("rows:2;cols:4", "io:rows;hidden:cols")
  count = lambda stats: sum(s["count"] for s in stats)  # noqa: E731
  elements = lambda stats: sum(  # noqa: E731
      s["elements_per_device"] * s["count"] for s in stats)
  sgd = train(CASES["sgd"][0], "simd", *layout, steps=1)[2].collective_stats()
  runs = {}
  for bucket_bytes in (0, None):
    fn = mtf.MeshFunction(build_step(CASES["adafactor_factored_beta1"][0]),
                          harness.make_impl("simd", *layout),
                          bucket_bytes=bucket_bytes)
    losses = [float(fn(tf.constant(X_NP), tf.constant(T_NP)))
              for _ in range(2)]
    stats = fn.collective_stats()
    assert all(s["kind"] == "allreduce_sum" for s in stats), stats
    runs[bucket_bytes] = (losses, fn.variable_value("w"), stats)
  per_reduction, fused = runs[0][2], runs[None][2]
  extra = [s for s in per_reduction if s not in sgd]
  assert max(s["elements_per_device"] for s in extra) <= 16 // 4, extra
  # w: row mean (io, over cols: 4 elements), column mean (hidden, over
  # rows: 4), its parameter scale and clipping RMS (over both), the row
  # accumulator's mean (over rows); b: its two RMS scalars (over cols).
  assert count(per_reduction) - count(sgd) == 7, per_reduction
  # Fused per phase and mesh axes: w's row mean with b's parameter scale.
  assert count(fused) - count(sgd) == 6, fused
  assert {"mesh_axes": ("cols",), "elements_per_device": 5} in [
      {k: s[k] for k in ("mesh_axes", "elements_per_device")} for s in fused]
  assert elements(fused) == elements(per_reduction)
  np.testing.assert_allclose(runs[None][0], runs[0][0], rtol=1e-6)
  np.testing.assert_allclose(runs[None][1], runs[0][1], rtol=1e-6)


def test_data_parallel_layout():
  """Replicated parameters, gradients summed over the batch split."""
  for case in ("adam", "adafactor_factored_beta1"):
    losses, values, _ = train(CASES[case][0], "simd", "all:8", "batch:all")
    check_against(losses, values, *single_device(case), what=case)


def test_adam_bias_correction_first_step_is_lr():
  lr = 0.01
  for bias_correction, expected in [(True, lr),
                                    (False, lr * 0.1 / math.sqrt(0.001))]:
    # A tiny epsilon: elements whose |g| is near epsilon move less.
    _, values, _ = train(lambda: optimize.AdamWeightDecayOptimizer(
        lr, bias_correction=bias_correction, epsilon=1e-12), steps=1)
    step = np.abs(values["w"] - W0)
    # m_hat / sqrt(v_hat) = g / |g| on the first step.
    np.testing.assert_allclose(step, expected, rtol=1e-3)


def test_adam_default_is_mesh_tf_update():
  """Mesh TF's AdamWeightDecayOptimizer has no bias correction: its update
  is lr * m / (sqrt(v) + eps) on the raw moments. bias_correction=True
  divides them by 1 - beta^t first. Two steps, by hand on w and b."""
  lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-6
  for kwargs, corrected in [({}, False), ({"bias_correction": True}, True)]:
    p = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
    m = {n: 0.0 for n in p}
    v = {n: 0.0 for n in p}
    for t in (1, 2):
      _, g = loss_and_grads(p)
      for n in p:
        m[n] = b1 * m[n] + (1 - b1) * g[n]
        v[n] = b2 * v[n] + (1 - b2) * g[n] ** 2
        m_hat, v_hat = m[n], v[n]
        if corrected:
          m_hat, v_hat = m_hat / (1 - b1 ** t), v_hat / (1 - b2 ** t)
        p[n] = p[n] - lr * m_hat / (np.sqrt(v_hat) + eps)
    _, values, _ = train(lambda: optimize.AdamWeightDecayOptimizer(
        lr, **kwargs), steps=2)
    for n in p:
      np.testing.assert_allclose(values[n], p[n], rtol=RTOL, atol=ATOL,
                                 err_msg="%s %s" % (kwargs, n))
      np.testing.assert_allclose(values[n + "/slot_m"], m[n], rtol=RTOL,
                                 atol=ATOL)


def test_optimizer_uses_a_given_step():
  """step= from get_global_step: no counter of its own, schedules follow the
  given step (lr = 0 at step 0 with linear warmup)."""
  sched = optimize.warmup_then_decay(0.1, 2, "rsqrt")
  losses, values, _ = train(lambda: optimize.SgdOptimizer(sched),
                            use_global_step=True)
  assert "optimizer_step" not in values and int(values["global_step"]) == STEPS
  ref = lambda n, p, g, s, step: p - sched(float(step)) * g
  check_against(losses, values, *reference(ref), what="sgd schedule")
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-7)  # lr(0) = 0


# --- mixed precision ----------------------------------------------------------
def test_variable_dtype():
  vdt = dtypes.VariableDType(tf.float32, activation_dtype=tf.bfloat16)
  assert (vdt.master_dtype, vdt.slice_dtype, vdt.activation_dtype) == (
      tf.float32, tf.float32, tf.bfloat16)
  assert vdt == dtypes.VariableDType("float32", None, "bfloat16")
  assert "bfloat16" in repr(vdt)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = dtypes.get_variable(mesh, "w", W_SHAPE, dtype=vdt)
  assert w.dtype == tf.bfloat16 and graph.trainable_variables[0].dtype == \
      tf.float32
  assert dtypes.get_variable(mesh, "v", B_SHAPE, dtype=tf.float32).dtype == \
      tf.float32


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS[1:])
def test_bfloat16_activations_float32_updates(mesh_shape, layout):
  losses, values, _ = train(CASES["adam"][0], "simd", mesh_shape, layout,
                            activation_dtype=tf.bfloat16)
  for n in ("w", "w/slot_m", "w/slot_v", "b/slot_v"):
    assert values[n].dtype == np.float32, n
  ref_losses, ref_values = single_device("adam")
  # bfloat16 has ~3 significant digits; the updates themselves are float32.
  np.testing.assert_allclose(losses, ref_losses, rtol=3e-2)
  # Adam moves each weight ~lr per step whatever |g|: an element with a
  # tiny gradient can take a bfloat16-noisy direction, so compare on average.
  diff = np.abs(values["w"] - ref_values["w"])
  assert diff.mean() < 1e-3 and diff.max() < 2 * STEPS * 0.01, diff
  assert np.abs(values["w"] - W0).max() > 0.02   # it did train


def test_float64_variables_update_in_float64():
  losses, values, _ = train(CASES["adam"][0], master_dtype=tf.float64)
  ref_losses, ref_values = reference(CASES["adam"][1])
  assert values["w/slot_m"].dtype == np.float64
  for n, v in ref_values.items():
    np.testing.assert_allclose(values[n], v, rtol=1e-10, atol=1e-12,
                               err_msg=n)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)   # float32 loss


# --- schedules ----------------------------------------------------------------
STEP_VALUES = np.array([0, 1, 5, 10, 50, 99, 100, 400, 950, 1000, 2000],
                       np.float32)


def closed_forms(s):
  return {
      "constant": np.full_like(s, 0.3),
      "linear_warmup": np.minimum(1.0, s / 100.0),
      "rsqrt_decay": 1.0 / np.sqrt(np.maximum(s, 100.0)),
      "linear_decay": np.clip((1000.0 - s) / 100.0, 0.0, 1.0),
      "warmup_rsqrt": 0.01 * np.minimum(1.0, s / 100.0) * np.sqrt(
          100.0 / np.maximum(s, 100.0)),
      "warmup_linear": 0.01 * np.minimum(1.0, s / 100.0) * np.clip(
          (1000.0 - s) / 500.0, 0.0, 1.0),
      "warmup_constant": 0.01 * np.minimum(1.0, s / 100.0),
      "product": 0.5 * np.minimum(1.0, s / 10.0),
      "adafactor_pow": 1.0 - (s + 1.0) ** -0.8,
      "adafactor_pow_defaults": 1.0 - (s + 1.0) ** -0.8,   # Mesh TF's
      "adafactor_adam": 0.9 * (1 - 0.9 ** s) / (1 - 0.9 ** (s + 1)),
  }


def schedules():
  return {
      "constant": lambda s: optimize.constant(s, 0.3) + 0.0 * s,
      "linear_warmup": lambda s: optimize.linear_warmup(s, 100),
      "rsqrt_decay": lambda s: optimize.rsqrt_decay(s, 100),
      "linear_decay": lambda s: optimize.linear_decay(s, 1000, 0.1),
      "warmup_rsqrt": optimize.warmup_then_decay(0.01, 100, "rsqrt"),
      "warmup_linear": optimize.warmup_then_decay(0.01, 100, "linear", 1000,
                                                  0.5),
      "warmup_constant": optimize.warmup_then_decay(0.01, 100, "constant"),
      "product": optimize.product_schedule(
          0.5, lambda s: optimize.linear_warmup(s, 10)),
      "adafactor_pow": optimize.adafactor_decay_rate_pow(0.8),
      "adafactor_pow_defaults": optimize.adafactor_decay_rate_pow(),
      "adafactor_adam": optimize.adafactor_decay_rate_adam(0.9),
  }


def test_adafactor_decay_rate_pow_offset():
  """Mesh TF's offset (a fine-tuning's first step) restarts the memory."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  steps = np.array([100, 101, 150, 1000], np.float32)
  decay = optimize.adafactor_decay_rate_pow(0.5, offset=100)
  out = decay(mtf.import_tf_tensor(mesh, tf.constant(steps), "steps:4"))
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("simd", "all:1",
                                                          "")})
  expected = 1.0 - (steps.astype(np.float64) - 100 + 1.0) ** -0.5
  np.testing.assert_allclose(lowering.export_to_tf_tensor(out).numpy(),
                             expected, rtol=1e-6)
  np.testing.assert_allclose([decay(float(s)) for s in steps], expected,
                             rtol=1e-12)
  assert decay(100.0) == 0.0


def test_schedules_match_closed_forms():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  # Elementwise ops: one tensor of many steps evaluates every step at once.
  steps = mtf.import_tf_tensor(mesh, tf.constant(STEP_VALUES),
                               "steps:%d" % len(STEP_VALUES))
  outs = {n: f(steps) for n, f in schedules().items()}
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("simd", "all:1",
                                                          "")})
  expected = closed_forms(STEP_VALUES.astype(np.float64))
  for n, t in outs.items():
    np.testing.assert_allclose(lowering.export_to_tf_tensor(t).numpy(),
                               expected[n], rtol=1e-5, atol=1e-7, err_msg=n)
    # Python numbers give the same values as Python floats.
    for i in (0, 3, 7, 10):
      value = schedules()[n](float(STEP_VALUES[i]))
      assert isinstance(value, float), n
      np.testing.assert_allclose(value, expected[n][i], rtol=1e-12,
                                 err_msg=n)


def test_schedule_errors():
  with pytest.raises(ValueError, match="total_steps"):
    optimize.warmup_then_decay(0.1, 10, "linear")
  with pytest.raises(ValueError, match="not one of"):
    optimize.warmup_then_decay(0.1, 10, "cosine")
  assert optimize.linear_warmup(0.0, 0) == 1.0


def test_global_step_counts():
  def build(mesh):
    step, _ = optimize.get_global_step(mesh, dtype=tf.int32)
    return optimize.step_num(step)
  fn = mtf.MeshFunction(build, harness.make_impl("placement", "all:1", ""))
  assert [float(fn()) for _ in range(3)] == [0.0, 1.0, 2.0]
  assert int(fn.variable_value("global_step")) == 3


# --- clip_by_global_norm ------------------------------------------------------
@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS)
@pytest.mark.parametrize("clip_norm", [0.5, 100.0])
def test_clip_by_global_norm_matches_tensorflow(clip_norm, mesh_shape, layout):
  arrays = [W0, B0, harness.random_array([8, 8], 4)]
  names = [W_SHAPE, B_SHAPE, X_SHAPE]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  grads = [mtf.import_tf_tensor(mesh, tf.constant(a), s)
           for a, s in zip(arrays, names)]
  clipped, norm = optimize.clip_by_global_norm(grads[:2] + [None] + grads[2:],
                                               clip_norm)
  assert clipped[2] is None
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "simd", mesh_shape, layout)})
  expected, expected_norm = tf.clip_by_global_norm(
      [tf.constant(a) for a in arrays], clip_norm)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(norm).numpy(),
                             expected_norm.numpy(), rtol=1e-6)
  for got, want in zip(clipped[:2] + clipped[3:], expected):
    np.testing.assert_allclose(lowering.export_to_tf_tensor(got).numpy(),
                               want.numpy(), rtol=1e-6, atol=1e-7)
  if mesh_shape != "all:1":   # the norm sums over split dims
    assert any(s["kind"].startswith("allreduce")
               for s in lowering.collective_stats())


def test_clip_by_global_norm_in_training():
  def make():
    class Clipped(optimize.SgdOptimizer):
      def apply_grads(self, grads, variables, step=None):
        grads, _ = optimize.clip_by_global_norm(grads, 0.05)
        return super().apply_grads(grads, variables, step)
    return Clipped(0.1)
  # Reference: the global norm over both grads, computed per step.
  p = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
  for _ in range(STEPS):
    _, g = loss_and_grads(p)
    norm = math.sqrt(sum((v ** 2).sum() for v in g.values()))
    p = {n: p[n] - 0.1 * g[n] * 0.05 / max(norm, 0.05) for n in p}
  for mesh_shape, layout in [("all:1", "")] + LAYOUTS[1:]:
    _, values, _ = train(make, "simd", mesh_shape, layout)
    for n in p:
      np.testing.assert_allclose(values[n], p[n], rtol=RTOL, atol=ATOL)


# --- API and errors -----------------------------------------------------------
def test_apply_grad_accepts_variables_in_every_form():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", W_SHAPE, activation_dtype=tf.bfloat16)
  b = mtf.get_variable(mesh, "b", B_SHAPE)
  opt = optimize.MomentumOptimizer(0.1, 0.9)
  grads = [mtf.ones(mesh, W_SHAPE, tf.bfloat16), mtf.ones(mesh, B_SHAPE)]
  ops = opt.apply_grads(grads, graph.trainable_variables)
  ops += opt.apply_grads(grads, [w, b.operation.outputs[0]])
  assert len(ops) == 8 and all(isinstance(op, mtf.Operation) for op in ops)
  assert opt.apply_grad(None, b) == []


def test_apply_grads_calls_a_ports_own_apply_grad():
  """A Mesh TF port that overrides apply_grad (Mesh TF's per-variable
  hook) gets it called once per variable, as in Mesh TF."""
  mesh = mtf.Mesh(mtf.Graph(), "m")
  w, b = (mtf.get_variable(mesh, "w", W_SHAPE),
          mtf.get_variable(mesh, "b", B_SHAPE))
  seen = []

  class Ported(optimize.Optimizer):
    def apply_grad(self, grad, var):
      seen.append(var.name)
      return [mtf.assign_sub(var, grad * 0.5)]

  ops = Ported().apply_grads([mtf.ones(mesh, W_SHAPE),
                              mtf.ones(mesh, B_SHAPE)], [w, b])
  assert seen == [w.name, b.name] and len(ops) == 2


def test_errors():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  w = mtf.get_variable(mesh, "w", W_SHAPE)
  opt = optimize.SgdOptimizer(0.1)
  adam = optimize.AdamWeightDecayOptimizer(0.1, bias_correction=True)
  adam.apply_grads([w], [w])     # makes its own counter
  with pytest.raises(ValueError, match="one step per graph"):
    adam.apply_grads([w], [w], step=optimize.get_global_step(mesh)[0])
  with pytest.raises(ValueError, match="1 grads for 2 variables"):
    opt.apply_grads([w], [w, w])
  with pytest.raises(TypeError, match="not a variable"):
    opt.apply_grads([w], [w * 2.0])
  with pytest.raises(ValueError, match="has shape"):
    opt.apply_grad(mtf.ones(mesh, B_SHAPE), w)
  with pytest.raises(ValueError, match="must be a scalar"):
    optimize.SgdOptimizer(mtf.ones(mesh, B_SHAPE)).apply_grad(w, w)
  with pytest.raises(ValueError, match="every gradient is None"):
    optimize.clip_by_global_norm([None], 1.0)
  with pytest.raises(ValueError, match="Unknown optimizer"):
    optimize.make_optimizer("lamb", 0.1)
  assert isinstance(optimize.make_optimizer("Adafactor", 0.1),
                    optimize.AdafactorOptimizer)
  assert optimize.make_optimizer("momentum", 0.1, momentum=0.5).momentum == 0.5
  with pytest.raises(NotImplementedError, match="_update"):
    optimize.Optimizer().apply_grad(w, w)


# --- Mesh TF's product schedules and several-schedule optimizers -------------
def test_product_learning_rate_is_the_product_at_the_offset_step():
  lr = optimize.product_learning_rate(30.0, 100, factors=[
      0.5, lambda s, total: s / total, 2.0], offset=10)
  assert lr == 0.5 * (20.0 / 90.0) * 2.0
  assert optimize.product_learning_rate(7, 10, factors=[]) == 1.0
  with pytest.raises(ValueError, match="factors is required"):
    optimize.product_learning_rate(1.0, 10)


def test_compute_lr_for_step_values_and_functions_of_the_step():
  sched = [None, [0.5, _warm], [3.0]]
  assert optimize.compute_lr_for_step(sched, 0.1, train_steps=10,
                                      step=4.0) == [0.1, 0.5 * 0.5, 3.0]
  rates = optimize.compute_lr_for_step(sched, 0.1, 10)
  assert rates[0] == 0.1 and all(callable(r) for r in rates[1:])
  assert [r(4.0) for r in rates[1:]] == [0.25, 3.0]
  # On a meshtf step Tensor: one tensor of steps evaluates each at once.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  steps = mtf.import_tf_tensor(mesh, tf.constant([0.0, 4.0, 9.0]), "steps:3")
  out = rates[1](steps)
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl("simd", "all:1",
                                                          "")})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(out).numpy(),
                             [0.05, 0.25, 0.5], rtol=1e-6)


@pytest.mark.parametrize("case", ["adam_multi_lr", "adafactor_multi_lr",
                                  "adafactor_multi_lr_stacked"])
def test_multi_lr_schedules_layout_invariant(case):
  """The per-variable rates follow the step on 8 devices as on one."""
  losses, values, _ = train(MULTI_LR_CASES[case][0], "simd", *LAYOUTS[1])
  check_against(losses, values, *single_device(case), what=case)
  check_against(losses, values, *reference(MULTI_LR_CASES[case][1]),
                what=case)


def test_multi_lr_without_schedules_is_the_base_optimizer():
  for make, ref in [
      (lambda: optimize.AdamWithMultiLRSchedule(
          variable_search=["w"], learning_rate=0.01), adam_ref(0.01)),
      (lambda: optimize.AdafactorWithMultiLRSchedule(
          alt_lr_schedules=[[0.5]]), adafactor_ref())]:
    check_against(*train(make, steps=2)[:2], *reference(ref, steps=2),
                  what="no schedules")


def test_from_hparams_options_and_errors():
  opt = optimize.adafactor_optimizer_from_hparams(hparams(), 0.02)
  assert isinstance(opt, optimize.AdafactorOptimizer)
  assert (opt._beta1, opt._clipping_threshold, opt._factored,
          opt._multiply_by_parameter_scale) == (0.5, 2.0, True, False)
  assert opt._decay_rate(3.0) == 1.0 - 4.0 ** -0.5
  assert isinstance(optimize.make_optimizer(hparams(optimizer="SGD"), 0.1),
                    optimize.SgdOptimizer)
  with pytest.raises(ValueError, match="optimizer_adafactor_decay_type"):
    optimize.adafactor_optimizer_from_hparams(
        hparams(optimizer_adafactor_decay_type="linear"), 0.1)
  with pytest.raises(ValueError, match="'SGD' or 'Adafactor'"):
    optimize.make_optimizer(hparams(optimizer="Adam"), 0.1)
  with pytest.raises(ValueError, match="one schedule per pattern"):
    optimize.AdamWithMultiLRSchedule(variable_search=["a", "b"],
                                     alt_lr_schedules=[None],
                                     learning_rate=0.1)


def test_adafactor_default_rate_under_unit_scaling():
  """As Mesh TF: without parameter scale the default rate is 0.05 times
  smaller, unless the unit-scaling convention is on at construction."""
  from meshtf.models import conventions
  before = conventions.unit_scaling_convention()
  try:
    for unit_scaling, factor in [(False, 0.05), (True, 1.0)]:
      conventions.unit_scaling_convention(unit_scaling)
      opt = optimize.AdafactorOptimizer(multiply_by_parameter_scale=False)
      np.testing.assert_allclose(opt._learning_rate(99.0), 0.01 * factor)
      np.testing.assert_allclose(opt._learning_rate(9999.0), 0.01 * factor)
  finally:
    conventions.unit_scaling_convention(before)
