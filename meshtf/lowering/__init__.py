"""Lowering engine, MeshImpl interface and backends."""
from meshtf.lowering.cluster import WorkerInfo
from meshtf.lowering.cluster import start_multi_worker
from meshtf.lowering.devices import gpu_devices
from meshtf.lowering.devices import virtual_cpu_devices
from meshtf.lowering.lowering import Lowering
from meshtf.lowering.pending import PendingSum
from meshtf.lowering.mesh_function import MeshFunction
from meshtf.lowering.mesh_impl import MeshImpl
from meshtf.lowering.placement import PlacementMeshImpl
from meshtf.lowering.simd import SimdMeshImpl
from meshtf.lowering.tpu import TpuMeshImpl
from meshtf.lowering.variables import VariableStore
