"""Layout-invariant initializers (meshtf/ops/initializers.py).

A variable's initial value depends only on (graph seed, variable name,
element index): every layout gives bit-identical values. On a large tensor
each initializer has the distribution it promises, and TensorFlow / Keras
initializer objects convert to the same distribution.
"""
import logging
import math

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.ops import initializers

SHAPE = "io:8;hidden:16"
LAYOUTS = [
    ("all:8", "io:all"),
    ("all:8", "hidden:all"),
    ("rows:2;cols:4", "io:rows;hidden:cols"),
    ("rows:2;cols:4", "io:cols;hidden:rows"),
]
CONST = harness.random_array([8, 16], 3)

# name -> initializer (meshtf objects, plain values, TF and Keras objects)
INITIALIZERS = {
    "zeros": mtf.zeros_initializer(),
    "ones": mtf.ones_initializer(),
    "constant_scalar": mtf.constant_initializer(0.25),
    "constant_array": mtf.constant_initializer(CONST),
    "random_normal": mtf.random_normal_initializer(mean=0.5, stddev=2.0),
    "truncated_normal": mtf.truncated_normal_initializer(stddev=0.3),
    "random_uniform": mtf.random_uniform_initializer(-0.3, 0.7),
    "variance_scaling_fan_in": mtf.variance_scaling_initializer(2.0, "fan_in"),
    "variance_scaling_fan_out_normal": mtf.variance_scaling_initializer(
        1.0, "fan_out", "untruncated_normal"),
    "variance_scaling_fan_avg_uniform": mtf.variance_scaling_initializer(
        3.0, "fan_avg", "uniform"),
    "default_none": None,
    "python_number": 1.5,
    "numpy_array": CONST,
    "keras_glorot_uniform": tf.keras.initializers.GlorotUniform(),
    "keras_he_normal": tf.keras.initializers.HeNormal(),
    "keras_random_normal": tf.keras.initializers.RandomNormal(0.1, 0.2),
    "keras_constant": tf.keras.initializers.Constant(0.7),
    "tf_random_uniform": tf.random_uniform_initializer(-1.0, 1.0),
    "tf_zeros": tf.zeros_initializer(),
}


def variable_model(init, name="w", shape=SHAPE):
  def model(mesh, unused_inputs):
    return {"w": mtf.get_variable(mesh, name, shape, initializer=init)}
  return model


@pytest.mark.parametrize("name", sorted(INITIALIZERS))
def test_initial_value_is_layout_invariant(name):
  model = variable_model(INITIALIZERS[name])
  base = harness.run_model(model, {}, "all:1", "")
  runs = harness.assert_layout_invariant(model, {}, LAYOUTS)
  for run in runs.values():
    # Bit for bit, not just close; and the gradient reaches the variable.
    np.testing.assert_array_equal(run.outputs["w"], base.outputs["w"])
    assert run.grads["w"] is not None
  assert base.outputs["w"].shape == (8, 16)


@pytest.mark.parametrize("name,expected", [
    ("zeros", np.zeros([8, 16])), ("ones", np.ones([8, 16])),
    ("constant_scalar", np.full([8, 16], 0.25)),
    ("constant_array", CONST), ("python_number", np.full([8, 16], 1.5)),
    ("numpy_array", CONST), ("keras_constant", np.full([8, 16], 0.7)),
    ("tf_zeros", np.zeros([8, 16]))])
def test_deterministic_initial_values(name, expected):
  harness.assert_layout_invariant(
      variable_model(INITIALIZERS[name]), {}, LAYOUTS[:3],
      reference=lambda t: {"w": tf.constant(expected, tf.float32)})


def test_rank3_variable_split_over_three_axes():
  model = variable_model(mtf.random_normal_initializer(), shape="a:4;b:6;c:8")
  base = harness.run_model(model, {}, "all:1", "")
  runs = harness.assert_layout_invariant(
      model, {}, [("x:2;y:2;z:2", "a:x;b:y;c:z"), ("x:2;y:4", "a:x;c:y"),
                  ("all:8", "c:all")])
  for run in runs.values():
    np.testing.assert_array_equal(run.outputs["w"], base.outputs["w"])


def test_values_depend_on_seed_and_name_only():
  def value(seed, name, mesh_shape="all:1", layout=""):
    return harness.run_model(variable_model(mtf.random_normal_initializer(),
                                            name), {}, mesh_shape, layout,
                             seed=seed).outputs["w"]
  a = value(0, "w")
  np.testing.assert_array_equal(a, value(0, "w", "all:8", "hidden:all"))
  assert not np.allclose(a, value(1, "w"))
  assert not np.allclose(a, value(0, "v"))


# --- distributions on a large tensor -----------------------------------------
BIG = [256, 512]
FAN_IN, FAN_OUT = BIG


def big_value(init, mesh_shape="all:1", layout=""):
  graph = mtf.Graph(seed=5)
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "big", "fan_in:%d;fan_out:%d" % tuple(BIG),
                       initializer=init)
  lowering = mtf.Lowering(graph, {mesh: harness.make_impl(
      "placement", mesh_shape, layout)})
  return lowering.export_to_tf_tensor(w).numpy()


def assert_stats(v, mean, std, bound=None, tol=0.03):
  assert abs(v.mean() - mean) < tol * max(std, 1e-3) + 1e-6, (v.mean(), mean)
  assert abs(v.std() - std) < tol * std, (v.std(), std)
  if bound is not None:
    lo, hi = bound
    assert v.min() >= lo and v.max() <= hi, (v.min(), v.max(), bound)
    # ... and the values reach close to the bounds.
    assert v.min() < lo + 0.02 * (hi - lo) and v.max() > hi - 0.02 * (hi - lo)


TRUNC_STD = 0.87962566103423978  # std of a unit normal cut at +-2


def _vs(scale, n, distribution):
  """(std, bound) of a variance-scaling distribution over fan n."""
  sd = math.sqrt(scale / n)
  if distribution == "uniform":
    return sd, (-sd * math.sqrt(3.0), sd * math.sqrt(3.0))
  if distribution == "truncated_normal":
    return sd, (-2.0 * sd / TRUNC_STD, 2.0 * sd / TRUNC_STD)
  return sd, None


# name -> (initializer, mean, std, (low, high) or None)
DISTRIBUTIONS = {
    "random_normal": (mtf.random_normal_initializer(0.5, 2.0), 0.5, 2.0, None),
    "truncated_normal": (mtf.truncated_normal_initializer(0.0, 1.0), 0.0,
                         TRUNC_STD, (-2.0, 2.0)),
    "truncated_normal_shifted": (mtf.truncated_normal_initializer(1.0, 0.1),
                                 1.0, 0.1 * TRUNC_STD, (0.8, 1.2)),
    "random_uniform": (mtf.random_uniform_initializer(-0.3, 0.7), 0.2,
                       1.0 / math.sqrt(12.0), (-0.3, 0.7)),
    "vs_fan_in_truncated": (mtf.variance_scaling_initializer(2.0, "fan_in"),
                            0.0) + _vs(2.0, FAN_IN, "truncated_normal"),
    "vs_normal_alias": (mtf.variance_scaling_initializer(
        1.0, "fan_out", "normal"), 0.0) + _vs(1.0, FAN_OUT,
                                              "truncated_normal"),
    "vs_fan_out_untruncated": (mtf.variance_scaling_initializer(
        1.0, "fan_out", "untruncated_normal"), 0.0) + _vs(
            1.0, FAN_OUT, "untruncated_normal"),
    "vs_fan_avg_uniform": (mtf.variance_scaling_initializer(
        3.0, "fan_avg", "uniform"), 0.0) + _vs(3.0, (FAN_IN + FAN_OUT) / 2.0,
                                               "uniform"),
    "default_glorot_uniform": (None, 0.0) + _vs(
        1.0, (FAN_IN + FAN_OUT) / 2.0, "uniform"),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_distribution(name):
  init, mean, std, bound = DISTRIBUTIONS[name]
  assert_stats(big_value(init), mean, std, bound)


def test_big_tensor_is_layout_invariant():
  init = mtf.truncated_normal_initializer(stddev=0.5)
  np.testing.assert_array_equal(big_value(init),
                                big_value(init, "rows:2;cols:4",
                                          "fan_in:cols;fan_out:rows"))


def test_random_values_look_independent():
  v = big_value(mtf.random_uniform_initializer(0.0, 1.0))
  # Neighbours along either axis are uncorrelated; no repeated rows.
  assert abs(np.corrcoef(v[:, :-1].ravel(), v[:, 1:].ravel())[0, 1]) < 0.02
  assert abs(np.corrcoef(v[:-1].ravel(), v[1:].ravel())[0, 1]) < 0.02
  assert len(np.unique(v)) > 0.9 * v.size


# --- Keras / TensorFlow initializer conversion --------------------------------
# Seeded, so the TensorFlow side of each comparison is reproducible.
KERAS = {
    "GlorotUniform": tf.keras.initializers.GlorotUniform(seed=1),
    "GlorotNormal": tf.keras.initializers.GlorotNormal(seed=1),
    "HeNormal": tf.keras.initializers.HeNormal(seed=1),
    "HeUniform": tf.keras.initializers.HeUniform(seed=1),
    "LecunNormal": tf.keras.initializers.LecunNormal(seed=1),
    "LecunUniform": tf.keras.initializers.LecunUniform(seed=1),
    "RandomNormal": tf.keras.initializers.RandomNormal(0.3, 0.05, seed=1),
    "TruncatedNormal": tf.keras.initializers.TruncatedNormal(-0.2, 0.5, seed=1),
    "RandomUniform": tf.keras.initializers.RandomUniform(-2.0, 1.0, seed=1),
    "VarianceScaling": tf.keras.initializers.VarianceScaling(
        0.5, "fan_out", "uniform", seed=1),
    "VarianceScalingDefault": tf.keras.initializers.VarianceScaling(seed=1),
    "Zeros": tf.keras.initializers.Zeros(),
    "Ones": tf.keras.initializers.Ones(),
    "Constant": tf.keras.initializers.Constant(-0.4),
    "tf.random_normal_initializer": tf.random_normal_initializer(1.0, 3.0,
                                                                 seed=1),
    "tf.truncated_normal_initializer": tf.initializers.TruncatedNormal(
        0.0, 2.0, seed=1),
    "tf.random_uniform_initializer": tf.random_uniform_initializer(0.0, 4.0,
                                                                   seed=1),
    "tf.ones_initializer": tf.ones_initializer(),
}
QUANTILES = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]


@pytest.mark.parametrize("name", sorted(KERAS))
def test_keras_and_tf_initializers_convert(name):
  """Same distribution as the object's own samples: mean, std, quantiles."""
  init = KERAS[name]
  converted = initializers.convert_initializer(init)
  assert isinstance(converted, initializers.Initializer)
  ours = big_value(init)
  theirs = init(shape=BIG, dtype=tf.float32).numpy()
  assert ours.shape == theirs.shape
  if theirs.min() == theirs.max():  # a constant
    np.testing.assert_array_equal(ours, theirs)
    return
  std = theirs.std()
  assert abs(ours.mean() - theirs.mean()) < 0.03 * std
  assert abs(ours.std() - std) < 0.03 * std, (ours.std(), std)
  # Quantiles (not extremes, which fluctuate) agree to a few % of a std.
  np.testing.assert_allclose(np.quantile(ours, QUANTILES),
                             np.quantile(theirs, QUANTILES), rtol=0,
                             atol=0.06 * std)


@pytest.mark.parametrize("value,cls", [
    (None, initializers.VarianceScalingInitializer),
    (0.5, initializers.ConstantInitializer),
    (2, initializers.ConstantInitializer),
    ([1.0, 2.0], initializers.ConstantInitializer),
    (np.zeros([2]), initializers.ConstantInitializer),
    (tf.keras.initializers.GlorotUniform(),
     initializers.VarianceScalingInitializer),
])
def test_convert_initializer_types(value, cls):
  assert isinstance(initializers.convert_initializer(value), cls)
  init = mtf.random_normal_initializer()
  assert initializers.convert_initializer(init) is init


def test_glorot_uniform_conversion_parameters():
  init = initializers.convert_initializer(tf.keras.initializers.GlorotUniform())
  assert (init.scale, init.mode, init.distribution) == (1.0, "fan_avg",
                                                        "uniform")
  init = initializers.convert_initializer(tf.keras.initializers.VarianceScaling(
      scale=2.0, mode="fan_out", distribution="untruncated_normal"))
  assert (init.scale, init.mode, init.distribution) == (
      2.0, "fan_out", "untruncated_normal")


def test_unknown_initializer_rejected():
  with pytest.raises(TypeError, match="neither a callable"):
    initializers.convert_initializer("glorot")


@pytest.mark.parametrize("layout", [("all:1", ""), ("rows:2;cols:4",
                                                    "a:rows;b:cols")])
def test_callable_initializer_computes_full_value_then_slices(layout):
  """Mesh TF code passes any callable (a lambda, a TF1 or Keras
  initializer meshtf cannot slice): accepted with a warning; its full value
  is made once and each processor takes its slice."""
  full = np.arange(24, dtype=np.float32).reshape(4, 6)
  calls = []

  def init(shape, dtype=None, **unused):
    calls.append(list(shape))
    return full

  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with pytest.warns(UserWarning, match="full value once"):
    w = mtf.get_variable(mesh, "w", "a:4;b:6", initializer=init)
  impl = harness.make_impl("placement", *layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(w), full)
  assert calls == [[4, 6]]   # once, not once per slice


def test_variance_scaling_rejects_bad_arguments():
  with pytest.raises(ValueError, match="mode 'fan_sum'"):
    mtf.variance_scaling_initializer(1.0, "fan_sum")
  with pytest.raises(ValueError, match="distribution 'cauchy'"):
    mtf.variance_scaling_initializer(1.0, "fan_in", "cauchy")


@pytest.mark.parametrize("shape,fans", [
    ([], (1, 1)), ([5], (5, 5)), ([3, 4], (3, 4)), ([2, 3, 4], (6, 8)),
    ([2, 5, 3, 4], (30, 40))])
def test_fans_follow_tensorflow(shape, fans):
  assert initializers.VarianceScalingInitializer.fans(shape) == fans


def test_constant_initializer_wrong_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", SHAPE,
                   initializer=mtf.constant_initializer(np.zeros([16, 8])))
  with pytest.raises(ValueError, match="has shape \\[16, 8\\], variable has"):
    mtf.Lowering(graph, {mesh: harness.make_impl("placement", "all:1", "")})


def test_every_exported_initializer_is_tested():
  exported = {n for n in dir(mtf) if n.endswith("_initializer")}
  tested = {type(v).__name__ for v in INITIALIZERS.values()}
  for n in exported:
    assert getattr(mtf, n).__name__ in tested, n
  assert mtf.initializers is initializers


@pytest.mark.parametrize("name", ["constant_array", "random_normal",
                                  "variance_scaling_fan_in", "ones"])
def test_initial_value_uneven_layouts(name):
  """io:7 / hidden:10 split unevenly: the padded slices start from the same
  numbers (the constant array is cut past its end, the random ones by
  global index)."""
  init = INITIALIZERS[name]
  if name == "constant_array":
    init = mtf.constant_initializer(CONST[:7, :10])
  model = variable_model(init, shape="io:7;hidden:10")
  base = harness.run_model(model, {}, "all:1", "")
  runs = harness.assert_layout_invariant(
      model, {}, [("all:8", "hidden:all"), ("rows:2;cols:4",
                                            "io:cols;hidden:rows"),
                  ("rows:2;cols:4", "hidden:cols+rows"),
                  ("rows:2;cols:4", harness.annotated(
                      "io:rows", {"_variables": "hidden:rows+cols"}))])
  for run in runs.values():
    np.testing.assert_array_equal(run.outputs["w"], base.outputs["w"])


@pytest.mark.parametrize("initializer,fills", [
    (initializers.ZerosInitializer(), True),
    (initializers.OnesInitializer(), True),
    (initializers.ConstantInitializer(2.5), True),
    (initializers.ConstantInitializer(np.ones([2, 3])), False),
    (initializers.RandomNormalInitializer(), False)])
def test_fills_run_eagerly_and_leave_no_cached_constant(initializer, fills):
  """A cached tf.function of tf.zeros(shape) folds into a constant of the
  slice's size that the cache would hold for the life of the process: a
  fill runs eagerly instead, and is not cached."""
  before = len(initializers._TRACED)  # pylint: disable=protected-access
  fn = initializers.traced_slice_fn(initializer, (1, 2), [2, 3], tf.float32)
  value = fn(tf.constant([0, 0], tf.int64), [2, 3])
  assert initializer.fills == fills and value.shape == (2, 3)
  if fills:
    assert fn.traced   # no tf.function around it either
    assert len(initializers._TRACED) == before  # pylint: disable=protected-access
    np.testing.assert_array_equal(
        value, np.full([2, 3], {"ZerosInitializer": 0.0, "OnesInitializer":
                                1.0}.get(type(initializer).__name__, 2.5)))


def test_one_function_per_shape_is_not_reported_as_retracing():
  """A model's variables trace one initializer function per shape, each
  once: TF must not warn "... triggered tf.function retracing" about it
  (it counted the closures of one lambda together)."""
  records = []

  class Collect(logging.Handler):
    def emit(self, record):
      records.append(record.getMessage())

  handler = Collect()
  tf.get_logger().addHandler(handler)
  try:
    initializer = initializers.RandomUniformInitializer(minval=-7.0)
    for n in range(3, 12):
      fn = initializers.traced_slice_fn(initializer, (5, n), [n], tf.float32)
      assert fn(tf.constant([0], tf.int64), [n]).shape == (n,)
  finally:
    tf.get_logger().removeHandler(handler)
  assert not [r for r in records if "retracing" in r], records


@pytest.mark.parametrize("initializer", [
    initializers.RandomUniformInitializer(-0.3, 0.7),
    initializers.VarianceScalingInitializer(2.0, "fan_in"),
    initializers.RandomNormalInitializer(0.5, 2.0)])
def test_initial_values_unchanged_by_the_compiled_bits(initializer):
  """A slice of 65,536 elements (rng.COMPILED_MIN_ELEMENTS): the
  initializers' traced functions draw Threefry's bits in one XLA kernel;
  the values are those of the same function traced with TensorFlow's
  kernels (outside rng.compiled_bits, as before the change) bit for bit,
  and the uniform's are the numbers the code before the change gave
  (sha256 of the slice's bytes)."""
  from meshtf.lowering import rng
  key = rng.op_key(7, "big")
  begin = tf.constant([256, 0], tf.int64)
  fn = initializers.traced_slice_fn(initializer, key, [512, 256], tf.float32)
  value = fn(begin, [256, 256]).numpy()
  # pylint: disable=protected-access
  before = tf.function(initializers._SliceValue(
      initializer, [256, 256], [512, 256], tf.float32), autograph=False)
  with rng.compiled_bits(False):
    reference = before(rng.key_words(key), begin).numpy()
  np.testing.assert_array_equal(value.view(np.uint32),
                                reference.view(np.uint32))
  if isinstance(initializer, initializers.RandomUniformInitializer):
    import hashlib
    assert hashlib.sha256(value.tobytes()).hexdigest()[:16] == (
        "36519e0e24aa9fc4")
    np.testing.assert_array_equal(value[0, :3], np.float32(
        [-0.04956302046775818, -0.2157461941242218, 0.07433781027793884]))
