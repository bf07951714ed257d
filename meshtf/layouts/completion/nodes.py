"""The completion's graph: one Node per operation (its dim names, the dims
that may not share mesh axes, its mode: fixed, derived, mirror, sum or
free) and one Edge per tensor from the operation that makes it to one that
reads it, with the levels of a proposal along it each way.

Example:
  >>> nodes_of = [nodes.Node(op, i, names_of) for i, op in enumerate(ops)]
  >>> by_op = {n.op: n for n in nodes_of}
  >>> nodes.connect(nodes_of, by_op, names_of)
"""
import enum

from meshtf.layouts.completion import levels


class NodeMode(enum.StrEnum):
  """How a node's layout is completed (a closed vocabulary: every level
  dispatches on it)."""
  FIXED = "fixed"       # given (an annotation, a variable layout, ...)
  DERIVED = "derived"   # the layout of its op's layout_source
  MIRROR = "mirror"     # a gradient op mirroring its forward op
  SUM = "sum"           # the sum of a gradient's parts
  FREE = "free"         # proposals and rules decide


# The modes whose owned dims copy their source's.
COPIES_SOURCE = frozenset([NodeMode.DERIVED, NodeMode.MIRROR])


class Edge(object):
  """Tensor `tensor` (dims `dims`) from `producer` into `consumer`, with
  the level of a proposal forward (into the consumer) and backward."""
  __slots__ = ("tensor", "dims", "producer", "consumer", "forward",
               "backward", "weightlike", "position")

  def __init__(self, tensor, dims, producer, consumer, position, forward,
               backward, weightlike):
    self.tensor = tensor
    self.dims = dims
    self.producer = producer
    self.consumer = consumer
    self.position = position
    self.forward = forward
    self.backward = backward
    self.weightlike = weightlike


class Node(object):
  __slots__ = ("op", "index", "names", "_partners", "values", "origins",
               "mode", "propagates", "source", "source_dims", "owned",
               "inputs", "readers", "dependents", "factors", "levels",
               "out_names", "contraction", "elementwise", "input_names",
               "output_names")

  def __init__(self, op, index, names_of):
    self.op = op
    self.index = index
    self.output_names = [names_of(t) for t in op.outputs]
    self.input_names = [names_of(t) for t in op.inputs]
    dims = []
    for names in self.output_names + self.input_names:
      dims.extend(names)
    self.names = tuple(dict.fromkeys(dims))
    self._partners = None
    self.values = {}     # dim name -> tuple of mesh axis names (() whole)
    self.origins = {}    # dim name -> Origin
    self.mode = NodeMode.FREE
    self.propagates = True
    self.source = None   # the node a derived / mirror / sum node copies
    self.source_dims = ()
    self.owned = frozenset()
    self.inputs = []
    self.readers = []
    self.dependents = []
    self.factors = ()    # (input dim, size, output dim, size) of a reshape
    self.levels = set()  # levels at which proposals reach this node
    self.out_names = frozenset(n for g in self.output_names for n in g)
    self.elementwise = len(self.output_names) == 1 and all(
        self.out_names.issuperset(g) for g in self.input_names)
    # An einsum that sums over some dims: where a split of a summed dim
    # and a wanted split of an output dim need one axis, it weighs the two
    # (GSPMD's dot partitioner does the same).
    self.contraction = (not self.elementwise and
                        len(self.output_names) == 1 and
                        bool(op.layout_dim_groups()))
    if self.contraction:
      self.levels.update((levels.CONTRACTION, levels.WEIGHTS))

  @property
  def partners(self):
    """{dim name: the dims that may not share its mesh axes} (those in one
    tensor with it, or in one of the op's layout_dim_groups)."""
    if self._partners is None:
      partners = {n: set() for n in self.names}
      groups = self.output_names + self.input_names + [
          tuple(g) for g in self.op.layout_dim_groups()]
      for g in groups:
        if len(g) > 1:
          for n in g:
            if n in partners:
              partners[n].update(g)
      self._partners = {n: frozenset(p - {n}) for n, p in partners.items()}
    return self._partners


def edge_levels(node, names):
  """(forward, backward) levels of proposals along an input of node's op
  with dim names `names`."""
  if node.elementwise:
    if node.out_names.issubset(names):
      return levels.ELEMENTWISE, levels.ELEMENTWISE
    return levels.BROADCAST_FORWARD, levels.BROADCAST_BACKWARD
  return levels.CONTRACTION, levels.CONTRACTION


def connect(nodes, by_op, names_of):
  weightlike = {}

  def is_weight(op):
    # A variable, or an elementwise chain (a cast) from one.
    if op not in weightlike:
      weightlike[op] = bool(op.creates_variable_slices) or (
          len(op.inputs) == 1 and len(op.outputs) == 1 and
          op.inputs[0].shape == op.outputs[0].shape and
          op.inputs[0].operation in by_op and
          is_weight(op.inputs[0].operation))
    return weightlike[op]

  for node in nodes:
    op = node.op
    for i, t in enumerate(op.inputs):
      producer = by_op.get(t.operation)
      if producer is None or producer is node:
        continue
      names = names_of(t)
      forward, backward = edge_levels(node, names)
      edge = Edge(t, names, producer, node, i, forward, backward,
                   is_weight(t.operation))
      node.inputs.append(edge)
      producer.readers.append(edge)
      node.levels.add(forward)
      producer.levels.add(backward)
      if backward >= levels.CONTRACTION:
        producer.levels.add(levels.WEIGHTS)
      if forward >= levels.CONTRACTION:
        node.levels.add(levels.WEIGHTS)
    if len(node.inputs) > 1:
      node.inputs.sort(key=lambda e: (e.forward, e.weightlike, e.position))
    factors = []
    if op.inputs and op.outputs:
      sizes_in = {d.name: d.size for d in op.inputs[0].shape.dims}
      sizes_out = {d.name: d.size for d in op.outputs[0].shape.dims}
      for a, b in op.layout_factors():
        if a in sizes_in and b in sizes_out:
          factors.append((a, sizes_in[a], b, sizes_out[b]))
    node.factors = tuple(factors)
  for node in nodes:
    if len(node.readers) > 1:
      node.readers.sort(key=lambda e: (e.backward, e.consumer.index,
                                       e.position))


def classify(node, by_op):
  op = node.op
  source = op.layout_source
  if source is not None and source.operation in by_op:
    node.mode = NodeMode.DERIVED
    node.source = by_op[source.operation]
    node.source_dims = tuple(d.name for d in source.shape.dims)
  elif op.forward_op is not None and _is_rename(op) and \
      op.inputs[0].operation in by_op and op.forward_op in by_op:
    # The gradient of a rename: where the rename moved nothing, partial
    # sums pass it (a local reshape) pending, so it follows its input and
    # the sum it feeds is reduced once (self-attention's keys' and values'
    # gradients); else it mirrors the rename (_sum_layout decides).
    node.mode = NodeMode.SUM
    node.source = by_op[op.forward_op]
    node.source_dims = ()
  elif op.forward_op is not None and op.forward_op in by_op:
    node.mode = NodeMode.MIRROR
    node.source = by_op[op.forward_op]
    theirs = set(node.source.names)
    node.source_dims = tuple(n for n in node.names if n in theirs)
  elif op.gradient_of is not None and op.gradient_of.operation in by_op:
    node.mode = NodeMode.SUM
    node.source = by_op[op.gradient_of.operation]
    node.source_dims = tuple(d.name for d in op.gradient_of.shape.dims)
  else:
    return
  mine = set(node.names)
  node.owned = frozenset(n for n in node.source_dims if n in mine)
  node.source.dependents.append(node)
  node.levels.add(levels.MIRROR)


def _is_rename(op):
  """A reshape that only renames dims (the same sizes in the same order)."""
  return (len(op.inputs) == 1 and len(op.outputs) == 1 and
          op.inputs[0].shape.to_integer_list ==
          op.outputs[0].shape.to_integer_list and bool(op.layout_factors()))
