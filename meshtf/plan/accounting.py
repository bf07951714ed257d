"""Per-device accounting of a meshtf graph under its layouts, without
running anything: flops and bytes touched per operation (by op family), the
parameters and optimizer state each device stores, and the activations
alive through the forward and backward passes (liveness over the graph's
operation order).

Counting rules (per device, on the slices the op's computation layout
gives it; padding of uneven splits included, since it is computed):
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

from meshtf.lowering import lowering as lowering_lib
from meshtf.ops import annotations

OpCost = collections.namedtuple("OpCost", ["op", "family", "flops", "bytes"])
# conv op -> which input is the forward conv's output y (ConvOperation makes
# it).
_CONV_Y = {"ConvOperation": None, "ConvInputGradOperation": 0,
           "ConvFilterGradOperation": 1}


def _prod(values):
  out = 1
  for v in values:
    out *= int(v)
  return out


def _family(op):
  """The op's family: its module under meshtf/ops (einsum, elementwise,
  reductions, conv, index, ...), or the class name elsewhere."""
  module = type(op).__module__
  return module.rsplit(".", 1)[-1] if ".ops." in module else type(op).__name__


def _local_elements(layout, tensor):
  return layout.slice_size(tensor.shape)


def op_cost(op, layout, graph_layout=None):
  """OpCost of one operation under its computation layout (a MeshLayout).
  With graph_layout, an op whose outputs are views of its inputs
  (_aliased_input: depend, a custom gradient, a relayout that moves
  nothing) costs nothing."""
  family = _family(op)
  if graph_layout is not None and op.outputs and all(
      _aliased_input(op, k, graph_layout) is not None
      for k in range(len(op.outputs))):
    return OpCost(op, family, 0, 0)
  touched = sum(_local_elements(layout, t) * t.dtype.size
                for t in list(op.inputs) + op.outputs)
  name = type(op).__name__
  if name == "EinsumOperation":
    union = op._all_dims  # pylint: disable=protected-access
    flops = max(len(op.inputs), 1) * layout.slice_size(union)
  elif name in _CONV_Y:
    # Every conv op does the forward conv's multiply-adds: per output
    # position and out channel, the window times the in channels.
    g = op._geom  # pylint: disable=protected-access
    y = op.outputs[0] if name == "ConvOperation" else op.inputs[_CONV_Y[name]]
    window = _prod(d.size for d in g.filter_spatial)
    flops = (2 * _local_elements(layout, y) * window *
             layout.slice_size([g.in_dim]))
  elif family == "reductions":
    flops = sum(_local_elements(layout, t) for t in op.inputs)
  else:
    flops = sum(_local_elements(layout, t) for t in op.outputs)
  return OpCost(op, family, int(flops), int(touched))


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


def account(operations, graph_layout, backward_start=None):
  """The Accounting of `operations` (a graph's, in order) under
  graph_layout (MeshLayout.assign). backward_start: the index of the first
  backward operation (activations produced before it and read after it are
  the ones kept for the backward pass); None: no backward pass."""
  operations = list(operations)
  costs = [op_cost(op, graph_layout.op_layout(op), graph_layout)
           for op in lowering_lib.all_operations(operations)]
  return Accounting(costs, _memory(operations, graph_layout, backward_start))


def _aliased_input(op, index, graph_layout):
  """The input whose buffer op's output `index` is, or None: the outputs
  an op declares (op.output_aliases: depend, a custom gradient's outputs),
  a relayout (mtf.shard, layout_like) between equal layouts, and a
  reshape the layouts make local with nothing moved (a rename): their
  lowering hands the input's slices on (a view)."""
  aliases = getattr(op, "output_aliases", None)
  if aliases:
    k = aliases.get(index)
    return None if k is None else op.inputs[k]
  if not op.inputs or index:
    return None
  x, out = op.inputs[0], op.outputs[0]
  if isinstance(op, annotations.ShardOperation) or isinstance(
      op, annotations.LayoutLikeOperation):
    same = (graph_layout.tensor_layout(x) ==
            graph_layout.tensor_layout(out))
    return x if same else None
  if type(op).__name__ == "ReshapeOperation":
    layout = graph_layout.op_layout(op)
    if (graph_layout.tensor_layout(x) != layout.tensor_layout(x.shape) or
        layout.slice_size(x.shape) != layout.slice_size(out.shape)):
      return None
    plan = layout.relayout_plan(x.shape, out.shape, x.dtype.size)
    return None if plan.steps else x
  return None


def _buffers(operations, graph_layout):
  """(spans, bytes): spans {tensor: [first op index, last op index,
  bytes per device]} of every activation buffer, keyed by the tensor that
  made it; bytes {"parameters", "optimizer_state", "padding"}.

  A tensor lives from its producer to its last reader (an output nobody
  reads dies at once). An output that is one of its op's inputs under
  another name (_aliased_input: depend, a custom gradient's outputs, a
  relayout that moves nothing) is that input's buffer: counted once,
  living to the last reader of either."""
  position = {op: i for i, op in enumerate(operations)}
  last_read = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last_read[t] = i
    for inner in lowering_lib.all_operations(op.inner_operations):
      for t in inner.inputs:
        if t.operation in position:
          last_read[t] = max(last_read.get(t, i), i)
  parameters = optimizer = padding = 0
  trainable = set()
  if operations:
    trainable = set(operations[0].graph.trainable_variables)
  root = {}        # tensor -> the tensor whose buffer it is
  span = {}        # root tensor -> [start, end, bytes]
  for op in operations:
    for k, t in enumerate(op.outputs):
      start = position[op]
      end = last_read.get(t, start)
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
      shards = _prod(s.num_shards for s in layout.dim_splits(t.shape))
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


def kept_for_backward(operations, graph_layout, backward_start):
  """[(tensor, bytes per device)] of the activations made before
  backward_start and read after it (what the backward pass keeps),
  largest first.

  Example:
    >>> kept = kept_for_backward(graph.operations, graph_layout,
    ...                          graph.backward_start)
    >>> [(t.name, t.dtype.name, n) for t, n in kept[:3]]
  """
  span, _ = _buffers(list(operations), graph_layout)
  kept = [(t, size) for t, (start, end, size) in span.items()
          if start < backward_start <= end]
  return sorted(kept, key=lambda kv: -kv[1])


def _memory(operations, graph_layout, backward_start):
  """Per-device bytes: variables (trainable = parameters, the rest =
  optimizer state and counters), then the activations' liveness
  (_buffers): the peak of the live bytes, and those kept across
  backward_start."""
  span, memory = _buffers(operations, graph_layout)
  events = collections.Counter()
  saved = 0
  for start, end, size in span.values():
    events[start] += size
    events[end + 1] -= size
    if backward_start is not None and start < backward_start <= end:
      saved += size
  live = peak = 0
  for i in sorted(events):
    live += events[i]
    peak = max(peak, live)
  memory.update(activations_saved=saved, activations_peak=peak,
                peak=memory["parameters"] + memory["optimizer_state"] + peak)
  return memory
