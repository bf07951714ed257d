"""The SPMD backend (SimdMeshImpl): one per-device program, traced once and
launched on every device, with TensorFlow collective ops.

  backend.py   SimdMeshImpl: tracing, launching, local slices, collectives
  keys.py      collective group / instance keys, TF's device rank order
  watchdog.py  the watchdog thread that aborts stuck collectives, and
               CollectiveTimeoutError
  slices.py    what a program run leaves on the host (PerDeviceSlices,
               HostPendingSum)

Example:
  >>> import meshtf as mtf
  >>> from meshtf.lowering import simd
  >>> impl = simd.SimdMeshImpl("all:2", "batch:all",
  ...                          mtf.virtual_cpu_devices(2))
  >>> impl.size
  2
"""
from meshtf.lowering.simd.backend import SimdMeshImpl
from meshtf.lowering.simd.keys import device_rank_key
from meshtf.lowering.simd.keys import next_instance_key
from meshtf.lowering.simd.slices import HostPendingSum
from meshtf.lowering.simd.slices import PerDeviceSlices
from meshtf.lowering.simd.watchdog import CollectiveTimeoutError
from meshtf.lowering.simd.watchdog import explain_timeout
