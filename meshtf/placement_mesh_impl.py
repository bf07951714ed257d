"""Mesh TensorFlow's module path: `mtf.placement_mesh_impl.PlacementMeshImpl`
and its ring collectives on lists of per-device tensors."""
from meshtf.lowering.placement import PlacementMeshImpl  # noqa: F401
from meshtf.lowering.rings import allconcat_ring  # noqa: F401
from meshtf.lowering.rings import allreduce_ring  # noqa: F401
from meshtf.lowering.rings import allreduce_ring_single_shard  # noqa: F401
from meshtf.lowering.rings import alltoall_pointtwise  # noqa: F401
from meshtf.lowering.rings import alltoall_ring  # noqa: F401
