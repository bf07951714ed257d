"""Per-device accounting of a meshtf graph under its layouts, without
running anything: flops and bytes touched per operation (by op family), the
parameters and optimizer state each device stores, and the activations
alive through the forward and backward passes (liveness over the graph's
operation order).

Counting rules (per device, on the slices the op's computation layout
gives it; padding of uneven splits included, since it is computed; each
op's Operation.flops):
  einsum        k operands: k x product of every dim's local size (a
                matmul: 2 M N K); one operand: a reduction
  conv          2 x local output x filter window x local input channels
  reduction     local input elements
  other ops     local output elements (elementwise, gather, top_k, ...)
  bytes         local inputs + local outputs (the roofline's memory side)

The liveness is sequential: the meshtf ops one at a time in graph order,
each meshtf tensor counted once (what XLA's scheduler works from).
plan/program_memory.py simulates the traced per-device program as
TensorFlow's executor runs it (its order, every TF op's buffers, in-place
reuse, collective scratch, folded constants); the report's peak is that
one where TF's executor runs the program.

Example:
  >>> acc = account(graph.operations, graph_layout, backward_start=120)
  >>> acc.flops_by_family["einsum"], acc.memory["peak"]
"""
import collections

from meshtf import shapes
from meshtf.lowering import lowering as lowering_lib
from meshtf.ops import annotations

OpCost = collections.namedtuple("OpCost", ["op", "family", "flops", "bytes"])


def _local_elements(layout, tensor):
  return layout.slice_size(tensor.shape)


def op_cost(op, layout, graph_layout=None):
  """OpCost of one operation under its computation layout (a MeshLayout).
  With graph_layout, an op whose outputs are views of its inputs
  (_aliased_input: depend, a custom gradient, a relayout that moves
  nothing) costs nothing."""
  family = op.family
  if graph_layout is not None and op.outputs and all(
      _aliased_input(op, k, graph_layout) is not None
      for k in range(len(op.outputs))):
    return OpCost(op, family, 0, 0)
  touched = sum(_local_elements(layout, t) * t.dtype.size
                for t in list(op.inputs) + op.outputs)
  return OpCost(op, family, int(op.flops(layout)), int(touched))


class Accounting(object):
  """Costs of a graph's operations and its per-device memory.

  Attributes:
    costs: [OpCost] in graph order.
    flops_by_family / bytes_by_family: {family: per-device totals}.
    memory: {"parameters", "optimizer_state", "activations_saved",
      "activations_peak", "peak", "padding"} in bytes per device.
  """

  def __init__(self, costs, memory):
    self.costs = costs
    self.memory = memory
    self.flops_by_family = collections.Counter()
    self.bytes_by_family = collections.Counter()
    for c in costs:
      self.flops_by_family[c.family] += c.flops
      self.bytes_by_family[c.family] += c.bytes

  @property
  def flops(self):
    return sum(self.flops_by_family.values())

  @property
  def bytes(self):
    return sum(self.bytes_by_family.values())


def account(operations, graph_layout, backward_start=None, fused=None):
  """The Accounting of `operations` (a graph's, in order) under
  graph_layout (MeshLayout.assign). backward_start: the index of the first
  backward operation (activations produced before it and read after it are
  the ones kept for the backward pass); None: no backward pass. fused:
  {op: fused kernel id} where XLA compiles the program (fused_kernels):
  a tensor made and read only inside one fused kernel takes no memory."""
  operations = list(operations)
  costs = []
  for op, times in runs_per_step(operations):
    c = op_cost(op, graph_layout.op_layout(op), graph_layout)
    costs.append(c._replace(flops=c.flops * times, bytes=c.bytes * times))
  return Accounting(costs, _memory(operations, graph_layout, backward_start,
                                   fused))


def fused_kernels(groups):
  """{op: fused kernel id} of the kernels XLA forms (plan/fusion.py's
  fusions(): lists of ops), those of two ops or more: the elementwise
  chains whose intermediates stay in registers.

  Example:
    >>> fused = fused_kernels(fusion.fusions(ops, graph_layout))
    >>> acc = account(ops, graph_layout, start, fused=fused)
  """
  return {op: k for k, group in enumerate(groups) if len(group) > 1
          for op in group}


def loop_trips(op):
  """How many times a loop op runs its inner operations per step: its
  trip_count (a while loop with maximum_iterations, a pipeline's; its
  gradient's backward loop the same), 1 when unknown before running."""
  return op.trip_count or 1


def iteration_operations(op):
  """The operations one iteration of a loop op runs: a forward loop's
  cond and body; a backward loop's recomputed forward ops, then the
  body's gradient ops."""
  return list(op.recomputed_operations) + list(op.inner_operations)


def runs_per_step(operations, times=1):
  """(op, how many times it runs per step) for operations and, depth
  first, what their iterations run (iteration_operations: a loop body
  loop_trips times its loop's; a backward loop's recomputed forward ops
  appear again, once per backward iteration).

  Example:
    >>> [(op.name, n) for op, n in runs_per_step(graph.operations)][-3:]
  """
  for op in operations:
    yield op, times
    if op.inner_operations:
      yield from runs_per_step(iteration_operations(op),
                               times * loop_trips(op))


def _aliased_input(op, index, graph_layout):
  """The input whose buffer op's output `index` is, or None: the outputs
  an op declares (op.output_aliases: depend, a custom gradient's outputs),
  a relayout (mtf.shard, layout_like) between equal layouts, and a
  reshape the layouts make local with nothing moved (a rename): their
  lowering hands the input's slices on (a view)."""
  aliases = op.output_aliases
  if aliases:
    k = aliases.get(index)
    return None if k is None else op.inputs[k]
  if not op.inputs:
    return None
  return op.view_input(index, graph_layout)


class LoopHistory(object):
  """What a forward loop records for its gradient: each iteration's state
  of the loop variables the backward loop reads ([iterations, state...]
  per variable, one buffer here)."""

  def __init__(self, loop, shape, dtype):
    self.operation = loop
    self.name = loop.name + "/history"
    self.shape = shape
    self.dtype = dtype


def _loop_buffers(op, start, graph_layout, position, fused=None):
  """{key: [start, end, bytes]} a loop op adds at `start`: the transient
  peak of one iteration of its inner operations, and for a forward loop
  whose gradient is in the graph, its recorded states (LoopHistory), kept
  until the last backward loop reads them."""
  out = {}
  layout = graph_layout.op_layout(op)
  carried = op.loop_carried
  span, _ = _buffers(iteration_operations(op), graph_layout,
                     keep_until_end=carried, fused=fused)
  peak = _peak(span)
  if peak:
    out[("iteration", op)] = [start, start, peak]
  grads = [g for g in op.gradient_loops if g in position]
  if grads:
    states = sorted(set(i for g in grads for i in g.state_used))
    trips = loop_trips(op)
    nbytes = trips * sum(layout.slice_size(op.inputs[i].shape) *
                         op.inputs[i].dtype.size for i in states)
    if nbytes:
      first = op.inputs[states[0]]
      shape = shapes.Shape([shapes.Dimension("iterations", trips)] +
                           first.shape.dims)
      out[LoopHistory(op, shape, first.dtype)] = [
          start, max(position[g] for g in grads), nbytes]
  return out


def _peak(span):
  events = collections.Counter()
  for start, end, size in span.values():
    events[start] += size
    events[end + 1] -= size
  live = peak = 0
  for i in sorted(events):
    live += events[i]
    peak = max(peak, live)
  return peak


def _buffers(operations, graph_layout, keep_until_end=(), fused=None):
  """(spans, bytes): spans {tensor: [first op index, last op index,
  bytes per device]} of every activation buffer, keyed by the tensor that
  made it; bytes {"parameters", "optimizer_state", "padding"}.

  A tensor lives from its producer to its last reader (an output nobody
  reads dies at once; keep_until_end, to the end: a loop body's results).
  A loop op adds one iteration's transient peak of its body and the states
  its forward pass records for the backward (_loop_buffers). With fused
  ({op: kernel id}, fused_kernels), a tensor whose maker and readers are
  all in one fused kernel is never written to memory. An output that is one of its op's inputs under
  another name (_aliased_input: depend, a custom gradient's outputs, a
  relayout that moves nothing) is that input's buffer: counted once,
  living to the last reader of either. A gradient put into its variable's
  layout (layout_like: a reduce-scatter under 2D or weight-update
  sharding) is relaid as soon as it is made, as TF's executor and XLA's
  scheduler run it, not where the optimizer's code made the relayout (after
  the whole backward pass): its larger unreduced value is not held."""
  position = {op: i for i, op in enumerate(operations)}
  for op in operations:
    if isinstance(op, annotations.LayoutLikeOperation):
      made = op.inputs[0].operation
      if made in position:
        position[op] = position[made]
  last_read = {}
  kernels = collections.defaultdict(set)   # tensor -> its readers' kernels
  for op in operations:
    i = position[op]
    for t in op.inputs:
      last_read[t] = max(last_read.get(t, i), i)
      if fused is not None:
        kernels[t].add(fused.get(op))
    for inner in lowering_lib.all_operations(iteration_operations(op)):
      for t in inner.inputs:
        if t.operation in position:
          last_read[t] = max(last_read.get(t, i), i)
          kernels[t].add(None)
  parameters = optimizer = padding = 0
  trainable = set()
  if operations:
    trainable = set(operations[0].graph.trainable_variables)
  end_of_all = max(position.values()) if position else 0
  for t in keep_until_end:
    last_read[t] = end_of_all
  root = {}        # tensor -> the tensor whose buffer it is
  span = {}        # root tensor -> [start, end, bytes]
  keep = set(keep_until_end)
  for op in operations:
    if op.inner_operations:
      span.update(_loop_buffers(op, position[op], graph_layout, position,
                                fused))
    kernel = fused.get(op) if fused is not None else None
    for k, t in enumerate(op.outputs):
      start = position[op]
      end = last_read.get(t, start)
      if (kernel is not None and kernels.get(t) == {kernel} and
          t not in keep):
        continue   # inside one fused kernel
      source = _aliased_input(op, k, graph_layout)
      if source is not None and source.operation in position:
        root[t] = root.get(source, source)
        if root[t] in span:
          span[root[t]][1] = max(span[root[t]][1], end)
        continue
      layout = graph_layout.tensor_mesh_layout(t)
      size = _local_elements(layout, t) * t.dtype.size
      # A slice's padding, on average over the processors: the slice minus
      # its share of the real elements.
      shards = shapes.prod(s.num_shards for s in layout.dim_splits(t.shape))
      padding += size - t.shape.size * t.dtype.size // shards
      if op.creates_variable_slices:
        if op in trainable:
          parameters += size
        else:
          optimizer += size
        continue
      span[t] = [start, end, size]
  return span, {"parameters": parameters, "optimizer_state": optimizer,
                "padding": padding}


def kept_for_backward(operations, graph_layout, backward_start, fused=None):
  """[(tensor, bytes per device)] of the activations made before
  backward_start and read after it (what the backward pass keeps),
  largest first.

  Example:
    >>> kept = kept_for_backward(graph.operations, graph_layout,
    ...                          graph.backward_start)
    >>> [(t.name, t.dtype.name, n) for t, n in kept[:3]]
  """
  span, _ = _buffers(list(operations), graph_layout, fused=fused)
  kept = [(t, size) for t, (start, end, size) in span.items()
          if start < backward_start <= end]
  return sorted(kept, key=lambda kv: -kv[1])


def _memory(operations, graph_layout, backward_start, fused=None):
  """Per-device bytes: variables (trainable = parameters, the rest =
  optimizer state and counters), then the activations' liveness
  (_buffers): the peak of the live bytes, and those kept across
  backward_start."""
  span, memory = _buffers(operations, graph_layout, fused=fused)
  saved = sum(size for start, end, size in span.values()
              if backward_start is not None and start < backward_start <= end)
  peak = _peak(span)
  memory.update(activations_saved=saved, activations_peak=peak,
                peak=memory["parameters"] + memory["optimizer_state"] + peak)
  return memory
