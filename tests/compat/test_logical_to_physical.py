"""meshtf/compat/logical_to_physical.py: Mesh TF's HierarchicalTiling and
auto_logical_to_physical_tpu give permutations with the tiles asked for;
physical_shape_3d_from_topology_proto_4d folds a TPU topology's 4-d mesh."""
from absl import flags
import numpy as np
import pytest

from meshtf.compat import logical_to_physical as l2p
from meshtf.compat import simd_mesh_impl


def test_last_axis_is_the_innermost_tile():
  t = l2p.HierarchicalTiling([("dp", None), ("mp", [1, 2])], [2, 2])
  assert t.mesh_shape.to_integer_list == [2, 2]
  assert t.logical_to_physical == [0, 1, 2, 3]
  t = l2p.HierarchicalTiling([("dp", None), ("mp", [2, 1])], [2, 2])
  assert t.logical_to_physical == [0, 2, 1, 3]   # mp runs down the columns


@pytest.mark.parametrize("logical,physical", [([128], [8, 8, 2]),
                                              ([8, 16], [8, 8, 2]),
                                              ([3, 5], [15])])
def test_auto_is_a_permutation(logical, physical):
  order = simd_mesh_impl.auto_logical_to_physical_tpu(logical, physical)
  assert sorted(order) == list(range(l2p._prod(physical)))


def test_bad_spec_refused():
  with pytest.raises(ValueError, match="multiply to"):
    l2p.HierarchicalTiling([("a", [2, 2]), ("b", [2, 1])], [2, 2])


def test_physical_shape_3d_from_topology_proto_4d():
  fold = simd_mesh_impl.physical_shape_3d_from_topology_proto_4d
  # [x, y, z, cores] -> [y * z, x, cores]; folded: [x * y, z, cores].
  assert fold([4, 2, 3, 2]) == [6, 4, 2]
  assert fold(np.array([4, 2, 3, 2]), fold_xy=True) == [8, 3, 2]
  assert all(type(v) is int for v in fold(np.array([4, 2, 3, 2])))
  with pytest.raises(ValueError, match="4-d shape"):
    fold([8, 8, 2])
  # Mesh TF's --fold_xy flag, where the program defines it.
  flags.DEFINE_bool("fold_xy", True, "test flag")
  try:
    assert fold([4, 2, 3, 2]) == [8, 3, 2]
    assert fold([4, 2, 3, 2], fold_xy=False) == [6, 4, 2]
  finally:
    delattr(flags.FLAGS, "fold_xy")
  assert fold([4, 2, 3, 2]) == [6, 4, 2]
