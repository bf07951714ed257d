"""Why a collective exists, from the program itself (pure Python).

Every collective the lowering emits (Lowering.collective_stats) and the
plan estimates (plan/estimate.py) carries a Reason: the operation whose
lowering emitted it, the tensor it moved, and the two layouts that met --
the layout the tensor was held in and the one it was wanted in -- each
dim with the Origin of its axes (meshtf/layouts/completion/: the
annotation, variable layout or rule, and the operations it came through):

  relayout        an input held in one layout, read by an operation that
                  computes in another
  reduce          partial sums (an einsum or reduction over a split dim)
                  allreduced where they are read whole
  reduce_scatter  partial sums whose reader splits an output dim over the
                  summed axes: reduced and split at once
  bucket          the partial sums of several gradients, reduced together
  reshape         an operation's own reshape moving a split to another dim
  computes        an operation's own collective (a max over a split dim, a
                  lookup in a split table, a halo)
  export          a pending sum exported from the program

explain(records) ranks them by the bytes they send, grouping the
collectives that repeat (one per layer) by `pattern` (the reason without
operation names).

Example:
  >>> print(explain(lowering.collective_stats(), top=3))
  1. allconcat over y (32 processors): 64 x 260.0 MB = 16.64 GB ...
"""
import collections
import enum


class Cause(enum.StrEnum):
  """Why a collective exists (the table above): a Reason's cause, and
  the cause the lowering records its collectives under."""
  RELAYOUT = "relayout"
  REDUCE = "reduce"
  REDUCE_SCATTER = "reduce_scatter"
  BUCKET = "bucket"
  RESHAPE = "reshape"
  COMPUTES = "computes"
  EXPORT = "export"


Reason = collections.namedtuple(
    "Reason", ["cause", "op", "tensor", "held", "wanted", "pattern"])

def _pattern(cause, tensor, graph_layout, held_op, wanted_op, held=None,
             wanted=None):
  """The reason without operation names (each origin as its kind), so that
  the same collective of every layer groups together."""
  def brief(op):
    return graph_layout.describe(tensor, op, brief=True)
  return "%s of %s: %s -> %s" % (
      cause, tensor.shape if tensor is not None else "-",
      held if held is not None else brief(held_op),
      wanted if wanted is not None else brief(wanted_op))


def layout_text(graph_layout, tensor, op=None):
  """tensor's layout as `op` computes with it (default: as its producer
  makes it), each dim with its origin."""
  return graph_layout.describe(tensor, op)


def relayout(graph_layout, op, tensor):
  """An input read in another layout than it is held in."""
  held = layout_text(graph_layout, tensor)
  wanted = layout_text(graph_layout, tensor, op)
  return Reason(Cause.RELAYOUT, op.name, tensor.name, held, wanted,
                _pattern(Cause.RELAYOUT, tensor, graph_layout, None, op))


def summed(graph_layout, tensor, brief=False, depth=0):
  """'partial sums over y: einsum_5 sums heads:y (annotation ...)' for a
  tensor whose producer sums over split dims (brief: without operation
  names)."""
  op = tensor.operation
  layout = graph_layout.op_layout(op)
  origins = graph_layout.origins(op)
  kept = {n for t in op.outputs for n in t.shape.dimension_names}
  parts, axes = [], []
  for t in op.inputs:
    for s in layout.dim_splits(t.shape):
      if s.name in kept or not s.mesh_axes or s.name in [p[0] for p in parts]:
        continue
      names = layout.mesh_axis_names(s.mesh_axes)
      axes.extend(a for a in names if a not in axes)
      origin = origins.get(s.name)
      parts.append((s.name, "%s:%s (%s)" % (
          s.name, "+".join(names), "?" if origin is None else
          origin.root.kind if brief else origin.describe())))
  who = type(op).__name__ if brief else op.name
  if not parts:
    # A linear operation of partial sums (the sum of a gradient's parts, a
    # rename): they came from its first input.
    if op.inputs and op.inputs[0].operation is not op and depth < 8:
      return summed(graph_layout, op.inputs[0], brief, depth + 1)
    return "partial sums of %s" % who
  return "partial sums over %s: %s sums %s" % (
      "+".join(axes), who, ", ".join(p[1] for p in parts))


def reduce(graph_layout, op, tensor, scatter=False, where=None):
  """Partial sums of tensor reduced where op reads them (op None: `where`,
  e.g. "(export)")."""
  cause = Cause.REDUCE_SCATTER if scatter else Cause.REDUCE
  held = summed(graph_layout, tensor)
  wanted = (layout_text(graph_layout, tensor, op) if op is not None
            else "whole")
  return Reason(cause, op.name if op is not None else where or "(reduced)",
                tensor.name, held, wanted,
                _pattern(cause, tensor, graph_layout, None, op,
                         held=summed(graph_layout, tensor, brief=True),
                         wanted=None if op is not None else wanted))


def bucket(graph_layout, tensors):
  """Several gradients' partial sums reduced in one fused allreduce."""
  first = tensors[0]
  held = "%d gradients' %s" % (len(tensors), summed(graph_layout, first))
  wanted = "reduced together (one collective: mtf.reduce_together)"
  return Reason(Cause.BUCKET, first.operation.name, ", ".join(
      t.name for t in tensors[:3]) + (", ..." if len(tensors) > 3 else ""),
                held, wanted, _pattern(
                    Cause.BUCKET, None, graph_layout, None, None,
                    held=summed(graph_layout, first, brief=True),
                    wanted=wanted))


def computes(graph_layout, op, cause=Cause.COMPUTES):
  """An operation's own collective (its lowering's): its layout."""
  t = op.outputs[0] if op.outputs else (op.inputs[0] if op.inputs else None)
  if t is None:
    return Reason(cause, op.name, "-", "-", "-", cause)
  held = "; ".join(layout_text(graph_layout, x, op)
                   for x in list(dict.fromkeys(op.inputs))[:2]) or "-"
  wanted = layout_text(graph_layout, t, op)
  brief = "; ".join(graph_layout.describe(x, op, brief=True)
                    for x in list(dict.fromkeys(op.inputs))[:2]) or "-"
  return Reason(cause, op.name, t.name, held, wanted,
                "%s %s: %s" % (cause, type(op).__name__, _pattern(
                    cause, t, graph_layout, None, op, held=brief)))


def explain(records, top=10):
  """The collectives that send the most bytes, with their reasons: the
  records (collective_stats() dicts with "reasons") grouped by kind, mesh
  axes, bytes and reason pattern, ranked by total bytes. One line per
  group and one example.

  Example:
    >>> print(explain(report.collectives, top=5))
  """
  groups = collections.OrderedDict()
  total = 0
  for r in records:
    reasons = list(r.get("reasons") or ())
    reasons += [None] * (r["count"] - len(reasons))
    for reason in reasons:
      key = (r["kind"], tuple(r["mesh_axes"]), r["group_size"],
             r["bytes_per_device"], reason.pattern if reason else "?")
      g = groups.setdefault(key, [0, reason])
      g[0] += 1
      total += r["bytes_per_device"]
  ranked = sorted(groups.items(), key=lambda kv: -kv[0][3] * kv[1][0])
  lines = ["collectives by bytes sent per device: %d groups, %.4g GB in all"
           % (len(groups), total / 1e9)]
  for i, ((kind, axes, group, nbytes, _), (count, reason)) in enumerate(
      ranked[:top]):
    lines.append("%2d. %s over %s (%d processors): %d x %s = %s (%.1f%%)" % (
        i + 1, kind, "+".join(axes), group, count, _mb(nbytes),
        _mb(nbytes * count), 100.0 * nbytes * count / total if total else 0))
    if reason is None:
      continue
    lines.append("    %s at %s, %s" % (reason.cause, reason.op,
                                       reason.tensor))
    lines.append("      held:   %s" % reason.held)
    lines.append("      wanted: %s" % reason.wanted)
  return "\n".join(lines)


def _mb(b):
  return "%.4g GB" % (b / 1e9) if b >= 1e9 else "%.4g MB" % (b / 1e6)
