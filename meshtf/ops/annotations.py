"""Sharding annotations (GSPMD 3.1, 3.5): shard and replicate.

`shard(x, layout)` is x with exactly `layout` (dim:mesh-axes pairs, as
layout rules; dims it does not name are replicated), whatever the mesh
layout's rules say; `replicate(x)` is x whole on every processor. The
lowering relays x into the annotated layout (the MeshLayout's relayout
plan: allconcat / allsplit / alltoall) and the operations that read the
result lower under it too (forward propagation, see
meshtf/layouts/assignment.py). The gradient carries the adjoint relayout:
it is laid out like x.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:8;d_model:16")
  >>> mtf.shard(x, "batch:x;d_model:y").shape
  Shape([batch:8, d_model:16])
"""
from meshtf import graph as graph_lib
from meshtf.layouts import errors
from meshtf.layouts import layout_rules as rules_lib
from meshtf.op_kinds import CostKind


def annotation_rules(tensor_or_shape, layout, what):
  """The LayoutRules of an annotation of a tensor (or a variable's shape):
  parsed, and naming only its dims; one LayoutError naming the tensor, the
  dims and the fix otherwise."""
  shape = getattr(tensor_or_shape, "shape", tensor_or_shape)
  label = "%s of %s with shape %s" % (
      what, errors.tensor_label(getattr(tensor_or_shape, "name", None)),
      errors.describe_shape(shape))
  try:
    rules = rules_lib.convert_to_layout_rules(layout)
  except errors.LayoutError as e:
    raise errors.LayoutError("%s: %s" % (label, e))
  unknown = [d for d, _ in rules.pairs if not shape.has_dim_name(d)]
  if unknown:
    raise errors.LayoutError(
        "%s: layout %r names dims %s that the tensor does not have; name "
        "only its dims %s" % (label, layout, unknown, shape.dimension_names))
  return rules


class _Relayout(graph_lib.Operation):
  """An identity whose output has another layout than its input (the
  lowering relays the input before lower() runs). Its gradient is laid out
  like its input: the adjoint relayout."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, name):
    super().__init__([x], name=name)
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  @property
  def has_gradient(self):
    return self._inputs[0].dtype.is_floating

  def gradient(self, grad_ys):
    return [LayoutLikeOperation(grad_ys[0], self._inputs[0]).outputs[0]]

  def keeps_pending(self, pending_axes, layout):
    """An identity: a pending sum read in its own layout stays pending
    (one the new layout relays is reduced by the relayout first)."""
    return True

  def view_input(self, index, graph_layout):
    """x, where graph_layout lays the output out as x: nothing moves."""
    x, out = self._inputs[0], self._outputs[0]
    same = (graph_layout.tensor_layout(x) ==
            graph_layout.tensor_layout(out))
    return x if same and not index else None

  def lower(self, lowering):
    # A sum still pending over axes the new layout keeps stays pending.
    lowering.set_tensor_lowering(self._outputs[0],
                                 lowering.pending_or_laid_out(self._inputs[0]))


class ShardOperation(_Relayout):
  """x, laid out exactly as layout_spec says."""

  def __init__(self, x, layout, name=None):
    rules = annotation_rules(x, layout, "mtf.shard")
    super().__init__(x, name or "shard")
    self.layout_spec = rules

  @property
  def layout_label(self):
    return "mtf.shard %r" % self.name


class LayoutLikeOperation(_Relayout):
  """x, laid out like the tensor `like`."""

  def __init__(self, x, like, name=None):
    if x.shape != like.shape:
      raise ValueError("layout_like: %s %s and %s %s differ in shape" % (
          x.name, x.shape, like.name, like.shape))
    super().__init__(x, name or "layout_like")
    self.layout_source = like


def shard(x, layout, name=None):
  """x with exactly `layout` for this tensor: dim:mesh-axes pairs as in
  layout rules ("batch:x;d_model:y", "batch:x+y"), dims not named
  replicated. Operations reading the result inherit the layout (see
  meshtf/layouts/assignment.py); the gradient is laid out like x.

  Example:
    >>> h = mtf.shard(h, "batch:x;d_model:y")   # GSPMD's 2D finalized BSM
  """
  return ShardOperation(x, layout, name=name).outputs[0]


def replicate(x, name=None):
  """x whole on every processor (shard(x, "")).

  Example:
    >>> logits = mtf.replicate(logits)
  """
  return ShardOperation(x, "", name=name or "replicate").outputs[0]


__all__ = ["shard", "replicate"]
