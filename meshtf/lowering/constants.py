"""Constants and processor-coordinate tensors shared within one per-device
program.

A lowered op passes Python values to TensorFlow -- reshape sizes, transpose
permutations, reduction axes, fill values, scalar factors -- and each
becomes a Const op of its own. In the traced per-device program of the
binary's lm_tiny that was 867 of its 2,301 TF ops, with 87 distinct values;
every op costs time to create in Python, and TensorFlow places, optimizes
(Grappler) and instantiates it once per device on the first run. The SPMD
backend registers its program graph here while tracing it
(`shared_in(graph)`); in a registered graph `constant` and `cached` hand out
one tensor per value (or key), made outside any control dependency. In any
other graph (eager code, the placement backend, a while-loop body, XLA
segments) they make a new tensor each time, as tf.constant does.

Example:
  >>> with shared_in(tf.compat.v1.get_default_graph()):   # while tracing
  ...   a = constant([2, 3], tf.int32)
  ...   b = constant([2, 3], tf.int32)
  >>> a is b
  True
"""
import contextlib
import weakref

import numpy as np
import tensorflow as tf

_CACHES = weakref.WeakKeyDictionary()   # graph -> {key: tensor}


@contextlib.contextmanager
def shared_in(graph):
  """While active, constants and cached tensors made in `graph` are shared
  (one per value / key)."""
  _CACHES[graph] = {}
  try:
    yield
  finally:
    _CACHES.pop(graph, None)


def _cache():
  if tf.executing_eagerly():
    return None, None
  graph = tf.compat.v1.get_default_graph()
  return graph, _CACHES.get(graph)


def cached(key, make):
  """make()'s tensor, made once per key in a registered graph (outside
  control dependencies, in the graph's root name scope); make() each time
  elsewhere. make must depend only on what every op of the graph may read
  (constants, the program's arguments).

  Example:
    >>> pcoord = cached(("pcoord", 0), lambda: pnum // 4)
  """
  graph, cache = _cache()
  if cache is None:
    return make()
  if key not in cache:
    with graph.control_dependencies(None), graph.name_scope(None):
      cache[key] = make()
  return cache[key]


def constant(value, dtype):
  """tf.constant(value, dtype), one per distinct value in a registered
  graph.

  Example:
    >>> t = constant(0.5, tf.float32)
  """
  dtype = tf.as_dtype(dtype)
  array = np.asarray(value, dtype=dtype.as_numpy_dtype)
  return cached(("const", dtype.name, array.shape, array.tobytes()),
                lambda: tf.constant(array, dtype))


def int32(values):
  """An int32 constant (shapes, permutations, axes) of a list or int."""
  return constant([int(v) for v in values] if isinstance(
      values, (list, tuple)) else int(values), tf.int32)


__all__ = ["shared_in", "cached", "constant", "int32"]
