"""Mesh TensorFlow's module path: `mtf.simd_mesh_impl.SimdMeshImpl`.

Example:
  >>> impl = mtf.simd_mesh_impl.SimdMeshImpl(
  ...     "batch:2", "batch:batch,heads:model", devices[:2])  # one warning
  >>> impl.layout_rules.pairs
  [('batch', 'batch')]
"""
from meshtf.compat.logical_to_physical import HierarchicalTiling  # noqa: F401
from meshtf.compat.logical_to_physical import auto_logical_to_physical_tpu  # noqa: F401
from meshtf.compat.logical_to_physical import physical_shape_3d_from_topology_proto_4d  # noqa: F401,E501
from meshtf.lowering import simd as _simd
from meshtf.compat.helpers import mesh_tf_layout_rules


class SimdMeshImpl(_simd.SimdMeshImpl):
  """Mesh TF's SimdMeshImpl(shape, layout, devices, ...): meshtf's SPMD
  backend, with Mesh TF's layout-rule semantics: a rule naming a mesh axis
  the mesh lacks is inactive (one warning naming it); mtf.SimdMeshImpl
  refuses it."""

  def __init__(self, shape, layout, devices, *args, **kwargs):
    super().__init__(shape, mesh_tf_layout_rules(layout), devices, *args, **kwargs)
