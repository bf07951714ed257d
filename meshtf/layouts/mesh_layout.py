"""MeshLayout: the whole mesh geometry and every tensor's layout, in one pure
object (no TensorFlow), from the --layout flag to the collectives.

A MeshLayout is (mesh shape, layout rules). It answers every layout question
the lowering, the backends, the binary's preflight and the cost report ask:
which mesh axes split a dimension, the mesh axes a contraction reduces over,
processor number <-> coordinates, processor groups, each processor's slice
(begin, padded size, valid size), and the relayout plan between two layouts
of a tensor, as data (meshtf/layouts/relayout.py). Backends execute plans and
own only the TensorFlow code.

Uneven splits (GSPMD section 4.1): a dimension of size S split n ways gives
every processor a slice of ceil(S / n) positions (the same static shape on
every processor, which one SPMD program needs); processor i holds positions
[i * c, i * c + c) of the dimension padded to n * c, so the padding sits at
the end, on the last processors. The padding may hold anything: ops that
would read it mask it on demand (reductions with their identity,
contractions with zero, selections with -inf), and exports, checkpoints and
gathers strip it. So

    vocab:250 split 4 ways -> slices of 63; processor 3 holds 61 valid
                               positions and 2 of padding (252 - 250)
    heads:6 split 4 ways   -> slices of 2; processor 3 holds none

Example:
  >>> layout = MeshLayout("rows:2;cols:4", "batch:rows;vocab:cols")
  >>> layout.slice_shape("batch:8;vocab:250")
  [4, 63]
  >>> layout.slice_begin("batch:8;vocab:250", 7)
  [4, 189]
  >>> layout.valid_slice_shape("batch:8;vocab:250", 7)
  [4, 61]
  >>> layout.processor_groups([1])[0]
  [0, 1, 2, 3]
"""
import collections
import warnings

import numpy as np

from meshtf import shapes
from meshtf.layouts import assignment
from meshtf.layouts import errors
from meshtf.layouts import layout_rules as rules_lib
from meshtf.layouts import relayout
from meshtf.layouts import tensor_layouts as tensor_layouts_lib
from meshtf.layouts.tensor_layouts import TensorLayout  # noqa: F401
from meshtf.layouts.tensor_layouts import shard_size


class DimSplit(collections.namedtuple(
    "DimSplit", ["tensor_axis", "name", "size", "mesh_axes", "axis_sizes",
                 "shard_size"])):
  """How one dimension of one tensor is split: over `mesh_axes` (major
  first; only axes of size > 1; empty: replicated) of sizes `axis_sizes`,
  into num_shards slices of shard_size positions each.

  Example:
    >>> s = MeshLayout("x:4", "vocab:x").dim_split("vocab:250", "vocab")
    >>> s.shard_size, s.padded_size, s.padding, s.valid_size(3)
    (63, 252, 2, 61)
  """

  @property
  def num_shards(self):
    return shapes.prod(self.axis_sizes)

  @property
  def is_split(self):
    return self.num_shards > 1

  @property
  def padded_size(self):
    return self.num_shards * self.shard_size

  @property
  def padding(self):
    return self.padded_size - self.size

  @property
  def is_even(self):
    return self.padding == 0

  @property
  def mesh_axis(self):
    """The mesh axis of a dim split over one axis (None if replicated; a
    tuple for a dim over several axes)."""
    if len(self.mesh_axes) > 1:
      return self.mesh_axes
    return self.mesh_axes[0] if self.mesh_axes else None

  def shard(self, coords):
    """Which of the num_shards slices the processor at mesh coordinates
    `coords` holds (mixed radix over mesh_axes, major first)."""
    index = 0
    for axis, size in zip(self.mesh_axes, self.axis_sizes):
      index = index * size + coords[axis]
    return index

  def begin(self, shard):
    return shard * self.shard_size

  def valid_size(self, shard):
    """Positions of shard `shard` that hold data (the rest is padding)."""
    return max(0, min(self.shard_size, self.size - shard * self.shard_size))


class MeshLayout(object):
  """A mesh shape and its layout rules: the geometry of every tensor.

  Args:
    mesh_shape: a Shape or string, e.g. "rows:2;cols:4".
    layout_rules: LayoutRules, or a string / dict / pair list for
      convert_to_layout_rules, e.g. "batch:rows;hidden:cols".
    variable_rules: the stored layout of variables (see variable_rules).
    activation_rules: the rules of a model's activation annotations
      (mtf.shard at each layer's output; a training config's
      activation_layout), parsed and checked against the mesh once here;
      the model reads them from this object (None: no annotations).

  Raises LayoutError (naming the rule, the axis and the fix) when a rule
  names an axis the mesh lacks or the mesh has a size below 1; rules made
  with absent_axes="inactive" (Mesh TensorFlow's, e.g. from
  mtf.convert_to_layout_rules) drop such a rule instead, with one warning.

  A rule must also name a dim some tensor has: the Lowering refuses one
  whose dim is a misspelling of a dim of its graph ("Batch:rows": did you
  mean 'batch'?) -- it would silently do nothing -- and warns once about
  one naming a dim the graph lacks altogether (a layout written for several
  models), unless a graph lowered with this MeshLayout before had that dim,
  or `expect_dims` named it (dims another graph of the same model has: a
  decode graph's beam). Mesh TF's inactive-mode rules are not checked (its
  default rules name dims many models lack).
  """

  def __init__(self, mesh_shape, layout_rules=None, variable_rules=None,
               activation_rules=None):
    self._mesh = shapes.convert_to_shape(mesh_shape)
    for d in self._mesh.dims:
      if d.size < 1:
        raise errors.LayoutError(
            "Mesh %s: axis %r has size %d; every mesh axis needs a size of "
            "at least 1 (e.g. 'data:4;model:2')"
            % (errors.describe_mesh(self._mesh), d.name, d.size))
    # The rules this mesh uses: inactive-mode (Mesh TF) rules naming an
    # axis the mesh lacks are dropped here, with one warning.
    given = rules_lib.convert_to_layout_rules(layout_rules)
    self._rules = rules_lib.rules_on_mesh(given, self._mesh)
    # Which rule sets must name dims of the graph (check_rule_dims): not
    # Mesh TF's inactive-mode ones (rules_on_mesh may drop the mode).
    self._checked_rules = [(self._rules, "layout rule")] \
        if given.absent_axes is rules_lib.AbsentAxes.ERROR else []
    self._variable_rules = None
    if variable_rules is not None:
      given = rules_lib.convert_to_layout_rules(variable_rules)
      self._variable_rules = rules_lib.rules_on_mesh(given, self._mesh)
      if given.absent_axes is rules_lib.AbsentAxes.ERROR:
        self._checked_rules.append((self._variable_rules,
                                    "variable layout rule"))
    self._activation_rules = None
    if activation_rules is not None:
      self._activation_rules = rules_lib.convert_to_layout_rules(
          activation_rules)
      rules_lib.validate_layout_rules(self._activation_rules, self._mesh)
    self._axis_of_name = {d.name: i for i, d in enumerate(self._mesh.dims)}
    # Dims a rule may name though the graph being lowered lacks them.
    self._expected_dims = set()
    self._warned = set()
    self._layouts = {}
    self._splits = {}
    self._slice_sizes = {}
    self._groups = {}
    self._derived = {}

  @classmethod
  def convert(cls, mesh_shape, layout_rules=None):
    """mesh_shape itself if it is a MeshLayout (layout_rules must then be
    None or its rules), else MeshLayout(mesh_shape, layout_rules)."""
    if isinstance(mesh_shape, MeshLayout):
      if layout_rules is not None and (rules_lib.rules_on_mesh(
          rules_lib.convert_to_layout_rules(layout_rules),
          mesh_shape.mesh_shape, warn=False) != mesh_shape.layout_rules):
        raise ValueError("Pass either a MeshLayout or (mesh shape, layout "
                         "rules), not a MeshLayout and other rules")
      return mesh_shape
    return cls(mesh_shape, layout_rules)

  mesh_shape = property(lambda self: self._mesh)
  shape = mesh_shape  # MeshImpl's name for it
  layout_rules = property(lambda self: self._rules)
  # The stored layout of variables (None: the rules), e.g. GSPMD's
  # weight-update sharding: "d_model:data" while activations split batch.
  # Tried before the rules, per variable (meshtf/layouts/assignment.py).
  variable_rules = property(lambda self: self._variable_rules)
  # The activation annotations' rules, or None (see the class docstring).
  activation_rules = property(lambda self: self._activation_rules)

  def with_rules(self, layout_rules):
    """A MeshLayout on the same mesh with other rules (no variable rules),
    cached: the computation layout of an operation (assignment.py)."""
    rules = rules_lib.convert_to_layout_rules(layout_rules)
    if rules == self._rules and self._variable_rules is None:
      return self
    key = (rules, rules.absent_axes)   # equal rules may differ in policy
    if key not in self._derived:
      self._derived[key] = MeshLayout(self._mesh, rules)
    return self._derived[key]
  ndims = property(lambda self: self._mesh.ndims)
  size = property(lambda self: self._mesh.size)

  def __repr__(self):
    extra = "" if self._variable_rules is None else ", variable_rules=%r" % (
        ";".join("%s:%s" % p for p in self._variable_rules.pairs))
    return "MeshLayout(%r, %r%s)" % (
        ";".join("%s:%d" % (d.name, d.size) for d in self._mesh.dims),
        ";".join("%s:%s" % p for p in self._rules.pairs), extra)

  def __eq__(self, other):
    return (isinstance(other, MeshLayout) and self._mesh == other._mesh and
            self._rules == other._rules and
            self._variable_rules == other._variable_rules)

  def __hash__(self):
    return hash((self._mesh, self._rules, self._variable_rules))

  def axis_size(self, mesh_axis):
    return self._mesh.dims[mesh_axis].size

  def group_size(self, mesh_axes):
    """Processors in one group along mesh_axes (indices or names).

    Example:
      >>> MeshLayout("x:2;y:4", "").group_size([0, 1])
      8
    """
    return self._mesh.group_size(mesh_axes)

  def mesh_axis_names(self, mesh_axes):
    return tuple(self._mesh.dims[a].name for a in mesh_axes)

  # --- tensor layouts ------------------------------------------------------
  def tensor_layout(self, arg, tensor_name=None):
    """The validated TensorLayout of a Tensor or Shape (or shape string).

    Raises LayoutError naming the tensor, both dims, the mesh axis and the
    fix when two dims of one tensor would split over one mesh axis. A dim
    the axis does not divide is split unevenly (padded), not an error.
    """
    shape = arg if isinstance(arg, shapes.Shape) else getattr(arg, "shape",
                                                              None)
    if shape is None:
      shape = shapes.convert_to_shape(arg)
    layout = self._layouts.get(shape)
    if layout is None:
      if tensor_name is None and not isinstance(arg, (shapes.Shape, str)):
        tensor_name = getattr(arg, "name", None)
      layout = tensor_layouts_lib.tensor_layout(shape, self._mesh, self._rules,
                                                tensor_name)
      self._layouts[shape] = layout
    return layout

  def tensor_dimension_to_mesh_axis(self, dim):
    """The mesh axis a rule maps dim to (size-1 axes included), None, or a
    tuple of axes for a multi-axis rule (Mesh TensorFlow's method)."""
    return self._rules.tensor_dimension_to_mesh_axis(dim, self._mesh)

  def split_axes(self, dim):
    """The mesh axes of size > 1 that split dim, major first (a tuple)."""
    axes = self._rules.tensor_dimension_to_mesh_axes(
        shapes.convert_to_dimension(dim), self._mesh)
    return tuple(a for a in axes if self._mesh.dims[a].size > 1)

  def split_axes_of_name(self, dim_name):
    """split_axes of a dim, by name (rules are by name)."""
    names = self._rules.mesh_axis_names(dim_name)
    if any(n not in self._axis_of_name for n in names):
      return ()
    return tuple(self._axis_of_name[n] for n in names
                 if self._mesh.dims[self._axis_of_name[n]].size > 1)

  def split_axis(self, dim):
    """The mesh axis of size > 1 that splits dim; None if none splits it;
    the tuple of axes if several do (collectives accept either)."""
    axes = self.split_axes(dim)
    if not axes:
      return None
    return axes[0] if len(axes) == 1 else axes

  def dim_splits(self, shape):
    """One DimSplit per dim of shape (Tensor, Shape or string)."""
    shape = _as_shape(shape)
    # Cached per shape: the plan report and the layout search ask for the
    # same shapes' splits thousands of times.
    cached = self._splits.get(shape)
    if cached is None:
      cached = self._splits[shape] = tuple(self._dim_splits(shape))
    return list(cached)

  def _dim_splits(self, shape):
    layout = self.tensor_layout(shape)
    out = []
    for i, (d, axes) in enumerate(zip(shape.dims, layout.dim_axes)):
      axes = tuple(a for a in axes if self._mesh.dims[a].size > 1)
      sizes = tuple(self._mesh.dims[a].size for a in axes)
      out.append(DimSplit(i, d.name, d.size, axes, sizes,
                          shard_size(d.size, shapes.prod(sizes))))
    return out

  def dim_split(self, shape, dim):
    """The DimSplit of one dim (a name, Dimension or tensor axis index)."""
    shape = _as_shape(shape)
    if isinstance(dim, int):
      return self.dim_splits(shape)[dim]
    name = dim if isinstance(dim, str) else shapes.convert_to_dimension(
        dim).name
    return self.dim_splits(shape)[shape.dimension_names.index(name)]

  def uneven_dims(self, shape):
    """The DimSplits of shape's dims that carry padding."""
    return [s for s in self.dim_splits(shape) if not s.is_even]

  def is_uneven(self, shape):
    return bool(self.uneven_dims(shape))

  def slice_shape(self, shape):
    """Per dim, the (padded) size of every processor's slice."""
    return [s.shard_size for s in self.dim_splits(shape)]

  def slice_size(self, shape):
    """Elements of every processor's (padded) slice."""
    shape = _as_shape(shape)
    size = self._slice_sizes.get(shape)
    if size is None:
      size = self._slice_sizes[shape] = shapes.prod(
          s.shard_size for s in self.dim_splits(shape))
    return size

  def slice_begin(self, shape, pnum):
    """Per dim, the global index where processor pnum's slice starts."""
    coords = self.pnum_to_processor_coordinates(pnum)
    return [s.begin(s.shard(coords)) for s in self.dim_splits(shape)]

  def valid_slice_shape(self, shape, pnum):
    """Per dim, how many positions of pnum's slice hold data (the rest of
    the slice is padding)."""
    coords = self.pnum_to_processor_coordinates(pnum)
    return [s.valid_size(s.shard(coords)) for s in self.dim_splits(shape)]

  def padding_report(self, shape):
    """How much an uneven layout of shape costs: a dict with the global
    padded element count, the real one and the fraction of every slice
    that is padding.

    Example:
      >>> MeshLayout("x:4", "vocab:x").padding_report("vocab:250")
      {'elements': 250, 'padded_elements': 252, 'padding_fraction': 0.0079}
    """
    shape = _as_shape(shape)
    padded = shapes.prod(s.padded_size for s in self.dim_splits(shape))
    real = shape.size
    return {"elements": real, "padded_elements": padded,
            "padding_fraction": round(1.0 - real / padded, 4) if padded
                                else 0.0}

  def reduced_mesh_axes(self, input_shape, output_shape):
    """Sorted mesh axes (of size > 1) of the dims of input_shape that
    output_shape lacks: a contraction's partial sums add up over them.

    Example:
      >>> MeshLayout("x:4", "io:x").reduced_mesh_axes("b:2;io:8", "b:2")
      [0]
    """
    input_shape, output_shape = _as_shape(input_shape), _as_shape(
        output_shape)
    kept = set(output_shape.dimension_names)
    return sorted({a for d in input_shape.dims if d.name not in kept
                   for a in self.split_axes(d)})

  # --- processors ------------------------------------------------------------
  def pnum_to_processor_coordinates(self, pnum):
    """Row-major coordinates of processor pnum.

    Example:
      >>> MeshLayout("rows:2;cols:4").pnum_to_processor_coordinates(6)
      [1, 2]
    """
    coords = []
    for d in reversed(self._mesh.dims):
      coords.append(pnum % d.size)
      pnum //= d.size
    return list(reversed(coords))

  def processor_coordinates_to_pnum(self, coords):
    pnum = 0
    for c, d in zip(coords, self._mesh.dims):
      pnum = pnum * d.size + c
    return pnum

  def processor_group_array(self, mesh_axes):
    """[num_groups, group_size] int array: the processors that differ only
    along mesh_axes, each group ordered by its coordinates along those axes
    (row-major), the groups by their coordinates along the other axes."""
    key = tuple(sorted(mesh_axes))
    if key not in self._groups:
      others = [a for a in range(self.ndims) if a not in key]
      pnums = np.arange(self.size).reshape(self._mesh.to_integer_list or [1])
      if self.ndims:
        pnums = np.transpose(pnums, others + list(key))
      group = self._mesh.group_size(key)
      self._groups[key] = pnums.reshape([-1, group])
    return self._groups[key]

  def processor_groups(self, mesh_axes):
    """processor_group_array as nested lists."""
    return self.processor_group_array(mesh_axes).tolist()

  # --- rules that name no dim -----------------------------------------------
  def expect_dims(self, dim_names):
    """Declares dims that rules may name though a graph lowered with this
    MeshLayout lacks them (check_rule_dims accepts them): the dims of other
    graphs of the same model (training / eval / decode), or of parts a
    config switches off.

    Example:
      >>> layout = MeshLayout("x:2", "batch:x;beam:x")
      >>> layout.expect_dims(["beam"])      # only the decode graph has it
    """
    self._expected_dims.update(dim_names)

  def check_rule_dims(self, operations, what="graph"):
    """Checks that each rule (layout rules, then variable rules) names a dim
    some tensor of operations has (or a graph lowered before with this
    MeshLayout had, or expect_dims named). A rule whose dim is a misspelling
    of one the graph has ("Batch", "batchh" for batch: closest_name with
    cutoff TYPO_CUTOFF) raises LayoutError with the closest name, the dims
    there are and the rule to write; the others (a layout written for a
    family of models, applied to one that lacks the dim) give one
    UnusedLayoutRuleWarning per MeshLayout and dim. Then remembers the
    graph's dims. Mesh TF's inactive-mode rules are not checked.

    Example:
      >>> MeshLayout("x:2", "Batch:x").check_rule_dims(graph.operations)
      Traceback (most recent call last):
      LayoutError: layout rule 'Batch:x' names dim 'Batch', which no tensor
      of the graph has, so it would split nothing: did you mean 'batch'? ...
    """
    dims = set()
    for op in operations:
      for t in list(op.outputs) + list(op.inputs):
        dims.update(t.shape.dimension_names)
    known = dims | self._expected_dims
    unused = []
    for rules, kind in self._checked_rules:
      for dim, text in rules_lib.unknown_rule_dims(rules, known):
        near = rules_lib.closest_name(dim, dims, rules_lib.TYPO_CUTOFF)
        if near is not None:
          raise errors.LayoutError(rules_lib.unknown_dim_message(
              "%s:%s" % (dim, text), dim, dims, what,
              cutoff=rules_lib.TYPO_CUTOFF).replace("layout rule", kind, 1))
        if (kind, dim) not in self._warned:
          self._warned.add((kind, dim))
          unused.append("%s '%s:%s'" % (kind, dim, text))
    if unused:
      many = len(unused) > 1
      warnings.warn(
          "%s %s no tensor of this %s has (its dims: %s): unused here, %s "
          "nothing" % (
              ", ".join(unused), "name dims" if many else "names a dim",
              what, ", ".join(sorted(dims)[:24]),
              "they split" if many else "it splits"),
          errors.UnusedLayoutRuleWarning, stacklevel=4)
    self._expected_dims |= dims

  # --- whole graphs and relayouts ------------------------------------------
  def validate_operations(self, operations):
    """Computes every output's layout and runs each operation's own layout
    check (Operation.validate_layout) under these rules; raises the first
    LayoutError."""
    for op in operations:
      for t in op.outputs:
        self.tensor_layout(t)
      op.validate_layout(self)

  def assign(self, operations):
    """The GraphLayout of operations (annotations, variable layouts and
    their propagation: meshtf/layouts/assignment.py), each operation
    checked under its computation layout; raises the first LayoutError.
    The Lowering and the training binary's preflight both call this, so
    they accept and refuse exactly the same layouts."""
    operations = list(operations)
    graph_layout = assignment.assign_layouts(self, operations)
    for op in operations:
      graph_layout.op_layout(op).validate_operations([op])
    return graph_layout

  def relayout_plan(self, old_shape, new_shape, dtype_size=4,
                    old_layout=None, new_layout=None):
    """The steps that turn a laid-out tensor of old_shape into new_shape
    (a reshape, possibly changing which dims the mesh axes split; or the
    same shape from old_layout to new_layout), as a RelayoutPlan
    (meshtf/layouts/relayout.py).

    Example:
      >>> layout = MeshLayout("x:2;y:4")
      >>> plan = layout.relayout_plan(
      ...     "b:8;m:16", "b:8;m:16", old_layout=TensorLayout([0, 1]),
      ...     new_layout=TensorLayout([(0, 1), None]))
      >>> [(s.kind.value, s.mesh_axis) for s in plan.steps]
      [('allconcat', 1), ('allsplit', 1)]
    """
    return relayout.reshape_plan(self, _as_shape(old_shape),
                                 _as_shape(new_shape), dtype_size,
                                 old_layout, new_layout)


def _as_shape(x):
  if isinstance(x, shapes.Shape):
    return x
  shape = getattr(x, "shape", None)
  if isinstance(shape, shapes.Shape):
    return shape
  return shapes.convert_to_shape(x)
