"""Per-tensor layouts derived from layout rules, with validation (pure Python).

A TensorLayout lists, for each tensor dimension, the mesh axes it splits over:
one index, None (replicated along that dimension), or a tuple of indices
(split over several axes, major first).

    tensor [batch:64, hidden:128], mesh rows:2 x cols:4,
    rules batch:rows;hidden:cols  ->  TensorLayout((0, 1))

               cols=0    cols=1    cols=2    cols=3
    rows=0   b[0:32]   b[0:32]   b[0:32]   b[0:32]
             h[0:32]   h[32:64]  h[64:96]  h[96:128]
    rows=1   b[32:64]  ...

    rules batch:rows+cols  ->  TensorLayout(((0, 1), None)): processor
    (r, c) holds batch stripe r * 4 + c (of 8 stripes of 8).

Example:
  >>> from meshtf.shapes import convert_to_shape
  >>> from meshtf.layouts.layout_rules import convert_to_layout_rules
  >>> tensor_layout(convert_to_shape("batch:64;hidden:128"),
  ...               convert_to_shape("rows:2;cols:4"),
  ...               convert_to_layout_rules("batch:rows;hidden:cols"))
  TensorLayout((0, 1))
"""
from meshtf.layouts import errors


def _as_axes(entry):
  if entry is None:
    return ()
  if isinstance(entry, int):
    return (entry,)
  return tuple(entry)


class TensorLayout(object):
  """Mesh axes of each tensor dimension. Iterating gives Mesh TensorFlow's
  form (an axis index or None per dim; a tuple for a multi-axis dim);
  `dim_axes` gives tuples throughout."""

  def __init__(self, tensor_axis_to_mesh_axis):
    self._axes = tuple(_as_axes(e) for e in tensor_axis_to_mesh_axis)
    self._t2m = tuple(None if not a else a[0] if len(a) == 1 else a
                      for a in self._axes)

  @property
  def tensor_axis_to_mesh_axis(self):
    return self._t2m

  @property
  def dim_axes(self):
    """Per dim, the tuple of mesh axes it splits over (empty: none)."""
    return self._axes

  def __iter__(self):
    return iter(self._t2m)

  def __len__(self):
    return len(self._t2m)

  def __getitem__(self, i):
    return self._t2m[i]

  def __eq__(self, other):
    return isinstance(other, TensorLayout) and self._axes == other._axes

  def __hash__(self):
    return hash(self._axes)

  def __repr__(self):
    return "TensorLayout(%r)" % (self._t2m,)

  @property
  def is_fully_replicated(self):
    return not any(self._axes)

  def mesh_axis_to_tensor_axis(self, mesh_ndims):
    """For each of the first mesh_ndims mesh axes, the tensor axis split
    over it, or None (a tuple, as in Mesh TensorFlow).

    Example:
      >>> TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(2)
      (0, 2)
    """
    out = [None] * mesh_ndims
    for tensor_axis, axes in enumerate(self._axes):
      for mesh_axis in axes:
        if mesh_axis < mesh_ndims:
          out[mesh_axis] = tensor_axis
    return tuple(out)

  def split_mesh_axes(self):
    return sorted(m for axes in self._axes for m in axes)


def tensor_layout(tensor_shape, mesh_shape, layout_rules, tensor_name=None):
  """Computes and validates the layout of one tensor.

  Raises LayoutError naming the tensor, dimensions, mesh axis and sizes when two
  dimensions share a mesh axis. A dimension the mesh axes do not divide is
  split unevenly: every slice has ceil(size / axes size) positions, the last
  ones padded (see meshtf/layouts/mesh_layout.py).
  """
  return checked_layout(
      tensor_shape, mesh_shape,
      [layout_rules.tensor_dimension_to_mesh_axes(d, mesh_shape)
       for d in tensor_shape.dims], tensor_name)


def _sentence_start(text):
  """text with its first letter upper-cased and the rest as it is (str.
  capitalize would lower-case the tensor's name: "MoE1D" -> "moe1d")."""
  return text[:1].upper() + text[1:]


def checked_layout(tensor_shape, mesh_shape, dim_axes, tensor_name=None,
                   fix=None):
  """TensorLayout(dim_axes) for tensor_shape, after checking that no mesh
  axis splits two of its dims (LayoutError naming the tensor, both dims,
  the axis, the sizes and `fix`, by default the rules' fix)."""
  owner = {}
  for dim, axes in zip(tensor_shape.dims, dim_axes):
    for axis in axes:
      if axis in owner:
        other = owner[axis]
        mesh_dim = mesh_shape.dims[axis]
        raise errors.LayoutError(
            "%s with shape %s would split both dimension %r (size %d) and "
            "dimension %r (size %d) over mesh axis %r (size %d) of mesh %s. "
            "A tensor's dimensions must split over different mesh axes: %s."
            % (_sentence_start(errors.tensor_label(tensor_name)),
               errors.describe_shape(tensor_shape), other.name, other.size,
               dim.name, dim.size, mesh_dim.name, mesh_dim.size,
               errors.describe_mesh(mesh_shape),
               fix or "map one of %r, %r to another axis or drop its rule"
               % (other.name, dim.name)))
      owner[axis] = dim
  return TensorLayout(dim_axes)


def shard_size(size, num_shards):
  """ceil(size / num_shards): the slice size of a dim split num_shards ways.

  Example:
    >>> shard_size(250, 4), shard_size(8, 4)
    (63, 2)
  """
  return -(-size // num_shards)


def slice_shape(tensor_shape, mesh_shape, layout):
  """Per-processor slice sizes (integers) of a tensor under `layout`: the
  padded sizes ceil(size / axes size) where a dim splits unevenly."""
  out = []
  for dim, axes in zip(tensor_shape.dims, layout.dim_axes):
    out.append(shard_size(dim.size, mesh_shape.group_size(axes)))
  return out


def validate_device_count(mesh_shape, num_devices):
  """Raises LayoutError if the mesh does not have one processor per device."""
  if mesh_shape.size != num_devices:
    raise errors.LayoutError(
        "Mesh %s has %d processors but %d devices were given. Give exactly "
        "one device per processor, or change the mesh shape so the product "
        "of its axis sizes is %d."
        % (errors.describe_mesh(mesh_shape), mesh_shape.size, num_devices,
           num_devices))
