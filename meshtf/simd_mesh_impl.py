"""Mesh TensorFlow's module path: `mtf.simd_mesh_impl.SimdMeshImpl`."""
from meshtf.lowering.logical_to_physical import HierarchicalTiling  # noqa: F401
from meshtf.lowering.logical_to_physical import auto_logical_to_physical_tpu  # noqa: F401
from meshtf.lowering.simd import SimdMeshImpl  # noqa: F401
