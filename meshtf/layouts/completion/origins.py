"""Where each entry of a completed layout came from: an Origin is a root (an
annotation, a variable layout, a rule, a conflict) or a hop from a
neighbour's entry, so that each collective can say why it exists.

Example:
  >>> from meshtf.layouts.completion import origins
  >>> origins.rule_origin("batch", ("x",)).describe()
  'rules batch:x'
"""
import enum

from meshtf.layouts import layout_rules as rules_lib


class OriginKind(enum.StrEnum):
  """What an Origin is (a closed vocabulary: the completion and the
  collectives' reasons compare it; its value is what describe() and the
  reasons print): a root, or a hop from a neighbour's entry."""
  # Roots.
  ANNOTATION = "annotation"
  VARIABLE = "variable layout"
  RULES = "rules"
  CONFLICT = "whole (axis taken)"
  # Hops: a derived or mirror node copying its source, a dim left whole
  # like its input's annotation, a gradient's sum taking its parts'
  # layout or a rename's gradient its input's (defaults.py), and a
  # proposal at a level (its name, levels.LEVEL_NAMES; the mirror
  # level's is MIRROR).
  LAYOUT_OF = "layout of"
  MIRROR = "mirror"
  WHOLE_LIKE_INPUT = "whole like its input"
  SUM_OF_PARTS = "sum of its parts"
  RENAME_OF_GRADIENT = "rename of a gradient"
  ELEMENTWISE = "elementwise"
  BROADCAST_BACKWARD = "broadcast (backward)"
  CONTRACTION = "contraction"
  WEIGHTS = "weights"
  BROADCAST_FORWARD = "broadcast (forward)"


# The roots, as the package exports them (completion.ANNOTATION, ...).
ANNOTATION = OriginKind.ANNOTATION
VARIABLE = OriginKind.VARIABLE
RULES = OriginKind.RULES
CONFLICT = OriginKind.CONFLICT


class Origin(object):
  """Where one dim's axes in one operation's layout came from: a root (an
  annotation, a variable layout, a rule, a conflict) or a hop from a
  neighbour's entry (`previous`) at a level, into operation `op`.

  Example:
    >>> origin.root.kind.value, origin.root.label, origin.path()[-2:]
    ('annotation', "mtf.shard 'shard_5'", ['cast_15', 'square_1'])
  """
  __slots__ = ("kind", "label", "op", "previous", "root", "hops")

  def __init__(self, kind, label=None, op=None, previous=None):
    self.kind = kind   # an OriginKind
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


_RULE_ORIGINS = {}


def rule_origin(name, axes):
  """The (shared) Origin of a dim laid out by its rule."""
  key = (name, axes)
  if key not in _RULE_ORIGINS:
    _RULE_ORIGINS[key] = Origin(RULES, "%s:%s" % (
        name, rules_lib.axes_text(axes)) if axes else "(none for %r)" % name)
  return _RULE_ORIGINS[key]
