"""Layout rules: which tensor dimension names split over which mesh axes.

A rule maps a dimension name to one mesh axis ("batch:rows"), or to several
axes in order ("batch:rows+cols": GSPMD's tiling of one dim over several
mesh dims; the first axis is the major one, so processor (r, c) holds
stripe r * |cols| + c of the batch).

A rule naming a mesh axis the mesh lacks is an error (a typo should be
caught) unless the rules say `absent_axes="inactive"`: Mesh TensorFlow's
semantics, where such a rule simply does nothing on that mesh (T5's
defaults name "ensemble", "batch" and "model" and run on meshes with any of
them). Mesh TF's entry points (mtf.convert_to_layout_rules, the Mesh TF
MeshImpl constructors, meshtf.compat.install()) make inactive-mode rules;
MeshLayout keeps the rules a mesh uses (rules_on_mesh) and warns once.

Example:
  >>> rules = convert_to_layout_rules("batch:rows;hidden:cols")
  >>> sorted(rules.pairs)
  [('batch', 'rows'), ('hidden', 'cols')]
  >>> convert_to_layout_rules("batch:x+y").mesh_axis_names("batch")
  ('x', 'y')
"""
import enum
import re
import warnings

from meshtf.layouts import errors

_RULE_SPLIT = re.compile(r"[;,.\s]+")  # Mesh TF also allows "."
AXIS_JOIN = "+"  # "batch:x+y": one dim over several mesh axes, major first
_AXIS_NAME = re.compile(r"[A-Za-z0-9_\-]+")


def axes_text(axis_names):
  """The rule text of a tuple of axis names: ('x', 'y') -> 'x+y'."""
  return AXIS_JOIN.join(axis_names)


def parse_axes(value, what="layout rule"):
  """A rule's mesh axes as a tuple of names: 'x', 'x+y', ('x', 'y') or
  ['x', 'y']; raises LayoutError on a malformed one.

  Example:
    >>> parse_axes("x+y"), parse_axes(("x",))
    (('x', 'y'), ('x',))
  """
  if isinstance(value, str):
    names = tuple(value.split(AXIS_JOIN))
  elif isinstance(value, (tuple, list)):
    names = tuple(value)
  else:
    names = None
  if (not names or any(not isinstance(n, str) or not _AXIS_NAME.fullmatch(n)
                       for n in names)):
    raise errors.LayoutError(
        "%s: mesh axes %r are malformed: give one mesh axis name, or several "
        "joined by '+' in major-to-minor order (e.g. 'batch:x+y')"
        % (what, value))
  if len(set(names)) != len(names):
    raise errors.LayoutError(
        "%s: mesh axes %r name an axis twice; a dim splits over each mesh "
        "axis at most once" % (what, axes_text(names)))
  return names


class AbsentAxes(enum.StrEnum):
  """What a rule naming a mesh axis the mesh lacks does (a LayoutRules'
  policy; MeshLayout and rules_on_mesh dispatch on it)."""
  ERROR = "error"         # refused (meshtf's MeshLayout and binary)
  INACTIVE = "inactive"   # does nothing there (Mesh TensorFlow's semantics)


# The policies' names (as LayoutRules' error message lists them).
ABSENT_AXES = tuple(policy.value for policy in AbsentAxes)


class LayoutRules(object):
  """A set of (tensor dimension name, mesh axes) pairs. The axes are one
  mesh axis name, or several joined by '+' (major first).

  Args:
    pairs: (dim name, axes) pairs.
    absent_axes: "error" (default): a MeshLayout refuses a rule naming an
      axis its mesh lacks; "inactive": such a rule does nothing on that mesh
      (Mesh TensorFlow's semantics), with one warning naming it.

  Example:
    >>> LayoutRules([("batch", "all")]).mesh_axis_name("batch")
    'all'
  """

  def __init__(self, pairs, absent_axes="error"):
    if absent_axes not in ABSENT_AXES:
      raise ValueError("LayoutRules: absent_axes=%r; use one of %s"
                       % (absent_axes, ABSENT_AXES))
    self.absent_axes = AbsentAxes(absent_axes)
    self._pairs = []
    by_dim = {}
    for pair in pairs:
      try:
        dim_name, value = pair
      except (TypeError, ValueError):
        dim_name, value = None, None
      if not isinstance(dim_name, str):
        raise errors.LayoutError(
            "Layout rule %r must be a (tensor dimension name, mesh axis "
            "name) pair of strings" % (pair,))
      axes = parse_axes(value, "layout rule for %r" % dim_name)
      text = axes_text(axes)
      if (dim_name, text) in self._pairs:
        continue
      if dim_name in by_dim:
        raise errors.LayoutError(
            "Layout rules map tensor dimension %r to mesh axes %r and %r; "
            "give one rule per dimension: keep one, or split %r over both "
            "with '%s:%s'" % (dim_name, axes_text(by_dim[dim_name]), text,
                              dim_name, dim_name,
                              axes_text(by_dim[dim_name] + axes)))
      by_dim[dim_name] = axes
      self._pairs.append((dim_name, text))
    self._by_dim = by_dim

  def with_absent_axes(self, absent_axes):
    """These rules with another absent-axis policy (see ABSENT_AXES).

    Example:
      >>> convert_to_layout_rules("batch:b").with_absent_axes(
      ...     "inactive").absent_axes.value
      'inactive'
    """
    if absent_axes == self.absent_axes:
      return self
    return LayoutRules(self._pairs, absent_axes)

  def split_by_mesh(self, mesh_shape):
    """(rules whose axes mesh_shape has, as LayoutRules; the other pairs).

    Example:
      >>> from meshtf.shapes import convert_to_shape
      >>> active, inactive = convert_to_layout_rules(
      ...     "batch:batch;heads:model").split_by_mesh(
      ...         convert_to_shape("batch:8"))
      >>> active.pairs, inactive
      ([('batch', 'batch')], [('heads', 'model')])
    """
    names = {d.name for d in mesh_shape.dims}
    active, inactive = [], []
    for dim_name, text in self._pairs:
      ok = all(a in names for a in self._by_dim[dim_name])
      (active if ok else inactive).append((dim_name, text))
    if not inactive:
      return self.with_absent_axes(AbsentAxes.ERROR), []
    return LayoutRules(active), inactive

  @property
  def pairs(self):
    """[(dim name, axes text)], e.g. [('batch', 'x+y')]."""
    return list(self._pairs)

  def mesh_axis_name(self, dim_name):
    """The rule's axes text for dim_name ('x', 'x+y'), or None."""
    axes = self._by_dim.get(dim_name)
    return None if axes is None else axes_text(axes)

  def mesh_axis_names(self, dim_name):
    """The tuple of mesh axis names dim_name splits over (empty: none)."""
    return self._by_dim.get(dim_name, ())

  def tensor_dimension_to_mesh_axes(self, tensor_dimension, mesh_shape):
    """Indices in mesh_shape of the axes `tensor_dimension` splits over, in
    the rule's order (empty: replicated). Rules naming an axis missing from
    mesh_shape are ignored here (they may belong to another mesh);
    `validate_layout_rules` reports them."""
    names = [d.name for d in mesh_shape.dims]
    axes = self._by_dim.get(tensor_dimension.name, ())
    if any(a not in names for a in axes):
      return ()
    return tuple(names.index(a) for a in axes)

  def tensor_dimension_to_mesh_axis(self, tensor_dimension, mesh_shape):
    """Mesh TensorFlow's form: the index of the one mesh axis the dim
    splits over, or None; a tuple of indices for a multi-axis rule."""
    axes = self.tensor_dimension_to_mesh_axes(tensor_dimension, mesh_shape)
    if not axes:
      return None
    return axes[0] if len(axes) == 1 else axes

  def tensor_layout(self, tensor_shape, mesh_shape):
    """Mesh TensorFlow's form: the TensorLayout of tensor_shape on
    mesh_shape under these rules (LayoutError if two of its dims would
    split over one mesh axis).

    Example:
      >>> LayoutRules([("batch", "x")]).tensor_layout(
      ...     shapes.convert_to_shape("batch:4;d:2"),
      ...     shapes.convert_to_shape("x:2")).tensor_axis_to_mesh_axis
      (0, None)
    """
    from meshtf.layouts import tensor_layouts  # imports this module
    from meshtf import shapes
    return tensor_layouts.tensor_layout(
        shapes.convert_to_shape(tensor_shape),
        shapes.convert_to_shape(mesh_shape), self)

  def mesh_dimension_name_to_tensor_dimension_names(self, mesh_dim_name):
    """Mesh TensorFlow's form: the tensor dims whose rules split over the
    mesh axis named mesh_dim_name (alone or with others), in rule order.

    Example:
      >>> LayoutRules([("batch", "x"), ("d_ff", "x+y")]
      ...             ).mesh_dimension_name_to_tensor_dimension_names("x")
      ['batch', 'd_ff']
    """
    return [dim for dim, axes in self._by_dim.items()
            if mesh_dim_name in axes]

  def __repr__(self):
    extra = ("" if self.absent_axes is AbsentAxes.ERROR
             else ", absent_axes=%r" % self.absent_axes.value)
    return "LayoutRules(%r%s)" % (";".join("%s:%s" % p for p in self._pairs),
                                  extra)

  # Equal rules map every dim alike; the absent-axis policy is not compared
  # (it decides only what a mesh lacking an axis does with them).
  def __eq__(self, other):
    return isinstance(other, LayoutRules) and set(self._pairs) == set(other._pairs)

  def __hash__(self):
    return hash(frozenset(self._pairs))


def convert_to_layout_rules(x):
  """Converts a LayoutRules, string, dict or list of pairs to LayoutRules.

  Strings list dim:axes pairs separated by ';', ',', '.' or spaces; several
  axes for one dim are joined by '+'. Dict and pair values may also be
  tuples of axis names.

  Example:
    >>> convert_to_layout_rules({"batch": ("rows", "cols")}).pairs
    [('batch', 'rows+cols')]
  """
  if isinstance(x, LayoutRules):
    return x
  if x is None:
    return LayoutRules([])
  if isinstance(x, dict):
    return LayoutRules(list(x.items()))
  if isinstance(x, str):
    pairs = []
    for item in _RULE_SPLIT.split(x.strip()):
      if not item:
        continue
      parts = item.split(":")
      if len(parts) != 2 or not parts[0] or not parts[1]:
        raise errors.LayoutError(
            "Cannot parse %r in layout %r: write dim:mesh_axis pairs such as "
            "'batch:rows;hidden:cols' (a dim over several axes: "
            "'batch:rows+cols')" % (item, x))
      pairs.append((parts[0], parts[1]))
    return LayoutRules(pairs)
  try:
    pairs = list(x)
  except TypeError:   # 42: a layout is no number
    raise errors.LayoutError(
        "Layout %r (a %s) is not layout rules: give a string such as "
        "'batch:rows;hidden:cols', a dict {'batch': 'rows'} or a list of "
        "(dim, mesh axes) pairs" % (x, type(x).__name__)) from None
  return LayoutRules(pairs)


def rules_on_mesh(layout_rules, mesh_shape, warn=True):
  """The rules mesh_shape uses. Rules whose absent_axes is "error": all of
  them, after validate_layout_rules (LayoutError naming a rule with an axis
  the mesh lacks). "inactive" (Mesh TensorFlow's semantics): those whose
  axes the mesh has, with one warning naming the others.

  Example:
    >>> from meshtf.shapes import convert_to_shape
    >>> rules = convert_to_layout_rules("batch:batch;heads:model")
    >>> rules_on_mesh(rules.with_absent_axes("inactive"),
    ...               convert_to_shape("batch:8"), warn=False).pairs
    [('batch', 'batch')]
  """
  if layout_rules.absent_axes is AbsentAxes.ERROR:
    validate_layout_rules(layout_rules, mesh_shape)
    return layout_rules
  active, inactive = layout_rules.split_by_mesh(mesh_shape)
  if inactive and warn:
    axes = sorted({a for dim, _ in inactive
                   for a in layout_rules.mesh_axis_names(dim)
                   if a not in {d.name for d in mesh_shape.dims}})
    warnings.warn(
        "Layout rule%s %s name%s mesh ax%s %s that mesh %s lacks: inactive "
        "on this mesh, as in Mesh TensorFlow (those dims are not split by "
        "them). meshtf's MeshLayout and binary refuse such rules."
        % ("s" if len(inactive) > 1 else "",
           ", ".join("'%s:%s'" % p for p in inactive),
           "" if len(inactive) > 1 else "s",
           "es" if len(axes) > 1 else "is", ", ".join(map(repr, axes)),
           errors.describe_mesh(mesh_shape)),
        errors.InactiveLayoutRuleWarning, stacklevel=3)
  return active


# closest_name's similarity (difflib's ratio) above which a rule's dim is
# taken for a misspelling of a graph's dim: "batchh" / "batch" 0.91,
# "dmodel" / "d_model" 0.92; "length" / "memory_length" 0.63 and "experts" /
# "expert_hidden" 0.6 are other dims.
TYPO_CUTOFF = 0.8


def closest_name(name, names, cutoff=0.6):
  """The name of `names` a misspelt `name` most likely means (the same but
  for case first, then the nearest by difflib above cutoff), or None.

  Example:
    >>> closest_name("Batch", ["batch", "heads"]), closest_name("hiden",
    ...     ["hidden", "io"]), closest_name("zz", ["batch"])
    ('batch', 'hidden', None)
  """
  import difflib
  names = sorted(set(names))
  same_case = [n for n in names if n.lower() == name.lower()]
  if same_case:
    return same_case[0]
  near = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
  return near[0] if near else None


def unknown_dim_message(rule_text, dim_name, dim_names, what="graph",
                        fix=None, cutoff=0.6):
  """The one line of a rule naming a dim that no tensor of a graph has:
  the rule, the closest dim name, the dims there are, the fix (default:
  the rule with the closest name; `fix(near)` words it otherwise).

  Example:
    >>> unknown_dim_message("Batch:data", "Batch", ["batch", "heads"])
    "layout rule 'Batch:data' names dim 'Batch', which no tensor of the
    graph has, so it would split nothing: did you mean 'batch'? (the
    graph's dims: batch, heads): write 'batch:data'"
  """
  near = closest_name(dim_name, dim_names, cutoff)
  listed = sorted(set(dim_names))
  shown = ", ".join(listed[:24]) + (", ..." if len(listed) > 24 else "")
  if fix is not None:
    advice = fix(near)
  elif near:
    advice = "write '%s'" % (near + rule_text[len(dim_name):])
  else:
    advice = "fix the dim name, or drop the rule"
  return ("layout rule '%s' names dim %r, which no tensor of the %s has, so "
          "it would split nothing%s (the %s's dims: %s): %s" % (
              rule_text, dim_name, what,
              ": did you mean %r?" % near if near else "", what,
              shown or "none", advice))


def unknown_rule_dims(layout_rules, dim_names):
  """The (dim name, axes text) rules of layout_rules whose dim is not in
  dim_names, in rule order (what check_rule_dims refuses).

  Example:
    >>> unknown_rule_dims(convert_to_layout_rules("Batch:x;heads:y"),
    ...                   {"batch", "heads"})
    [('Batch', 'x')]
  """
  names = set(dim_names)
  return [(d, text) for d, text in layout_rules.pairs if d not in names]


def validate_layout_rules(layout_rules, mesh_shape):
  """Raises LayoutError if a rule names a mesh axis that mesh_shape lacks.

  Example:
    >>> from meshtf.shapes import convert_to_shape
    >>> validate_layout_rules(convert_to_layout_rules("batch:rows"),
    ...                       convert_to_shape("rows:2"))
  """
  axis_names = [d.name for d in mesh_shape.dims]
  for dim_name, text in layout_rules.pairs:
    for axis_name in layout_rules.mesh_axis_names(dim_name):
      if axis_name not in axis_names:
        raise errors.LayoutError(
            "Layout rule '%s:%s' names mesh axis %r, but mesh %s has axes %s. "
            "Fix the rule to use one of %s, or add %r to the mesh shape."
            % (dim_name, text, axis_name, errors.describe_mesh(mesh_shape),
               axis_names, axis_names, axis_name))
