"""Layout-invariant variable initializers.

Each initializer computes one slice from (key, slice begin, slice shape,
full shape); random ones draw from meshtf.lowering.rng, so the full value
depends only on (graph seed, variable name, element index).

TensorFlow / Keras initializer objects are accepted too and converted by
class name (RandomNormal, TruncatedNormal, RandomUniform, Zeros, Ones,
Constant, VarianceScaling, Glorot*, He*, Lecun*).

Example:
  >>> init = VarianceScalingInitializer(scale=2.0, mode="fan_in")
  >>> init.fans([3, 4])
  (3, 4)
"""
import inspect
import math
import warnings

import numpy as np
import tensorflow as tf

from meshtf.lowering import rng


class Initializer(object):
  """Base class: slice_value(key, begin, slice_shape, full_shape, dtype)."""

  # A fill with one value (zeros, ones, a scalar) runs eagerly: traced, TF
  # folds it into a constant of the slice's size that the cached function
  # then holds for the life of the process (one per slice shape: measured,
  # an Adam model kept a copy of its parameters' size this way).
  fills = False

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    raise NotImplementedError

  def cache_key(self):
    """Hashable parameters (None if they are not all plain scalars): equal
    keys compute equal values from equal (key, begin, shapes, dtype)."""
    params = tuple(sorted(vars(self).items()))
    if all(isinstance(v, (int, float, str, bool, type(None)))
           for _, v in params):
      return (type(self).__name__,) + params
    return None


# (initializer params, slice shape, full shape, dtype) -> tf.function of
# (key words, begin). Tracing Threefry costs ~0.1 s and each new function is
# optimised again when first run; variables sharing a shape and initializer
# (every layer of a model, every layout of a test) reuse one.
_TRACED = {}


class _SliceValue(object):
  """(key words, begin) -> one slice's initial value, for one (initializer,
  slice shape, full shape, dtype). A callable object, not a closure: TF's
  retracing warning counts the tf.functions of one code object together, and
  a model's variables make one function per shape by design (each traced
  once), which it would report as "triggered tf.function retracing"."""

  def __init__(self, initializer, slice_shape, full_shape, dtype):
    self._initializer = initializer
    self._slice_shape = list(slice_shape)
    self._full_shape = list(full_shape)
    self._dtype = dtype

  def __call__(self, key_words, begin):
    return self._initializer.slice_value(
        (key_words[0], key_words[1]), begin, self._slice_shape,
        self._full_shape, self._dtype)


def traced_slice_fn(initializer, key, full_shape, dtype):
  """fn(begin, slice_shape) -> the slice's initial value, through a cached
  tf.function that takes the variable's key as an argument. The result has
  `traced = True` (callers need not wrap it in a tf.function again).

  Example:
    >>> fn = traced_slice_fn(RandomUniformInitializer(), (1, 2), [4], tf.float32)
    >>> fn(tf.constant([2], tf.int64), [2]).shape
    TensorShape([2])
  """
  params = initializer.cache_key()
  if initializer.fills:
    def fill(begin, slice_shape):
      return initializer.slice_value(key, begin, slice_shape, full_shape,
                                     dtype)
    fill.traced = True   # cheap eagerly: no tf.function around it either
    return fill

  def fn(begin, slice_shape):
    # Threefry's bits as one XLA kernel (rng.compiled_bits: the same bits,
    # ~15x faster on CPU), read when the function below is traced.
    with rng.compiled_bits():
      if params is None:
        return initializer.slice_value(key, begin, slice_shape, full_shape,
                                       dtype)
      cache = (params, tuple(slice_shape), tuple(full_shape), dtype)
      if cache not in _TRACED:
        _TRACED[cache] = tf.function(
            _SliceValue(initializer, slice_shape, full_shape, dtype),
            autograph=False)
      # Made here, in the caller's (eager) init scope, not while tracing.
      return _TRACED[cache](tf.constant(np.array(key, np.uint32)), begin)
  fn.traced = params is not None
  return fn


class ZerosInitializer(Initializer):
  fills = True

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return tf.zeros(slice_shape, dtype)


class OnesInitializer(Initializer):
  fills = True

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return tf.ones(slice_shape, dtype)


class ConstantInitializer(Initializer):
  """A scalar, or an array of the variable's full shape (sliced)."""

  def __init__(self, value=0.0):
    self.value = value

  @property
  def fills(self):
    return np.ndim(self.value) == 0

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    if np.ndim(self.value) == 0:
      return tf.fill(slice_shape, tf.constant(self.value, dtype))
    full = tf.constant(np.asarray(self.value), dtype)
    if list(full.shape) != list(full_shape):
      raise ValueError("ConstantInitializer value has shape %s, variable "
                       "has %s" % (list(full.shape), list(full_shape)))
    return _slice_of(full, begin, slice_shape, full_shape)


class RandomNormalInitializer(Initializer):
  def __init__(self, mean=0.0, stddev=1.0):
    self.mean, self.stddev = mean, stddev

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return rng.normal_slice(key, begin, slice_shape, full_shape, self.mean,
                            self.stddev, dtype)


class TruncatedNormalInitializer(Initializer):
  """Normal cut at two standard deviations, as tf.truncated_normal."""

  def __init__(self, mean=0.0, stddev=1.0):
    self.mean, self.stddev = mean, stddev

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return rng.normal_slice(key, begin, slice_shape, full_shape, self.mean,
                            self.stddev, dtype, truncate_at=2.0)


class RandomUniformInitializer(Initializer):
  def __init__(self, minval=-0.05, maxval=0.05):
    self.minval, self.maxval = minval, maxval

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return rng.uniform_slice(key, begin, slice_shape, full_shape, self.minval,
                             self.maxval, dtype)


class VarianceScalingInitializer(Initializer):
  """Scale / fan variance, fans as in TensorFlow: for rank >= 2,
  fan_in = shape[-2] * receptive, fan_out = shape[-1] * receptive."""

  def __init__(self, scale=1.0, mode="fan_in", distribution="truncated_normal"):
    if mode not in ("fan_in", "fan_out", "fan_avg"):
      raise ValueError("VarianceScalingInitializer mode %r: use fan_in, "
                       "fan_out or fan_avg" % mode)
    if distribution == "normal":
      distribution = "truncated_normal"
    if distribution not in ("truncated_normal", "untruncated_normal",
                            "uniform"):
      raise ValueError("VarianceScalingInitializer distribution %r: use "
                       "truncated_normal, untruncated_normal or uniform"
                       % distribution)
    self.scale, self.mode, self.distribution = scale, mode, distribution

  @staticmethod
  def fans(full_shape):
    full_shape = list(full_shape)
    if not full_shape:
      return 1, 1
    if len(full_shape) == 1:
      return full_shape[0], full_shape[0]
    receptive = int(np.prod(full_shape[:-2]))
    return full_shape[-2] * receptive, full_shape[-1] * receptive

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    fan_in, fan_out = self.fans(full_shape)
    n = {"fan_in": fan_in, "fan_out": fan_out,
         "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
    variance = self.scale / max(1.0, n)
    if self.distribution == "uniform":
      limit = math.sqrt(3.0 * variance)
      return rng.uniform_slice(key, begin, slice_shape, full_shape, -limit,
                               limit, dtype)
    if self.distribution == "untruncated_normal":
      return rng.normal_slice(key, begin, slice_shape, full_shape, 0.0,
                              math.sqrt(variance), dtype)
    # Stddev of a unit normal truncated at +-2 is 0.8796...
    return rng.normal_slice(key, begin, slice_shape, full_shape, 0.0,
                            math.sqrt(variance) / 0.87962566103423978, dtype,
                            truncate_at=2.0)


_BY_CLASS_NAME = {
    "Zeros": lambda c: ZerosInitializer(),
    "ZerosInitializer": lambda c: ZerosInitializer(),
    "Ones": lambda c: OnesInitializer(),
    "OnesInitializer": lambda c: OnesInitializer(),
    "Constant": lambda c: ConstantInitializer(c.get("value", 0.0)),
    "RandomNormal": lambda c: RandomNormalInitializer(c.get("mean", 0.0),
                                                      c.get("stddev", 1.0)),
    "TruncatedNormal": lambda c: TruncatedNormalInitializer(
        c.get("mean", 0.0), c.get("stddev", 1.0)),
    "RandomUniform": lambda c: RandomUniformInitializer(
        c.get("minval", -0.05), c.get("maxval", 0.05)),
    "VarianceScaling": lambda c: VarianceScalingInitializer(
        c.get("scale", 1.0), c.get("mode", "fan_in"),
        c.get("distribution", "truncated_normal")),
    "GlorotUniform": lambda c: VarianceScalingInitializer(1.0, "fan_avg",
                                                          "uniform"),
    "GlorotNormal": lambda c: VarianceScalingInitializer(1.0, "fan_avg"),
    "HeNormal": lambda c: VarianceScalingInitializer(2.0, "fan_in"),
    "HeUniform": lambda c: VarianceScalingInitializer(2.0, "fan_in", "uniform"),
    "LecunNormal": lambda c: VarianceScalingInitializer(1.0, "fan_in"),
    "LecunUniform": lambda c: VarianceScalingInitializer(1.0, "fan_in",
                                                         "uniform"),
}


def convert_initializer(init):
  """Turns None, a number, an array, a meshtf or a TF/Keras initializer into
  a meshtf Initializer (None -> Glorot uniform, TensorFlow's default).

  Example:
    >>> type(convert_initializer(0.5)).__name__
    'ConstantInitializer'
  """
  if init is None:
    return VarianceScalingInitializer(1.0, "fan_avg", "uniform")
  if isinstance(init, Initializer):
    return init
  if isinstance(init, (int, float, np.ndarray, list)):
    return ConstantInitializer(init)
  name = type(init).__name__
  if name in _BY_CLASS_NAME:
    config = init.get_config() if hasattr(init, "get_config") else {}
    return _BY_CLASS_NAME[name](config)
  if callable(init):
    return FullValueInitializer(init)
  raise TypeError(
      "Initializer %r is neither a callable nor a known initializer; use "
      "one of mtf.initializers (zeros, ones, constant, random_normal, "
      "truncated_normal, random_uniform, variance_scaling), a Keras "
      "initializer, or a function (shape, dtype) -> value" % (init,))


class FullValueInitializer(Initializer):
  """Any callable initializer fn(shape, dtype=...) -> full value (Mesh TF
  code passes these: TF1 initializers, lambdas, mocks).

  meshtf cannot compute one slice of it alone, so the full value is made
  once per variable on the host and each processor takes its slice: the
  same numbers on every layout within one run, but the host holds the
  whole variable once, and a random fn draws from TensorFlow's global RNG
  (not meshtf's keyed one), so two runs or two Lowerings differ. A warning
  says so; mtf.initializers are layout-invariant without these costs.

  Example:
    >>> init = convert_initializer(lambda shape, dtype: tf.ones(shape, dtype))
    >>> type(init).__name__
    'FullValueInitializer'
  """

  def __init__(self, fn):
    self.fn = fn
    self._last = (None, None)   # (variable key, full value): slices of one
    # variable are made one after the other, so one entry suffices.
    warnings.warn(
        "initializer %r is not one of mtf.initializers: meshtf computes its "
        "full value once per variable on the host and slices it (not "
        "layout-invariant across runs if it is random; the host holds the "
        "whole variable)" % (fn,), stacklevel=4)

  def cache_key(self):
    return None

  def full_value(self, key, full_shape, dtype):
    """The variable's whole initial value (computed once per key)."""
    cache = (tuple(np.asarray(key).tolist()), tuple(full_shape), dtype)
    if self._last[0] != cache:
      with tf.init_scope():
        value = _call_initializer(self.fn, list(full_shape), dtype)
        value = tf.cast(tf.convert_to_tensor(value), dtype)
      if value.shape.as_list() != list(full_shape):
        raise ValueError(
            "initializer %r returned shape %s for a variable of shape %s" % (
                self.fn, value.shape.as_list(), list(full_shape)))
      self._last = (cache, value)
    return self._last[1]

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    return _slice_of(self.full_value(key, full_shape, dtype), begin,
                     slice_shape, full_shape)


def _call_initializer(fn, shape, dtype):
  """fn(shape, dtype=dtype) if fn takes a dtype (TF/Keras initializers and
  Mesh TF's test functions do), else fn(shape)."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):   # no signature: try the usual form
    return fn(shape, dtype=dtype)
  if any(p.name == "dtype" or p.kind == p.VAR_KEYWORD for p in params):
    return fn(shape, dtype=dtype)
  return fn(shape)


# Public names for other meshtf modules (conv_layers adapts plain-function
# initializers to Mesh TF's filter shapes).
BY_CLASS_NAME = _BY_CLASS_NAME
call_initializer = _call_initializer


def _slice_of(full, begin, slice_shape, full_shape):
  """The slice at begin of full; the last slices of an uneven split reach
  past the variable's end and are padded."""
  begin = tf.cast(begin, tf.int32)
  past = tf.maximum(begin + slice_shape - list(full_shape), 0)
  full = tf.pad(full, tf.stack([tf.zeros_like(past), past], axis=1))
  return tf.slice(full, begin, slice_shape)


zeros_initializer = ZerosInitializer
ones_initializer = OnesInitializer
constant_initializer = ConstantInitializer
random_normal_initializer = RandomNormalInitializer
truncated_normal_initializer = TruncatedNormalInitializer
random_uniform_initializer = RandomUniformInitializer
variance_scaling_initializer = VarianceScalingInitializer
