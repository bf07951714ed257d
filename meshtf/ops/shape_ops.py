"""Shape ops: reshape, rename_dimension, replace_dimensions, transpose,
anonymize / anonymous_shape (replicate a tensor) and combined_dimension.

reshape may change layouts, and so communicates (MeshImpl.reshape):
split -> unsplit is an allconcat, unsplit -> split a local slice, another
dim on the same mesh axis an alltoall. transpose only reorders local axes.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;io:6")
  >>> mtf.reshape(x, "batch:4;a:2;b:3").shape
  Shape([batch:4, a:2, b:3])
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts.relayout import StepKind
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import _local


class ReshapeOperation(graph_lib.Operation):
  """Reshape in row-major order to a shape with the same number of
  elements; dimension names (and so layouts) may change."""

  cost_kind = CostKind.FUSIBLE
  reshapes = True

  def __init__(self, x, new_shape, name=None):
    new_shape = shapes.convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise ValueError("reshape %s from %s (%d elements) to %s (%d elements):"
                       " sizes differ" % (x.name, x.shape, x.shape.size,
                                          new_shape, new_shape.size))
    super().__init__([x], name=name or "reshape")
    self._outputs = [graph_lib.Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [reshape(grad_ys[0], self._inputs[0].shape)]

  def layout_factors(self):
    """Each renamed dim with the dim of the other shape that has the same
    outer size (the product of the sizes before it): splitting both n ways
    selects the same elements where n divides both (or they are equal),
    as the relayout plan's cumprod rule says (meshtf/layouts/relayout.py).

    Example:
      >>> y = mtf.rename_dimension(x, "length", "memory_length")
      >>> y.operation.layout_factors()
      [('length', 'memory_length')]
    """
    old, new = self._inputs[0].shape, self._outputs[0].shape
    new_names = set(new.dimension_names)
    old_names = set(old.dimension_names)
    # Size-1 dims share their neighbour's outer size and split nothing.
    outer = {o: d.name for d, o in zip(new.dims, new.cumprod())
             if d.size > 1}
    pairs = []
    for d, o in zip(old.dims, old.cumprod()):
      b = outer.get(o)
      if (d.size > 1 and d.name not in new_names and b is not None
          and b not in old_names):
        pairs.append((d.name, b))
    return pairs

  def keeps_pending(self, pending_axes, layout):
    """A reshape the layout makes local (a rename: every step of its
    relayout plan a local reshape) is linear: the allreduce can wait."""
    if pending_axes[0] is None:
      return False
    x, out = self._inputs[0], self._outputs[0]
    return all(s.kind is StepKind.RESHAPE for s in layout.relayout_plan(
        x.shape, out.shape, x.dtype.size).steps)

  def view_input(self, index, graph_layout):
    """x, when the layouts make this reshape local with nothing moved (a
    rename): its lowering hands x's slices on."""
    if index:
      return None
    x, out = self._inputs[0], self._outputs[0]
    layout = graph_layout.op_layout(self)
    if (graph_layout.tensor_layout(x) != layout.tensor_layout(x.shape) or
        layout.slice_size(x.shape) != layout.slice_size(out.shape)):
      return None
    plan = layout.relayout_plan(x.shape, out.shape, x.dtype.size)
    return None if plan.steps else x

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, out = self._inputs[0], self._outputs[0]
    raw = lowering.pending_or_laid_out(x)
    if self.keeps_pending(pending_lib.pending_axes([raw]), impl.mesh_layout):
      plan = impl.mesh_layout.relayout_plan(x.shape, out.shape, x.dtype.size)
      lowering.set_tensor_lowering(out, pending_lib.PendingSum(
          impl, impl.execute_relayout(raw.laid_out, plan), raw.mesh_axes))
      return
    lowering.set_tensor_lowering(
        out, impl.reshape(lowering.tensors[x], x.shape, out.shape))


def reshape(x, new_shape, name=None):
  """x with new_shape (same number of elements, row-major order).

  Example:
    >>> y = mtf.reshape(x, [batch, mtf.Dimension("heads", 4), d_kv])
  """
  new_shape = shapes.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x, old_name, new_name):
  """x with dimension old_name renamed to new_name (x may also be a Shape).

  Example:
    >>> y = mtf.rename_dimension(x, "hidden", "hidden2")
  """
  if isinstance(x, shapes.Shape):
    return x.rename_dimension(old_name, new_name)
  return reshape(x, x.shape.rename_dimension(old_name, new_name),
                 name="rename_dimension")


def replace_dimensions(tensor_or_shape, old_dim_or_dims, new_dim_or_dims):
  """Replaces one dim (or a run of dims) by others, keeping the position.

  Example:
    >>> y = mtf.replace_dimensions(x, hidden, [heads, d_kv])
  """
  def as_list(d):
    return [shapes.convert_to_dimension(v) for v in d] \
        if isinstance(d, (list, tuple)) and not isinstance(
            d, shapes.Dimension) else [shapes.convert_to_dimension(d)]
  old, new = as_list(old_dim_or_dims), as_list(new_dim_or_dims)
  shape = (tensor_or_shape if isinstance(tensor_or_shape, shapes.Shape)
           else tensor_or_shape.shape)
  dims = shape.dims
  positions = [dims.index(d) if d in dims else -1 for d in old]
  if -1 in positions or positions != list(range(positions[0],
                                               positions[0] + len(old))):
    raise ValueError("replace_dimensions: %s must appear consecutively in %s"
                     % (old, shape))
  new_shape = shapes.Shape(dims[:positions[0]] + new +
                           dims[positions[0] + len(old):])
  if isinstance(tensor_or_shape, shapes.Shape):
    return new_shape
  return reshape(tensor_or_shape, new_shape, name="replace_dimensions")


class TransposeOperation(graph_lib.Operation):
  """Reorders dims; local only, since layouts follow dimension names."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, new_shape, name=None):
    new_shape = shapes.convert_to_shape(new_shape)
    if set(new_shape.dims) != set(x.shape.dims):
      raise ValueError("transpose %s: new shape %s must have the same dims "
                       "as %s" % (x.name, new_shape, x.shape))
    super().__init__([x], name=name or "transpose")
    self._outputs = [graph_lib.Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [transpose(grad_ys[0], self._inputs[0].shape)]

  def lower(self, lowering):
    x, out = self._inputs[0], self._outputs[0]
    old, new = x.shape.dimension_names, out.shape.dimension_names
    lowering.set_tensor_lowering(out, lowering.mesh_impl(self).slicewise(
        lambda t: _local.transpose_to(t, old, new), lowering.tensors[x]))


def transpose(x, new_shape, name=None):
  """x with its dims in the order of new_shape.

  Example:
    >>> xt = mtf.transpose(x, [io, batch])
  """
  new_shape = shapes.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return TransposeOperation(x, new_shape, name=name).outputs[0]


# --- anonymous dims ----------------------------------------------------------
def anonymous_shape(shape):
  """shape with its dims renamed "_anonymous_0", "_anonymous_1", ... (sizes
  kept). No layout rule names them, so a tensor of this shape is
  replicated: every processor holds all of it.

  Example:
    >>> mtf.anonymous_shape("batch:4;io:3")
    Shape([_anonymous_0:4, _anonymous_1:3])
  """
  shape = shapes.convert_to_shape(shape)
  return shapes.Shape([shapes.Dimension("_anonymous_%d" % i, d.size)
                       for i, d in enumerate(shape.dims)])


def anonymize(x, name=None):
  """x reshaped to anonymous_shape(x.shape): the same values, replicated on
  every processor (an allconcat over each mesh axis that splits x, none
  otherwise). Reshaping back to named dims is a local slice.

  Example:
    >>> everywhere = mtf.anonymize(logits)   # e.g. before a host export
  """
  return reshape(x, anonymous_shape(x.shape), name=name or "anonymize")


def combined_dimension(dims, name=None):
  """One Dimension as large as the product of dims' sizes, named name or
  the first dim's name (Mesh TensorFlow's helper, e.g. to flatten [heads,
  d_kv] into one dim with replace_dimensions).

  Example:
    >>> hidden = mtf.combined_dimension([heads, d_kv], name="hidden")
    >>> y = mtf.replace_dimensions(x, [heads, d_kv], hidden)
  """
  dims = [shapes.convert_to_dimension(d) for d in (dims or [])]
  if not dims:
    raise ValueError("combined_dimension: dims is empty; pass a list of one "
                     "or more Dimensions")
  return shapes.Dimension(name or dims[0].name, shapes.Shape(dims).size)
