"""Helpers for per-slice TensorFlow code shared by the op families.

Shapes, permutations and axes go to TensorFlow through
meshtf.lowering.constants: one Const per value in a per-device program.
"""
import tensorflow as tf

from meshtf import shapes
from meshtf.lowering import constants


def as_shape(x):
  return shapes.convert_to_shape(x)


def transpose(t, perm):
  """tf.transpose(t, perm), a bool tensor moved as bfloat16 (0 and 1 are
  exact): TensorFlow's oneDNN Transpose logs an error line for bool -- and
  for the integer types -- on this machine's CPUs ("oneDNN supports
  DT_BOOL only on platforms with AVX-512"; float32 and bfloat16 do not),
  which Grappler's constant folding used to hide by folding the attention
  masks away.

  Example:
    >>> transpose(tf.constant([[True, False]]), [1, 0]).shape
    TensorShape([2, 1])
  """
  perm = constants.int32(perm)
  if t.dtype == tf.bool:
    return tf.cast(tf.transpose(tf.cast(t, tf.bfloat16), perm), tf.bool)
  return tf.transpose(t, perm)


def expand_to(t, old_shape, new_shape):
  """Reorders slice t's dims (named by old_shape) into new_shape's order and
  inserts size-1 axes for dims missing from old_shape, ready to broadcast."""
  old_names = old_shape.dimension_names
  new_names = new_shape.dimension_names
  perm = [old_names.index(n) for n in new_names if n in old_names]
  if perm != list(range(len(perm))):
    t = transpose(t, perm)
  if len(old_names) != len(new_names):
    sizes = iter(t.shape)
    t = tf.reshape(t, constants.int32([int(next(sizes)) if n in old_names
                                       else 1 for n in new_names]))
  return t


def transpose_to(t, old_names, new_names):
  """Transposes slice t from dim order old_names to new_names (same set)."""
  perm = [old_names.index(n) for n in new_names]
  return transpose(t, perm) if perm != list(range(len(perm))) else t


def einsum_equation(input_shapes, output_shape):
  """A tf.einsum equation with one letter per dimension name."""
  letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
  names = {}
  for s in list(input_shapes) + [output_shape]:
    for d in s.dims:
      if d.name not in names:
        if len(names) == len(letters):
          raise ValueError("einsum supports at most %d distinct dimensions"
                           % len(letters))
        names[d.name] = letters[len(names)]
  term = lambda s: "".join(names[d.name] for d in s.dims)
  return ",".join(term(s) for s in input_shapes) + "->" + term(output_shape)


def union_shape(shape_list):
  """All dims of the shapes, first-seen order; raises on size conflicts."""
  dims = []
  seen = {}
  for s in shape_list:
    for d in s.dims:
      if d.name in seen:
        if seen[d.name] != d.size:
          raise ValueError(
              "Dimension %r has size %d in one operand and %d in another; "
              "tensors that share a dimension name must agree on its size"
              % (d.name, seen[d.name], d.size))
      else:
        seen[d.name] = d.size
        dims.append(d)
  return shapes.Shape(dims)



def einsum_fn(input_shapes, output_shape):
  """A function of the input slices computing the einsum. Two-operand
  contractions become tf.matmul (with transpose flags, merged dim groups and
  operands swapped to match the output order): on CPU oneDNN's matmul is
  faster than its einsum, and Grappler fuses it with bias-add and relu.

  Example:
    >>> fn = einsum_fn([as_shape("b:2;k:3"), as_shape("k:3;h:4")],
    ...                as_shape("b:2;h:4"))
    >>> fn(tf.ones([2, 3]), tf.ones([3, 4])).shape
    TensorShape([2, 4])
  """
  equation = einsum_equation(input_shapes, output_shape)
  if len(input_shapes) == 2:
    plan = _matmul_plan(input_shapes[0].dimension_names,
                        input_shapes[1].dimension_names,
                        output_shape.dimension_names)
    if plan is not None:
      return plan
  return lambda *xs: tf.einsum(equation, *xs)


def _matmul_plan(a, b, out):
  sa, sb, so = set(a), set(b), set(out)
  if (sa - sb - so) or (sb - sa - so):
    return None  # a dim summed within one operand: leave it to tf.einsum
  batch = [n for n in out if n in sa and n in sb]
  contract = [n for n in a if n in sb and n not in so]
  if not contract:
    return None
  a_free = [n for n in out if n in sa and n not in sb]
  b_free = [n for n in out if n in sb and n not in sa]
  swap = (out != batch + a_free + b_free and out == batch + b_free + a_free)
  if swap:
    a, b, a_free, b_free = b, a, b_free, a_free
  # Left operand [batch, free, contract], right [batch, contract, free]; an
  # operand already in the other order of its two groups uses a transpose
  # flag instead of a transpose.
  a_groups, trans_a = _groups(a, batch, a_free, contract)
  b_groups, trans_b = _groups(b, batch, contract, b_free)
  result_names = batch + a_free + b_free

  def fn(x, y):
    if swap:
      x, y = y, x
    sizes = dict(zip(a, [int(s) for s in x.shape]))
    sizes.update(zip(b, [int(s) for s in y.shape]))
    x = _arrange(x, a, batch, a_groups, sizes)
    y = _arrange(y, b, batch, b_groups, sizes)
    z = tf.matmul(x, y, transpose_a=trans_a, transpose_b=trans_b)
    z_sizes = [sizes[n] for n in result_names]
    if list(z.shape) != z_sizes:
      z = tf.reshape(z, constants.int32(z_sizes))
    return transpose_to(z, result_names, list(out))
  return fn


def _groups(names, batch, first, second):
  """The operand's two dim groups in the order to lay them out, and whether
  that order is the transposed one."""
  if list(names) == batch + second + first and first and second:
    return (second, first), True
  return (first, second), False


def _arrange(t, names, batch, groups, sizes):
  """Transposes slice t to [batch, group0, group1] and merges each group into
  one axis (rank = len(batch) + 2)."""
  order = batch + groups[0] + groups[1]
  t = transpose_to(t, list(names), order)
  shape = [sizes[n] for n in batch] + [shapes.prod(sizes[n] for n in g)
                                        for g in groups]
  if list(t.shape) != shape:
    t = tf.reshape(t, constants.int32(shape))
  return t
