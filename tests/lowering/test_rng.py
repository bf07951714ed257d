"""Layout-invariant randomness: values depend on (seed, name, index) only."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.lowering import rng


def full_and_slice(fn, begin, size, full_shape, **kw):
  key = rng.op_key(3, "name")
  full = fn(key, tf.constant([0] * len(full_shape), tf.int64), full_shape,
            full_shape, **kw).numpy()
  part = fn(key, tf.constant(begin, tf.int64), size, full_shape, **kw).numpy()
  idx = tuple(slice(b, b + n) for b, n in zip(begin, size))
  return full, full[idx], part


@pytest.mark.parametrize("fn", [rng.uniform_slice, rng.normal_slice])
def test_slice_equals_part_of_full(fn):
  full, expected, part = full_and_slice(fn, [1, 4, 0], [2, 2, 3], [4, 8, 3])
  np.testing.assert_array_equal(part, expected)


def test_distribution_moments():
  key = rng.op_key(0, "stats")
  zero = tf.constant([0], tf.int64)
  u = rng.uniform_slice(key, zero, [200000], [200000]).numpy()
  n = rng.normal_slice(key, zero, [200000], [200000]).numpy()
  t = rng.normal_slice(key, zero, [200000], [200000], truncate_at=2.0).numpy()
  assert abs(u.mean() - 0.5) < 0.01 and 0 < u.min() and u.max() < 1
  assert abs(u.std() - (1 / 12) ** 0.5) < 0.01
  assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
  assert t.min() >= -2.0 and t.max() <= 2.0 and abs(t.std() - 0.8796) < 0.01
  # Neighbouring indices are uncorrelated.
  assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


def test_extreme_bits_stay_strictly_inside(monkeypatch):
  """The top 24-bit value once rounded to u = 1.0 in float32, so a normal
  draw was erfinv(1) = inf (seen in a 32x1024 attention weight)."""
  extremes = tf.constant([0xFFFFFFFF, 0xFFFFFF00, 0xFFFFFEFF, 0, 0xFF],
                         tf.uint32)
  u = rng._bits_to_unit(extremes, tf.float32).numpy()
  assert (u > 0).all() and (u < 1).all(), u
  # Only the clamped top value moved; the rest are (k + 0.5) / 2^24.
  k = np.array([2 ** 24 - 2, 0, 0], np.float64)
  np.testing.assert_array_equal(u[2:], ((k + 0.5) / 2 ** 24).astype(
      np.float32))
  monkeypatch.setattr(rng, "random_bits",
                      lambda *a: (tf.fill([64], np.uint32(0xFFFFFFFF)), None))
  zero = tf.constant([0], tf.int64)
  n = rng.normal_slice(rng.op_key(0, "x"), zero, [64], [64]).numpy()
  assert np.isfinite(n).all() and (n > 5).all(), n
  v = rng.uniform_slice(rng.op_key(0, "x"), zero, [64], [64]).numpy()
  assert (v < 1).all()


def test_keys_differ_by_seed_name_and_stream():
  keys = {rng.op_key(0, "a"), rng.op_key(1, "a"), rng.op_key(0, "b"),
          rng.op_key(0, "a", stream=1)}
  assert len(keys) == 4


def test_large_index_uses_high_bits():
  key = rng.op_key(0, "big")
  lo = rng.uniform_slice(key, tf.constant([5], tf.int64), [4], [2 ** 40])
  hi = rng.uniform_slice(key, tf.constant([5 + 2 ** 32], tf.int64), [4],
                         [2 ** 40])
  assert not np.array_equal(lo.numpy(), hi.numpy())


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "a:all"), ("rows:2;cols:4", "a:rows;b:cols"),
    ("x:2;y:2;z:2", "b:x;c:y"), ("all:1", "")])
def test_variable_initial_values_identical_on_every_layout(mesh_shape, layout):
  def initial_value():
    graph = mtf.Graph(seed=5); mesh = mtf.Mesh(graph, "m")
    mtf.get_variable(mesh, "w", "a:8;b:4;c:2",
                     initializer=mtf.truncated_normal_initializer(stddev=1.0))
    store = mtf.VariableStore()
    mtf.Lowering(graph, {mesh: harness.make_impl("placement", mesh_shape,
                                                 layout)},
                 variable_store=store)
    return store
  store = initial_value()
  value = store.full_value("w")
  graph = mtf.Graph(seed=5); mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", "a:8;b:4;c:2",
                   initializer=mtf.truncated_normal_initializer(stddev=1.0))
  reference_store = mtf.VariableStore()
  mtf.Lowering(graph, {mesh: harness.make_impl("placement", "all:1", "")},
               variable_store=reference_store)
  np.testing.assert_array_equal(value, reference_store.full_value("w"))
  # Replicas of one slice hold bit-identical values.
  entry = store.entry("w")
  impl = entry.mesh_impl
  by_begin = {}
  for p, v in enumerate(entry.slices):
    key = tuple(impl.slice_begin(entry.shape, p))
    by_begin.setdefault(key, []).append(v.numpy())
  for copies in by_begin.values():
    for c in copies[1:]:
      np.testing.assert_array_equal(c, copies[0])


@pytest.mark.parametrize("distribution, fn, params", [
    ("uniform", rng.uniform_slice, (-2.0, 3.0)),
    ("normal", rng.normal_slice, (1.0, 0.5))])
def test_the_shared_slice_function_gives_the_same_bits(distribution, fn,
                                                       params):
  key = rng.op_key(5, "dropout")
  begin = tf.constant([2, 8], tf.int64)
  direct = fn(key, begin, [2, 8], [4, 16], *params).numpy()
  shared = rng.slice_function(distribution, params, [2, 8], [4, 16],
                              tf.float32)
  np.testing.assert_array_equal(shared(key, begin).numpy(), direct)
  # one function per (distribution, params, shapes, dtype)
  assert rng.slice_function(distribution, params, [2, 8], [4, 16],
                            tf.float32)(key, begin) is not None
  assert len([k for k in rng._SHARED_FUNCTIONS if k[:5] == ("slice",
      distribution, params, (2, 8), (4, 16))]) == 1


@pytest.mark.parametrize("fn", [rng.uniform_slice, rng.normal_slice])
@pytest.mark.parametrize("begin,size,full", [
    ([0, 0], [16, 8], [16, 8]),            # a power of two: no padding
    ([3, 5], [9, 11], [20, 30]),           # padded up to the bucket
    ([2 ** 20, 0], [4, 2 ** 13], [2 ** 21, 2 ** 13])])   # index >= 2^32
def test_compiled_bits_are_the_same_bits(monkeypatch, fn, begin, size, full):
  """Inside compiled_bits() Threefry runs as one XLA kernel (variable
  initializers): the same values bit for bit as TensorFlow's kernels, for
  bucket-padded sizes and indices with high bits too."""
  monkeypatch.setattr(rng, "COMPILED_MIN_ELEMENTS", 64)
  key = rng.op_key(3, "name")
  b = tf.constant(begin, tf.int64)
  reference = fn(key, b, size, full).numpy()
  with rng.compiled_bits():
    compiled = fn(key, b, size, full).numpy()
    assert rng._compiles(size) == tf.test.is_built_with_xla()
  np.testing.assert_array_equal(compiled.view(np.uint32),
                                reference.view(np.uint32))
  # Traced with the key words as tensors (as the initializers' functions).
  traced = tf.function(lambda words, b: fn((words[0], words[1]), b, size,
                                           full), autograph=False)
  with rng.compiled_bits():
    value = traced(rng.key_words(key), b).numpy()
  np.testing.assert_array_equal(value.view(np.uint32),
                                reference.view(np.uint32))


def test_compiled_bits_only_inside_the_context():
  assert not rng._compiles([1 << 20])
  with rng.compiled_bits():
    assert rng._compiles([1 << 20]) == tf.test.is_built_with_xla()
    assert not rng._compiles([rng.COMPILED_MIN_ELEMENTS - 1])
    with rng.compiled_bits(False):
      assert not rng._compiles([1 << 20])
  assert not rng._compiles([1 << 20])
