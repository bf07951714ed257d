"""The default level, in graph order: a dim an input holds whole by annotation
stays whole, else the rule, else whole (its axis is taken: the conflict is
recorded); the sum of a gradient's parts takes its parts' common layout.

Example:
  >>> for node in nodes_of:
  ...   if node.mode is not nodes.NodeMode.FIXED:
  ...     defaults.fill_default(node, rules)
"""
from meshtf.layouts import layout_rules as rules_lib
from meshtf.layouts.completion import levels
from meshtf.layouts.completion import nodes as nodes_lib
from meshtf.layouts.completion import origins as origins_lib
from meshtf.layouts.completion import propagation as propagation_lib


def fill_default(node, rules):
  """The default level for one node (graph order: its inputs and sources
  are final)."""
  if node.mode in nodes_lib.COPIES_SOURCE:
    propagation_lib.copy_source(node, levels.DEFAULT)
  elif node.mode is nodes_lib.NodeMode.SUM:
    _sum_layout(node)
  values, origins = node.values, node.origins
  for name in node.names:
    if name in values:
      continue
    inherited = None
    for e in node.inputs:
      v = e.producer.values.get(name)
      if v == () and (e.producer.origins[name].root.kind is
                      origins_lib.ANNOTATION):
        inherited = e.producer.origins[name]
        break
    if inherited is not None:
      values[name] = ()
      origins[name] = origins_lib.Origin(
          origins_lib.OriginKind.WHOLE_LIKE_INPUT, None, node.op.name,
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
      origins[name] = origins_lib.rule_origin(name, axes)
    else:
      values[name] = ()
      origins[name] = (origins_lib.rule_origin(name, ()) if not axes
                       else _conflict_origin(node, name, axes, taker))


def _conflict_origin(node, name, axes, taker):
  held = node.values[taker]
  taker_origin = node.origins[taker]

  def label():
    return "rule %s:%s, but %s holds %s (%s)" % (
        name, rules_lib.axes_text(axes), taker, rules_lib.axes_text(held),
        taker_origin.describe(2))
  return origins_lib.Origin(origins_lib.CONFLICT, label, node.op.name)


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
          node.origins[dim] = origins_lib.Origin(
              origins_lib.OriginKind.MIRROR if moved
              else origins_lib.OriginKind.RENAME_OF_GRADIENT, None, op.name,
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
      node.origins[name] = origins_lib.Origin(
          origins_lib.OriginKind.SUM_OF_PARTS, None, op.name,
          e.producer.origins[name])
    return
  src = node.source
  for name in node.owned:
    if name in src.values:
      node.values[name] = src.values[name]
      node.origins[name] = origins_lib.Origin(
          origins_lib.OriginKind.MIRROR, None, op.name, src.origins[name])
