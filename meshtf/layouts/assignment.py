"""Per-tensor layouts: annotations, variable layouts and their propagation
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

An annotation propagates forward: an operation lowers under one layout of
all its dims (its "computation layout") chosen from its inputs' layouts,
and its outputs keep that layout, so a few annotations lay out a whole
network (GSPMD annotates 7 tensors per Transformer layer). The choice, per
dim of the operation, takes the first of:

  1. a split of the dim in an input (activations before variables, then
     input order) -- output dims first, then the others (contracted dims);
  2. an input that holds the dim whole (so mtf.replicate propagates);
  3. the rules;

skipping any choice that would put two dims of one tensor (or of an
einsum, all its dims) on one mesh axis. Inputs whose layout differs are
relaid (the MeshLayout's relayout plans) before the operation runs. Without
annotations and variable rules every computation layout is the rules', and
nothing changes. Operations inside control flow (loop bodies, recomputed
functions) lower under the rules: their state keeps one layout.

Example:
  >>> layout = MeshLayout("x:2;y:4", "d_model:x;d_ff:y")
  >>> graph_layout = assign_layouts(layout, graph.operations)
  >>> graph_layout.tensor_layout(h)     # h = einsum(shard(x, ...), w_in)
  TensorLayout((0, None, 1))
"""
from meshtf.layouts import errors
from meshtf.layouts import layout_rules as rules_lib


class GraphLayout(object):
  """The computation layout (a MeshLayout) of every operation of a graph,
  and so the layout of every tensor: its producer's."""

  def __init__(self, base, op_layouts):
    self._base = base
    self._ops = op_layouts

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


def assign_layouts(mesh_layout, operations):
  """The GraphLayout of `operations` (in graph order, inner operations of
  control flow after their container, as lowering.all_operations yields
  them). Raises LayoutError (naming the tensor, dims, axes and the fix) for
  an annotation the mesh cannot place."""
  operations = list(operations)
  if not mesh_layout.variable_rules and not any(
      op.layout_spec is not None for op in operations):
    return GraphLayout(mesh_layout, {})
  forced = set()
  for op in operations:
    if op.inner_operations:
      forced.add(op)
      forced.update(_all_inner(op))
  graph = GraphLayout(mesh_layout, {})
  layouts = graph._ops  # pylint: disable=protected-access
  for op in operations:
    if op.layout_spec is not None:
      layout = _annotated(mesh_layout, op)
    elif op.layout_source is not None:
      layout = graph.tensor_mesh_layout(op.layout_source)
    elif op.creates_variable_slices and mesh_layout.variable_rules:
      layout = _variable_layout(mesh_layout, op.outputs[0].shape)
    elif op in forced:
      layout = mesh_layout
    else:
      layout = _propagated(mesh_layout, graph, op)
    if layout is not mesh_layout:
      layouts[op] = layout
  return graph


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
  names = shape.dimension_names
  chosen, used = [], set()
  for rules in (mesh_layout.variable_rules, mesh_layout.layout_rules):
    for name, _ in rules.pairs:
      axes = rules.mesh_axis_names(name)
      if (name in names and name not in dict(chosen)
          and not used & set(axes)):
        chosen.append((name, axes))
        used.update(axes)
  return mesh_layout.with_rules(rules_lib.LayoutRules(chosen))


def _propagated(mesh_layout, graph, op):
  """The computation layout of an operation without annotation (see the
  module docstring); the rules' if that one fails the op's own check."""
  groups = [set(t.shape.dimension_names) for t in op.inputs + op.outputs]
  groups += [set(g) for g in op.layout_dim_groups()]
  out_names = [n for t in op.outputs for n in t.shape.dimension_names]
  inputs = sorted(enumerate(op.inputs), key=lambda it: (
      it[1].operation.creates_variable_slices, it[0]))
  split, whole = [], []
  for _, t in inputs:
    layout = graph.tensor_mesh_layout(t)
    for s in layout.dim_splits(t.shape):
      (split if s.is_split else whole).append(
          (s.name, tuple(mesh_layout.mesh_axis_names(s.mesh_axes))))
  names = list(dict.fromkeys(out_names + [n for g in groups for n in g]))
  rules = [(n, tuple(mesh_layout.mesh_axis_names(
      mesh_layout.split_axes_of_name(n)))) for n in names]
  proposals = ([p for p in split if p[0] in out_names] +
               [p for p in split if p[0] not in out_names] + whole + rules)
  chosen = {}
  for name, axes in proposals:
    if name in chosen:
      continue
    taken = {a for g in groups if name in g for n in g if n in chosen
             for a in chosen[n]}
    if not taken & set(axes):
      chosen[name] = axes
  pairs = [(n, a) for n, a in chosen.items() if a]
  if sorted(pairs) == sorted(r for r in rules if r[1]):
    return mesh_layout
  layout = mesh_layout.with_rules(rules_lib.LayoutRules(pairs))
  try:
    layout.validate_operations([op])
  except errors.LayoutError:
    return mesh_layout  # the rules' layout (checked by the caller)
  return layout


def _text(rules):
  return ";".join("%s:%s" % p for p in rules.pairs)
