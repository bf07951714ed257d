"""The closed vocabularies in which an Operation declares its plan facts
(meshtf/graph.py's declared hooks), read alike by the lowering and by
meshtf/plan.

Example:
  >>> from meshtf.op_kinds import CostKind
  >>> CostKind("fusible")
  <CostKind.FUSIBLE: 'fusible'>
"""
import enum


class CostKind(enum.Enum):
  """What an operation costs on a device, as plan/fusion.py forms kernels
  (XLA's loop and input fusion):

    FREE      computes and moves nothing of its own: variables, imports,
              constants (their readers pay the reads)
    FUSIBLE   elementwise ops, broadcasts, casts, reshapes, slices,
              gathers, annotations: fuse with their producers and readers
    REDUCING  reductions, cumsums, one-operand einsums: fuse with their
              producers; the output is written and read back
    KERNEL    einsums, convolutions, top_k, sort, scatter, loops: one
              kernel each, reading its operands and writing its output
  """
  FREE = "free"
  FUSIBLE = "fusible"
  REDUCING = "reducing"
  KERNEL = "kernel"


__all__ = ["CostKind"]
