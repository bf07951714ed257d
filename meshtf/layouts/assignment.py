"""Per-tensor layouts: annotations, variable layouts and their completion
(GSPMD sections 3.1-3.5), pure Python.

By default every tensor is laid out by the mesh layout's rules (Mesh
TensorFlow's model). Three things override that for a tensor:

  mtf.shard(x, "batch:x;d_model:y")   this tensor has exactly this layout
  mtf.replicate(x)                    (dims not named are replicated)
  get_variable(..., layout=...)       a variable's stored layout
  MeshLayout(..., variable_rules=...) the stored layout of every variable:
                                      these rules in order, then the layout
                                      rules, skipping any that would put two
                                      of its dims on one axis

Each operation lowers under one layout of all its dims (its "computation
layout"), and its outputs keep it; an input laid out otherwise is relaid
(the MeshLayout's relayout plans) before the operation runs. The sharding
completion (meshtf/layouts/completion/) chooses every computation layout
from the annotations, forward and backward, as GSPMD does: annotations and
variable layouts fixed; a backward operation mirrors the forward operation
whose gradient it is; then elementwise neighbours, broadcasts backward,
contractions and reshapes, weights, broadcasts forward, each to a fixed
point; the rules last, for what nothing else decides. So a few annotations
lay out a whole network (GSPMD annotates 7 tensors per Transformer layer)
and its backward pass. Without annotations and variable rules every
computation layout is the rules', and nothing changes. Operations inside
control flow (loop bodies, recomputed functions) and imported host data
lower under the rules: their state and their input keep one layout.

Every dim of every computation layout records its Origin (the annotation,
variable layout or rule, and the operations it travelled through):
GraphLayout.origins(op), GraphLayout.describe(tensor).

Example:
  >>> layout = MeshLayout("x:2;y:4", "d_model:x;d_ff:y")
  >>> graph_layout = assign_layouts(layout, graph.operations)
  >>> graph_layout.tensor_layout(h)     # h = einsum(shard(x, ...), w_in)
  TensorLayout((0, None, 1))
"""
from meshtf.layouts import completion as completion_lib
from meshtf.layouts import errors
from meshtf.layouts import layout_rules as rules_lib


class GraphLayout(object):
  """The computation layout (a MeshLayout) of every operation of a graph,
  and so the layout of every tensor: its producer's; with the Origin of
  each dim's axes where the layouts were completed."""

  def __init__(self, base, op_layouts, completion=None):
    self._base = base
    self._ops = op_layouts
    self._completion = completion

  base = property(lambda self: self._base)

  @property
  def is_trivial(self):
    """True when every operation lowers under the base rules."""
    return not self._ops

  def op_layout(self, op):
    """The MeshLayout op lowers under."""
    return self._ops.get(op, self._base)

  def tensor_mesh_layout(self, tensor):
    """The MeshLayout whose rules lay out tensor (its producer's)."""
    return self.op_layout(tensor.operation)

  def tensor_layout(self, tensor):
    return self.op_layout(tensor.operation).tensor_layout(tensor.shape,
                                                          tensor.name)

  def origins(self, op):
    """{dim name: Origin} of op's computation layout (completion.Origin:
    the annotation, variable layout or rule behind each dim's axes, and
    the operations it came through); every dim from the rules where no
    completion ran."""
    node = self._completion.node(op) if self._completion else None
    if node is not None:
      return dict(node.origins)
    rules = self._base.layout_rules
    return {n: completion_lib.rule_origin(n, rules.mesh_axis_names(n))
            for t in op.outputs + op.inputs
            for n in t.shape.dimension_names}

  def describe(self, tensor, op=None, brief=False):
    """The layout of tensor -- as its producer makes it, or as `op`
    computes with it -- one phrase per dim with its origin, e.g.
    "batch:x (annotation mtf.shard 'shard_5', via add_6), length whole".
    brief: each origin as its kind only, without operation names (the
    same for every layer of a model)."""
    op = op or tensor.operation
    layout = self.op_layout(op)
    origins = self.origins(op)
    parts = []
    for s in layout.dim_splits(tensor.shape):
      axes = layout.mesh_axis_names(s.mesh_axes)
      origin = origins.get(s.name)
      what = ("%s:%s" % (s.name, rules_lib.axes_text(axes)) if axes
              else "%s whole" % s.name)
      # A whole dim says why only where its rule lost its axis.
      if origin and (axes or origin.root.kind is completion_lib.CONFLICT):
        what = "%s (%s)" % (what, origin.root.kind if brief
                            else origin.describe())
      parts.append(what)
    return ", ".join(parts) or "a scalar"


def assign_layouts(mesh_layout, operations):
  """The GraphLayout of `operations` (in graph order, inner operations of
  control flow after their container, as lowering.all_operations yields
  them). Raises LayoutError (naming the tensor, dims, axes and the fix) for
  an annotation the mesh cannot place."""
  operations = list(operations)
  if not mesh_layout.variable_rules and not any(
      op.layout_spec is not None for op in operations):
    return GraphLayout(mesh_layout, {})
  return complete_layouts(mesh_layout, operations)


def complete_layouts(mesh_layout, operations):
  """assign_layouts without its shortcut for graphs with nothing to
  complete (tests run both to show the completion then keeps the rules)."""
  fixed = {}
  for op in operations:
    if op.inner_operations:
      _fix(fixed, mesh_layout, op, mesh_layout, _CONTROL_FLOW, True)
      for inner in _all_inner(op):
        _fix(fixed, mesh_layout, inner, mesh_layout, _CONTROL_FLOW, True)
  for op in operations:
    if op in fixed:
      continue
    if op.layout_spec is not None:
      kind = (completion_lib.VARIABLE if op.creates_variable_slices
              else completion_lib.ANNOTATION)
      _fix(fixed, mesh_layout, op, _annotated(mesh_layout, op),
           completion_lib.Origin(kind, "%s (%s)" % (
               op.layout_label, _text(op.layout_spec) or "replicated"),
                                 op.name), True)
    elif op.creates_variable_slices and mesh_layout.variable_rules:
      layout = _variable_layout(mesh_layout, op.outputs[0].shape)
      _fix(fixed, mesh_layout, op, layout, completion_lib.Origin(
          completion_lib.VARIABLE, "variable_rules %s for %r" % (
              _text(mesh_layout.variable_rules), op.name), op.name), True)
    elif op.imports_host_slices:
      _fix(fixed, mesh_layout, op, mesh_layout, _IMPORTED, True)
  result = completion_lib.complete(mesh_layout, operations, fixed)
  cache = {}
  layouts = {}
  rules = mesh_layout.layout_rules
  ruled = {}
  for node in result:
    op = node.op
    values = node.values
    same = True
    for n in node.names:
      if n not in ruled:
        ruled[n] = rules.mesh_axis_names(n)
      if values.get(n, ()) != ruled[n]:
        same = False
        break
    if same:
      continue
    key = tuple(sorted((n, v) for n, v in values.items() if v))
    layout = cache.get(key)
    if layout is None:
      layout = cache[key] = mesh_layout.with_rules(_rules(key))
    if op not in fixed:
      try:
        layout.validate_operations([op])
      except errors.LayoutError:
        continue   # the rules' layout (checked by the caller)
    layouts[op] = layout
  return GraphLayout(mesh_layout, layouts, result)


_RULES = {}


def _rules(pairs):
  """LayoutRules of ((dim name, axis names), ...), parsed once."""
  rules = _RULES.get(pairs)
  if rules is None:
    rules = _RULES[pairs] = rules_lib.LayoutRules(
        [(n, rules_lib.axes_text(v)) for n, v in pairs])
  return rules


_CONTROL_FLOW = completion_lib.Origin(completion_lib.RULES,
                                      "(inside control flow)")
_IMPORTED = completion_lib.Origin(completion_lib.RULES, "(imported data)")


def _fix(fixed, mesh_layout, op, layout, origin, propagates):
  """Records op's given layout for the completion."""
  rules = layout.layout_rules
  names = {n for t in op.outputs + op.inputs for n in t.shape.dimension_names}
  fixed[op] = ({n: rules.mesh_axis_names(n) for n in names}, origin,
               propagates)


def _all_inner(op):
  for inner in op.inner_operations:
    yield inner
    yield from _all_inner(inner)


def _annotated(mesh_layout, op):
  """The layout an annotated operation (mtf.shard, a variable's layout)
  gives its output: exactly the annotation."""
  out = op.outputs[0]
  rules = op.layout_spec
  for dim_name, text in rules.pairs:
    for axis in rules.mesh_axis_names(dim_name):
      if axis not in mesh_layout.mesh_shape.dimension_names:
        raise errors.LayoutError(
            "%s (layout %r of %s with shape %s) names mesh axis %r, but mesh "
            "%s has axes %s: use one of them" % (
                op.layout_label, _text(rules), errors.tensor_label(out.name),
                errors.describe_shape(out.shape), axis,
                errors.describe_mesh(mesh_layout.mesh_shape),
                mesh_layout.mesh_shape.dimension_names))
  layout = mesh_layout.with_rules(rules)
  try:
    layout.tensor_layout(out.shape, out.name)
  except errors.LayoutError as e:
    raise errors.LayoutError("%s (layout %r): %s" % (
        op.layout_label, _text(rules), str(e).replace(
            "map one of", "in the annotation, map one of")))
  return layout


def _variable_layout(mesh_layout, shape):
  """A variable's stored layout under variable_rules: its rules in order,
  then the layout rules, each skipped where it would put two of the
  variable's dims on one axis (so "experts:data;d_model:data" splits the
  expert weights by experts and the other weights by d_model)."""
  names = tuple(shape.dimension_names)
  key = (mesh_layout, names)
  if key not in _VARIABLE_LAYOUTS:
    chosen, used = [], set()
    for rules in (mesh_layout.variable_rules, mesh_layout.layout_rules):
      for name, _ in rules.pairs:
        axes = rules.mesh_axis_names(name)
        if (name in names and name not in dict(chosen)
            and not used & set(axes)):
          chosen.append((name, axes))
          used.update(axes)
    _VARIABLE_LAYOUTS[key] = mesh_layout.with_rules(
        rules_lib.LayoutRules(chosen))
  return _VARIABLE_LAYOUTS[key]


_VARIABLE_LAYOUTS = {}   # (MeshLayout, dim names) -> MeshLayout


def _text(rules):
  return ";".join("%s:%s" % p for p in rules.pairs)
