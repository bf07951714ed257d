"""The SPMD backend's collectives on TensorFlow's collective V2 ops.

Each function runs inside the per-device program on the local slice.
TensorFlow orders a group's members ("ranks") by device name; when that
differs from the processors' positions along the mesh axis, results are
reordered with small constant tables indexed by the group index.

Which implementation TensorFlow uses for a collective is the ops'
communication_hint: "nccl" (NCCL's kernels, GPUs only), "ring" (TF's own
ring, any device) or "auto" (TF chooses: ring on CPU). A SimdMeshImpl
decides it once from its devices (default_communication_hint) unless told.

Example (inside a SimdMeshImpl program):
  >>> y = all_reduce(x, "SUM", args)   # args: group_size, group_key, ...
"""
import collections

import numpy as np
import tensorflow as tf

GroupTable = collections.namedtuple(
    "GroupTable", ["base_key", "group_size", "strides", "rank_to_pos"])

_MERGE = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}
_WIRE_DTYPES = (tf.float32, tf.float64, tf.int32, tf.int64)

COMMUNICATION_HINTS = ("auto", "ring", "nccl")
# jit_compile modes of the per-device program: "segments" = XLA clusters of
# everything but the collectives; "program" = the whole program as one XLA
# computation (tf.function(jit_compile=True)).
JIT_MODES = ("segments", "program")
COLLECTIVE_OPS = frozenset(["CollectiveReduceV2", "CollectiveGatherV2",
                            "CollectiveAllToAllV2"])
_TF_OP = {"allreduce": "CollectiveReduceV2", "allconcat": "CollectiveGatherV2",
          "alltoall": "CollectiveAllToAllV2", "permute": "CollectiveAllToAllV2"}


def device_type(name):
  """The device type of a TF device name, upper case ("GPU", "CPU", ...).

  Example:
    >>> device_type("/job:localhost/replica:0/task:0/device:GPU:1")
    'GPU'
    >>> device_type("/gpu:0")
    'GPU'
  """
  last = name.rstrip("/").split("/")[-1]
  if last.lower().startswith("device:"):
    last = last[len("device:"):]
  return last.split(":")[0].upper()


def default_communication_hint(devices):
  """"nccl" when every device is a GPU (NCCL moves the data over the
  GPUs' links), else "auto" (NCCL cannot serve a CPU; TF picks its ring).

  Example:
    >>> default_communication_hint(["/gpu:0", "/gpu:1"])
    'nccl'
    >>> default_communication_hint(["/cpu:0", "/gpu:0"])
    'auto'
  """
  types = {device_type(d) for d in devices}
  return "nccl" if types == {"GPU"} else "auto"


def check_communication_hint(hint, where):
  """hint itself if valid (None: not given); else ValueError with the fix.

  Example:
    >>> check_communication_hint("nccl", "SimdMeshImpl")
    'nccl'
  """
  if hint is None or hint in COMMUNICATION_HINTS:
    return hint
  raise ValueError("%s: communication_hint=%r is not one of %s: pass 'nccl' "
                   "for GPU meshes, 'auto' otherwise, or None to choose from "
                   "the devices" % (where, hint,
                                    ", ".join(COMMUNICATION_HINTS)))


def check_jit_compile(jit_compile, where):
  """The jit mode: "" (off) for False, "program" for True, the mode for
  "segments" / "program", None for None (not given); else ValueError.

  Example:
    >>> check_jit_compile(True, "MeshFunction")
    'program'
  """
  if jit_compile is None:
    return None
  if jit_compile is False or jit_compile == "":
    return ""
  if jit_compile is True:
    return "program"
  if jit_compile in JIT_MODES:
    return jit_compile
  raise ValueError("%s: jit_compile=%r is not one of False, True, %s: pass "
                   "jit_compile='segments' (XLA between the collectives) or "
                   "'program' (the whole per-device program)"
                   % (where, jit_compile,
                      ", ".join(repr(m) for m in JIT_MODES)))


def xla_program_refusal(kind, reduction, whole_mesh, devices, hint="auto"):
  """Why TF 2.21 cannot compile this collective inside a jit_compile=True
  program, or None where its XLA lowering may (untested on GPU here).
  kind: the collective's family (a CollectiveKind's .family: "allreduce"
  for every reduction, which `reduction` names).

  TF 2.21's tf2xla lowers only CollectiveReduceV2, with Add/Mul, hint
  "nccl" or "auto", a compile-time constant group key (a group spanning
  the whole mesh; a group over some axes takes its key from the processor
  number) and not on CPU (measured: "Collectives are not yet implemented
  for CPU devices when compiling with XLA", b/194942685). Gather and
  all-to-all have no XLA kernel ("No registered 'CollectiveGatherV2'
  OpKernel for XLA_CPU_JIT").

  Example:
    >>> xla_program_refusal("allreduce", "SUM", True, ["/gpu:0", "/gpu:1"])
    >>> xla_program_refusal("allconcat", None, True, ["/gpu:0", "/gpu:1"])
    'TF 2.21 has no XLA kernel for CollectiveGatherV2'
  """
  if any(device_type(d) != "GPU" for d in devices):
    return ("TF 2.21's XLA does not compile collectives on %s devices "
            "('Collectives are not yet implemented for CPU devices when "
            "compiling with XLA')" % "/".join(sorted(
                {device_type(d) for d in devices} - {"GPU"})))
  if kind != "allreduce":
    return "TF 2.21 has no XLA kernel for %s" % _TF_OP[kind]
  if reduction != "SUM":
    return ("TF 2.21's XLA lowering of CollectiveReduceV2 takes Add and Mul "
            "only, not %s" % reduction)
  if hint not in ("nccl", "auto"):
    return ("TF 2.21's XLA lowering of CollectiveReduceV2 takes the hints "
            "nccl and auto only, not %s" % hint)
  if not whole_mesh:
    return ("XLA needs a compile-time constant group key, and a group over "
            "some of the mesh axes takes its key from the processor number")
  return None


def _to_wire(t, moves_only=False):
  """Casts dtypes the collective kernels lack (bool, ...). Sums always
  take bfloat16 / float16 in float32 (no rounding at every hop of a ring);
  moves_only (gathers, all-to-alls: no arithmetic) send them as they are,
  half the bytes of float32 and bitwise the same result.

  Example:
    >>> wire, back = _to_wire(tf.ones([2], tf.bfloat16), moves_only=True)
    >>> wire.dtype       # bfloat16's bits, in the ops' 16-bit type
    tf.float16
  """
  if t.dtype in _WIRE_DTYPES or (moves_only and t.dtype == tf.float16):
    return t, lambda y: y
  if moves_only and t.dtype == tf.bfloat16:
    # The ops' dtype lists lack bfloat16; its bits travel as float16's (a
    # move does no arithmetic on them).
    return (tf.bitcast(t, tf.float16),
            lambda y: tf.bitcast(y, tf.bfloat16))
  wire = tf.float32 if t.dtype.is_floating else tf.int32
  dtype = t.dtype
  return tf.cast(t, wire), lambda y: tf.cast(y, dtype)


def _rows(table, group_index):
  """(rank -> position, position -> rank) rows of this processor's group,
  or (None, None) when ranks already follow positions."""
  if table.rank_to_pos is None:
    return None, None
  pos_to_rank = np.argsort(table.rank_to_pos, axis=1).astype(np.int32)
  return (tf.gather(tf.constant(table.rank_to_pos), group_index),
          tf.gather(tf.constant(pos_to_rank), group_index))


def _merge_leading(y, axis, n):
  """[n, d0, .., d_axis, ..] -> [d0, .., n * d_axis, ..]."""
  rank = y.shape.rank - 1
  if axis:
    y = tf.transpose(y, list(range(1, axis + 1)) + [0] +
                     list(range(axis + 1, rank + 1)))
  shape = list(y.shape)
  merged = shape[:axis] + [n * shape[axis + 1]] + shape[axis + 2:]
  return tf.reshape(y, merged)


def _with_shape(t, shape):
  """t with its static shape set (the collective ops' shape functions give
  none). Not tf.ensure_shape: that is one more op for the executor to run
  per collective, per device, per step, checking what the op guarantees."""
  t.set_shape(shape)
  return t


def all_reduce(t, reduction, args):
  wire, back = _to_wire(t)
  return back(_with_shape(tf.raw_ops.CollectiveReduceV2(
      input=wire, merge_op=_MERGE[reduction], final_op="Id", **args),
                          wire.shape))


def all_concat(t, concat_axis, table, group_index, args):
  n = table.group_size
  wire, back = _to_wire(t, moves_only=True)
  g = tf.raw_ops.CollectiveGatherV2(input=tf.expand_dims(wire, 0), **args)
  g = tf.reshape(g, [n] + list(t.shape))
  _, pos_to_rank = _rows(table, group_index)
  if pos_to_rank is not None:
    g = tf.gather(g, pos_to_rank)
  return back(_merge_leading(g, concat_axis, n))


def _exchange(x, table, group_index, args):
  """All-to-all of x[n, ...] whose row j is for the peer at position j;
  returns rows indexed by the sender's position."""
  rank_to_pos, pos_to_rank = _rows(table, group_index)
  wire, back = _to_wire(x, moves_only=True)
  if rank_to_pos is not None:
    wire = tf.gather(wire, rank_to_pos)
  y = _with_shape(tf.raw_ops.CollectiveAllToAllV2(input=wire, **args),
                  wire.shape)
  if pos_to_rank is not None:
    y = tf.gather(y, pos_to_rank)
  return back(y)


def all_to_all(t, split_axis, concat_axis, table, group_index, args):
  n = table.group_size
  shape = list(t.shape)
  x = tf.reshape(t, shape[:split_axis] + [n, shape[split_axis] // n] +
                 shape[split_axis + 1:])
  if split_axis:
    rank = x.shape.rank
    x = tf.transpose(x, [split_axis] + [i for i in range(rank)
                                        if i != split_axis])
  y = _exchange(x, table, group_index, args)
  return _merge_leading(y, concat_axis, n)


def permute(t, source_pcoord, my_pcoord, table, group_index, args):
  """Processor at position j gets the slice of position source_pcoord[j]
  (zeros where None)."""
  n = table.group_size
  src = tf.constant([-1 if s is None else s for s in source_pcoord], tf.int32)
  rank = t.shape.rank
  sends = tf.reshape(tf.equal(src, my_pcoord), [n] + [1] * rank)
  x = tf.where(sends, tf.expand_dims(t, 0), tf.zeros_like(tf.expand_dims(t, 0)))
  y = _exchange(x, table, group_index, args)
  mine = tf.gather(src, my_pcoord)
  got = tf.gather(y, tf.maximum(mine, 0))
  return tf.where(mine >= 0, got, tf.zeros_like(got))
