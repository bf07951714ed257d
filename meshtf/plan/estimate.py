"""The collectives of a graph under its layouts, estimated from the layouts
alone -- no tracing, about 20x faster than plan()'s traced program -- for
searching many layouts (meshtf/plan/search.py), which then traces the best
few exactly.

The estimate follows the lowering's rules where they decide what a layout
costs, and leaves out the small rest:

  an input laid out otherwise than its reader's computation layout is
    relaid by the MeshLayout's plan (its steps' collectives);
  a reshape runs the MeshLayout's reshape plan;
  a shift along a split dim exchanges halos (Operation.permutes);
  a dim split in an input but absent from every output is summed over its
    mesh axes: ops whose outputs are partial sums (Operation.sums_partials:
    einsums, sum reductions, gathers, convolutions) leave the sum pending,
    others allreduce at once (Operation.split_reduction: max, min, ...);
  a pending sum is reduced where it is read: linear readers
    (Operation.keeps_pending: negation, scalar multiples, renames, the
    bfloat16 -> float32 casts of gradients a loop sums over its
    iterations, sums of sums over the same axes; an op whose outputs are
    its inputs' values) keep it pending when they are its only reader
    and read it in its own layout;
    a loop's sums over its
    iterations stay pending past the loop (reduced once); a reader that
    splits a summed axis reduce-scatters; any other reader allreduces it
    (once);
  a pending sum nothing reads is reduced as its export would be;
  the pending members of a reduce group (mtf.gradients' results) are
    reduced in fused buckets as the lowering's Bucketer forms them
    (meshtf/lowering/bucketing.py, same cap).

Left out: top_k/sort gathers, conv halos and shifts along a dim split
unevenly or over several axes (permutes), and the gather of ids split
like the table (these are small or rare in the models here);
tests/plan/test_estimate.py measures the gap against traced plans. An op
inside a loop counts its collectives once per iteration.

Example:
  >>> records = estimate_collectives(graph.operations, graph_layout)
  >>> sum(r["bytes_per_device"] * r["count"] for r in records)
"""
import collections

from meshtf.layouts import reasons as reasons_lib
from meshtf.layouts import relayout as relayout_lib
from meshtf.layouts.relayout import CollectiveKind
from meshtf.lowering import bucketing
from meshtf.lowering import lowering as lowering_lib
from meshtf.plan import accounting


class _Recorder(object):
  """Collective records, grouped like Lowering.collective_stats(), each
  occurrence with its Reason (layouts/reasons.py)."""

  def __init__(self, mesh_layout):
    self._mesh_layout = mesh_layout
    self.counts = collections.OrderedDict()
    # (record key, ready, needed): where in the operations' order each
    # collective's input is ready and where its result is first needed.
    self.events = []
    self.span = (0, 0)
    self.times = 1

  def _count(self, key, reason):
    # An op inside a loop runs its collectives once per iteration.
    self.counts.setdefault(key, []).extend([reason] * self.times)
    self.events.extend([(key,) + tuple(self.span)] * self.times)

  def add(self, kind, mesh_axes, elements, itemsize, reason=None):
    group = self._mesh_layout.group_size(mesh_axes)
    if group <= 1 or not elements:
      return
    kind = CollectiveKind(kind)
    key = (kind, tuple(self._mesh_layout.mesh_axis_names(mesh_axes)), group,
           int(elements),
           relayout_lib.collective_bytes(kind, group, elements, itemsize))
    self._count(key, reason)

  def add_plan(self, plan, reason=None):
    for s in plan.steps:
      if s.kind in relayout_lib.COLLECTIVE_STEPS:
        key = (CollectiveKind(s.kind),
               tuple(self._mesh_layout.mesh_axis_names(
                   relayout_lib.step_axes(s))),
               s.group_size, s.elements_per_device, s.bytes_per_device)
        if s.group_size > 1:
          self._count(key, reason)

  def records(self):
    return [dict(kind=k[0], mesh_axes=list(k[1]), group_size=k[2],
                 elements_per_device=k[3], bytes_per_device=k[4],
                 count=len(why), reasons=why)
            for k, why in self.counts.items()]

  def timeline(self):
    """[record dict with count 1, "ready" and "needed" positions], one
    per collective, in the order they were emitted."""
    return [dict(kind=k[0], mesh_axes=list(k[1]), group_size=k[2],
                 elements_per_device=k[3], bytes_per_device=k[4], count=1,
                 ready=ready, needed=needed)
            for k, ready, needed in self.events]


class _Linear(object):
  """op.keeps_pending for op's inputs as the estimate holds them, asked
  once (see the docstring)."""

  def __init__(self, op, pending, layout):
    self._op, self._pending, self._layout = op, pending, layout
    self._answer = None

  def __call__(self):
    if self._answer is None:
      axes = [tuple(self._pending[t]) if t in self._pending else None
              for t in self._op.inputs]
      self._answer = bool(self._op.keeps_pending(axes, self._layout))
    return self._answer


class _Memo(object):
  """What the estimate asks of layouts and shapes alone, answered once per
  distinct question: a layer repeated N times asks the same relayout plans
  and summed axes N times (pure functions of a MeshLayout, shapes and
  layouts, so the records are those of asking each time).
  misses: how many answers were computed (tests count the work)."""

  def __init__(self, base):
    self.base = base
    self.misses = 0
    self._plans = {}
    self._axes = {}
    # The layouts asked about, kept alive: their ids key the answers.
    self._layouts = []

  def relayout_plan(self, layout, old_shape, new_shape, itemsize,
                    old=None, new=None):
    key = (id(layout), old_shape, new_shape, itemsize, old, new)
    plan = self._plans.get(key)
    if plan is None:
      self.misses += 1
      self._layouts.append(layout)
      plan = self._plans[key] = layout.relayout_plan(
          old_shape, new_shape, itemsize, old, new)
    return plan

  def summed_axes(self, layout, op):
    """The mesh axes of the dims split in op's inputs and absent from all
    its outputs, sorted (what its outputs are partial sums over)."""
    key = (id(layout), tuple(t.shape for t in op.inputs),
           tuple(t.shape for t in op.outputs))
    axes = self._axes.get(key)
    if axes is None:
      self.misses += 1
      self._layouts.append(layout)
      out_axes, out_names = set(), set()
      for t in op.outputs:
        for split in layout.dim_splits(t.shape):
          out_names.add(split.name)
          out_axes.update(split.mesh_axes)
      in_axes = {a for t in op.inputs for split in layout.dim_splits(t.shape)
                 if split.name not in out_names for a in split.mesh_axes}
      axes = self._axes[key] = tuple(sorted(in_axes - out_axes))
    return axes


def _shares_rename_relay(t, new, graph_layout, pending, relaid):
  """Whether t, a rename's output, is relaid to `new` by relaying the
  rename's input (Lowering._relay_to: one relayout for both); marks the
  input relaid. False (nothing marked) for partial sums."""
  chain = []
  x = t
  while x not in pending:
    x = lowering_lib.renamed_source(x, graph_layout.tensor_mesh_layout)
    if x is None or x in pending:
      break
    chain.append(x)
    if (x, new) in relaid:
      relaid.add((t, new))
      relaid.update((c, new) for c in chain)
      return True
  if not chain or t in pending:
    return False
  relaid.update((c, new) for c in chain)
  return False


def _bucket_plan(operations, graph_layout, bucket_bytes):
  """(producer op -> [(group, member)], op -> [groups it completes],
  member -> readers) of the graph's reduce groups, as the Bucketer sees
  them."""
  by_producer = collections.defaultdict(list)
  last = collections.defaultdict(list)
  readers = collections.defaultdict(list)
  if not bucket_bytes or not operations:
    return by_producer, last, readers
  position = {op: i for i, op in enumerate(operations)}
  for g, tensors in enumerate(operations[0].graph.reduce_groups):
    top = [t for t in tensors if t.operation in position]
    if len(top) < 2:
      continue
    for t in top:
      by_producer[t.operation].append((g, t))
    last[max(top, key=lambda t: position[t.operation]).operation].append(g)
  members = {t for pairs in by_producer.values() for _, t in pairs}
  for op in lowering_lib.all_operations(operations):
    for t in dict.fromkeys(op.inputs):
      if t in members:
        readers[t].append(op)
  return by_producer, last, readers


def estimate_collectives(operations, graph_layout, outputs=None,
                         bucket_bytes=None, timeline=None, memo=None):
  """Estimated collective records of operations (a graph's, in order)
  under graph_layout (MeshLayout.assign), in Lowering.collective_stats()'s
  form. outputs: the tensors the step exports (default: those nothing
  reads, as plan() traces it). bucket_bytes: the Lowering's cap of fused
  gradient buckets (None: its default, 0: off). timeline: a list that
  gets one record per collective with "ready" (the position, in
  lowering.all_operations(operations), of the op after which its input is
  ready) and "needed" (the op that first reads its result;
  len(all_operations) for the step's exports) -- plan/timeline.py's
  input. memo: a _Memo(graph_layout.base) to answer from (a test reads
  its misses)."""
  operations = list(operations)
  base = graph_layout.base
  memo = memo if memo is not None else _Memo(base)
  rec = _Recorder(base)
  # (Inside loops too: a linear reader in a loop body keeps a sum pending.)
  readers = collections.Counter(
      t for op in lowering_lib.all_operations(operations) for t in op.inputs)
  pending = {}   # tensor -> sorted mesh axes its partial sums still need
  reduced = set()
  relaid = set()   # (tensor, layout): the lowering relays once per layout
  cap = bucketing.check_bucket_bytes(bucket_bytes)
  by_producer, completes, member_readers = _bucket_plan(
      operations, graph_layout, cap)
  top_level = set(operations) if by_producer else ()
  buckets = collections.OrderedDict()   # key -> [members, bytes]
  everything = list(lowering_lib.all_operations(operations))
  position = {op: i for i, op in enumerate(everything)}
  first_read = {}
  for op in everything:
    for t in op.inputs:
      first_read.setdefault(t, position[op])

  def span(t, reader):
    """(ready, needed) of a collective on t read by `reader` (None: the
    step's end)."""
    ready = position.get(t.operation, 0)
    return (ready, position[reader] if reader is not None
            else len(everything))

  def issue(members):
    members = [t for t in members if t not in reduced]
    if members:
      rec.span = (rec.span[0], min(first_read.get(t, len(everything))
                                   for t in members))
    if len(members) == 1:
      reduce_now(members[0])
    elif members:
      rec.add(CollectiveKind.ALLREDUCE_SUM, pending[members[0]], sum(
          graph_layout.tensor_mesh_layout(t).slice_size(t.shape)
          for t in members), members[0].dtype.size,
              reasons_lib.bucket(graph_layout, members))
      reduced.update(members)

  def offer(g, t):
    own = graph_layout.tensor_layout(t)
    if (t not in pending or t in reduced or not member_readers.get(t) or
        any(t in b[0] for b in buckets.values()) or any(
            graph_layout.op_layout(r).tensor_layout(t.shape) != own
            for r in member_readers[t])):
      return
    nbytes = graph_layout.tensor_mesh_layout(t).slice_size(
        t.shape) * t.dtype.size
    key = (g, tuple(pending[t]), t.dtype)
    if key in buckets and buckets[key][1] + nbytes > cap:
      issue(buckets.pop(key)[0])
    bucket = buckets.setdefault(key, [[], 0])
    bucket[0].append(t)
    bucket[1] += nbytes
    if bucket[1] >= cap:
      issue(buckets.pop(key)[0])

  def after(op):
    if op not in top_level:
      return
    rec.span = (position[op], position[op] + 1)
    for g, t in by_producer.get(op, ()):
      offer(g, t)
    for g in completes.get(op, ()):
      for key in [k for k in buckets if k[0] == g]:
        issue(buckets.pop(key)[0])

  def reduce_now(t, reader=None, where=None):
    if t in pending and t not in reduced:
      layout = graph_layout.tensor_mesh_layout(t)
      rec.add(CollectiveKind.ALLREDUCE_SUM, pending[t],
              layout.slice_size(t.shape), t.dtype.size,
              reasons_lib.reduce(graph_layout, reader, t, where=where))
      reduced.add(t)

  times = collections.Counter()
  for op, n in accounting.runs_per_step(operations):
    times[op] += n
  # A loop's sums over its iterations (accumulators, weight gradients) stay
  # pending past it when their body tensor is pending: reduced once.
  loop_ends = collections.defaultdict(list)
  for op in everything:
    if op.inner_operations and op.summed_outputs:
      inner = list(lowering_lib.all_operations(op.inner_operations))
      loop_ends[position[inner[-1]]].append(op)
  for op in everything:
    rec.times = times[op] or 1
    _estimate_op(op, graph_layout, memo, rec, readers, pending, reduced,
                 relaid, reduce_now, span)
    rec.times = 1
    after(op)
    for loop in loop_ends.get(position[op], ()):
      for out, inner in loop.summed_outputs:
        if inner in pending and inner not in reduced:
          pending[out] = pending[inner]
          reduced.add(inner)
  for members, _ in list(buckets.values()):
    rec.span = (len(everything) - 1, len(everything))
    issue(members)
  if outputs is None:
    outputs = [t for op in operations for t in op.outputs if not readers[t]]
  for t in outputs:
    rec.span = span(t, None)
    reduce_now(t, where="(export)")
  if timeline is not None:
    timeline.extend(rec.timeline())
  return rec.records()


def _estimate_op(op, graph_layout, memo, rec, readers, pending, reduced,
                 relaid, reduce_now, span):
  """The collectives lowering op emits (estimate_collectives' rules)."""
  layout = graph_layout.op_layout(op)
  linear = _Linear(op, pending, layout)
  keeps = set()
  for t in dict.fromkeys(op.inputs):
    rec.span = span(t, op)
    own = graph_layout.tensor_mesh_layout(t)
    old = own.tensor_layout(t.shape)
    new = layout.tensor_layout(t.shape)
    plan = None
    if old != new:
      if (t, new) in relaid or _shares_rename_relay(t, new, graph_layout,
                                                    pending, relaid):
        continue   # relaid (or reduce-scattered) once for every reader
      relaid.add((t, new))
      plan = memo.relayout_plan(memo.base, t.shape, t.shape, t.dtype.size,
                                old, new)
    if t in pending and t not in reduced:
      if plan is not None:
        fused, rest = relayout_lib.fuse_reduce_scatter(
            plan, pending[t], t.dtype.size)
        if len(rest) < len(pending[t]):
          why = reasons_lib.reduce(graph_layout, op, t, scatter=True)
          rec.add_plan(fused, why)
          rec.add(CollectiveKind.ALLREDUCE_SUM, rest,
                  layout.slice_size(t.shape), t.dtype.size, why)
          continue
      # A relayout reduces it first (the lowering's _relay_to).
      if plan is None and readers[t] == 1 and linear():
        keeps.add(t)
        continue
      reduce_now(t, op)
    if plan is not None:
      rec.add_plan(plan, reasons_lib.relayout(graph_layout, op, t))
  if op.inner_operations:
    return   # a loop: its body's ops are estimated one by one
  if op.output_aliases is not None:
    # Its outputs are some of its inputs: pending or not where it passes
    # pending sums through (a custom gradient's outputs are its
    # function's; a recomputation's copy of a kept op gives the kept
    # value), else read reduced (depend). It computes and moves nothing.
    if linear():
      for k, i in op.output_aliases.items():
        source = op.inputs[i]
        if source in pending and source not in reduced:
          pending[op.outputs[k]] = pending[source]
    return
  halo = op.permutes(layout)
  if halo is not None:
    x = op.inputs[0]
    for mesh_axis, elements in halo:
      rec.add(CollectiveKind.PERMUTE, [mesh_axis], elements, x.dtype.size,
              reasons_lib.computes(graph_layout, op))
    return
  if keeps:
    for out in op.outputs:
      pending[out] = pending[next(iter(keeps))]
    return
  if op.reshapes:
    x, out = op.inputs[0], op.outputs[0]
    rec.span = span(x, op)
    rec.add_plan(memo.relayout_plan(layout, x.shape, out.shape,
                                    x.dtype.size),
                 reasons_lib.computes(graph_layout, op,
                                      reasons_lib.Cause.RESHAPE))
    return
  if not op.inputs or not op.outputs:
    return
  axes = memo.summed_axes(layout, op)
  if not axes:
    return
  axes = list(axes)
  if op.sums_partials:
    for out in op.outputs:
      pending[out] = axes
  else:
    kind = CollectiveKind.allreduce(op.split_reduction)
    here = span(op.inputs[0], op)[1]
    rec.span = (here, here + 1)
    for out in op.outputs:
      rec.add(kind, axes, layout.slice_size(out.shape), out.dtype.size,
              reasons_lib.computes(graph_layout, op))
