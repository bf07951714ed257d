"""Layout-invariant randomness: values depend only on (seed, op name, global
element index), never on the layout or on which processor computes them.

A counter-based generator (Threefry-2x32, 20 rounds) maps each element's
global flat index to 64 random bits. A slice computes its own elements from
its global start offsets, so every layout yields the same full tensor and
replicas of one slice agree bit for bit.

Example:
  >>> import tensorflow as tf
  >>> key = op_key(0, "w")
  >>> full = uniform_slice(key, tf.constant([0, 0], tf.int64), [4, 6], [4, 6])
  >>> part = uniform_slice(key, tf.constant([2, 3], tf.int64), [2, 3], [4, 6])
  >>> bool(tf.reduce_all(full[2:, 3:] == part))
  True
"""
import contextlib
import math
import threading
import zlib

import numpy as np
import tensorflow as tf

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def op_key(seed, name, stream=0):
  """Two uint32 key words from an integer seed, a name and a stream id."""
  h = zlib.crc32(name.encode("utf-8"))
  k0 = (int(seed) * 0x9E3779B1 + h) & 0xFFFFFFFF
  k1 = ((int(seed) >> 32) ^ (h * 0x85EBCA6B) ^ (stream * 0xC2B2AE35)) & 0xFFFFFFFF
  return (k0, k1)


def _rotl(x, r):
  return tf.bitwise.bitwise_or(tf.bitwise.left_shift(x, np.uint32(r)),
                               tf.bitwise.right_shift(x, np.uint32(32 - r)))


def threefry2x32(key, x0, x1):
  """Threefry-2x32 block cipher on uint32 tensors x0, x1 with a 2-word key
  (two Python ints, or two uint32 scalar tensors)."""
  if isinstance(key[0], tf.Tensor):
    # Key words as uint32 tensors: one traced function serves every key.
    k0, k1 = key[0], key[1]
    ks = (k0, k1, tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(k0, k1),
                                         np.uint32(_PARITY)))
    injections = [ks[(b + 2) % 3] + np.uint32(b + 1) for b in range(5)]
  else:
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, np.uint32(int(k0) ^ int(k1) ^ _PARITY))
    injections = [np.uint32((int(ks[(b + 2) % 3]) + b + 1) & 0xFFFFFFFF)
                  for b in range(5)]
  x0 = x0 + ks[0]
  x1 = x1 + ks[1]
  for block in range(5):
    for r in range(4):
      x0 = x0 + x1
      x1 = _rotl(x1, _ROTATIONS[(block % 2) * 4 + r])
      x1 = tf.bitwise.bitwise_xor(x1, x0)
    x0 = x0 + ks[(block + 1) % 3]
    x1 = x1 + injections[block]
  return x0, x1


def global_flat_index(slice_begin, slice_shape, full_shape):
  """int64 tensor of shape slice_shape: row-major global index of each
  element of the slice that starts at slice_begin (int64 vector)."""
  strides = []
  acc = 1
  for s in reversed(full_shape):
    strides.append(acc)
    acc *= s
  strides = list(reversed(strides))
  index = tf.zeros(slice_shape, tf.int64)
  ndims = len(slice_shape)
  for i, (n, stride) in enumerate(zip(slice_shape, strides)):
    coord = tf.range(n, dtype=tf.int64) + slice_begin[i]
    bshape = [1] * ndims
    bshape[i] = n
    index = index + tf.reshape(coord * stride, bshape)
  return index


def random_bits(key, slice_begin, slice_shape, full_shape):
  """Two uint32 tensors of random bits for the elements of one slice
  (through one XLA kernel inside compiled_bits(), the same bits)."""
  index = global_flat_index(slice_begin, slice_shape, full_shape)
  if _compiles(slice_shape):
    return _compiled_bits(key, index, slice_shape)
  return _threefry_of_index(key, index)


def _threefry_of_index(key, index):
  lo = tf.cast(tf.bitwise.bitwise_and(index, 0xFFFFFFFF), tf.uint32)
  hi = tf.cast(tf.bitwise.right_shift(index, 32), tf.uint32)
  return threefry2x32(key, lo, hi)


# --- Threefry as one XLA kernel (variable initializers) --------------------
# TensorFlow runs Threefry's ~120 integer ops one kernel each, every one a
# pass over the slice in memory: 0.75 s for 8.2M elements (a T5-small
# embedding's slice) here, where XLA's one fused loop takes 0.046 s after a
# ~0.3 s compile (measured, 2 cores at load 7). Integer ops are exact, so
# the bits are the same; the float part (uniform / erfinv) stays in
# TensorFlow's kernels, bit for bit as before. Compiled once per bucket
# (flat sizes rounded up to a power of two), so a model's many shapes share
# a few kernels; slices below COMPILED_MIN_ELEMENTS cost less than a
# compile and stay in TensorFlow.
COMPILED_MIN_ELEMENTS = 1 << 16
_STATE = threading.local()
_COMPILED_FUNCTIONS = {}   # bucket size -> tf.function(jit_compile=True)


@contextlib.contextmanager
def compiled_bits(enabled=True):
  """Within it, random_bits of slices of at least COMPILED_MIN_ELEMENTS
  elements run as one XLA kernel (where TensorFlow has XLA): the same bits,
  ~15x faster on CPU. Read when a function is traced, so a tf.function
  traced inside keeps the choice. Variable initializers use it (a one-off
  host computation); per-step randomness (dropout) does not, so the step's
  program is unchanged.

  Example:
    >>> with compiled_bits():
    ...   u = uniform_slice(op_key(0, "w"), tf.constant([0], tf.int64),
    ...                     [1 << 16], [1 << 16])
  """
  before = getattr(_STATE, "enabled", False)
  _STATE.enabled = enabled
  try:
    yield
  finally:
    _STATE.enabled = before


def _compiles(slice_shape):
  return (getattr(_STATE, "enabled", False) and _xla_available()
          and int(np.prod(slice_shape)) >= COMPILED_MIN_ELEMENTS)


_XLA = []


def _xla_available():
  if not _XLA:
    _XLA.append(bool(tf.test.is_built_with_xla()))
  return _XLA[0]


class _Threefry(object):
  """(key words, flat int64 indices) -> the two uint32 words of each: one
  object per bucket size (TF's retracing warning counts one function's
  traces together)."""

  def __call__(self, words, index):
    return _threefry_of_index((words[0], words[1]), index)


def _compiled_bits(key, index, slice_shape):
  n = int(np.prod(slice_shape))
  bucket = 1 << (n - 1).bit_length()
  if bucket not in _COMPILED_FUNCTIONS:
    _COMPILED_FUNCTIONS[bucket] = tf.function(_Threefry(), autograph=False,
                                              jit_compile=True)
  if isinstance(key[0], tf.Tensor):
    words = tf.stack([tf.cast(key[0], tf.uint32), tf.cast(key[1], tf.uint32)])
  else:
    words = tf.constant(np.array(key, np.uint32))
  flat = tf.reshape(index, [-1])
  if bucket > n:
    flat = tf.pad(flat, [[0, bucket - n]])
  x0, x1 = _COMPILED_FUNCTIONS[bucket](words, flat)
  if bucket > n:
    x0, x1 = x0[:n], x1[:n]
  return tf.reshape(x0, slice_shape), tf.reshape(x1, slice_shape)


# The largest float32 below 1.
_BELOW_ONE = np.float32(1.0) - np.float32(2.0 ** -24)


def _bits_to_unit(bits, dtype):
  """24 high bits -> a float32 strictly inside (0, 1): (k + 0.5) / 2^24.

  The top k (2^24 - 1) gives 1 - 2^-25, which float32 rounds to 1.0 (a tie,
  to even): erfinv(2u - 1) was then inf, one normal value in 2^24 (measured:
  a Mesh TF attention weight of 32x1024 initialized with an inf). Clamping
  moves only that k, to the largest float32 below 1; every other value is
  unchanged.
  """
  u = (tf.cast(tf.bitwise.right_shift(bits, np.uint32(8)), tf.float32)
       + 0.5) * (1.0 / (1 << 24))
  return tf.cast(tf.minimum(u, _BELOW_ONE), dtype)


def uniform_slice(key, slice_begin, slice_shape, full_shape, minval=0.0,
                  maxval=1.0, dtype=tf.float32):
  """Uniform values in (minval, maxval) for one slice."""
  bits, _ = random_bits(key, slice_begin, slice_shape, full_shape)
  u = _bits_to_unit(bits, tf.float32)
  return tf.cast(minval + (maxval - minval) * u, dtype)


def normal_slice(key, slice_begin, slice_shape, full_shape, mean=0.0,
                 stddev=1.0, dtype=tf.float32, truncate_at=None):
  """Normal values (inverse-CDF of a uniform) for one slice; with
  truncate_at=t the distribution is cut to [-t, t] standard deviations."""
  bits, _ = random_bits(key, slice_begin, slice_shape, full_shape)
  u = _bits_to_unit(bits, tf.float32)
  if truncate_at is not None:
    lo = 0.5 * (1.0 + math.erf(-truncate_at / math.sqrt(2.0)))
    u = lo + (1.0 - 2.0 * lo) * u
  z = math.sqrt(2.0) * _vectorized(tf.math.erfinv, 2.0 * u - 1.0)
  return tf.cast(mean + stddev * z, dtype)


def _vectorized(fn, x, multiple=64):
  """fn(x) for an elementwise fn, computed on x flattened and padded to a
  multiple of `multiple` elements. TensorFlow's CPU kernels compute whole
  SIMD packets with one polynomial and the tail of a tensor with another
  (erfinv differs in the last bit), so without the padding a value would
  depend on the size of the slice it falls in -- i.e. on the layout."""
  shape = tf.shape(x)
  flat = tf.reshape(x, [-1])
  n = tf.size(flat)
  flat = tf.pad(flat, [[0, (multiple - n % multiple) % multiple]])
  return tf.reshape(fn(flat)[:n], shape)


# cache key -> a not-inlined tf.function that graphs call instead of holding
# their own copy of the generator (shared_function).
_SHARED_FUNCTIONS = {}


def shared_function(cache_key, make):
  """The tf.function made once per cache_key from make() (a callable of
  tensors, the key words first), not inlined (_noinline): a graph holds one
  call op per random op instead of Threefry's ~120 ops (a T5-sized training
  step with dropout: 25,642 TF ops per device), and TensorFlow instantiates
  the body once per device however many ops call it.

  Example:
    >>> fn = shared_function(("mine", 4), lambda: _RandomSlice(
    ...     "uniform", (0.0, 1.0), [4], [4], tf.float32))
  """
  if cache_key not in _SHARED_FUNCTIONS:
    _SHARED_FUNCTIONS[cache_key] = tf.function(
        make(), autograph=False, experimental_attributes={"_noinline": True})
  return _SHARED_FUNCTIONS[cache_key]


def key_words(key):
  """The two key words of op_key as a uint32 tensor (a shared function's
  first argument)."""
  return tf.constant(np.array(key, np.uint32), tf.uint32)


class _RandomSlice(object):
  """(key words, begin) -> one slice of a random tensor. A callable object,
  not a closure: TF's retracing warning counts the tf.functions of one code
  object together, and each of these is traced once by design."""

  def __init__(self, distribution, params, slice_shape, full_shape, dtype):
    self._fn = uniform_slice if distribution == "uniform" else normal_slice
    self._params = tuple(params)
    self._slice_shape = list(slice_shape)
    self._full_shape = list(full_shape)
    self._dtype = dtype

  def __call__(self, words, begin):
    return self._fn((words[0], words[1]), begin, self._slice_shape,
                    self._full_shape, *self._params, dtype=self._dtype)


def slice_function(distribution, params, slice_shape, full_shape, dtype):
  """fn(key, begin): the slice's random values (uniform_slice or
  normal_slice with `params`) as a call of a function shared by every
  random op of this shape (shared_function); bit for bit the same values.

  Example:
    >>> fn = slice_function("uniform", (0.0, 1.0), [2, 3], [4, 6], tf.float32)
    >>> part = fn(op_key(0, "w"), tf.constant([2, 3], tf.int64))
  """
  dtype = tf.as_dtype(dtype)
  function = shared_function(
      ("slice", distribution, tuple(params), tuple(slice_shape),
       tuple(full_shape), dtype.name),
      lambda: _RandomSlice(distribution, params, slice_shape, full_shape,
                           dtype))
  return lambda key, begin: function(key_words(key),
                                     tf.cast(begin, tf.int64))
