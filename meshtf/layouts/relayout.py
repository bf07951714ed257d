"""Relayout plans: how a laid-out tensor moves from one layout to another, as
data (pure Python). Backends execute the steps (MeshImpl.execute_relayout);
the collective statistics of the run and the cost report read the same
numbers, so predicted and emitted communication cannot drift apart.

Per mesh axis of size n, from the old dim a it splits to the new dim b:

  a and b select the same elements   nothing (the slices already match)
  a split, b unsplit                  allconcat over the axis (padding of an
                                      uneven a is stripped)
  a unsplit, b split                  allsplit: a local slice (an uneven b
                                      is padded first), no communication
  a split, b split, and an unsplit    alltoall: the twin's stripes go to the
  old dim (the "twin") slices like b  peers, a's stripes arrive
  otherwise                           allconcat, then allsplit

"Select the same elements" is Mesh TensorFlow's cumprod rule: two dims with
the same product of the sizes before them split n ways pick the same
elements of the flattened tensor -- when both divide by n, or (uneven
splits) when they have the same size. A local reshape runs between the
collectives and the splits when the shapes differ.

Bytes per device are what each device sends on the usual algorithms:
allconcat (ring allgather) (n-1) x its slice, alltoall (n-1)/n of it,
allreduce (ring) 2(n-1)/n of it, permute its slice, allsplit nothing.

Example:
  >>> from meshtf.layouts.mesh_layout import MeshLayout
  >>> plan = MeshLayout("x:4", "batch:x;group:x").relayout_plan(
  ...     "batch:8;io:6", "group:4;size:2;io:6")
  >>> [s.kind for s in plan.steps], plan.bytes_per_device
  (['reshape'], 0)
"""
import collections

from meshtf.layouts.tensor_layouts import shard_size

RelayoutStep = collections.namedtuple(
    "RelayoutStep",
    ["kind",                 # allconcat | alltoall | allsplit | reshape
     "mesh_axis",            # the mesh axis (None for reshape)
     "split_axis",           # tensor axis split (allsplit, alltoall)
     "concat_axis",          # tensor axis gathered (allconcat, alltoall)
     "concat_size",          # true size of the gathered dim (strips padding)
     "local_shape",          # the slice shape after the step
     "group_size",           # processors in each group (1 for local steps)
     "elements_per_device",  # elements of the slice each device puts in
     "bytes_per_device"])    # bytes each device sends


def collective_bytes(kind, group_size, elements, itemsize):
  """Bytes one device sends in a collective of `elements` input elements.

  Example:
    >>> collective_bytes("allreduce_sum", 4, 1000, 4)   # 2 * 3/4 * 4000
    6000
  """
  n = group_size
  if n <= 1:
    return 0
  if kind == "allconcat":
    sent = (n - 1) * elements
  elif kind == "alltoall":
    sent = elements * (n - 1) / n
  elif kind.startswith("allreduce"):
    sent = 2.0 * elements * (n - 1) / n
  elif kind == "permute":
    sent = elements
  else:
    sent = 0
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
    return [s for s in self.steps if s.kind in ("allconcat", "alltoall")]

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
      if s.kind == "reshape":
        lines.append("reshape the slice to %s (local)" % (s.local_shape,))
      elif s.kind == "allsplit":
        lines.append("allsplit tensor axis %d over mesh axis %d (local)" % (
            s.split_axis, s.mesh_axis))
      else:
        lines.append("%s over mesh axis %d (%d processors): %d bytes per "
                     "device" % (s.kind, s.mesh_axis, s.group_size,
                                 s.bytes_per_device))
    return lines

  def __repr__(self):
    return "RelayoutPlan(%s -> %s: %s)" % (
        self.old_shape, self.new_shape, "; ".join(self.describe()) or "local")


def _prod(values):
  out = 1
  for v in values:
    out *= v
  return out


def _same_selection(size_a, outer_a, size_b, outer_b, n):
  """Whether splitting dim a and dim b (of two shapes of one size) n ways
  gives every processor the same elements, in the same order."""
  if outer_a != outer_b:
    return False
  return size_a == size_b or (size_a % n == 0 and size_b % n == 0)


def reshape_plan(mesh_layout, old_shape, new_shape, dtype_size=4):
  """The RelayoutPlan of reshaping old_shape to new_shape (equal sizes)
  under mesh_layout's rules (see the module docstring)."""
  old_layout = list(mesh_layout.tensor_layout(old_shape))
  new_layout = list(mesh_layout.tensor_layout(new_shape))
  # Per dim, the product of the sizes of the dims before it.
  old_pos, new_pos = old_shape.cumprod(), new_shape.cumprod()
  local = mesh_layout.slice_shape(old_shape)
  steps, split_after = [], []

  def collective(kind, m, split_axis, concat_axis, sent_shape):
    n = mesh_layout.axis_size(m)
    elements = _prod(sent_shape)
    steps.append(RelayoutStep(
        kind, m, split_axis, concat_axis,
        old_shape.dims[concat_axis].size, tuple(local), n, elements,
        collective_bytes(kind, n, elements, dtype_size)))

  for m, mesh_dim in enumerate(mesh_layout.mesh_shape.dims):
    n = mesh_dim.size
    if n == 1:
      continue
    a = old_layout.index(m) if m in old_layout else None
    b = new_layout.index(m) if m in new_layout else None
    if a is not None and b is not None and _same_selection(
        old_shape.dims[a].size, old_pos[a], new_shape.dims[b].size,
        new_pos[b], n):
      continue
    if b is not None:
      twin = _twin(old_shape, old_pos, new_shape.dims[b].size, new_pos[b], n)
      if a is not None and twin is not None and old_layout[twin] is None:
        sent = list(local)
        sent[twin] = n * shard_size(old_shape.dims[twin].size, n)
        local[twin] = shard_size(old_shape.dims[twin].size, n)
        local[a] = old_shape.dims[a].size
        collective("alltoall", m, twin, a, sent)
        old_layout[a], old_layout[twin] = None, m
        continue
      split_after.append((m, b))
    if a is not None:
      sent = list(local)
      local[a] = old_shape.dims[a].size
      collective("allconcat", m, None, a, sent)
      old_layout[a] = None
  new_local = []
  for d, m in zip(new_shape.dims, new_layout):
    still_split = m is not None and m in old_layout
    new_local.append(shard_size(d.size, mesh_layout.axis_size(m)) if still_split
                     else d.size)
  if local != new_local:
    if _prod(local) != _prod(new_local):
      raise AssertionError("reshape plan %s -> %s: local sizes %s and %s "
                           "differ" % (old_shape, new_shape, local, new_local))
    local = new_local
    steps.append(RelayoutStep("reshape", None, None, None, None, tuple(local),
                              1, 0, 0))
  for m, b in split_after:
    local[b] = shard_size(new_shape.dims[b].size, mesh_layout.axis_size(m))
    steps.append(RelayoutStep("allsplit", m, b, None, None, tuple(local),
                              mesh_layout.axis_size(m), 0, 0))
  return RelayoutPlan(old_shape, new_shape, steps)


def _twin(shape, outer_sizes, size, outer, n):
  """The dim of shape that splits n ways like a dim of `size` with outer
  size `outer` in another shape (at most one: a dim of size >= 2 doubles
  the next outer size), or None."""
  for i, (o, d) in enumerate(zip(outer_sizes, shape.dims)):
    if _same_selection(d.size, o, size, outer, n):
      return i
  return None
