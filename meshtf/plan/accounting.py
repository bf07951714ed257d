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


def op_cost(op, layout):
  """OpCost of one operation under its computation layout (a MeshLayout)."""
  family = _family(op)
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
  costs = [op_cost(op, graph_layout.op_layout(op))
           for op in lowering_lib.all_operations(operations)]
  return Accounting(costs, _memory(operations, graph_layout, backward_start))


def _memory(operations, graph_layout, backward_start):
  """Per-device bytes: variables (trainable = parameters, the rest =
  optimizer state and counters), then the activations' liveness: a tensor
  lives from its producer to its last reader (an output nobody reads dies
  at once)."""
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
  events = collections.Counter()
  saved = 0
  for op in operations:
    for t in op.outputs:
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
      start = position[op]
      end = last_read.get(t, start)
      events[start] += size
      events[end + 1] -= size
      if (backward_start is not None and start < backward_start <= end):
        saved += size
  live = peak = 0
  for i in sorted(events):
    live += events[i]
    peak = max(peak, live)
  return {"parameters": parameters, "optimizer_state": optimizer,
          "activations_saved": saved, "activations_peak": peak,
          "peak": parameters + optimizer + peak, "padding": padding}
