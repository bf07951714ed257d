"""The completion pass: builds the graph of nodes, fixes the given layouts,
runs the propagation levels and the default level, and returns the
Completion (meshtf/layouts/completion/__init__.py describes the pass).

Example:
  >>> result = complete(layout, graph.operations, fixed)
  >>> result.values(h_op)
  {'batch': ('x',), 'd_ff': ('y',), 'd_model': ()}
"""
import contextlib
import gc

from meshtf.layouts.completion import defaults as defaults_lib
from meshtf.layouts.completion import levels
from meshtf.layouts.completion import nodes as nodes_lib
from meshtf.layouts.completion import propagation as propagation_lib


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
  with cyclic_collector_off():
    return _complete(mesh_layout, operations, fixed)


@contextlib.contextmanager
def cyclic_collector_off():
  """Python's cyclic garbage collector off inside the block (on again
  after, if it was on): for passes over a large graph that make a few
  small objects per operation and free almost none (the completion here,
  the plan's passes), where the collector would rescan the graph again
  and again.

    >>> with cyclic_collector_off():
    ...   gc.isenabled()
    False
  """
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
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
  nodes = [nodes_lib.Node(op, i, names_of) for i, op in enumerate(operations)]
  by_op = {n.op: n for n in nodes}
  nodes_lib.connect(nodes, by_op, names_of)
  for node in nodes:
    given = fixed.get(node.op)
    if given is not None:
      values, origin, propagates = given
      node.mode = nodes_lib.NodeMode.FIXED
      node.propagates = propagates
      for name in node.names:
        node.values[name] = tuple(values.get(name, ()))
        node.origins[name] = origin
    else:
      nodes_lib.classify(node, by_op)
  axis_sizes = {d.name: d.size for d in mesh_layout.mesh_shape.dims}
  for level in (levels.MIRROR,) + levels.PROPAGATION_LEVELS:
    propagation_lib.propagate(nodes, level, axis_sizes)
  rule_cache = {}

  def rules(name):
    axes = rule_cache.get(name)
    if axes is None:
      axes = rule_cache[name] = mesh_layout.layout_rules.mesh_axis_names(
          name)
    return axes
  for node in nodes:
    if node.mode is not nodes_lib.NodeMode.FIXED:
      defaults_lib.fill_default(node, rules)
  return Completion(nodes, by_op)
