"""Pictures of a whole model's variables over the mesh, as one PNG: which
processors hold which block of every variable, like the Mesh-TensorFlow
paper's figures and jax.debug.visualize_array_sharding.

One panel per variable, largest first; variables with the same shape and
the same layout share a panel that says how many they are. A panel draws
the tensor with its first dim vertical and the product of the others
horizontal (a 1-D variable as one bar), cut into the blocks its layout
makes. A block is coloured by the lowest-numbered processor that holds it
and labelled with the mesh coordinates that pick it ("x=1,y=3", "x=1", or
"all" where every processor holds the whole variable) when a panel has at
most 64 blocks. Uneven splits (GSPMD 4.1) show their padding hatched.

The horizontal dims are drawn split dims first (a transpose, which the
layout does not care about), so a block is one rectangle. With two or
more split dims among them, the horizontal axis is grouped by block:
sizes and owners are exact, positions inside a block are not.

`variable_panels` computes the panels (pure Python); `draw_variable_layouts`
draws them with matplotlib's Agg backend (imported only there).

Example:
  >>> report = mtf.plan.plan(graph, mtf.MeshLayout("x:2;y:4", "d_ff:y"))
  >>> panels = draw_variable_layouts(graph, report.graph_layout,
  ...                                "/tmp/layouts.png")
  >>> [b["label"] for b in panels[0]["blocks"]]
  ['y=0', 'y=1', 'y=2', 'y=3']
"""
import os

from meshtf import shapes

# Above this many blocks a panel's labels would overlap: colours only.
MAX_LABELLED_BLOCKS = 64
PADDING_HATCH = "////"


def _rules_text(mesh_layout, splits):
  """'d_model:x; d_ff:y' for the split dims ('x+y': over two axes)."""
  names = mesh_layout.mesh_shape.dimension_names
  parts = ["%s:%s" % (s.name, "+".join(names[a] for a in s.mesh_axes))
           for s in splits if s.is_split]
  return "; ".join(parts) or "replicated"


def _name_pattern(names):
  """'decoder/*/wi/kernel' for names that differ only in some '/'
  components; else the first name and how many more."""
  if len(names) == 1:
    return names[0]
  parts = [n.split("/") for n in names]
  if len({len(p) for p in parts}) == 1:
    return "/".join(p[0] if len(set(p)) == 1 else "*"
                    for p in zip(*parts))
  return "%s and %d more" % (names[0], len(names) - 1)


def _blocks(mesh_layout, shape, splits):
  """The distinct blocks of one variable: geometry in the drawing (rows
  from the top, columns from the left, padded extents) and holders."""
  vertical = splits[0] if len(splits) >= 2 else None
  horizontal = splits[1:] if len(splits) >= 2 else splits
  split_h = [s for s in horizontal if s.is_split]
  whole_width = shapes.prod(s.size for s in horizontal if not s.is_split)
  block_width = shapes.prod(s.shard_size for s in split_h) * whole_width
  split_axes = sorted({a for s in splits for a in s.mesh_axes})
  mesh_names = mesh_layout.mesh_shape.dimension_names
  blocks = {}
  for pnum in range(mesh_layout.size):
    coords = mesh_layout.pnum_to_processor_coordinates(pnum)
    index = 0
    valid_width = whole_width
    for s in split_h:
      shard = s.shard(coords)
      index = index * s.num_shards + shard
      valid_width *= s.valid_size(shard)
    if vertical is None:
      top, height, valid_height = 0, 1, 1
    else:
      shard = vertical.shard(coords)
      top, height = vertical.begin(shard), vertical.shard_size
      valid_height = vertical.valid_size(shard)
    key = (top, index * block_width)
    if key not in blocks:
      blocks[key] = {
          "label": ",".join("%s=%d" % (mesh_names[a], coords[a])
                            for a in split_axes) or "all",
          "processors": [],
          "top": top, "left": key[1], "height": height,
          "width": block_width, "valid_height": valid_height,
          "valid_width": valid_width}
    blocks[key]["processors"].append(pnum)
  return [blocks[k] for k in sorted(blocks)]


def variable_panels(graph, graph_layout, variables=None):
  """The panels draw_variable_layouts draws, largest variable first, as
  dicts: "variables" (names), "title", "shape", "rules", "rows" (the
  vertical dim's name, "" for a 1-D variable), "cols" (the horizontal
  dims' names, in drawing order), "row_size" / "col_sizes" (their
  sizes), "height" / "width" (padded extents) and
  "blocks": one dict per distinct block, ordered top-left first, with its
  "label", "processors" (pnums holding it), "top", "left", "height",
  "width" and "valid_height" / "valid_width" (the rest is padding).

  variables: Variable operations (default graph.trainable_variables);
  graph_layout: a GraphLayout (PlanReport.graph_layout): each variable is
  drawn in its own stored layout.

  Example:
    >>> panels = variable_panels(graph, report.graph_layout)
    >>> panels[0]["rules"], len(panels[0]["blocks"])
    ('d_model:x; d_ff:y', 8)
  """
  variables = list(graph.trainable_variables if variables is None
                   else variables)
  groups = {}
  for var in variables:
    tensor = var.outputs[0]
    mesh_layout = graph_layout.tensor_mesh_layout(tensor)
    splits = mesh_layout.dim_splits(tensor.shape)
    key = (tuple((d.name, d.size) for d in tensor.shape.dims),
           tuple(s.mesh_axes for s in splits))
    if key not in groups:
      groups[key] = {"vars": [], "layout": mesh_layout, "splits": splits,
                     "shape": tensor.shape}
    groups[key]["vars"].append(var.name)
  ordered = sorted(groups.values(), key=lambda g: (-g["shape"].size,
                                                   sorted(g["vars"])[0]))
  panels = []
  for group in ordered:
    names = sorted(group["vars"])
    shape, splits, layout = group["shape"], group["splits"], group["layout"]
    horizontal = splits[1:] if len(splits) >= 2 else splits
    horizontal = ([s for s in horizontal if s.is_split] +
                  [s for s in horizontal if not s.is_split])
    rules = _rules_text(layout, splits)
    count = "%d variables: " % len(names) if len(names) > 1 else ""
    panels.append({
        "variables": names,
        "title": "%s%s\n%s  %s" % (count, _name_pattern(names), shape, rules),
        "shape": str(shape),
        "rules": rules,
        "rows": splits[0].name if len(splits) >= 2 else "",
        "row_size": splits[0].size if len(splits) >= 2 else 1,
        "cols": [s.name for s in horizontal],
        "col_sizes": [s.size for s in horizontal],
        "height": splits[0].padded_size if len(splits) >= 2 else 1,
        "width": shapes.prod(s.padded_size for s in horizontal),
        "blocks": _blocks(layout, shape, splits),
    })
  return panels


def _colour(pnum, size, colormaps):
  """The colour of processor pnum: a qualitative palette for small meshes,
  a continuous map for large ones."""
  if size <= 10:
    return colormaps["tab10"](pnum)
  if size <= 20:
    return colormaps["tab20"](pnum)
  return colormaps["turbo"](pnum / float(size - 1))


def _axis_label(names, sizes):
  if len(names) == 1:
    return "%s (%d)" % (names[0], sizes[0])
  return "%s (%s)" % (" x ".join(names), "x".join(str(s) for s in sizes))


def _draw_blocks(ax, panel, size, matplotlib, colours=None):
  """The blocks' valid parts in their processor's colour, their padding
  hatched (two collections: fast for the 2048 blocks of a large mesh).
  colours: {pnum: colour} asked before (shared by a picture's panels: a
  colormap call per block was most of a 2048-processor picture's time)."""
  solid, hatched, solid_colours, hatched_colours = [], [], [], []
  rectangle = matplotlib.patches.Rectangle
  colours = {} if colours is None else colours
  for b in panel["blocks"]:
    if b["label"] == "all":
      colour = (0.85, 0.85, 0.85, 1.0)
    else:
      pnum = min(b["processors"])
      colour = colours.get(pnum)
      if colour is None:
        colour = colours[pnum] = _colour(pnum, size, matplotlib.colormaps)
    if b["valid_height"] and b["valid_width"]:
      solid.append(rectangle((b["left"], b["top"]), b["valid_width"],
                             b["valid_height"]))
      solid_colours.append(colour)
    # The padding sits at the end of each split dim: the block's right
    # and bottom strips.
    if b["valid_width"] < b["width"]:
      hatched.append(rectangle((b["left"] + b["valid_width"], b["top"]),
                               b["width"] - b["valid_width"], b["height"]))
      hatched_colours.append(colour)
    if b["valid_height"] < b["height"]:
      hatched.append(rectangle((b["left"], b["top"] + b["valid_height"]),
                               b["valid_width"],
                               b["height"] - b["valid_height"]))
      hatched_colours.append(colour)
  edges = len(panel["blocks"]) <= 1024
  collection = matplotlib.collections.PatchCollection
  ax.add_collection(collection(
      solid, facecolors=solid_colours, edgecolors=(0, 0, 0, 0.6),
      linewidths=(0.6 if len(panel["blocks"]) <= MAX_LABELLED_BLOCKS else
                  0.2 if edges else 0)))
  if hatched:
    ax.add_collection(collection(
        hatched, facecolors="white", edgecolors=hatched_colours,
        hatch=PADDING_HATCH, linewidths=0.6))
  width, height = max(panel["width"], 1), max(panel["height"], 1)
  ax.set_xlim(0, width)
  ax.set_ylim(height, 0)   # row 0 at the top, as a matrix is printed
  xticks = sorted({0, width, shapes.prod(panel["col_sizes"])})
  ax.set_xticks(xticks)
  ax.set_xticklabels([str(t) for t in xticks])
  ax.set_xlabel(_axis_label(panel["cols"], panel["col_sizes"])
                if panel["cols"] else "", fontsize=8)
  if panel["rows"]:
    yticks = sorted({0, height, panel["row_size"]})
    ax.set_yticks(yticks)
    ax.set_yticklabels([str(t) for t in yticks])
    ax.set_ylabel(_axis_label([panel["rows"]], [panel["row_size"]]),
                  fontsize=8)
  else:
    ax.set_yticks([])
  ax.tick_params(labelsize=7)
  ax.set_title(panel["title"], fontsize=8)


def _draw_labels(ax, panel, dpi):
  """Each block's label where it fits (turned on its side if only that
  way); returns how many were drawn. Called after the layout is final."""
  blocks = panel["blocks"]
  if len(blocks) > MAX_LABELLED_BLOCKS:
    return 0
  fontsize = 9 if len(blocks) <= 8 else 8 if len(blocks) <= 16 else 6
  box = ax.get_window_extent()
  px_x = box.width / max(panel["width"], 1)
  px_y = box.height / max(panel["height"], 1)
  drawn = 0
  for b in blocks:
    # About 0.6 em per character and 1.3 em per line, plus the box's pad;
    # a label needs a tenth of its block to spare.
    text_w = (len(b["label"]) * fontsize * 0.6 + 4) * dpi / 72.0
    text_h = (fontsize * 1.3 + 4) * dpi / 72.0
    block_w, block_h = 0.9 * b["width"] * px_x, 0.9 * b["height"] * px_y
    if text_w <= block_w and text_h <= block_h:
      rotation = 0
    elif text_w <= block_h and text_h <= block_w:
      rotation = 90
    else:
      continue
    ax.text(b["left"] + b["width"] / 2.0, b["top"] + b["height"] / 2.0,
            b["label"], ha="center", va="center", fontsize=fontsize,
            rotation=rotation, bbox=dict(facecolor="white", alpha=0.6,
                                         linewidth=0, pad=1))
    drawn += 1
  return drawn


def draw_variable_layouts(graph, graph_layout, path, max_panels=12,
                          variables=None, mesh_layout=None):
  """Writes a PNG of the variables' layouts to path (see the module
  docstring) and returns the panels drawn: variable_panels' dicts, the
  first max_panels (the figure's title says how many were left out),
  each with "labels_drawn": how many block labels fitted.

  mesh_layout: for the figure's title (default graph_layout.base).

  Example:
    >>> panels = draw_variable_layouts(graph, report.graph_layout,
    ...                                "/tmp/layouts.png", max_panels=6)
    >>> panels[0]["title"]
    '2 variables: decoder/*/DenseReluDense/wi/kernel\n[d_model:32, ...'
  """
  import matplotlib
  import matplotlib.collections  # noqa: F401  (submodules used by name)
  import matplotlib.patches  # noqa: F401
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  all_panels = variable_panels(graph, graph_layout, variables)
  panels = all_panels[:max_panels]
  mesh_layout = mesh_layout or graph_layout.base
  mesh = mesh_layout.mesh_shape
  ncols = min(3, max(len(panels), 1))
  nrows = max(1, -(-len(panels) // ncols))
  dpi = 100
  fig = Figure(figsize=(4.6 * ncols, 3.3 * nrows + 0.6), dpi=dpi)
  FigureCanvasAgg(fig)
  left_out = len(all_panels) - len(panels)
  fig.suptitle(
      "variables over mesh %s (%d processors), largest first: colour = "
      "processor, hatched = padding%s" % (
          ";".join("%s:%d" % (d.name, d.size) for d in mesh.dims),
          mesh_layout.size, "; %d smaller shape/layout groups not drawn"
          % left_out if left_out else ""), fontsize=10)
  axes = []
  colours = {}
  for i, panel in enumerate(panels):
    axes.append(fig.add_subplot(nrows, ncols, i + 1))
    _draw_blocks(axes[-1], panel, mesh_layout.size, matplotlib, colours)
  # The layout fixes the axes' sizes, which the labels must fit.
  fig.tight_layout(rect=(0, 0, 1, 0.96))
  for ax, panel in zip(axes, panels):
    panel["labels_drawn"] = _draw_labels(ax, panel, dpi)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, format="png")
  return panels


__all__ = ["draw_variable_layouts", "variable_panels", "MAX_LABELLED_BLOCKS"]
