"""Collectives on a ring of devices, on Python lists of per-device tensors
(Mesh TensorFlow's placement_mesh_impl functions).

xs[i] is a tf.Tensor on devices[i]; devices[i - 1] and devices[i + 1]
(mod n) are its ring neighbours. The ring versions move data only between
neighbours, one hop per op, so every link carries about the same bytes;
`alltoall_pointtwise` (Mesh TF's spelling) sends each piece straight to
its target instead. Each returns a list of n tensors, the i-th on
devices[i]. PlacementMeshImpl does not need them (it lowers collectives
itself); they are here for code that called Mesh TF's.

Example:
  >>> devices = mtf.virtual_cpu_devices(4)
  >>> xs = [tf.constant([1.0, 2.0]) * i for i in range(4)]
  >>> [y.numpy().tolist() for y in allreduce_ring(xs, devices)]
  [[6.0, 12.0], [6.0, 12.0], [6.0, 12.0], [6.0, 12.0]]
"""
import tensorflow as tf

from meshtf.compat import helpers

# allreduce_ring splits tensors of at least this many elements into one
# chunk per device (Mesh TF's threshold); smaller ones go whole.
_MIN_ELEMENTS_TO_SPLIT = 1024


def _check(what, xs, devices):
  xs = list(xs)
  if len(devices) != len(xs):
    raise ValueError("%s: %d tensors but %d devices; give one device per "
                     "tensor" % (what, len(xs), len(devices)))
  return xs


def _on(device, fn, *args, **kwargs):
  with tf.device(device):
    return fn(*args, **kwargs)


def allreduce_ring_single_shard(xs, devices, reduction_fn_string="SUM"):
  """The reduction ("SUM", "MAX" or "MIN") of all xs, on every device.

  The running reduction travels from both ends of the ring toward its
  middle (about n / 2 hops), is completed on the two middle devices, and
  is copied outward from there: every device gets the same value.

  Example:
    >>> ys = allreduce_ring_single_shard(xs, devices, "MAX")
  """
  xs = _check("allreduce_ring_single_shard", xs, devices)
  n = len(xs)
  combine = helpers.binary_reduction_fn(reduction_fn_string)
  if n == 1:
    return xs
  mid = (n - 1) // 2          # the last device of the left half
  left = xs[0]
  for i in range(1, mid + 1):
    left = _on(devices[i], combine, left, xs[i])
  right = xs[n - 1]
  for i in range(n - 2, mid, -1):
    right = _on(devices[i], combine, xs[i], right)
  out = [None] * n
  # Both middle devices combine the same two values in the same order.
  for i in (mid, mid + 1):
    out[i] = _on(devices[i], combine, left, right)
  for i in range(mid - 1, -1, -1):
    out[i] = _on(devices[i], tf.identity, out[i + 1])
  for i in range(mid + 2, n):
    out[i] = _on(devices[i], tf.identity, out[i - 1])
  return out


def allreduce_ring(xs, devices, reduction_fn_string="SUM"):
  """The reduction of all xs on every device, as a ring reduce-scatter
  then a ring allgather.

  Each tensor is flattened and cut into n chunks; chunk k is reduced hop
  by hop around the ring, ending complete on device k, then passed on
  around the ring to the others. Every link carries 2 (n - 1) / n of a
  tensor. Tensors with fewer than 1,024 elements, a size n does not
  divide, or an unknown shape use allreduce_ring_single_shard.

  Example:
    >>> ys = allreduce_ring([tf.ones([32, 32])] * 8, devices)   # 8s
  """
  xs = _check("allreduce_ring", xs, devices)
  n = len(xs)
  if n == 1:
    return xs
  shape = xs[0].shape
  size = shape.num_elements() if shape.is_fully_defined() else None
  if size is None or size < _MIN_ELEMENTS_TO_SPLIT or size % n:
    return allreduce_ring_single_shard(xs, devices, reduction_fn_string)
  combine = helpers.binary_reduction_fn(reduction_fn_string)
  # chunks[i][k]: chunk k of device i's tensor, on device i.
  chunks = [_on(devices[i], lambda x: tf.split(tf.reshape(x, [-1]), n),
                xs[i]) for i in range(n)]
  # have[i][k]: the complete chunk k on device i.
  have = [[None] * n for _ in range(n)]
  for k in range(n):
    # Reduce-scatter: start on device k + 1, add each device's chunk k on
    # the way round, complete on device k.
    partial = chunks[(k + 1) % n][k]
    for hop in range(2, n + 1):
      d = (k + hop) % n
      partial = _on(devices[d], combine, partial, chunks[d][k])
    have[k][k] = partial
    # Allgather: then on round the ring from device k.
    for hop in range(1, n):
      d = (k + hop) % n
      have[d][k] = _on(devices[d], tf.identity, have[(d - 1) % n][k])
  return [_on(devices[i], lambda parts: tf.reshape(tf.concat(parts, 0),
                                                  shape), have[i])
          for i in range(n)]


def allconcat_ring(xs, devices, concat_axis):
  """The concatenation of all xs along concat_axis (in device order), on
  every device. Each tensor travels both ways round the ring, n // 2 hops
  one way and (n - 1) // 2 the other.

  Example:
    >>> ys = allconcat_ring([tf.fill([1, 2], float(i)) for i in range(4)],
    ...                     devices, 0)       # each [4, 2]: rows 0, 1, 2, 3
  """
  xs = _check("allconcat_ring", xs, devices)
  n = len(xs)
  if n == 1:
    return xs
  have = [[None] * n for _ in range(n)]   # have[device][source]
  for s in range(n):
    have[s][s] = xs[s]
    for step, hops in ((1, n // 2), (-1, (n - 1) // 2)):
      for hop in range(1, hops + 1):
        d, prev = (s + step * hop) % n, (s + step * (hop - 1)) % n
        have[d][s] = _on(devices[d], tf.identity, have[prev][s])
  return [_on(devices[i], tf.concat, have[i], concat_axis) for i in range(n)]


def _pieces(x, n, split_axis):
  """x split into n equal pieces along split_axis."""
  return tf.split(x, n, axis=split_axis)


def alltoall_pointtwise(xs, devices, split_axis, concat_axis):
  """All-to-all: device t gets piece t of every xs[s] (each split into n
  along split_axis), concatenated in source order along concat_axis.
  Each piece goes straight from its source to its target.

  Example:
    >>> ys = alltoall_pointtwise(xs, devices, split_axis=0, concat_axis=1)
  """
  xs = _check("alltoall_pointtwise", xs, devices)
  n = len(xs)
  if n == 1:
    return xs
  pieces = [_on(devices[s], _pieces, xs[s], n, split_axis) for s in range(n)]
  return [_on(devices[t], tf.concat, [pieces[s][t] for s in range(n)],
              concat_axis) for t in range(n)]


def _first_piece(message, piece_size, split_axis):
  """(the first piece_size entries along split_axis, the rest)."""
  if isinstance(piece_size, int):
    size = message.shape[split_axis]
    if size is not None:
      return tf.split(message, [piece_size, size - piece_size],
                      axis=split_axis)
  rest = tf.shape(message)[split_axis] - piece_size
  return tf.split(message, tf.stack([piece_size, rest]), axis=split_axis,
                  num=2)


def alltoall_ring(xs, devices, split_axis, concat_axis):
  """alltoall_pointtwise's result, moving data only between ring
  neighbours: each source sends one message each way round the ring, the
  pieces for the next n // 2 devices one way and the previous
  (n - 1) // 2 the other, concatenated nearest first; each device on the
  way keeps the first piece and passes the rest on.

  Example:
    >>> ys = alltoall_ring(xs, devices, split_axis=0, concat_axis=1)
  """
  xs = _check("alltoall_ring", xs, devices)
  n = len(xs)
  if n == 1:
    return xs
  have = [[None] * n for _ in range(n)]   # have[target][source]
  for s in range(n):
    x = xs[s]
    pieces = _on(devices[s], _pieces, x, n, split_axis)
    have[s][s] = pieces[s]
    size = x.shape[split_axis]
    piece_size = (size // n if size is not None
                  else _on(devices[s], lambda: tf.shape(x)[split_axis] // n))
    for step, hops in ((1, n // 2), (-1, (n - 1) // 2)):
      if not hops:
        continue
      targets = [(s + step * hop) % n for hop in range(1, hops + 1)]
      message = _on(devices[s], tf.concat, [pieces[t] for t in targets],
                    split_axis)
      for t in targets[:-1]:
        have[t][s], message = _on(devices[t], _first_piece, message,
                                  piece_size, split_axis)
      have[targets[-1]][s] = _on(devices[targets[-1]], tf.identity, message)
  return [_on(devices[t], tf.concat, have[t], concat_axis) for t in range(n)]


__all__ = ["allreduce_ring_single_shard", "allreduce_ring",
           "allconcat_ring", "alltoall_pointtwise", "alltoall_ring"]
