"""Sharding completion (GSPMD section 3.5): the layout of every operation of
a graph, forward and backward alike, from a few annotations, pure Python.

Named dims are the factors. Shardy (OpenXLA's successor to GSPMD's
propagation) rewrites every operation as factors -- "this input dim and
that output dim are one index space" -- and propagates a sharding per
factor. A meshtf graph already is that: a dim name means the same index
space in every tensor of an operation (an einsum's signature, a
reduction's kept dims, a broadcast's shared dims), so a layout is one map
dim name -> mesh axes per operation (its computation layout), and
propagating is copying an entry of that map along a tensor from the
operation that makes it to one that reads it, or back. Only reshapes name
one factor twice (length -> memory_length); they declare the pairs
(Operation.layout_factors). Nothing else needs op-by-op rules: which dims
an operation contracts is which names its output lacks.

The pass, per dim of each operation:

  fixed     annotations (mtf.shard, mtf.replicate: the dims they do not
            name are whole), variable layouts (get_variable(layout=),
            MeshLayout variable_rules), and, under the rules, operations
            inside control flow and imported host data; an operation with
            a layout_source takes that tensor's layout
  mirror    a backward operation lowers under the layout of the forward
            operation whose gradient rule made it (so Figure 7's backward
            gathers and reduce-scatters what the forward did); the sum of
            a gradient's parts takes its parts' common layout, else the
            layout of the tensor it is the gradient of
  then, to a fixed point at each level before the next starts:
  1 elementwise  an input with the output's dims <-> the output
  2 broadcast    the output -> an input with fewer dims (backward)
  3 contraction  einsums, reductions, reshapes, gathers, every other op,
                 both ways
  4 weights      a variable's stored layout through such an operation
                 (the activations decide a computation first: a weight
                 stored split over the data axis is gathered, not summed)
  5 broadcast    an input with fewer dims -> the output (forward)
  default   in graph order: a dim an input holds whole by annotation stays
            whole (mtf.replicate propagates forward), else the rule, else
            whole (its axis is taken: the conflict is recorded)

A layout is only refined: a dim without axes takes them, a dim on x may
become x+y, never anything else; a proposal whose axes another dim of the
operation holds (one tensor, or all of an einsum's dims) is dropped --
that is how dims on different axes merge (GSPMD Figure 3) and how a
conflict becomes a relayout the lowering plans. Within a level the
operations are visited in graph order (a changed one revisits its
neighbours), and at each visit proposals come from the inputs (activations
before variables) before the readers: deterministic. Every entry records
its Origin -- the annotation, variable layout or rule it came from and the
operations it travelled through -- so that each collective can say why it
exists (MeshLayout.assign's GraphLayout.origins).

A graph without annotations and variable rules never gets here
(assignment.py keeps the rules' layout for every operation); run through
this pass it would get exactly the rules, too.

Example:
  >>> layout = MeshLayout("x:2;y:4", "")
  >>> result = complete(layout, graph.operations, fixed)
  >>> result.values(h_op)          # h = relu(einsum(shard(x), w_in))
  {'batch': ('x',), 'd_ff': ('y',), 'd_model': ()}
"""
import gc
import heapq

from meshtf.layouts import layout_rules as rules_lib

# Levels, in the order they are enabled.
FIXED, MIRROR, ELEMENTWISE, BROADCAST_BACKWARD, CONTRACTION, WEIGHTS, \
    BROADCAST_FORWARD, DEFAULT = range(8)
LEVEL_NAMES = ("fixed", "mirror", "elementwise", "broadcast (backward)",
               "contraction", "weights", "broadcast (forward)", "default")
_PROPAGATION_LEVELS = (ELEMENTWISE, BROADCAST_BACKWARD, CONTRACTION, WEIGHTS,
                       BROADCAST_FORWARD)

# Origin roots.
ANNOTATION = "annotation"
VARIABLE = "variable layout"
RULES = "rules"
CONFLICT = "whole (axis taken)"


class Origin(object):
  """Where one dim's axes in one operation's layout came from: a root (an
  annotation, a variable layout, a rule, a conflict) or a hop from a
  neighbour's entry (`previous`) at a level, into operation `op`.

  Example:
    >>> origin.root.kind, origin.root.label, origin.path()[-2:]
    ('annotation', "mtf.shard 'shard_5'", ['cast_15', 'square_1'])
  """
  __slots__ = ("kind", "label", "op", "previous", "root", "hops")

  def __init__(self, kind, label=None, op=None, previous=None):
    self.kind = kind
    self.label = label
    self.op = op
    self.previous = previous
    self.root = self if previous is None else previous.root
    self.hops = 0 if previous is None else previous.hops + 1

  def path(self, limit=None):
    """Operation names from the root to here (the last `limit`)."""
    out, o = [], self
    while o is not None and (limit is None or len(out) < limit):
      if o.op and (not out or out[-1] != o.op):
        out.append(o.op)
      o = o.previous
    return out[::-1]

  def describe(self, limit=4):
    """One line, e.g. "annotation mtf.shard 'shard_5', via add_6 > cast_15
    (3 hops)"."""
    root = self.root
    text = root.kind if not root.label else "%s %s" % (root.kind,
                                                      _label(root.label))
    if self.hops:
      path = self.path(limit + 1)[1:] if root.op else self.path(limit)
      text += ", via %s%s" % (" > ".join(path[-limit:]),
                              " (%d hops)" % self.hops
                              if self.hops > limit else "")
    return text

  def __repr__(self):
    return "Origin(%s)" % self.describe()


def _label(label):
  return label() if callable(label) else label


class _Edge(object):
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


class _Node(object):
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
    self.mode = "free"   # fixed | derived | mirror | sum | free
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
      self.levels.update((CONTRACTION, WEIGHTS))

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


def _edge_levels(node, names):
  """(forward, backward) levels of proposals along an input of node's op
  with dim names `names`."""
  if node.elementwise:
    if node.out_names.issubset(names):
      return ELEMENTWISE, ELEMENTWISE
    return BROADCAST_FORWARD, BROADCAST_BACKWARD
  return CONTRACTION, CONTRACTION


class Completion(object):
  """The completed layouts: per operation, each dim's mesh axes (a tuple of
  axis names, () whole) and its Origin."""

  def __init__(self, nodes, by_op):
    self._nodes = nodes
    self._by_op = by_op

  def node(self, op):
    return self._by_op.get(op)

  def values(self, op):
    """{dim name: mesh axis names} of op's computation layout."""
    node = self._by_op.get(op)
    return dict(node.values) if node is not None else None

  def origins(self, op):
    """{dim name: Origin} of op's computation layout."""
    node = self._by_op.get(op)
    return dict(node.origins) if node is not None else None

  def __iter__(self):
    return iter(self._nodes)


def complete(mesh_layout, operations, fixed):
  """The Completion of operations (graph order, inner operations of control
  flow after their container) on mesh_layout's mesh. fixed: {op: (values,
  origin, propagates)} for the operations whose layout is given (values:
  {dim name: axis names} for every dim of the op)."""
  # The pass makes ~10 small objects per operation and frees none: the
  # cyclic collector would rescan the whole (large) graph again and again.
  enabled = gc.isenabled()
  gc.disable()
  try:
    return _complete(mesh_layout, operations, fixed)
  finally:
    if enabled:
      gc.enable()


def _complete(mesh_layout, operations, fixed):
  cache = {}

  def names_of(t):
    names = cache.get(t)
    if names is None:
      names = cache[t] = tuple(t.shape.dimension_names)
    return names
  nodes = [_Node(op, i, names_of) for i, op in enumerate(operations)]
  by_op = {n.op: n for n in nodes}
  _connect(nodes, by_op, names_of)
  for node in nodes:
    given = fixed.get(node.op)
    if given is not None:
      values, origin, propagates = given
      node.mode = "fixed"
      node.propagates = propagates
      for name in node.names:
        node.values[name] = tuple(values.get(name, ()))
        node.origins[name] = origin
    else:
      _classify(node, by_op)
  axis_sizes = {d.name: d.size for d in mesh_layout.mesh_shape.dims}
  for level in (MIRROR,) + _PROPAGATION_LEVELS:
    _propagate(nodes, level, axis_sizes)
  rule_cache = {}

  def rules(name):
    axes = rule_cache.get(name)
    if axes is None:
      axes = rule_cache[name] = mesh_layout.layout_rules.mesh_axis_names(
          name)
    return axes
  for node in nodes:
    if node.mode != "fixed":
      _fill_default(node, rules)
  return Completion(nodes, by_op)


def _connect(nodes, by_op, names_of):
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
      forward, backward = _edge_levels(node, names)
      edge = _Edge(t, names, producer, node, i, forward, backward,
                   is_weight(t.operation))
      node.inputs.append(edge)
      producer.readers.append(edge)
      node.levels.add(forward)
      producer.levels.add(backward)
      if backward >= CONTRACTION:
        producer.levels.add(WEIGHTS)
      if forward >= CONTRACTION:
        node.levels.add(WEIGHTS)
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


def _classify(node, by_op):
  op = node.op
  source = op.layout_source
  if source is not None and source.operation in by_op:
    node.mode = "derived"
    node.source = by_op[source.operation]
    node.source_dims = tuple(d.name for d in source.shape.dims)
  elif op.forward_op is not None and _is_rename(op) and \
      op.inputs[0].operation in by_op and op.forward_op in by_op:
    # The gradient of a rename: where the rename moved nothing, partial
    # sums pass it (a local reshape) pending, so it follows its input and
    # the sum it feeds is reduced once (self-attention's keys' and values'
    # gradients); else it mirrors the rename (_sum_layout decides).
    node.mode = "sum"
    node.source = by_op[op.forward_op]
    node.source_dims = ()
  elif op.forward_op is not None and op.forward_op in by_op:
    node.mode = "mirror"
    node.source = by_op[op.forward_op]
    theirs = set(node.source.names)
    node.source_dims = tuple(n for n in node.names if n in theirs)
  elif op.gradient_of is not None and op.gradient_of.operation in by_op:
    node.mode = "sum"
    node.source = by_op[op.gradient_of.operation]
    node.source_dims = tuple(d.name for d in op.gradient_of.shape.dims)
  else:
    return
  mine = set(node.names)
  node.owned = frozenset(n for n in node.source_dims if n in mine)
  node.source.dependents.append(node)
  node.levels.add(MIRROR)


def _copy_source(node, level):
  """A derived or mirror node's owned dims, as its source has them."""
  changed = False
  src = node.source
  kind = "layout of" if node.mode == "derived" else "mirror"
  for name in node.owned:
    v = src.values.get(name)
    if v is None or node.values.get(name) == v:
      continue
    node.values[name] = v
    node.origins[name] = Origin(kind, None, node.op.name,
                                src.origins[name])
    changed = True
  return changed


def _blocking(node, name, axes):
  """The partner dims of `name` in node holding one of `axes` beyond
  name's own."""
  cur = node.values.get(name) or ()
  extra = axes[len(cur):]
  values = node.values
  out = []
  for p in node.partners[name]:
    held = values.get(p)
    if held and any(a in held for a in extra):
      out.append(p)
  return sorted(out)


def _propose(node, name, axes, previous, level, ctx):
  """Refines node's dim `name` to `axes` if they extend its axes and no
  partner dim holds one of them (a contraction may instead give up the
  partner's axes, where that moves fewer bytes). Returns whether it
  changed."""
  cur = node.values.get(name)
  if cur is not None and (cur == axes or len(axes) <= len(cur) or
                          axes[:len(cur)] != cur):
    return False
  blocking = _blocking(node, name, axes)
  if blocking:
    if not node.contraction or any(b in node.owned for b in blocking):
      return False
    trial = dict(node.values)
    for b in blocking:
      del trial[b]
    trial[name] = axes
    if _cost(node, trial, level, ctx) >= _cost(node, node.values, level,
                                               ctx):
      return False
    for b in blocking:
      del node.values[b]
      del node.origins[b]
  node.values[name] = axes
  node.origins[name] = Origin(LEVEL_NAMES[level], None, node.op.name,
                              previous)
  return True


def _visit(node, level, ctx):
  """Applies every proposal reaching node at levels <= level: from its
  inputs (a contraction: output dims first, then the summed ones), then
  from its readers (a contraction: from the contraction level on, when
  its inputs have spoken)."""
  changed = False
  if node.mode in ("derived", "mirror"):
    changed = _copy_source(node, level)
  owned = node.owned
  out_first = (True, False) if node.contraction else (None,)
  for wanted_out in out_first:
    for e in node.inputs:
      if e.forward > level:
        break
      p = e.producer
      if not p.propagates or p.mode == "sum":
        continue
      for name in e.dims:
        if name in owned or (wanted_out is not None and
                             (name in node.out_names) != wanted_out):
          continue
        v = p.values.get(name)
        if not v:
          continue
        origin = p.origins[name]
        if (e.forward >= CONTRACTION and level < WEIGHTS and
            origin.root.kind == VARIABLE):
          continue
        changed |= _propose(node, name, v, origin, e.forward, ctx)
  if not node.contraction or level >= CONTRACTION:
    for e in node.readers:
      if e.backward > level:
        break
      c = e.consumer
      if not c.propagates or c.mode == "sum":
        continue
      for name in e.dims:
        if name in owned:
          continue
        v = c.values.get(name)
        if not v:
          continue
        origin = c.origins[name]
        if (e.backward >= CONTRACTION and level < WEIGHTS and
            origin.root.kind == VARIABLE):
          continue
        changed |= _propose(node, name, v, origin,
                            max(e.backward, CONTRACTION
                                if node.contraction else e.backward), ctx)
  if node.factors and level >= CONTRACTION:
    changed |= _carry_factors(node, level, ctx)
  return changed


def _cost(node, values, level, ctx):
  """Bytes one device sends if node computes under `values`: its inputs
  relaid from their producers' layouts (gathers; splits are free, and a
  producer that has not decided follows), and its output's partial sums
  reduced -- scattered over an output dim a reader wants split there,
  else allreduced -- and gathered where a reader wants it whole. The
  usual ring algorithms' bytes (meshtf/layouts/relayout.py)."""
  sizes = ctx
  total = 0.0
  for e in node.inputs:
    old = e.producer.values
    itemsize = e.tensor.dtype.size
    local = 1
    for d in e.tensor.shape.dims:
      local *= -(-d.size // _count(old.get(d.name) or (), sizes))
    for d in e.tensor.shape.dims:
      o, n = old.get(d.name), values.get(d.name) or ()
      if not o:
        continue
      k = 0
      while k < len(o) and k < len(n) and o[k] == n[k]:
        k += 1
      for axis in reversed(o[k:]):
        total += (sizes.get(axis, 1) - 1) * local * itemsize
        local *= sizes.get(axis, 1)
  out = node.op.outputs[0]
  itemsize = out.dtype.size
  local = 1
  for d in out.shape.dims:
    local *= -(-d.size // _count(values.get(d.name) or (), sizes))
  wish = {}
  for d in out.shape.dims:
    for e in node.readers:
      v = e.consumer.values.get(d.name)
      if v:
        wish[d.name] = v
        break
  wished = {a for v in wish.values() for a in v}
  for name, v in values.items():
    if name in node.out_names or not v:
      continue
    for axis in v:
      n = sizes.get(axis, 1)
      if n <= 1:
        continue
      if axis in wished:
        total += (n - 1) / n * local * itemsize
        local /= n
      else:
        total += 2.0 * (n - 1) / n * local * itemsize
  for name, v in values.items():
    w = wish.get(name)
    if name in node.out_names and v and w is not None and w[:len(v)] != v:
      for axis in v:
        total += (sizes.get(axis, 1) - 1) * local * itemsize
        local *= sizes.get(axis, 1)
  return total


def _count(axes, sizes):
  n = 1
  for a in axes:
    n *= sizes.get(a, 1)
  return n


def _carry_factors(node, level, axis_sizes):
  """A reshape's paired dims (one factor, two names) take each other's
  axes where both sizes divide over them (or are equal)."""
  changed = False
  for a, size_a, b, size_b in node.factors:
    for src, dst in ((a, b), (b, a)):
      v = node.values.get(src)
      if not v or src in node.owned and dst in node.owned:
        continue
      if node.origins[src].root.kind == RULES:
        continue   # a rule names one dim; the other has its own rule
      if dst in node.owned:
        continue
      n = 1
      for axis in v:
        n *= axis_sizes.get(axis, 1)
      if size_a != size_b and (size_a % n or size_b % n):
        continue
      changed |= _propose(node, dst, v, node.origins[src], level,
                          axis_sizes)
  return changed


def _propagate(nodes, level, axis_sizes):
  """Runs the proposals of every level <= level to a fixed point."""
  # What reached a node at lower levels is settled: only the proposals
  # this level enables are new -- along its edges, from a neighbour that
  # has something to say.
  seeds = set()
  for n in nodes:
    if not n.values or not n.propagates or n.mode == "sum":
      continue
    weights = level == WEIGHTS and any(
        o.root.kind == VARIABLE for o in n.origins.values())
    for e in n.readers:
      if e.forward == level or weights and e.forward >= CONTRACTION:
        seeds.add(e.consumer)
    for e in n.inputs:
      if e.backward == level or weights and e.backward >= CONTRACTION:
        seeds.add(e.producer)
    if level == MIRROR:
      seeds.update(n.dependents)
  heap = [n.index for n in seeds if n.mode not in ("fixed", "sum")]
  heapq.heapify(heap)
  queued = set(heap)
  # Contractions decide first at their level, so that nothing copies a
  # wish they then weigh against their inputs.
  first = [n for n in reversed(nodes) if n.contraction and
           n.mode == "free"] if level >= CONTRACTION else []
  while heap or first:
    if first:
      node = first.pop()
    else:
      node = nodes[heapq.heappop(heap)]
      queued.discard(node.index)
    if not _visit(node, level, axis_sizes):
      continue
    for e in node.inputs:
      p = e.producer
      if e.backward <= level and p.mode not in ("fixed", "sum") and \
          p.index not in queued:
        queued.add(p.index)
        heapq.heappush(heap, p.index)
    for e in node.readers:
      c = e.consumer
      if e.forward <= level and c.mode not in ("fixed", "sum") and \
          c.index not in queued:
        queued.add(c.index)
        heapq.heappush(heap, c.index)
    for d in node.dependents:
      if d.mode != "sum" and d.index not in queued:
        queued.add(d.index)
        heapq.heappush(heap, d.index)


def _fill_default(node, rules):
  """The default level for one node (graph order: its inputs and sources
  are final)."""
  if node.mode in ("derived", "mirror"):
    _copy_source(node, DEFAULT)
  elif node.mode == "sum":
    _sum_layout(node)
  values, origins = node.values, node.origins
  for name in node.names:
    if name in values:
      continue
    inherited = None
    for e in node.inputs:
      v = e.producer.values.get(name)
      if v == () and e.producer.origins[name].root.kind == ANNOTATION:
        inherited = e.producer.origins[name]
        break
    if inherited is not None:
      values[name] = ()
      origins[name] = Origin("whole like its input", None, node.op.name,
                             inherited)
      continue
    axes = rules(name)
    taker = None
    for partner in node.partners[name]:
      held = values.get(partner)
      if held and any(a in held for a in axes):
        taker = partner
        break
    if axes and taker is None:
      values[name] = axes
      origins[name] = rule_origin(name, axes)
    else:
      values[name] = ()
      origins[name] = (rule_origin(name, ()) if not axes
                       else _conflict_origin(node, name, axes, taker))


_RULE_ORIGINS = {}


def rule_origin(name, axes):
  """The (shared) Origin of a dim laid out by its rule."""
  key = (name, axes)
  if key not in _RULE_ORIGINS:
    _RULE_ORIGINS[key] = Origin(RULES, "%s:%s" % (
        name, rules_lib.axes_text(axes)) if axes else "(none for %r)" % name)
  return _RULE_ORIGINS[key]


def _conflict_origin(node, name, axes, taker):
  held = node.values[taker]
  taker_origin = node.origins[taker]

  def label():
    return "rule %s:%s, but %s holds %s (%s)" % (
        name, rules_lib.axes_text(axes), taker, rules_lib.axes_text(held),
        taker_origin.describe(2))
  return Origin(CONFLICT, label, node.op.name)


def _is_rename(op):
  """A reshape that only renames dims (the same sizes in the same order)."""
  return (len(op.inputs) == 1 and len(op.outputs) == 1 and
          op.inputs[0].shape.to_integer_list ==
          op.outputs[0].shape.to_integer_list and bool(op.layout_factors()))


def _sum_layout(node):
  """A sum of a gradient's parts: the parts' common layout (partial sums
  then stay pending through the sum and are reduced once, where the
  gradient is read), else the layout of the tensor it is the gradient of.
  The gradient of a rename: its input's layout, dim by dim."""
  op = node.op
  if node.source is not None and not node.source_dims:
    forward, x_node = node.source, node.inputs[0].producer
    f_in = forward.op.inputs[0].shape.dimension_names
    f_out = forward.op.outputs[0].shape.dimension_names
    moved = [forward.values.get(n) for n in f_in] != [
        forward.values.get(n) for n in f_out]
    x, out = op.inputs[0], op.outputs[0]
    for a, b in zip(x.shape.dimension_names, out.shape.dimension_names):
      src, name = (forward, None) if moved else (x_node, a)
      for dim in (a, b):
        v = src.values.get(name or dim)
        if v is not None:
          node.values[dim] = v
          node.origins[dim] = Origin(
              "mirror" if moved else "rename of a gradient", None, op.name,
              src.origins[name or dim])
    return
  common = None
  for e in node.inputs:
    layout = tuple(e.producer.values.get(n) for n in e.dims)
    if common is None:
      common = (e.dims, layout, e)
    elif (e.dims, layout) != common[:2]:
      common = None
      break
  if common is not None and len(node.inputs) == len(op.inputs) and \
      all(v is not None for v in common[1]):
    dims, layout, e = common
    for name, v in zip(dims, layout):
      node.values[name] = v
      node.origins[name] = Origin("sum of its parts", None, op.name,
                                  e.producer.origins[name])
    return
  src = node.source
  for name in node.owned:
    if name in src.values:
      node.values[name] = src.values[name]
      node.origins[name] = Origin("mirror", None, op.name,
                                  src.origins[name])
