"""Hardware models for the plan report: peak compute, memory, the
interconnect a mesh lands on, and the compiler that runs the program, each
constant printed with its source (catalogue.py, interconnect.py).

A collective's time comes from where its group sits on the machine's
links: collective_seconds(hw, mesh_shape, record) places the group of a
collective_stats() record (its kind, mesh axes and the slice each device
puts in) on hw's interconnect and prices its algorithm there.

Example:
  >>> HARDWARE["h100_8x_node"].describe()[1]
  '  peak per GPU = 989 TFLOP/s bf16 dense  [NVIDIA H100 SXM datasheet]'
"""
from meshtf.layouts.relayout import CollectiveKind
from meshtf.plan.hardware import interconnect
from meshtf.plan.hardware.catalogue import HARDWARE
from meshtf.plan.hardware.catalogue import Compiler
from meshtf.plan.hardware.catalogue import Hardware
from meshtf.plan.hardware.catalogue import Source
from meshtf.plan.hardware.catalogue import executor_threads
from meshtf.plan.hardware.catalogue import get

# A collective's bytes sent per device over its input slice's bytes
# (relayout.collective_bytes), by kind.
_SENT_PER_SLICE = {CollectiveKind.ALLCONCAT: lambda n: n - 1.0,
                   CollectiveKind.ALLTOALL: lambda n: (n - 1.0) / n,
                   CollectiveKind.REDUCE_SCATTER: lambda n: (n - 1.0) / n,
                   CollectiveKind.PERMUTE: lambda n: 1.0}


def slice_bytes(record):
  """Bytes of the slice each device puts into a collective_stats()
  record's collective (its elements times their size, recovered from the
  bytes it sends)."""
  n = record["group_size"]
  elements = record["elements_per_device"]
  if n <= 1 or not elements:
    return 0
  kind = CollectiveKind(record["kind"])
  factor = _SENT_PER_SLICE.get(kind, lambda n: 2.0 * (n - 1) / n)(n)
  itemsize = max(int(round(record["bytes_per_device"] /
                           (factor * elements))), 1)
  return elements * itemsize


def collective_seconds(hw, mesh_shape, record):
  """Seconds of one collective (a collective_stats() record) on hw.

  Example:
    >>> collective_seconds(get("tpuv3"), mtf.convert_to_shape("x:32;y:64"),
    ...     {"kind": "allreduce_sum", "mesh_axes": ["y"], "group_size": 64,
    ...      "elements_per_device": 1 << 20, "bytes_per_device": ...})
  """
  axes = [mesh_shape.dimension_names.index(a) for a in record["mesh_axes"]]
  group = hw.interconnect.place(mesh_shape, axes)
  return hw.interconnect.collective_seconds(record["kind"], group,
                                            slice_bytes(record))
