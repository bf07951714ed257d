"""The MeshImpl collectives, checked against numpy on every backend."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import harness

MESH = "a:2;b:2;c:2"


def impl_for(backend, layout=""):
  return harness.make_impl(backend, MESH, layout)


def per_device_values(impl, shape, seed=0):
  rs = np.random.RandomState(seed)
  return [rs.normal(size=shape).astype(np.float32) for _ in range(impl.size)]


def run(impl, fn, values):
  """fn applied to the laid-out tensor whose slice on processor p is
  values[p]; returns the per-processor results as numpy."""
  return [t.numpy() for t in impl.run_on_slices(fn, values)]


@pytest.fixture(params=sorted(harness.BACKENDS))
def backend(request):
  return request.param


@pytest.mark.parametrize("axes", [[0], [1], [2], [0, 2], [0, 1, 2]])
@pytest.mark.parametrize("reduction,np_fn", [("SUM", np.sum), ("MAX", np.max),
                                             ("MIN", np.min)])
def test_allreduce(backend, axes, reduction, np_fn):
  impl = impl_for(backend)
  values = per_device_values(impl, [3, 2])
  out = run(impl, lambda x: impl.allreduce(x, axes, reduction), values)
  for group in impl.processor_groups(axes):
    expected = np_fn(np.stack([values[p] for p in group]), axis=0)
    for p in group:
      np.testing.assert_allclose(out[p], expected, rtol=1e-6)


def test_processor_groups_vary_only_along_axes():
  impl = harness.make_impl("placement", MESH, "")
  groups = impl.processor_groups([1])
  assert len(groups) == 4 and all(len(g) == 2 for g in groups)
  for g in groups:
    c0, c1 = (impl.pnum_to_processor_coordinates(p) for p in g)
    assert c0[0] == c1[0] and c0[2] == c1[2] and (c0[1], c1[1]) == (0, 1)


@pytest.mark.parametrize("mesh_axis", [0, 1, 2])
def test_allconcat_allsplit_alltoall(backend, mesh_axis):
  impl = impl_for(backend)
  values = per_device_values(impl, [4, 6])
  cat = run(impl, lambda x: impl.allconcat(x, mesh_axis, 1), values)
  split = run(impl, lambda x: impl.allsplit(x, mesh_axis, 0), values)
  a2a = run(impl, lambda x: impl.alltoall(x, mesh_axis, split_axis=0,
                                          concat_axis=1), values)
  for group in impl.processor_groups([mesh_axis]):
    full = np.concatenate([values[p] for p in group], axis=1)
    for i, p in enumerate(group):
      np.testing.assert_array_equal(cat[p], full)
      np.testing.assert_array_equal(split[p], values[p][2 * i:2 * i + 2])
      expected = np.concatenate([values[q][2 * i:2 * i + 2] for q in group],
                                axis=1)
      np.testing.assert_array_equal(a2a[p], expected)


@pytest.mark.parametrize("offset,wrap", [(1, True), (-1, True), (1, False),
                                         (-1, False)])
def test_shift_by_n_processors(backend, offset, wrap):
  impl = impl_for(backend)
  values = per_device_values(impl, [2])
  out = run(impl, lambda x: impl.shift_by_n_processors(x, 2, offset, wrap),
            values)
  for group in impl.processor_groups([2]):
    for i, p in enumerate(group):
      j = i - offset
      if wrap:
        np.testing.assert_array_equal(out[p], values[group[j % 2]])
      elif 0 <= j < 2:
        np.testing.assert_array_equal(out[p], values[group[j]])
      else:
        np.testing.assert_array_equal(out[p], np.zeros(2))


def test_pnum_and_pcoord(backend):
  impl = impl_for(backend)
  zeros = [np.zeros([], np.int32)] * 8
  pnums = [int(t) for t in run(impl, lambda x: impl.laid_out_pnum(), zeros)]
  assert pnums == list(range(8))
  for axis in range(3):
    coords = [int(t) for t in run(
        impl, lambda x, a=axis: impl.laid_out_pcoord(a), zeros)]
    assert coords == [impl.pnum_to_processor_coordinates(p)[axis]
                      for p in range(8)]


LAYOUTS = ["", "x:a", "y:b", "x:a;y:c", "x:c;y:a;z:b", "z:a;y:b"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_import_export_roundtrip(backend, layout):
  import meshtf as mtf
  impl = impl_for(backend, layout)
  shape = mtf.convert_to_shape("x:4;y:6;z:2")
  full = np.arange(48, dtype=np.float32).reshape([4, 6, 2])
  lo = impl.run_on_slices(lambda x: impl.import_tf_tensor(tf.constant(full),
                                                          shape),
                          [np.zeros([], np.float32)] * 8)
  for p, s in enumerate(t.numpy() for t in lo):
    begin = impl.slice_begin(shape, p)
    size = impl.slice_shape(shape)
    idx = tuple(slice(b, b + n) for b, n in zip(begin, size))
    np.testing.assert_array_equal(s, full[idx])
  np.testing.assert_array_equal(impl.assemble_slices(lo, shape).numpy(), full)


def test_collectives_are_recorded(backend):
  impl = impl_for(backend)
  records = []
  impl._recorder = records.append
  try:
    impl.run_on_slices(lambda x: impl.alltoall(
        impl.allreduce(x, [0, 1], "SUM"), 2, 0, 1),
                       per_device_values(impl, [4, 6]))
  finally:
    impl._recorder = None
  assert [(r.kind, r.mesh_axes, r.group_size, r.elements_per_device)
          for r in records] == [("allreduce_sum", ("a", "b"), 4, 24),
                                ("alltoall", ("c",), 2, 24)]


def test_every_axis_subset_groups_partition_the_mesh():
  impl = harness.make_impl("placement", MESH, "")
  for r in range(4):
    for axes in itertools.combinations(range(3), r):
      groups = impl.processor_groups(list(axes))
      assert sorted(sum(groups, [])) == list(range(8))
      assert all(len(g) == 2 ** r for g in groups)


@pytest.mark.parametrize("axes,size", [(0, 4), (2, 5), ((0, 2), 8),
                                       ((2, 1), 7)])
def test_reduce_scatter_is_sum_then_split_at_half_the_bytes(backend, axes,
                                                            size):
  """The sum over the group of each processor's [size, 3] values, each
  member keeping its stripe of the first dim (padded when uneven; a tuple
  of axes: major first); each device sends (n-1)/n of its slice, half an
  allreduce's volume."""
  impl = impl_for(backend)
  values = per_device_values(impl, [size, 3])
  stats = []
  impl._recorder = stats.append   # pylint: disable=protected-access
  try:
    out = run(impl, lambda x: impl.reduce_scatter(x, axes, 0), values)
  finally:
    impl._recorder = None         # pylint: disable=protected-access
  axes = axes if isinstance(axes, tuple) else (axes,)
  n = int(np.prod([impl.shape.dims[a].size for a in axes]))
  stripe = -(-size // n)
  for group in impl.processor_groups(list(axes)):
    total = np.sum(np.stack([values[p] for p in group]), axis=0)
    total = np.pad(total, [[0, n * stripe - size], [0, 0]])
    for p in group:
      coords = impl.pnum_to_processor_coordinates(p)
      shard = 0
      for a in axes:
        shard = shard * impl.shape.dims[a].size + coords[a]
      np.testing.assert_allclose(out[p], total[shard * stripe:
                                               (shard + 1) * stripe],
                                 rtol=1e-5, atol=1e-6)
  sent = sum(r.bytes_per_device for r in stats)
  allreduce = 2.0 * (n - 1) / n * size * 3 * 4
  assert {r.kind for r in stats} == {"reduce_scatter"}
  # Padding rounds the pieces up; for even sizes it is exactly half.
  assert allreduce / 2 <= sent <= allreduce / 2 * (n * stripe / size) + 1
