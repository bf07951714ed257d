"""Layout-invariant random tensors: random_uniform, random_normal, dropout.

Values depend only on (graph seed, op seed, op name, global element index):
each processor computes its own slice from its slice's global offsets, so a
run on any mesh reproduces the single-device numbers.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> u = mtf.random_uniform(mesh, "batch:4;io:8", name="noise")
  >>> u.shape
  Shape([batch:4, io:8])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import rng
from meshtf.op_kinds import CostKind
from meshtf.ops import elementwise


class RandomOperation(graph_lib.Operation):
  """Uniform or normal random values of a given shape."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, mesh, shape, distribution, params, seed=0, dtype=tf.float32,
               name=None):
    if distribution not in ("uniform", "normal"):
      raise ValueError("random distribution %r: use uniform or normal"
                       % distribution)
    super().__init__([], mesh=mesh, name=name or "random_" + distribution)
    self._distribution = distribution
    self._params = params
    self._seed = seed
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(shape),
                                      dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    key = rng.op_key(self.graph.seed * 1000003 + self._seed, self.name)
    full = out.shape.to_integer_list
    sizes = impl.slice_shape(out.shape)
    if tf.executing_eagerly() or getattr(impl, "jit_compile", ""):
      # Eager: op by op; under XLA: its own fused copy of the generator.
      fn = (rng.uniform_slice if self._distribution == "uniform"
            else rng.normal_slice)
      local = lambda begin: fn(key, begin, sizes, full, *self._params,
                               dtype=out.dtype)
    else:
      # A graph: one call of a function that every random op of this shape
      # shares (rng.slice_function), not ~120 ops of its own.
      shared = rng.slice_function(self._distribution, self._params, sizes,
                                  full, out.dtype)
      local = lambda begin: shared(key, begin)
    lowering.set_tensor_lowering(out, impl.slicewise(
        local, impl.laid_out_slice_begin(out.shape)))


def random_uniform(mesh, shape, minval=0.0, maxval=1.0, dtype=tf.float32,
                   seed=0, name=None):
  """Uniform values in (minval, maxval), the same on every layout.

  Example:
    >>> u = mtf.random_uniform(mesh, [batch, io], seed=1)
  """
  return RandomOperation(mesh, shape, "uniform", (minval, maxval), seed, dtype,
                         name).outputs[0]


def random_normal(mesh, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=0,
                  name=None):
  """Normal values, the same on every layout.

  Example:
    >>> n = mtf.random_normal(mesh, [batch, io], stddev=0.1)
  """
  return RandomOperation(mesh, shape, "normal", (mean, stddev), seed, dtype,
                         name).outputs[0]


def dropout(x, *args, keep_prob=None, noise_shape=None, rate=None, seed=0,
            name=None, is_training=None):
  """Zeroes elements with probability rate (= 1 - keep_prob) and scales the
  rest by 1 / keep_prob; the mask is layout-invariant.

  Positional arguments follow meshtf's order (keep_prob, noise_shape, rate,
  seed, name), or Mesh TensorFlow's (is_training, keep_prob, rate,
  noise_shape, name) when the first is a bool; is_training=False returns x.

  Example:
    >>> h = mtf.dropout(h, rate=0.1)
    >>> h = mtf.dropout(h, False, rate=0.1)   # Mesh TF's form: not training
  """
  mesh_tf_form = bool(args) and isinstance(args[0], bool)
  order = (("is_training", "keep_prob", "rate", "noise_shape", "name")
           if mesh_tf_form else
           ("keep_prob", "noise_shape", "rate", "seed", "name"))
  if len(args) > len(order):
    raise TypeError("dropout: at most %d positional arguments after x (%s)"
                    % (len(order), ", ".join(order)))
  given = dict(zip(order, args))
  keep_prob = given.get("keep_prob", keep_prob)
  noise_shape = given.get("noise_shape", noise_shape)
  rate = given.get("rate", rate)
  seed = given.get("seed", seed)
  name = given.get("name", name)
  is_training = given.get("is_training", is_training)
  if is_training is False:
    return x
  if is_training is not None and keep_prob is None and rate is None:
    rate = 0.0   # Mesh TF's default
  if (keep_prob is None) == (rate is None):
    raise ValueError("dropout: give exactly one of keep_prob and rate")
  keep_prob = 1.0 - rate if keep_prob is None else keep_prob
  if keep_prob >= 1.0:
    return x
  noise_shape = shapes.convert_to_shape(noise_shape) if noise_shape else x.shape
  u = random_uniform(x.mesh, noise_shape, dtype=x.dtype, seed=seed,
                     name=name or "dropout")
  keep = elementwise.cast(elementwise.less(u, keep_prob), x.dtype)
  return x * keep * (1.0 / keep_prob)
