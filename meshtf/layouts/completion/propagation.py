"""The propagation levels: proposals copied along the graph's edges and
refined into each operation's layout, to a fixed point per level; a
contraction weighs a proposal against the bytes it moves (_cost).

Example:
  >>> for level in (levels.MIRROR,) + levels.PROPAGATION_LEVELS:
  ...   propagation.propagate(nodes_of, level, axis_sizes)
"""
import heapq

from meshtf import shapes
from meshtf.layouts.completion import levels
from meshtf.layouts.completion import nodes as nodes_lib
from meshtf.layouts.completion import origins as origins_lib

# The kind of the hop a proposal makes at each level that proposes.
_HOP_KINDS = {level: origins_lib.OriginKind(levels.LEVEL_NAMES[level])
              for level in (levels.MIRROR,) + levels.PROPAGATION_LEVELS}
# The modes of nodes that take no proposals.
_SETTLED = frozenset([nodes_lib.NodeMode.FIXED, nodes_lib.NodeMode.SUM])


def copy_source(node, level):
  """A derived or mirror node's owned dims, as its source has them."""
  changed = False
  src = node.source
  kind = (origins_lib.OriginKind.LAYOUT_OF
          if node.mode is nodes_lib.NodeMode.DERIVED
          else origins_lib.OriginKind.MIRROR)
  for name in node.owned:
    v = src.values.get(name)
    if v is None or node.values.get(name) == v:
      continue
    node.values[name] = v
    node.origins[name] = origins_lib.Origin(kind, None, node.op.name,
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
  node.origins[name] = origins_lib.Origin(_HOP_KINDS[level], None,
                                          node.op.name, previous)
  return True


def _visit(node, level, ctx):
  """Applies every proposal reaching node at levels <= level: from its
  inputs (a contraction: output dims first, then the summed ones), then
  from its readers (a contraction: from the contraction level on, when
  its inputs have spoken)."""
  changed = False
  if node.mode in nodes_lib.COPIES_SOURCE:
    changed = copy_source(node, level)
  owned = node.owned
  out_first = (True, False) if node.contraction else (None,)
  for wanted_out in out_first:
    for e in node.inputs:
      if e.forward > level:
        break
      p = e.producer
      if not p.propagates or p.mode is nodes_lib.NodeMode.SUM:
        continue
      for name in e.dims:
        if name in owned or (wanted_out is not None and
                             (name in node.out_names) != wanted_out):
          continue
        v = p.values.get(name)
        if not v:
          continue
        origin = p.origins[name]
        if (e.forward >= levels.CONTRACTION and level < levels.WEIGHTS and
            origin.root.kind is origins_lib.VARIABLE):
          continue
        changed |= _propose(node, name, v, origin, e.forward, ctx)
  if not node.contraction or level >= levels.CONTRACTION:
    for e in node.readers:
      if e.backward > level:
        break
      c = e.consumer
      if not c.propagates or c.mode is nodes_lib.NodeMode.SUM:
        continue
      for name in e.dims:
        if name in owned:
          continue
        v = c.values.get(name)
        if not v:
          continue
        origin = c.origins[name]
        if (e.backward >= levels.CONTRACTION and level < levels.WEIGHTS and
            origin.root.kind is origins_lib.VARIABLE):
          continue
        changed |= _propose(node, name, v, origin,
                            max(e.backward, levels.CONTRACTION
                                if node.contraction else e.backward), ctx)
  if node.factors and level >= levels.CONTRACTION:
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
      local *= -(-d.size // shapes.prod(
          sizes.get(a, 1) for a in old.get(d.name) or ()))
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
    local *= -(-d.size // shapes.prod(
        sizes.get(a, 1) for a in values.get(d.name) or ()))
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


def _carry_factors(node, level, axis_sizes):
  """A reshape's paired dims (one factor, two names) take each other's
  axes where both sizes divide over them (or are equal)."""
  changed = False
  for a, size_a, b, size_b in node.factors:
    for src, dst in ((a, b), (b, a)):
      v = node.values.get(src)
      if not v or src in node.owned and dst in node.owned:
        continue
      if node.origins[src].root.kind is origins_lib.RULES:
        continue   # a rule names one dim; the other has its own rule
      if dst in node.owned:
        continue
      n = shapes.prod(axis_sizes.get(axis, 1) for axis in v)
      if size_a != size_b and (size_a % n or size_b % n):
        continue
      changed |= _propose(node, dst, v, node.origins[src], level,
                          axis_sizes)
  return changed


def propagate(nodes, level, axis_sizes):
  """Runs the proposals of every level <= level to a fixed point."""
  # What reached a node at lower levels is settled: only the proposals
  # this level enables are new -- along its edges, from a neighbour that
  # has something to say.
  seeds = set()
  for n in nodes:
    if not n.values or not n.propagates or n.mode is nodes_lib.NodeMode.SUM:
      continue
    weights = level == levels.WEIGHTS and any(
        o.root.kind is origins_lib.VARIABLE for o in n.origins.values())
    for e in n.readers:
      if e.forward == level or weights and e.forward >= levels.CONTRACTION:
        seeds.add(e.consumer)
    for e in n.inputs:
      if e.backward == level or weights and e.backward >= levels.CONTRACTION:
        seeds.add(e.producer)
    if level == levels.MIRROR:
      seeds.update(n.dependents)
  heap = [n.index for n in seeds if n.mode not in _SETTLED]
  heapq.heapify(heap)
  queued = set(heap)
  # Contractions decide first at their level, so that nothing copies a
  # wish they then weigh against their inputs.
  first = [n for n in reversed(nodes) if n.contraction and
           n.mode is nodes_lib.NodeMode.FREE
           ] if level >= levels.CONTRACTION else []
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
      if e.backward <= level and p.mode not in _SETTLED and \
          p.index not in queued:
        queued.add(p.index)
        heapq.heappush(heap, p.index)
    for e in node.readers:
      c = e.consumer
      if e.forward <= level and c.mode not in _SETTLED and \
          c.index not in queued:
        queued.add(c.index)
        heapq.heappush(heap, c.index)
    for d in node.dependents:
      if d.mode is not nodes_lib.NodeMode.SUM and d.index not in queued:
        queued.add(d.index)
        heapq.heappush(heap, d.index)
