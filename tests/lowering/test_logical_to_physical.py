"""meshtf/lowering/logical_to_physical.py: Mesh TF's HierarchicalTiling and
auto_logical_to_physical_tpu give permutations with the tiles asked for."""
import pytest

from meshtf import simd_mesh_impl
from meshtf.lowering import logical_to_physical as l2p


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
