"""Per-tensor layouts derived from layout rules, with validation (pure Python).

A TensorLayout lists, for each tensor dimension, the index of the mesh axis it
splits over or None (replicated along that dimension).

    tensor [batch:64, hidden:128], mesh rows:2 x cols:4,
    rules batch:rows;hidden:cols  ->  TensorLayout((0, 1))

               cols=0    cols=1    cols=2    cols=3
    rows=0   b[0:32]   b[0:32]   b[0:32]   b[0:32]
             h[0:32]   h[32:64]  h[64:96]  h[96:128]
    rows=1   b[32:64]  ...

Example:
  >>> from meshtf.shapes import convert_to_shape
  >>> from meshtf.layouts.layout_rules import convert_to_layout_rules
  >>> tensor_layout(convert_to_shape("batch:64;hidden:128"),
  ...               convert_to_shape("rows:2;cols:4"),
  ...               convert_to_layout_rules("batch:rows;hidden:cols"))
  TensorLayout((0, 1))
"""
from meshtf.layouts import errors


class TensorLayout(object):
  """Mesh axis index (or None) for each tensor dimension."""

  def __init__(self, tensor_axis_to_mesh_axis):
    self._t2m = tuple(tensor_axis_to_mesh_axis)

  @property
  def tensor_axis_to_mesh_axis(self):
    return self._t2m

  def __iter__(self):
    return iter(self._t2m)

  def __len__(self):
    return len(self._t2m)

  def __getitem__(self, i):
    return self._t2m[i]

  def __eq__(self, other):
    return isinstance(other, TensorLayout) and self._t2m == other._t2m

  def __hash__(self):
    return hash(self._t2m)

  def __repr__(self):
    return "TensorLayout(%r)" % (self._t2m,)

  @property
  def is_fully_replicated(self):
    return all(m is None for m in self._t2m)

  def mesh_axis_to_tensor_axis(self, mesh_ndims):
    """For each mesh axis, the tensor axis split over it, or None."""
    out = [None] * mesh_ndims
    for tensor_axis, mesh_axis in enumerate(self._t2m):
      if mesh_axis is not None:
        out[mesh_axis] = tensor_axis
    return out

  def split_mesh_axes(self):
    return sorted(m for m in self._t2m if m is not None)


def tensor_layout(tensor_shape, mesh_shape, layout_rules, tensor_name=None):
  """Computes and validates the layout of one tensor.

  Raises LayoutError naming the tensor, dimensions, mesh axis and sizes when two
  dimensions share a mesh axis. A dimension the mesh axis does not divide is
  split unevenly: every slice has ceil(size / axis size) positions, the last
  ones padded (see meshtf/layouts/mesh_layout.py).
  """
  t2m = []
  owner = {}
  for dim in tensor_shape.dims:
    axis = layout_rules.tensor_dimension_to_mesh_axis(dim, mesh_shape)
    if axis is not None:
      mesh_dim = mesh_shape.dims[axis]
      if axis in owner:
        other = owner[axis]
        raise errors.LayoutError(
            "%s with shape %s would split both dimension %r (size %d) and "
            "dimension %r (size %d) over mesh axis %r (size %d) of mesh %s. "
            "A tensor's dimensions must split over different mesh axes: "
            "map one of %r, %r to another axis or drop its rule."
            % (errors.tensor_label(tensor_name).capitalize(),
               errors.describe_shape(tensor_shape), other.name, other.size,
               dim.name, dim.size, mesh_dim.name, mesh_dim.size,
               errors.describe_mesh(mesh_shape), other.name, dim.name))
      owner[axis] = dim
    t2m.append(axis)
  return TensorLayout(t2m)


def shard_size(size, num_shards):
  """ceil(size / num_shards): the slice size of a dim split num_shards ways.

  Example:
    >>> shard_size(250, 4), shard_size(8, 4)
    (63, 2)
  """
  return -(-size // num_shards)


def slice_shape(tensor_shape, mesh_shape, layout):
  """Per-processor slice sizes (integers) of a tensor under `layout`: the
  padded sizes ceil(size / axis size) where a dim splits unevenly."""
  return [dim.size if axis is None
          else shard_size(dim.size, mesh_shape.dims[axis].size)
          for dim, axis in zip(tensor_shape.dims, layout)]


def validate_device_count(mesh_shape, num_devices):
  """Raises LayoutError if the mesh does not have one processor per device."""
  if mesh_shape.size != num_devices:
    raise errors.LayoutError(
        "Mesh %s has %d processors but %d devices were given. Give exactly "
        "one device per processor, or change the mesh shape so the product "
        "of its axis sizes is %d."
        % (errors.describe_mesh(mesh_shape), mesh_shape.size, num_devices,
           num_devices))
