"""Logical mesh -> physical processor order (Mesh TF's simd_mesh_impl
HierarchicalTiling and auto_logical_to_physical_tpu), pure Python.

A logical mesh axis is a tile of the physical mesh: spec[i] = (name,
tile shape over the physical dims). The last logical axis is the innermost
tile (stride 1); each earlier one strides over the later ones, so the
processors along the last axis are physical neighbours.

Example:
  >>> t = HierarchicalTiling([("dp", None), ("mp", [1, 2])], [2, 2])
  >>> t.mesh_shape.to_integer_list, t.logical_to_physical
  ([2, 2], [0, 1, 2, 3])
"""
import functools
import operator

from absl import flags

from meshtf import shapes


def _prod(values):
  return functools.reduce(operator.mul, values, 1)


def _row_major(index, sizes):
  """Coordinates of `index` in an array of `sizes` (row-major)."""
  coords = []
  for s in reversed(sizes):
    coords.append(index % s)
    index //= s
  return list(reversed(coords))


class HierarchicalTiling(object):
  """A logical mesh laid on a physical one by nested tiles.

  Args:
    spec: [(name, tile shape or None)] per logical axis; a None first tile
      is what the others leave of the physical mesh.
    physical_shape: sizes of the physical mesh's dims.
  """

  def __init__(self, spec, physical_shape):
    physical_shape = list(physical_shape)
    tiles = [None if t is None else list(t) for _, t in spec]
    if tiles and tiles[0] is None:
      tiles[0] = [p // _prod(t[j] for t in tiles[1:])
                  for j, p in enumerate(physical_shape)]
    # Strides: the last tile is innermost; each earlier tile strides over
    # the product of the later ones along every physical dim.
    strides, acc = [None] * len(tiles), [1] * len(physical_shape)
    for i in reversed(range(len(tiles))):
      strides[i] = list(acc)
      acc = [a * t for a, t in zip(acc, tiles[i])]
    if acc != physical_shape:
      raise ValueError("HierarchicalTiling: tiles %s multiply to %s, not the "
                       "physical shape %s" % (tiles, acc, physical_shape))
    sizes = [_prod(t) for t in tiles]
    self._mesh_shape = shapes.Shape([shapes.Dimension(name, s) for (name, _),
                                     s in zip(spec, sizes)])
    self._l2p = []
    for logical in range(_prod(sizes)):
      physical = [0] * len(physical_shape)
      for c, tile, stride in zip(_row_major(logical, sizes), tiles, strides):
        for j, (t, s) in enumerate(zip(_row_major(c, tile), stride)):
          physical[j] += t * s
      pnum = 0
      for c, p in zip(physical, physical_shape):
        pnum = pnum * p + c
      self._l2p.append(pnum)

  @property
  def logical_to_physical(self):
    """Physical processor number of each logical processor."""
    return list(self._l2p)

  @property
  def mesh_shape(self):
    return self._mesh_shape

  @staticmethod
  def spec_to_mesh_shape(spec, num_processors):
    """The logical mesh Shape of spec (a None tile takes the rest)."""
    sizes = [None if t is None else _prod(t) for _, t in spec]
    known = _prod(s for s in sizes if s is not None)
    return shapes.Shape([shapes.Dimension(name, num_processors // known
                                          if s is None else s)
                         for (name, _), s in zip(spec, sizes)])


def _greedy_tiles(logical_shape, physical_shape):
  """Tile shapes putting each logical axis on whole physical factors, the
  last logical axis on the minor physical dims; None if none is found."""
  left = list(physical_shape)
  tiles = []
  for size in reversed(logical_shape):
    tile = [1] * len(left)
    for j in reversed(range(len(left))):
      while size > 1 and left[j] > 1 and size % 2 == 0 and left[j] % 2 == 0:
        tile[j] *= 2
        left[j] //= 2
        size //= 2
      if size > 1 and left[j] % size == 0:
        tile[j] *= size
        left[j] //= size
        size = 1
    if size != 1:
      return None
    tiles.append(tile)
  return list(reversed(tiles))


def auto_logical_to_physical_tpu(logical_shape, physical_shape,
                                 return_coordinates=False):
  """A logical-to-physical processor order that keeps each logical axis on
  a compact physical tile where the sizes allow (else row-major).

  Example:
    >>> sorted(auto_logical_to_physical_tpu([4, 2], [2, 2, 2]))
    [0, 1, 2, 3, 4, 5, 6, 7]
  """
  logical_shape, physical_shape = list(logical_shape), list(physical_shape)
  if _prod(logical_shape) != _prod(physical_shape):
    raise ValueError("auto_logical_to_physical_tpu: logical %s and physical "
                     "%s meshes differ in size" % (logical_shape,
                                                   physical_shape))
  tiles = _greedy_tiles(logical_shape, physical_shape)
  if tiles is None:
    order = list(range(_prod(physical_shape)))
  else:
    spec = [("a%d" % i, t) for i, t in enumerate(tiles)]
    order = HierarchicalTiling(spec, physical_shape).logical_to_physical
  if return_coordinates:
    return [_row_major(p, physical_shape) for p in order]
  return order


def physical_shape_3d_from_topology_proto_4d(mesh_shape, fold_xy=None):
  """A TPU topology's 4-d mesh shape [x, y, z, cores] as the 3-d physical
  shape auto_logical_to_physical_tpu takes: [y * z, x, cores], or with
  fold_xy [x * y, z, cores] (a 3-d torus with x and y folded into one dim).

  fold_xy None reads Mesh TF's --fold_xy absl flag where the program
  defines one, else False (meshtf defines no flag on import).

  Example:
    >>> physical_shape_3d_from_topology_proto_4d([4, 4, 2, 2])
    [8, 4, 2]
    >>> physical_shape_3d_from_topology_proto_4d([4, 4, 2, 2], fold_xy=True)
    [16, 2, 2]
  """
  mesh_shape = list(mesh_shape)
  if len(mesh_shape) != 4:
    raise ValueError("physical_shape_3d_from_topology_proto_4d: expected a "
                     "4-d shape [x, y, z, cores], got %s" % (mesh_shape,))
  if fold_xy is None:
    fold_xy = "fold_xy" in flags.FLAGS and bool(flags.FLAGS["fold_xy"].value)
  x, y, z, cores = (int(v) for v in mesh_shape)
  return [x * y, z, cores] if fold_xy else [y * z, x, cores]
