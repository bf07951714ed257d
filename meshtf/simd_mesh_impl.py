"""Mesh TensorFlow's module path: `mtf.simd_mesh_impl.SimdMeshImpl`."""
from meshtf.lowering.logical_to_physical import HierarchicalTiling  # noqa: F401
from meshtf.lowering.logical_to_physical import auto_logical_to_physical_tpu  # noqa: F401
from meshtf.lowering.logical_to_physical import physical_shape_3d_from_topology_proto_4d  # noqa: F401,E501
from meshtf.lowering.simd import SimdMeshImpl  # noqa: F401
