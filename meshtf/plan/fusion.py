"""What an op costs on a device: one kernel per op (TensorFlow's executor)
or XLA's fused kernels, each at its roofline.

Where XLA compiles the program (hardware compiler "xla": TPU; GPUs with
jit_compile), chains of elementwise ops are fused: a fused kernel reads
the tensors that enter it and writes the tensors that leave it, once each;
what stays inside costs no memory traffic. Which ops fuse, as XLA's loop
and input fusion do it (stated assumptions; each op declares its kind,
Operation.cost_kind, meshtf/op_kinds.py):

  fusible     elementwise, broadcast, cast, scalar ops, one-hots, ranges,
              fills, random numbers, reshapes, slices / pads / concats,
              gathers, annotations, variable assignments
  reducing    sum/max/... reductions, cumsums, one-operand einsums: fuse
              with their producers; their output is written and read back
              (XLA does not fuse a reduction's consumers into it)
  kernels     einsums, convolutions, top_k, sort, scatter: one kernel each
              reading its operands and writing its output
  free        variables, imports, constants (their readers pay the reads)

Duplication (XLA's InstructionFusion::ComputeGloballyUnfusible, in
xla/service/instruction_fusion.cc: a producer that is "effectively not
more than unary" is fused into every consumer, recomputed in each, when
all of them can fuse it; seen in TF 2.21's CPU HLO after optimizations of
einsum -> + mask -> softmax, whose exp kernel reads the einsum's output
and the mask again rather than the masked logits): a fused kernel's
output that leaves it is not written when it comes from a chain of
elementwise ops inside the kernel, each with one operand of its size
(the rest smaller: broadcasts, scalars), starting from a tensor made
outside the kernel, and every reader outside is fusible or reducing
(no relayout between); those readers read the chain's inputs instead.
Producers of two or more full-size operands are written once.

A tensor that a collective relays between its producer and a reader is
written by the producer's kernel and read by the reader's. Fusions never
form a cycle: each op gets a stage, the most kernels (or relays) on a path
from the graph's inputs to it, and ops fuse only within a stage.

An einsum's time is max(flops / peak, bytes / memory bandwidth); on a
matrix unit of tile T (TPU MXU: 128x128) its contracted and output sizes
are padded to multiples of T on the operand that stays in the unit (the
cheaper orientation). Not modelled: fusion into einsums (XLA's CPU
backend calls GEMMs as black boxes, cpu_instruction_fusion.cc, and the
HLO here shows every dot alone; TPU's convolution / output fusion has no
public rule to count from), layout copies (transposes) XLA inserts,
kernel launch and per-fusion overheads on TPU. Dropout's mask: XLA on
CPU writes the random bits once (u32, 4 bytes an element, as the float32
mask here costs) and fuses the compare and convert into each reader, so
the float32 mask priced here moves the same bytes.

Example:
  >>> costs = op_seconds(graph.operations, graph_layout, hw)
  >>> sum(costs.values())   # the step's compute, seconds per device
"""
import collections

from meshtf.lowering import lowering as lowering_lib
from meshtf.op_kinds import CostKind
from meshtf.plan import accounting
from meshtf.plan.hardware import Compiler

_FUSES = (CostKind.FUSIBLE, CostKind.REDUCING)


def _roofline(flops, nbytes, hw):
  return max(flops / hw.peak_flops, nbytes / hw.memory_bandwidth)


def op_seconds(operations, graph_layout, hw, costs=None, found=None):
  """{op: seconds} of every operation (all_operations order) on hw: one
  kernel per op for compiler "tf" (+ hw.kernel_overhead each), fused
  kernels for "xla", a fused kernel's time spread over its ops in
  proportion to their unfused bytes. costs: {op: accounting.OpCost} when
  already counted; found: union_find(operations, graph_layout) when
  already found (plan() finds the fusions once for the memory and the
  time)."""
  ops = list(lowering_lib.all_operations(list(operations)))
  if costs is None:
    costs = {op: accounting.op_cost(op, graph_layout.op_layout(op),
                                    graph_layout) for op in ops}
  # A loop body's op runs once per iteration: its kernel's bytes and
  # padded flops count that many times (costs' flops already do).
  times = {op: n for op, n in accounting.runs_per_step(list(operations))}
  if hw.compiler is not Compiler.XLA:
    # One launch per run; a loop's sums add one kernel per iteration each.
    seconds = {op: _roofline(c.flops, c.bytes, hw) + (
        hw.kernel_overhead * times.get(op, 1)
        if op.cost_kind is not CostKind.FREE else 0.0) for op, c in costs.items()}
    for loop, sums in _loop_sums(ops, graph_layout, times).items():
      for total in sums:
        seconds[loop] = seconds.get(loop, 0.0) + _roofline(
            total.elements, total.inner_bytes + 2 * total.acc_bytes,
            hw) + hw.kernel_overhead * total.runs
    return seconds
  return _fused_seconds(ops, graph_layout, hw, costs, times, found=found)


_LoopSum = collections.namedtuple(
    "_LoopSum", ["acc", "inner", "runs", "elements", "inner_bytes",
                 "acc_bytes"])


def _loop_sums(ops, graph_layout, times):
  """{loop op: [_LoopSum]}: the sums a loop adds its body's tensors to in
  every iteration (a pipeline's weight gradients in float32, its finished
  microbatches) -- tf.add ops the lowering makes, not meshtf ops: each run
  reads the body tensor (inner_bytes a step) and the accumulator and
  writes the accumulator (acc_bytes a step each way)."""
  out = {}
  for op in ops:
    summed = op.summed_outputs
    if not summed or not op.inner_operations:
      continue
    runs = times.get(op, 1) * accounting.loop_trips(op)
    layout = graph_layout.op_layout(op)
    out[op] = [_LoopSum(
        acc, inner, runs, layout.slice_size(acc.shape) * runs,
        graph_layout.op_layout(inner.operation).slice_size(inner.shape) *
        inner.dtype.size * runs,
        layout.slice_size(acc.shape) * acc.dtype.size * runs)
               for acc, inner in summed]
  return out


class _Fusions(object):
  """Union-find of the ops that fuse (see the module docstring)."""

  def __init__(self, ops, graph_layout):
    self.index = {op: i for i, op in enumerate(ops)}
    self.parent = list(range(len(ops)))
    self.kinds = [op.cost_kind for op in ops]
    self.graph_layout = graph_layout
    stage_out = [0] * len(ops)
    for i, op in enumerate(ops):
      stage = 0
      producers = []
      for t in op.inputs:
        p = self.index.get(t.operation)
        if p is None:
          continue
        relaid = self.relaid(t, op)
        stage = max(stage, stage_out[p] + (1 if relaid else 0))
        producers.append((p, relaid))
      kind = self.kinds[i]
      stage_out[i] = stage + (0 if kind is CostKind.FUSIBLE else 1)
      if kind in _FUSES:
        for p, relaid in producers:
          if (not relaid and self.kinds[p] is CostKind.FUSIBLE and
              stage_out[p] == stage):
            self.union(p, i)

  def relaid(self, t, reader):
    """Whether a relayout runs between t's producer and reader."""
    gl = self.graph_layout
    made, read = gl.tensor_mesh_layout(t), gl.op_layout(reader)
    # (Most readers lower under their producer's layout object; both
    # MeshLayouts cache their tensor layouts by shape.)
    return made is not read and (made.tensor_layout(t.shape) !=
                                 read.tensor_layout(t.shape))

  def find(self, i):
    while self.parent[i] != i:
      self.parent[i] = self.parent[self.parent[i]]
      i = self.parent[i]
    return i

  def union(self, a, b):
    ra, rb = self.find(a), self.find(b)
    if ra != rb:
      self.parent[max(ra, rb)] = min(ra, rb)


def union_find(operations, graph_layout):
  """Which of operations' ops (all_operations order) fuse: the union-find
  fusions(), op_seconds() and kernels() read, found once where a plan asks
  all three."""
  return _Fusions(list(lowering_lib.all_operations(list(operations))),
                  graph_layout)


def fusions(operations, graph_layout, found=None):
  """[[op, ...]] the fused kernels XLA would form (module docstring):
  each list an op group, in graph order; kernels and free ops alone.
  found: union_find(operations, graph_layout) when already found."""
  ops = list(lowering_lib.all_operations(list(operations)))
  f = found if found is not None else _Fusions(ops, graph_layout)
  groups = collections.OrderedDict()
  for i, op in enumerate(ops):
    groups.setdefault(f.find(i), []).append(op)
  return list(groups.values())


Kernel = collections.namedtuple(
    "Kernel", ["ops", "kind", "flops", "bytes", "reads", "writes"])
Kernel.__doc__ = """One kernel of a step: its ops; kind "einsum" (a
two-operand einsum alone), "fused" (elementwise / reduction ops fused) or
"free" (a variable, import or constant: nothing moved); flops (an
einsum's padded to the matrix unit); bytes it moves; reads / writes:
{tensor: bytes} (a loop body's kernel counted once per iteration)."""


def kernels(operations, graph_layout, hw, costs=None):
  """[Kernel] of the step on XLA hardware hw (module docstring): what each
  kernel reads and writes, in bytes -- the plan's memory traffic, which
  bench/fusion_check.py compares with XLA's own kernels of the same
  program.

  Example:
    >>> ks = kernels(graph.operations, graph_layout, hardware.get("tpuv3"))
    >>> sum(k.bytes for k in ks if k.kind == "fused")   # elementwise traffic
  """
  ops = list(lowering_lib.all_operations(list(operations)))
  if costs is None:
    costs = {op: accounting.op_cost(op, graph_layout.op_layout(op),
                                    graph_layout) for op in ops}
  times = {op: n for op, n in accounting.runs_per_step(list(operations))}
  return _kernels(ops, graph_layout, hw, costs, times)


def _kernels(ops, graph_layout, hw, costs, times=None, recompute=True,
             found=None):
  times = times or {}
  f = found if found is not None else _Fusions(ops, graph_layout)
  readers = collections.defaultdict(list)
  for op in ops:
    for t in dict.fromkeys(op.inputs):
      readers[t].append(op)
  members = collections.defaultdict(list)
  for i in range(len(ops)):
    members[f.find(i)].append(i)
  recomputed = (_recomputed_tails(ops, f, readers, graph_layout)
                if recompute else {})
  out = []
  for root, group in members.items():
    group_ops = [ops[i] for i in group]
    kind = f.kinds[root]
    if len(group) == 1 and kind is CostKind.FREE:
      out.append(Kernel(group_ops, "free", 0, 0, {}, {}))
      continue
    if len(group) == 1 and kind is CostKind.KERNEL:
      op = group_ops[0]
      c = costs[op]
      flops = c.flops
      if op.matrix_unit and hw.matmul_tile:
        flops = op.flops(graph_layout.op_layout(op),
                         hw.matmul_tile) * times.get(op, 1)
      layout = graph_layout.op_layout(op)
      n = times.get(op, 1)
      reads = {t: layout.slice_size(t.shape) * t.dtype.size * n
               for t in op.inputs}
      writes = {t: layout.slice_size(t.shape) * t.dtype.size * n
                for t in op.outputs}
      out.append(Kernel(group_ops, "einsum" if op.matrix_unit else "kernel",
                        flops, c.bytes, reads, writes))
      continue
    inside = set(group_ops)
    reads, writes = {}, {}
    for op in group_ops:
      layout = graph_layout.op_layout(op)
      n = times.get(op, 1)
      for t in op.inputs:
        if (t.operation in inside and not f.relaid(t, op)) or t in reads:
          continue
        # A duplicated producer: this kernel reads what it is made of.
        for u in recomputed.get(t, (t,)):
          if u not in reads:
            reads[u] = layout.slice_size(u.shape) * u.dtype.size * n
      for t in op.outputs:
        if t in recomputed:
          continue   # each reader recomputes it: never written
        outside = [r for r in readers.get(t, ())
                   if r not in inside or f.relaid(t, r)]
        if outside or not readers.get(t):
          writes[t] = layout.slice_size(t.shape) * t.dtype.size * n
    if not writes and any(t in recomputed for op in group_ops
                          for t in op.outputs):
      reads = {}   # every reader recomputes it: the kernel is gone
    out.append(Kernel(group_ops, "fused",
                      sum(costs[op].flops for op in group_ops),
                      sum(reads.values()) + sum(writes.values()),
                      reads, writes))
  return _with_loop_sums(out, ops, graph_layout, times, readers)


def _with_loop_sums(kernels, ops, graph_layout, times, readers):
  """kernels with each loop's per-iteration sums (_loop_sums): XLA fuses
  the add into the fused kernel that makes the body tensor (a gradient's
  widening cast), which then reads and writes the accumulator instead of
  writing the tensor; after a kernel of its own (an einsum), the add is
  a kernel reading both and writing the accumulator."""
  made_by = {}
  for i, k in enumerate(kernels):
    if k.kind == "fused":
      for t in k.writes:
        made_by[t] = i
  extra = []
  for loop, sums in _loop_sums(ops, graph_layout, times).items():
    for acc, inner, _, elements, inner_bytes, acc_bytes in sums:
      i = made_by.get(inner)
      if i is not None:
        k = kernels[i]
        reads, writes = dict(k.reads), dict(k.writes)
        if not readers.get(inner):
          del writes[inner]   # summed in the kernel, never written
        reads[acc] = reads.get(acc, 0) + acc_bytes
        writes[acc] = writes.get(acc, 0) + acc_bytes
        kernels[i] = k._replace(
            flops=k.flops + elements, reads=reads, writes=writes,
            bytes=sum(reads.values()) + sum(writes.values()))
      else:
        extra.append(Kernel([loop], "fused", elements,
                            inner_bytes + 2 * acc_bytes,
                            {inner: inner_bytes, acc: acc_bytes},
                            {acc: acc_bytes}))
  return kernels + extra


def _fused_seconds(ops, graph_layout, hw, costs, times=None,
                   recompute=True, found=None):
  seconds = collections.Counter()
  for k in _kernels(ops, graph_layout, hw, costs, times, recompute, found):
    if k.kind == "free":
      seconds[k.ops[0]] += 0.0
      continue
    total = _roofline(k.flops, k.bytes, hw)
    if len(k.ops) == 1:
      seconds[k.ops[0]] += total   # (a loop: its own kernel and its sums)
      continue
    weights = [costs[op].bytes + 1 for op in k.ops]
    norm = float(sum(weights))
    for op, w in zip(k.ops, weights):
      seconds[op] += total * w / norm
  return dict(seconds)


def _recomputed_tails(ops, f, readers, graph_layout):
  """{tensor: (tensors its readers read instead)}: XLA's duplication of
  effectively unary producers (module docstring). A fused kernel's output
  t that leaves it is recomputed by each reader instead of written when
  t comes from a chain of elementwise ops inside the kernel, each with at
  most one operand of t's size (the others smaller: broadcasts, scalars),
  the chain starting at a tensor from outside the kernel, and every reader
  outside is itself fusible or reducing, laid out alike (no relayout)."""
  out = {}
  for op in ops:
    if not op.elementwise:
      continue
    group = f.find(f.index[op])
    for t in op.outputs:
      outside = [r for r in readers.get(t, ())
                 if f.find(f.index[r]) != group]
      if not outside or any(
          f.kinds[f.index[r]] not in _FUSES or
          f.relaid(t, r) for r in outside):
        continue
      sources = _unary_chain(t, group, f, graph_layout)
      if sources is not None:
        out[t] = sources
  return out


def _unary_chain(t, group, f, graph_layout):
  """The tensors from outside `group` that t is computed from by a chain
  of effectively unary elementwise ops in `group`, or None."""
  sources = []
  reader = None
  while True:
    op = t.operation
    i = f.index.get(op)
    if (i is None or f.find(i) != group or
        (reader is not None and f.relaid(t, reader))):
      sources.append(t)
      return tuple(dict.fromkeys(sources))
    if not op.elementwise:
      return None
    layout = graph_layout.op_layout(op)
    size = layout.slice_size(t.shape)
    full = [x for x in op.inputs if layout.slice_size(x.shape) >= size]
    if len(full) != 1:
      return None
    for x in op.inputs:
      if x is not full[0]:
        j = f.index.get(x.operation)
        if j is not None and f.find(j) == group:
          return None   # a small operand made inside: not duplicated
        sources.append(x)
    t, reader = full[0], op
