"""The meshtf graph: Graph, Mesh, Tensor and the Operation base class.

A graph is symbolic: no TensorFlow tensors exist until a `Lowering` walks
the operations in order. Each Operation subclass keeps its shape rule (in
__init__), its `gradient()` and its `lower()` together.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "mesh")
  >>> x = mtf.zeros(mesh, "batch:4;io:3")
  >>> (x + 1.0).shape
  Shape([batch:4, io:3])
"""
import re

import tensorflow as tf

from meshtf import op_kinds
from meshtf import shapes


class Graph(object):
  """Holds operations in creation order, with unique names.

  Attributes:
    operations: all Operations, in the order they were created.
    trainable_variables / all_variables: Variable operations.
    seed: integer mixed into every random op's key (layout-invariant rng).
  """

  def __init__(self, seed=0):
    self.operations = []
    self.trainable_variables = []
    self.all_variables = []
    # The first Variable of each name: get_variable's reuse lookup (a scan
    # of all_variables per call made deep models quadratic to build).
    self.variables_by_name = {}
    self.seed = seed
    # Index in operations of the first backward op (set by mtf.gradients).
    self.backward_start = None
    # Groups of tensors whose pending sums the lowering reduces together in
    # fused buckets (mtf.reduce_together; mtf.gradients adds its results).
    self.reduce_groups = []
    self._names = set()
    self._next_suffix = {}

  def combine_assignments(self, assignments):
    """Mesh TensorFlow's hook for merging a step's variable assignments
    into fewer operations; returns them unchanged. Mesh TF combined them
    to save TF1 graph nodes; meshtf's lowering emits one assign per slice
    either way, and its gradient allreduces are bucketed instead
    (meshtf/lowering/bucketing.py).

    Example:
      >>> ops = graph.combine_assignments([mtf.assign_sub(w, g)])
    """
    return list(assignments)

  def unique_name(self, name):
    """`name` if unused, else `name_1`, `name_2`, ...

    As in Mesh TensorFlow (and TensorFlow), names are case-insensitive when
    deciding whether they are taken, and a tf.compat.v1.variable_scope
    prefixes them ("scope/name"): checkpoint names depend on both.

    Example:
      >>> g = Graph(); g.unique_name("a"), g.unique_name("A")
      ('a', 'A_1')
    """
    scope = variable_scope_name()
    if scope:
      name = scope + "/" + name
    key = name.lower()
    if key not in self._names:
      self._names.add(key)
      return name
    # Probing resumes after the last suffix handed out for `name` (all lower
    # ones are taken): the same names as probing from 1, without the
    # quadratic cost when a name ("mul") is reused thousands of times.
    i = self._next_suffix.get(key, 1)
    while "%s_%d" % (key, i) in self._names:
      i += 1
    self._names.add("%s_%d" % (key, i))
    self._next_suffix[key] = i + 1
    return "%s_%d" % (name, i)

  def __repr__(self):
    return "Graph(%d operations)" % len(self.operations)


def reduce_together(tensors):
  """Marks `tensors` (None entries skipped) as one group for the lowering:
  those still pending sums (partial results awaiting an allreduce, e.g. the
  weight gradients of data parallelism) go out as few fused allreduces as
  their dtypes and mesh axes allow, each as soon as its bucket is complete
  (Lowering(..., bucket_bytes=...)). The values do not change. Returns
  `tensors`. mtf.gradients groups its results this way.

  Example:
    >>> q, k = mtf.reduce_together([q, k])   # two einsums over split d_model
  """
  tensors = list(tensors)
  present = tuple(dict.fromkeys(t for t in tensors if t is not None))
  for t in present:
    if not isinstance(t, Tensor):
      raise TypeError("reduce_together: %r is not a meshtf Tensor" % (t,))
  if present:
    present[0].graph.reduce_groups.append(present)
  return tensors


class Mesh(object):
  """A named mesh of processors. Its shape and layout come from the MeshImpl
  given to the Lowering, so one model serves every mesh and layout."""

  def __init__(self, graph, name, variable_placer=None):
    del variable_placer  # Mesh TensorFlow's argument; placement is per slice here.
    self.graph = graph
    self.name = name

  def __repr__(self):
    return "Mesh(%r)" % self.name


class Tensor(object):
  """A named-dimension tensor: the `index`-th output of `operation`."""

  def __init__(self, operation, shape, dtype, index=0):
    if not isinstance(shape, shapes.Shape):
      raise TypeError("Tensor shape must be a Shape, got %r" % (shape,))
    self._operation = operation
    self._shape = shape
    self._dtype = tf.as_dtype(dtype)
    self._index = index

  operation = property(lambda self: self._operation)
  shape = property(lambda self: self._shape)
  dtype = property(lambda self: self._dtype)
  mesh = property(lambda self: self._operation.mesh)
  graph = property(lambda self: self._operation.graph)

  @property
  def name(self):
    return "%s:%d" % (self._operation.name, self._index)

  @property
  def size(self):
    return self._shape.size

  def __repr__(self):
    return "Tensor[%s, %s, %s]" % (self.name, self._shape, self._dtype.name)

  # Arithmetic (+ - * / ** and unary -) broadcasts by dimension name: the
  # elementwise family attaches the operators (meshtf/ops/__init__.py), so
  # this module imports no op family.


def all_operations(operations):
  """operations and, depth first, the inner operations of those that lower
  a sub-graph themselves (a while loop's body, its gradient's backward
  body): an op lists them in `inner_operations`. They are never lowered at
  top level, but their layouts are validated up front and their inputs
  count as consumers (so pending sums they share are reduced once)."""
  for op in operations:
    yield op
    if op.inner_operations:
      yield from all_operations(op.inner_operations)


def variable_scope_name():
  """The enclosing tf.compat.v1.variable_scope's name ('' outside any):
  Mesh TF model code names its weights with these scopes."""
  return tf.compat.v1.get_variable_scope().name


_NAME_OK = re.compile(r"[A-Za-z0-9_.\-/]+")


class Operation(object):
  """Base class of meshtf operations.

  Subclasses call `super().__init__(inputs, mesh, name)`, then set
  `self._outputs` (their shape rule), and implement `lower(lowering)` and,
  if differentiable, `gradient(grad_ys)` returning one Tensor or None per
  input.
  """

  def __init__(self, inputs, mesh=None, name=None):
    inputs = list(inputs)
    if mesh is None:
      if not inputs:
        raise ValueError("%s needs a mesh or at least one input" %
                         type(self).__name__)
      mesh = inputs[0].mesh
    for t in inputs:
      if not isinstance(t, Tensor):
        raise TypeError("%s: input %r is not a meshtf Tensor" %
                        (type(self).__name__, t))
      if t.mesh is not mesh:
        raise ValueError(
            "%s: input %s lives on mesh %r but the op is on mesh %r; import "
            "it onto one mesh first" % (type(self).__name__, t.name,
                                        t.mesh.name, mesh.name))
    self._inputs = inputs
    self._outputs = []
    self._mesh = mesh
    base = name or _default_name(type(self).__name__)
    if not _NAME_OK.fullmatch(base) and not self.creates_variable_slices:
      # Mesh TF code names ops freely ("component-wise exp"); only a
      # variable's name (its checkpoint key) must be exact.
      base = re.sub(r"[^A-Za-z0-9_.\-/]", "_", base) or "op"
    if not _NAME_OK.fullmatch(base):
      raise ValueError("Bad operation name %r: use letters, digits, _ . - /"
                       % base)
    self._name = mesh.graph.unique_name(base)
    mesh.graph.operations.append(self)

  # Declared hooks: the Lowering and the backends read these (no probing).
  # A Variable makes per-processor slices (create_slices(lowering),
  # entry_without_slices(mesh_impl)); an import op makes each processor's
  # slice on the host (host_slice(mesh_impl, pnum)); an op that lowers a
  # sub-graph itself lists it in inner_operations.
  creates_variable_slices = False
  imports_host_slices = False
  inner_operations = ()
  # A per-tensor layout (meshtf/layouts/assignment.py): layout_spec is
  # LayoutRules naming the output's exact layout (mtf.shard, a variable's
  # layout); layout_source a Tensor whose layout the output takes (the
  # adjoint of mtf.shard); layout_label names the annotation in errors.
  layout_spec = None
  layout_source = None
  # Set by mtf.gradients (meshtf/autodiff.py) for the sharding completion
  # (meshtf/layouts/completion/): forward_op is the operation whose
  # gradient rule made this one (the backward op then lowers under that
  # operation's layout); gradient_of the tensor whose gradient this op
  # sums (the parts of a gradient read by several operations).
  forward_op = None
  gradient_of = None

  # Declared plan facts, beside the layout facts below: what the op costs
  # and what its lowering does with partial sums and split dims. The
  # lowering and meshtf/plan read the same declarations (no class names,
  # no probing). Every meshtf op class states its cost_kind
  # (tests/ops/test_declarations.py); an Operation subclass from elsewhere
  # is priced as a kernel.
  cost_kind = op_kinds.CostKind.KERNEL
  # Its output's local values are partial sums over the mesh axes of the
  # split input dims that no output keeps (an einsum's contracted dims,
  # reduce_sum's reduced ones): its lowering makes a PendingSum, and the
  # plan leaves the sum pending.
  sums_partials = False
  # The allreduce the plan counts over those mesh axes when the partial
  # results are not sums (reduce_max's MAX).
  split_reduction = "MAX"
  # Elementwise arithmetic (unary, binary, scalar and cast ops): XLA may
  # recompute a chain of them in each reader (plan/fusion.py).
  elementwise = False
  # A matrix product: its kernel runs on the matrix unit, its flops padded
  # to the unit's tile (flops(layout, tile)).
  matrix_unit = False
  # Its lowering relays its input to its output's dims (a reshape: the
  # MeshLayout's relayout plan from the input's shape to the output's).
  reshapes = False
  # {output index: input index} of the outputs that are inputs' values (a
  # custom gradient's outputs are its function's): nothing computed or
  # moved for them. None when no output is.
  output_aliases = None
  # A loop's facts (ops/control/loops.py): trip_count, the iterations of a
  # run when known before running (None: unknown, counted once);
  # recomputed_operations, the forward ops each iteration of a backward
  # loop re-runs before its body; loop_carried, the body tensors each
  # iteration leaves for the next; summed_outputs, [(output, body tensor)]
  # of the sums over the iterations; gradient_loops, the backward loops
  # that read the states this loop records (each names them in
  # state_used).
  trip_count = None
  recomputed_operations = ()
  loop_carried = ()
  summed_outputs = ()
  gradient_loops = ()

  def keeps_pending(self, pending_axes, layout):
    """Whether this op, reading pending sums as their only reader, leaves
    its output the same pending sum (a linear op: negation, a scalar
    multiple, a rename, a sum of sums over the same axes), to be reduced
    later. pending_axes: per input, the mesh axes (a tuple) its pending
    sum still needs, or None; layout: the op's computation MeshLayout.
    The op's lower() and plan/estimate.py ask this.

    Example:
      >>> y = mtf.negative(mtf.einsum([x, w], output_shape=[batch]))
      >>> y.operation.keeps_pending([(1,)], mesh_layout)
      True
    """
    del pending_axes, layout
    return False

  def flops(self, layout, tile=0):
    """Floating-point operations of the op on one device's slices under
    its computation layout (a MeshLayout): by default one per local
    output element. tile: the matrix unit's tile, which a matrix product
    (matrix_unit) pads its sizes to (0: unpadded).

    Example:
      >>> (x + 1.0).operation.flops(mesh_layout)   # x's local elements
    """
    del tile
    return sum(layout.slice_size(t.shape) for t in self._outputs)

  def permutes(self, layout):
    """[(mesh axis, elements per device)] of the neighbour exchanges the
    lowering makes under layout (a shift's halo along a split dim), or
    None for an op that makes none of its own."""
    del layout
    return None

  def view_input(self, index, graph_layout):
    """The input whose value output `index` is under graph_layout
    (MeshLayout.assign) although output_aliases does not say so (a
    relayout between equal layouts, a rename that moves nothing), or
    None. plan/accounting.py counts such an output's memory once."""
    del index, graph_layout
    return None

  @property
  def family(self):
    """The op's family: its module under meshtf/ops (einsum, elementwise,
    reductions, conv, index, ...), or its class name elsewhere (the
    plan's flops_by_family).

    Example:
      >>> mtf.exp(x).operation.family
      'elementwise'
    """
    module = type(self).__module__
    return (module.rsplit(".", 1)[-1] if ".ops." in module
            else type(self).__name__)

  @property
  def layout_label(self):
    return "%s %r" % (type(self).__name__, self.name)

  def layout_dim_groups(self):
    """Sets of dim names, beyond each input's and output's, that must split
    over distinct mesh axes when a computation layout is chosen (einsum:
    all its dims)."""
    return ()

  def layout_factors(self):
    """(input dim name, output dim name) pairs that are one index space
    under two names (a reshape's renamed or major dims): the sharding
    completion carries a split across them (meshtf/layouts/completion/).
    Dims of the same name are one index space already."""
    return ()

  def validate_layout(self, mesh_layout):
    """Raises LayoutError if mesh_layout (a MeshLayout, or a MeshImpl) can
    place every tensor of the graph but not this op (its own constraints,
    e.g. an einsum's dims on distinct axes). Called before any TF work."""
    del mesh_layout

  # Mesh TensorFlow's splittability (auto_mtf reads it): the dim names the
  # op needs whole on each processor; every other dim of its inputs and
  # outputs is splittable.
  def unsplittable_dim_names(self):
    return frozenset()

  def _all_dim_names(self):
    return frozenset(d.name for t in self._inputs + self._outputs
                     for d in t.shape.dims)

  @property
  def splittable_dims(self):
    """Names of the dims a layout may split (frozenset)."""
    return self._all_dim_names() - self.unsplittable_dims

  @property
  def unsplittable_dims(self):
    """Names of the dims this op needs whole (frozenset)."""
    return frozenset(self.unsplittable_dim_names()) & self._all_dim_names()

  def _initialize_all_dimensions_as_splittable(self):
    """(all dim names, frozenset()): Mesh TF's helper."""
    return self._all_dim_names(), frozenset()

  def _initialize_splittable_and_unsplittable_dims(
      self, default_splittability, exception_dims_iterable=None):
    """(splittable, unsplittable) names: every dim default_splittability
    ("splittable" or "unsplittable") except exception_dims (Mesh TF)."""
    if default_splittability not in ("splittable", "unsplittable"):
      raise ValueError("default_splittability %r: use 'splittable' or "
                       "'unsplittable'" % (default_splittability,))
    exceptions = frozenset(d if isinstance(d, str) else d.name
                           for d in (exception_dims_iterable or ()))
    everything = self._all_dim_names()
    flipped = everything & exceptions
    if default_splittability == "splittable":
      return everything - flipped, flipped
    return flipped, everything - flipped

  inputs = property(lambda self: list(self._inputs))
  outputs = property(lambda self: list(self._outputs))
  mesh = property(lambda self: self._mesh)
  graph = property(lambda self: self._mesh.graph)
  name = property(lambda self: self._name)

  @property
  def has_gradient(self):
    """True if gradient() is implemented (ops without it pass none back)."""
    return type(self).gradient is not Operation.gradient

  def gradient(self, grad_ys):
    raise NotImplementedError("%s has no gradient" % type(self).__name__)

  def lower(self, lowering):
    raise NotImplementedError("%s has no lowering" % type(self).__name__)

  def __repr__(self):
    return "%s(%s)" % (type(self).__name__, self._name)


def _default_name(class_name):
  name = class_name[:-len("Operation")] if class_name.endswith("Operation") \
      else class_name
  return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "op"
