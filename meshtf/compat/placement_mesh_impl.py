"""Mesh TensorFlow's module path: `mtf.placement_mesh_impl.PlacementMeshImpl`
and its ring collectives on lists of per-device tensors.

Example:
  >>> impl = mtf.placement_mesh_impl.PlacementMeshImpl(
  ...     "batch:2", "batch:batch,heads:model", ["/cpu:0"] * 2)  # one warning
  >>> impl.layout_rules.pairs
  [('batch', 'batch')]
"""
from meshtf.lowering import placement as _placement
from meshtf.compat.helpers import mesh_tf_layout_rules
from meshtf.compat.rings import allconcat_ring  # noqa: F401
from meshtf.compat.rings import allreduce_ring  # noqa: F401
from meshtf.compat.rings import allreduce_ring_single_shard  # noqa: F401
from meshtf.compat.rings import alltoall_pointtwise  # noqa: F401
from meshtf.compat.rings import alltoall_ring  # noqa: F401


class PlacementMeshImpl(_placement.PlacementMeshImpl):
  """Mesh TF's PlacementMeshImpl(shape, layout, devices): meshtf's, with Mesh
  TF's layout-rule semantics: a rule naming a mesh axis the mesh lacks is
  inactive (one warning naming it); mtf.PlacementMeshImpl refuses it."""

  def __init__(self, shape, layout, devices):
    super().__init__(shape, mesh_tf_layout_rules(layout), devices)

