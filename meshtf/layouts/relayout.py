"""Relayout plans: how a laid-out tensor moves from one layout to another, as
data (pure Python). Backends execute the steps (MeshImpl.execute_relayout);
the collective statistics of the run and the cost report read the same
numbers, so predicted and emitted communication cannot drift apart.

Per old split dim a (over mesh axes A) and the new dim b over the same A:

  a and b select the same elements   nothing (the slices already match)
  a split, no b                       allconcat over each axis of A, minor
                                      first (the last one cuts the padding
                                      of an uneven a)
  b split, A free                     allsplit: a local slice per axis,
                                      major first (an uneven b is padded
                                      first), no communication
  A (one axis, or several in mesh     alltoall over all of A: the twin's
  order) and an unsplit old dim (the  stripes go to the peers, a's arrive
  "twin") slices like b
  otherwise                           allconcat, then allsplit

"Select the same elements" is Mesh TensorFlow's cumprod rule: two dims with
the same product of the sizes before them split n ways pick the same
elements of the flattened tensor -- when both divide by n, or (uneven
splits) when they have the same size. A local reshape runs between the
collectives and the splits when the shapes differ.

Bytes per device are what each device sends on the usual algorithms:
allconcat (ring allgather) (n-1) x its slice, alltoall and reduce-scatter
(n-1)/n of it, allreduce (ring) 2(n-1)/n of it, permute its slice,
allsplit nothing.

Example:
  >>> from meshtf.layouts.mesh_layout import MeshLayout
  >>> plan = MeshLayout("x:4", "batch:x;group:x").relayout_plan(
  ...     "batch:8;io:6", "group:4;size:2;io:6")
  >>> [s.kind.value for s in plan.steps], plan.bytes_per_device
  (['reshape'], 0)
"""
import collections
import enum

from meshtf import shapes
from meshtf.layouts.tensor_layouts import shard_size


class StepKind(enum.StrEnum):
  """What a RelayoutStep does (a closed vocabulary: backends dispatch on
  it, the plan prices it). Its value is the collective record's kind."""
  ALLCONCAT = "allconcat"
  ALLTOALL = "alltoall"
  ALLSPLIT = "allsplit"               # a local slice: no communication
  REDUCE_SCATTER = "reduce_scatter"
  RESHAPE = "reshape"                 # a local reshape of the slice


class CollectiveKind(enum.StrEnum):
  """The kind of a collective record (a closed vocabulary: the lowering
  records it, Lowering.collective_stats and the plan report it,
  collective_bytes and the interconnect models price it). A communicating
  StepKind's value is the CollectiveKind of the same name.

  Example:
    >>> CollectiveKind.allreduce("SUM"), CollectiveKind.ALLCONCAT.is_allreduce
    (<CollectiveKind.ALLREDUCE_SUM: 'allreduce_sum'>, False)
  """
  ALLREDUCE_SUM = "allreduce_sum"
  ALLREDUCE_MAX = "allreduce_max"
  ALLREDUCE_MIN = "allreduce_min"
  ALLCONCAT = "allconcat"
  ALLTOALL = "alltoall"
  REDUCE_SCATTER = "reduce_scatter"
  PERMUTE = "permute"              # a shift or receive along one axis

  @classmethod
  def allreduce(cls, reduction_fn_string):
    """The allreduce of "SUM", "MAX" or "MIN"."""
    return cls("allreduce_" + reduction_fn_string.lower())

  @property
  def is_allreduce(self):
    return self in _ALLREDUCES

  @property
  def family(self):
    """The collective op family ("allreduce" for every reduction)."""
    return "allreduce" if self.is_allreduce else self.value


_ALLREDUCES = frozenset([CollectiveKind.ALLREDUCE_SUM,
                         CollectiveKind.ALLREDUCE_MAX,
                         CollectiveKind.ALLREDUCE_MIN])

# The steps that communicate.
COLLECTIVE_STEPS = frozenset([StepKind.ALLCONCAT, StepKind.ALLTOALL,
                              StepKind.REDUCE_SCATTER])

RelayoutStep = collections.namedtuple(
    "RelayoutStep",
    ["kind",                 # a StepKind
     "mesh_axis",            # the mesh axis (None for reshape; a tuple of
                             # axes, major first, for an alltoall over
                             # several)
     "split_axis",           # tensor axis split (allsplit, alltoall)
     "concat_axis",          # tensor axis gathered (allconcat, alltoall)
     "concat_size",          # true size of a fully gathered dim (cuts the
                             # padding); None while other axes still split it
     "padded_size",          # allsplit: the size the dim is padded to first
     "local_shape",          # the slice shape after the step
     "group_size",           # processors in each group (1 for local steps)
     "elements_per_device",  # elements of the slice each device puts in
     "bytes_per_device"])    # bytes each device sends


def step_axes(step):
  """The mesh axes of a step as a tuple (an alltoall may span several)."""
  m = step.mesh_axis
  return tuple(m) if isinstance(m, tuple) else () if m is None else (m,)


def collective_bytes(kind, group_size, elements, itemsize):
  """Bytes one device sends in a collective of `elements` input elements.

  Example:
    >>> collective_bytes("allreduce_sum", 4, 1000, 4)   # 2 * 3/4 * 4000
    6000
  """
  kind = CollectiveKind(kind)
  n = group_size
  if n <= 1:
    return 0
  if kind is CollectiveKind.ALLCONCAT:
    sent = (n - 1) * elements
  elif kind in (CollectiveKind.ALLTOALL, CollectiveKind.REDUCE_SCATTER):
    sent = elements * (n - 1) / n
  elif kind.is_allreduce:
    sent = 2.0 * elements * (n - 1) / n
  else:  # CollectiveKind.PERMUTE
    sent = elements
  return int(round(sent * itemsize))


class RelayoutPlan(object):
  """The steps of one relayout, with what each moves.

  Attributes:
    old_shape, new_shape: the tensor's shapes before and after.
    steps: RelayoutSteps in execution order.
  """

  def __init__(self, old_shape, new_shape, steps):
    self.old_shape = old_shape
    self.new_shape = new_shape
    self.steps = list(steps)

  @property
  def collectives(self):
    """The steps that communicate."""
    return [s for s in self.steps if s.kind in COLLECTIVE_STEPS]

  @property
  def bytes_per_device(self):
    return sum(s.bytes_per_device for s in self.steps)

  def __iter__(self):
    return iter(self.steps)

  def __len__(self):
    return len(self.steps)

  def describe(self):
    """One line per step, e.g. 'alltoall over mesh axis 0 (4 processors):
    1536 bytes per device'."""
    lines = []
    for s in self.steps:
      if s.kind is StepKind.RESHAPE:
        lines.append("reshape the slice to %s (local)" % (s.local_shape,))
      elif s.kind is StepKind.ALLSPLIT:
        lines.append("allsplit tensor axis %d over mesh axis %d (local)" % (
            s.split_axis, s.mesh_axis))
      else:
        lines.append("%s over mesh axis %s (%d processors): %d bytes per "
                     "device" % (s.kind, "+".join(
                         str(a) for a in step_axes(s)), s.group_size,
                                 s.bytes_per_device))
    return lines

  def __repr__(self):
    return "RelayoutPlan(%s -> %s: %s)" % (
        self.old_shape, self.new_shape, "; ".join(self.describe()) or "local")


def _same_selection(size_a, outer_a, size_b, outer_b, n):
  """Whether splitting dim a and dim b (of two shapes of one size) n ways
  gives every processor the same elements, in the same order."""
  if outer_a != outer_b:
    return False
  return size_a == size_b or (size_a % n == 0 and size_b % n == 0)


def reshape_plan(mesh_layout, old_shape, new_shape, dtype_size=4,
                 old_layout=None, new_layout=None):
  """The RelayoutPlan of reshaping old_shape to new_shape (equal sizes;
  equal shapes for a pure relayout) from old_layout to new_layout
  (TensorLayouts; by default mesh_layout's layouts of the two shapes).
  See the module docstring."""
  if old_layout is None:
    old_layout = mesh_layout.tensor_layout(old_shape)
  if new_layout is None:
    new_layout = mesh_layout.tensor_layout(new_shape)
  size = mesh_layout.axis_size
  # Per dim, its mesh axes of size > 1 (major first).
  old_axes = [tuple(m for m in axes if size(m) > 1)
              for axes in old_layout.dim_axes]
  new_axes = [tuple(m for m in axes if size(m) > 1)
              for axes in new_layout.dim_axes]
  # Per dim, the product of the sizes of the dims before it.
  old_pos, new_pos = old_shape.cumprod(), new_shape.cumprod()
  local = [shard_size(d.size, shapes.prod(size(m) for m in axes))
           for d, axes in zip(old_shape.dims, old_axes)]
  steps, held = [], {}   # held: new dim -> the axes its slices split over

  def collective(kind, m, split_axis, concat_axis, sent_shape, concat_size):
    n = shards(m) if isinstance(m, tuple) else size(m)
    elements = shapes.prod(sent_shape)
    steps.append(RelayoutStep(
        kind, m, split_axis, concat_axis, concat_size, None, tuple(local), n,
        elements, collective_bytes(kind, n, elements, dtype_size)))

  def shards(axes):
    return shapes.prod(size(m) for m in axes)

  def consistent(dim_size, axes, prefix):
    # The slices over `axes`, regrouped by the minor axes beyond `prefix`,
    # are exactly the slices over `prefix` (padding included).
    return shard_size(dim_size, shards(axes)) * shards(
        axes[len(prefix):]) == shard_size(dim_size, shards(prefix))

  for a, axes in enumerate(old_axes):
    if not axes:
      continue
    same_major = [b for b, bx in enumerate(new_axes) if bx[:1] == axes[:1]]
    b = same_major[0] if same_major else None
    if b is not None:
      prefix = _common_prefix(axes, new_axes[b])
      size_a, size_b = old_shape.dims[a].size, new_shape.dims[b].size
      if (_same_selection(size_a, old_pos[a], size_b, new_pos[b],
                          shards(prefix)) and
          consistent(size_a, axes, prefix) and
          consistent(size_b, new_axes[b], prefix)):
        # Keep the split over the common axes; gather the rest of a.
        for m in reversed(axes[len(prefix):]):
          sent = list(local)
          local[a] *= size(m)
          collective(StepKind.ALLCONCAT, m, None, a, sent, None)
        held[b] = prefix
        old_axes[a] = prefix
        continue
      if new_axes[b] == axes and list(axes) == sorted(axes):
        # The axes move to a dim that an unsplit old dim (the twin)
        # slices like b: its stripes travel to the peers, a's arrive -- one
        # alltoall over the group of all the axes (in mesh order, so the
        # group's order is the stripes' order), (n-1)/n of the slice.
        n = shards(axes)
        twin = _twin(old_shape, old_pos, size_b, new_pos[b], n)
        if twin is not None and not old_axes[twin]:
          sent = list(local)
          sent[twin] = n * shard_size(old_shape.dims[twin].size, n)
          local[twin] = shard_size(old_shape.dims[twin].size, n)
          local[a] = size_a
          collective(StepKind.ALLTOALL, axes[0] if len(axes) == 1 else axes,
                     twin,
                     a, sent, size_a)
          old_axes[a], old_axes[twin] = (), axes
          held[b] = axes
          continue
    # Gather a, minor axis first; the last gather cuts the padding.
    for i, m in enumerate(reversed(axes)):
      sent = list(local)
      last = i == len(axes) - 1
      local[a] = old_shape.dims[a].size if last else local[a] * size(m)
      collective(StepKind.ALLCONCAT, m, None, a, sent,
                 old_shape.dims[a].size if last else None)
    old_axes[a] = ()
  new_local = [shard_size(d.size, shards(held.get(b, ())))
               for b, d in enumerate(new_shape.dims)]
  if local != new_local:
    if shapes.prod(local) != shapes.prod(new_local):
      raise AssertionError("reshape plan %s -> %s: local sizes %s and %s "
                           "differ" % (old_shape, new_shape, local, new_local))
    local = new_local
    steps.append(RelayoutStep(StepKind.RESHAPE, None, None, None, None, None,
                              tuple(local), 1, 0, 0))
  for b, axes in enumerate(new_axes):
    rest = axes[len(held.get(b, ())):]
    if not rest:
      continue
    # Pad to a multiple of the remaining axes' shards, split the major axis
    # first.
    padded = shard_size(new_shape.dims[b].size, shards(axes)) * shards(rest)
    for m in rest:
      local[b] = padded // size(m)
      steps.append(RelayoutStep(StepKind.ALLSPLIT, m, b, None, None, padded,
                                tuple(local), size(m), 0, 0))
      padded = local[b]
  return RelayoutPlan(old_shape, new_shape, steps)


def fuse_reduce_scatter(plan, pending_axes, dtype_size=4):
  """The plan for a tensor that still holds partial sums over pending_axes:
  each allsplit over a pending axis becomes a reduce-scatter (the sum and
  the split at half an allreduce's bytes; gathers and alltoalls before it
  are linear, so they may run on partial sums). Returns (plan, the pending
  axes still to allreduce afterwards).

  Example:
    >>> from meshtf.layouts.mesh_layout import MeshLayout, TensorLayout
    >>> layout = MeshLayout("data:4")
    >>> plan = layout.relayout_plan("m:8;h:4", "m:8;h:4",
    ...     old_layout=TensorLayout([None, None]),
    ...     new_layout=TensorLayout([0, None]))
    >>> fused, rest = fuse_reduce_scatter(plan, [0])
    >>> [s.kind.value for s in fused.steps], rest, fused.bytes_per_device
    (['reduce_scatter'], [], 96)
  """
  pending = list(pending_axes)
  steps = []
  for s in plan.steps:
    if s.kind is StepKind.ALLSPLIT and s.mesh_axis in pending:
      pending.remove(s.mesh_axis)
      elements = shapes.prod(s.local_shape) * s.group_size
      s = s._replace(kind=StepKind.REDUCE_SCATTER,
                     elements_per_device=elements,
                     bytes_per_device=collective_bytes(
                         CollectiveKind.REDUCE_SCATTER, s.group_size, elements,
                         dtype_size))
    steps.append(s)
  return RelayoutPlan(plan.old_shape, plan.new_shape, steps), pending


def _common_prefix(a, b):
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return a[:n]


def _twin(shape, outer_sizes, size, outer, n):
  """The dim of shape that splits n ways like a dim of `size` with outer
  size `outer` in another shape (at most one: a dim of size >= 2 doubles
  the next outer size), or None."""
  for i, (o, d) in enumerate(zip(outer_sizes, shape.dims)):
    if _same_selection(d.size, o, size, outer, n):
      return i
  return None
