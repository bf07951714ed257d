"""meshtf/compat/rings.py (Mesh TF's placement_mesh_impl ring
collectives): the numbers of numpy sums, maxima, concats and all-to-alls on
1-8 virtual CPU devices, each result on its own device, and in a traced
graph the ring versions read only their own or a neighbour's tensors."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from meshtf.compat import placement_mesh_impl as pmi


def _inputs(n, shape, seed=0):
  rs = np.random.RandomState(seed)
  arrays = [rs.randn(*shape).astype(np.float32) for _ in range(n)]
  xs = []
  for i, a in enumerate(arrays):
    with tf.device(DEVICES[i]):
      xs.append(tf.identity(tf.constant(a)))
  return arrays, xs


def _check_devices(ys, n):
  assert len(ys) == n
  for i, y in enumerate(ys):
    assert tf.DeviceSpec.from_string(y.device).device_index == \
        tf.DeviceSpec.from_string(DEVICES[i]).device_index, (i, y.device)


# [16, 64] = 1,024 elements: split into chunks for 4 and 8 devices, whole
# for 3 (1,024 % 3 != 0) and for the small [3, 5].
@pytest.mark.parametrize("n,shape", [(1, [3, 5]), (2, [3, 5]), (3, [16, 64]),
                                     (4, [16, 64]), (5, [3, 5]),
                                     (8, [16, 64])])
@pytest.mark.parametrize("fn", [pmi.allreduce_ring,
                                pmi.allreduce_ring_single_shard])
def test_allreduce_matches_numpy(fn, n, shape):
  arrays, xs = _inputs(n, shape)
  for name, reduce_np in [("SUM", np.sum), ("MAX", np.max), ("MIN", np.min)]:
    ys = fn(xs, DEVICES[:n], name)
    _check_devices(ys, n)
    want = reduce_np(np.stack(arrays), axis=0)
    for y in ys:
      assert y.shape == tuple(shape)
      np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5,
                                 err_msg=name)
      # One value everywhere, bit for bit.
      np.testing.assert_array_equal(y.numpy(), ys[0].numpy())


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("axis", [0, 1])
def test_allconcat_ring_matches_numpy(n, axis):
  arrays, xs = _inputs(n, [2, 3])
  ys = pmi.allconcat_ring(xs, DEVICES[:n], axis)
  _check_devices(ys, n)
  for y in ys:
    np.testing.assert_array_equal(y.numpy(), np.concatenate(arrays, axis))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("split_axis,concat_axis", [(0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("fn", [pmi.alltoall_ring, pmi.alltoall_pointtwise])
def test_alltoall_matches_numpy(fn, n, split_axis, concat_axis):
  shape = [2, 3]
  shape[split_axis] *= n
  arrays, xs = _inputs(n, shape)
  ys = fn(xs, DEVICES[:n], split_axis, concat_axis)
  _check_devices(ys, n)
  for t, y in enumerate(ys):
    # Piece t of every source, in source order.
    want = np.concatenate([np.split(a, n, split_axis)[t] for a in arrays],
                          concat_axis)
    np.testing.assert_array_equal(y.numpy(), want, err_msg="target %d" % t)


def test_alltoall_ring_with_an_unknown_split_size():
  n = 4
  arrays, _ = _inputs(n, [8, 3])
  spec = tf.TensorSpec([None, 3], tf.float32)

  @tf.function(input_signature=[spec] * n)
  def alltoall(*xs):
    return pmi.alltoall_ring(list(xs), DEVICES[:n], 0, 1)
  ys = alltoall(*arrays)
  for t, y in enumerate(ys):
    want = np.concatenate([a[2 * t:2 * t + 2] for a in arrays], 1)
    np.testing.assert_array_equal(y.numpy(), want)


def _longest_hop(fn, *args, n=8):
  """The largest ring distance between an op's device and the device of a
  tensor it reads, in fn's traced graph on n devices."""
  index = {tf.DeviceSpec.from_string(d).device_index: i
           for i, d in enumerate(DEVICES[:n])}

  @tf.function(input_signature=[tf.TensorSpec([16, 64], tf.float32)] * n)
  def traced(*xs):
    placed = []
    for i, x in enumerate(xs):
      with tf.device(DEVICES[i]):
        placed.append(tf.identity(x))
    return fn(placed, DEVICES[:n], *args)
  graph = traced.get_concrete_function().graph
  where = lambda op: index.get(tf.DeviceSpec.from_string(
      op.device).device_index) if op.device else None
  longest = 0
  for op in graph.get_operations():
    for t in op.inputs:
      here, there = where(op), where(t.op)
      if here is not None and there is not None:
        longest = max(longest, min((here - there) % n, (there - here) % n))
  return longest


@pytest.mark.parametrize("fn,args", [
    (pmi.allreduce_ring, ("SUM",)),
    (pmi.allreduce_ring_single_shard, ("MAX",)),
    (pmi.allconcat_ring, (0,)), (pmi.alltoall_ring, (0, 1))])
def test_ring_versions_talk_only_to_neighbours(fn, args):
  """Every op on device i reads tensors of devices i - 1, i, i + 1 only."""
  assert _longest_hop(fn, *args) == 1


def test_pointwise_alltoall_sends_straight_across():
  assert _longest_hop(pmi.alltoall_pointtwise, 0, 1) == 4   # 8 devices


def test_errors():
  _, xs = _inputs(2, [2, 2])
  with pytest.raises(ValueError, match="2 tensors but 3 devices"):
    pmi.allreduce_ring(xs, DEVICES[:3])
  with pytest.raises(ValueError, match="unknown reduction"):
    pmi.allreduce_ring_single_shard(xs, DEVICES[:2], "PROD")
