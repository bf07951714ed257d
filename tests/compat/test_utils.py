"""meshtf/compat/utils.py: Mesh TF's utils helpers (BalancedVariablePlacer is
checked by Mesh TF's own utils_test, tests/compat)."""
import numpy as np
import pytest
import tensorflow as tf

from meshtf.compat import utils


def _topology(mesh_shape):
  coords = np.array([[[x, y, z, c] for x in range(mesh_shape[0])
                      for y in range(mesh_shape[1])
                      for z in range(mesh_shape[2])
                      for c in range(mesh_shape[3])]], np.int32)
  return tf.tpu.experimental.Topology(mesh_shape=mesh_shape,
                                      device_coordinates=coords)


def test_topology_rank_of_a_topology_and_its_proto():
  topology = _topology([2, 2, 1, 2])
  assert utils.topology_rank(topology) == 4
  assert utils.topology_rank(topology.serialized()) == 4
  with pytest.raises(ValueError, match="not a Topology"):
    utils.topology_rank([2, 2, 1, 2])


def test_create_host_call_has_no_summaries_to_write(tmp_path):
  # mtf.scalar_summary records nothing in meshtf: Mesh TF's "no summaries"
  # answer, None (TPUEstimator then runs no host_call).
  assert utils.create_host_call(str(tmp_path)) is None
