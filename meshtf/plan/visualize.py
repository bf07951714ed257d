"""Pictures of layouts: which processor holds which slice of a tensor, as
text (the README's table), like the Mesh-TensorFlow paper's figures and
jax.debug.visualize_array_sharding.

Example:
  >>> print(visualize_layout("vocab:250;d:4", mtf.MeshLayout("x:4", "vocab:x")))
  [vocab:250, d:4] on x:4
        x=0         x=1         x=2         x=3
        v[0:63]     v[63:126]   v[126:189]  v[189:250]
"""
from meshtf import shapes


def _abbrev(name, others):
  """The shortest prefix of a dim name that starts none of the `others`
  (d_model and d_ff: "d_m" and "d_f", so "d" never reads as either)."""
  for n in range(1, len(name) + 1):
    if not any(o.startswith(name[:n]) for o in others):
      return name[:n]
  return name


def _cell(mesh_layout, shape, pnum, abbrevs):
  begin = mesh_layout.slice_begin(shape, pnum)
  valid = mesh_layout.valid_slice_shape(shape, pnum)
  parts = []
  for s, b, v in zip(mesh_layout.dim_splits(shape), begin, valid):
    if s.is_split:
      parts.append("%s[%d:%d]" % (abbrevs[s.name], b, b + v) if v
                   else "%s[-]" % abbrevs[s.name])
  return " ".join(parts) or "all"


def _shown(n, limit=8):
  """Indices of a grid axis of n to draw: all, or the first 4 and the last
  (None stands for the ones left out)."""
  return list(range(n)) if n <= limit else [0, 1, 2, 3, None, n - 1]


def visualize_layout(tensor_or_shape, mesh_layout, lowering=None):
  """A text picture of a tensor's layout: one cell per processor (a grid
  for 1-D and 2-D meshes, one line per processor otherwise), naming the
  global ranges of its split dims ("[-]": only padding) -- "all" where a
  processor holds the whole tensor.

  tensor_or_shape: a Tensor, Variable operation or shape; mesh_layout: a
  MeshLayout (or a MeshImpl); lowering: optional, for a tensor whose
  layout is annotated or propagated (Lowering.layout_of).

  Example:
    >>> print(mtf.visualize_layout(w, impl))
  """
  tensor = getattr(tensor_or_shape, "outputs", [tensor_or_shape])[0] \
      if hasattr(tensor_or_shape, "outputs") else tensor_or_shape
  mesh_layout = getattr(mesh_layout, "mesh_layout", mesh_layout)
  if lowering is not None and hasattr(tensor, "operation"):
    mesh_layout = lowering.layout_of(tensor)
  shape = getattr(tensor, "shape", None)
  if not isinstance(shape, shapes.Shape):
    shape = shapes.convert_to_shape(tensor)
  abbrevs = {d.name: _abbrev(d.name, [o for o in shape.dimension_names
                                      if o != d.name])
             for d in shape.dims}
  mesh = mesh_layout.mesh_shape
  title = "%s on %s" % (shape, " x ".join("%s:%d" % (d.name, d.size)
                                          for d in mesh.dims))
  cells = [_cell(mesh_layout, shape, p, abbrevs)
           for p in range(mesh_layout.size)]
  if mesh.ndims > 2:
    return "\n".join([title] + [
        "  %s  %s" % (mesh_layout.pnum_to_processor_coordinates(p), c)
        for p, c in enumerate(cells)])
  rows, cols = ((1, mesh.dims[0].size) if mesh.ndims == 1
                else (mesh.dims[0].size, mesh.dims[1].size))
  width = max(len(c) for c in cells) + 2
  col_name = mesh.dims[-1].name
  row_name = mesh.dims[0].name if mesh.ndims == 2 else ""
  label = len(row_name) + 6

  def at(j, text):
    return ("..." if j is None else text).ljust(width)
  lines = [title, " " * label + "".join(
      at(j, "%s=%s" % (col_name, j)) for j in _shown(cols))]
  for i in _shown(rows) if rows > 1 else [0]:
    head = ("..." if i is None else "%s=%d" % (row_name, i)) if row_name \
        else ""
    lines.append(head.ljust(label) + "".join(
        at(j, "" if i is None else cells[i * cols + (j or 0)])
        for j in _shown(cols)))
  return "\n".join(line.rstrip() for line in lines)
