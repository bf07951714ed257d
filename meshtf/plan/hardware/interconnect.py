"""Interconnect models: where a collective's group sits on the machine's
links, and what its algorithm costs there.

Processor p of a mesh (row-major over the mesh's axes) is device p of the
machine; a machine numbers its devices along its physical dimensions
(major first), so a mesh axis lands on the physical dimensions its
processors' device numbers span. Three machines:

  Torus        TPU slices: chips on a 2-D (v2, v3) or 3-D (v4) grid of
               links, each dimension a ring (wraparound) where the slice
               spans the pod's whole dimension (v2/v3) or is made of whole
               cubes (v4), else a line; the cores of a chip (the minor
               physical dimension) share its links.
               allreduce / allgather / reduce-scatter: one ring per
               physical dimension in turn (reduce-scatter along each, then
               allgather back), each moving the data that is left after the
               dimensions before it -- so an allreduce over a 32 x 64 mesh
               of TPU v3 cores costs about one slice over one link's
               bandwidth, not 2(n-1) steps of one ring over 2,048.
               alltoall: bounded by the busiest link: along a dimension of
               m chips a member's slice S crosses its middle links m*S/4
               (dimension-order routing along a line), times the cores
               sharing the chip and the interleaved groups sharing the
               links; plus one transfer latency per hop of the longest
               route. On TPU v2/v3 the pieces route along lines even where
               the dimension is a ring (alltoall_rings=False): a choice,
               made to agree with what GShard measured on TPU v3 --
               Figure 9's alltoall grows ~9x from 16 to 2,048 partitions
               (lines: 8.1x; rings, half the load on a pod's dimensions:
               4.1x) and Figure 8's dispatch and combine 3.75x from 128 to
               2,048 experts (lines 4x, rings 2x). Measured against it,
               not fitted: GSPMD Table 6's alltoall times, where lines
               predict about twice the paper's share (bench/papers.py).
  NodeNetwork  GPU nodes: NVLink (through NVSwitch) within a node, one NIC
               per GPU across nodes; hierarchical rings (within the node,
               then across nodes on 1/l of the data, l GPUs of the group
               per node); alltoall limited by the NVLink share and the NIC
               share of its pieces.
  SharedBus    virtual CPU devices of one process: every collective pays a
               fixed latency plus its bytes at a copy bandwidth
               (calibrated here; see catalogue.py).

Each model's collective_seconds(kind, group, slice_bytes) takes the bytes
of the slice each device puts in (an allconcat's input, a reduce-scatter's
whole input) and returns seconds; group comes from place(mesh_shape,
mesh_axes).

Example:
  >>> torus = hardware.get("tpuv3").interconnect
  >>> g = torus.place(mtf.convert_to_shape("x:32;y:64"), [1])
  >>> torus.collective_seconds("allreduce_sum", g, 8 << 20)   # ~0.2 ms
"""
import collections
import itertools

from meshtf import shapes
from meshtf.layouts.relayout import CollectiveKind

# One physical dimension as a group uses it: m members, `stride` device
# coordinates apart, along a ring (wraparound) or a line; kind "core"
# (within a chip), "chip" (links between chips), "node" / "nvlink".
DimUse = collections.namedtuple("DimUse", ["name", "members", "stride",
                                           "ring", "kind"])
Group = collections.namedtuple("Group", ["size", "dims", "devices"])


def _group_devices(mesh_shape, mesh_axes):
  """Device numbers of processor 0's group over mesh_axes (indices)."""
  sizes = [d.size for d in mesh_shape.dims]
  strides = [shapes.prod(sizes[i + 1:]) for i in range(len(sizes))]
  ranges = [range(sizes[i]) if i in mesh_axes else [0]
            for i in range(len(sizes))]
  return [sum(c * s for c, s in zip(coords, strides))
          for coords in itertools.product(*ranges)]


def _dim_uses(devices, dims):
  """DimUse per physical dimension a group's devices span. dims: [(name,
  extent, ring, kind)] major first."""
  extents = [d[1] for d in dims]
  strides = [shapes.prod(extents[i + 1:]) for i in range(len(extents))]
  uses = []
  for (name, extent, ring, kind), stride in zip(dims, strides):
    coords = sorted({(dev // stride) % extent for dev in devices})
    if len(coords) < 2:
      continue
    gaps = {b - a for a, b in zip(coords, coords[1:])}
    step = min(gaps)
    full = len(coords) * step == extent
    uses.append(DimUse(name, len(coords), step, ring and full, kind))
  return uses


def _square_factors(n, rank):
  """n as `rank` factors, as equal as powers allow, smallest first:
  _square_factors(512, 2) == [16, 32]."""
  dims = [1] * rank
  rest = n
  p = 2
  primes = []
  while rest > 1:
    while rest % p == 0:
      primes.append(p)
      rest //= p
    p += 1
  for f in sorted(primes, reverse=True):
    dims[dims.index(min(dims))] *= f
  return sorted(dims)


class Torus(object):
  """TPU slices (see the module docstring).

  Attributes:
    cores_per_chip, links_per_chip, link_bandwidth (bytes/s per link per
    direction), core_bandwidth (bytes/s between the cores of a chip),
    transfer_latency (seconds per transfer a ring step or a piece makes),
    pod_dims (chips per dimension of the whole pod), rank (2 or 3),
    ring_rule ("pod": a dimension is a ring when it spans the pod's;
    "cube": when every dimension is a multiple of 4), alltoall_rings
    (an alltoall's pieces also take the wraparound links; False: they
    route along lines).
  """

  def __init__(self, cores_per_chip, links_per_chip, link_bandwidth,
               core_bandwidth, transfer_latency, pod_dims, ring_rule,
               alltoall_rings=False):
    self.cores_per_chip = cores_per_chip
    self.links_per_chip = links_per_chip
    self.link_bandwidth = link_bandwidth
    self.core_bandwidth = core_bandwidth
    self.transfer_latency = transfer_latency
    self.pod_dims = list(pod_dims)
    self.rank = len(pod_dims)
    self.ring_rule = ring_rule
    self.alltoall_rings = alltoall_rings

  def slice_dims(self, devices):
    """[(name, extent, ring, kind)] of the smallest slice holding
    `devices` cores, major first: its chip dimensions as equal as powers
    of two allow (v3: 8 cores -> 2x2 chips, 2,048 -> 32x32), then the
    cores of a chip."""
    chips = max(-(-devices // self.cores_per_chip), 1)
    extents = _square_factors(chips, self.rank)
    if self.ring_rule == "cube":
      rings = [all(e % 4 == 0 for e in extents)] * self.rank
    else:
      rings = [e == p for e, p in zip(extents, sorted(self.pod_dims))]
    dims = [("chips_%d" % i, e, r, "chip")
            for i, (e, r) in enumerate(zip(extents, rings))]
    if self.cores_per_chip > 1:
      dims.append(("cores", self.cores_per_chip, False, "core"))
    return dims

  def place(self, mesh_shape, mesh_axes):
    """The Group of processor 0 over mesh_axes (indices into mesh_shape)
    on the slice holding the mesh."""
    devices = _group_devices(mesh_shape, mesh_axes)
    dims = self.slice_dims(mesh_shape.size)
    return Group(len(devices), _dim_uses(devices, dims), mesh_shape.size)

  def _ring_bandwidth(self, use):
    if use.kind == "core":
      return self.core_bandwidth
    # A ring in both directions on a wraparound dimension; a line carries
    # one ring (its way back uses the other direction of the same links).
    # The chip's cores and the `stride` interleaved groups share the links.
    return (self.link_bandwidth * (2 if use.ring else 1) /
            (self.cores_per_chip * use.stride))

  def _reduce_scatter(self, uses, slice_bytes):
    """Seconds of a reduce-scatter of slice_bytes over the dims `uses`,
    one ring per dimension in the cheapest order."""
    best = None
    for order in itertools.permutations(uses):
      left, t = float(slice_bytes), 0.0
      for u in order:
        t += (left * (u.members - 1) / u.members / self._ring_bandwidth(u)
              + (u.members - 1) * self.transfer_latency)
        left /= u.members
      best = t if best is None else min(best, t)
    return best or 0.0

  def _alltoall(self, group, slice_bytes):
    """Seconds of an alltoall of slice_bytes: the busiest link's load
    (pieces routed dimension by dimension along lines, see the module
    docstring), the chip's injection, and one transfer latency per hop of
    the longest route."""
    load = 0.0
    hops = 0
    for u in group.dims:
      if u.kind == "core":
        continue
      # Across the middle of a line of m members: (m/2)^2 pairs, each
      # S/n per direction, over the (n/m) parallel lines' links; a ring
      # halves the distance and doubles the links across the cut.
      ring = self.alltoall_rings and u.ring
      load = max(load, slice_bytes * u.members * u.stride *
                 self.cores_per_chip / (8.0 if ring else 4.0))
      hops += (u.members // 2 if ring else u.members - 1) * u.stride
    share = (group.size - 1.0) / group.size
    inject = (slice_bytes * share * self.cores_per_chip /
              self.links_per_chip)
    return (max(load, inject) / self.link_bandwidth +
            (hops + 1) * self.transfer_latency)

  def collective_seconds(self, kind, group, slice_bytes):
    """Seconds of one collective (see the module docstring)."""
    if group.size <= 1:
      return 0.0
    kind = CollectiveKind(kind)
    if kind.is_allreduce:
      return 2 * self._reduce_scatter(group.dims, slice_bytes)
    if kind is CollectiveKind.REDUCE_SCATTER:
      return self._reduce_scatter(group.dims, slice_bytes)
    if kind is CollectiveKind.ALLCONCAT:
      return self._reduce_scatter(group.dims, slice_bytes * group.size)
    if kind is CollectiveKind.ALLTOALL:
      return self._alltoall(group, slice_bytes)
    # permute: one neighbour transfer.
    return (slice_bytes / self.link_bandwidth * self.cores_per_chip +
            self.transfer_latency)


class NodeNetwork(object):
  """GPU nodes (see the module docstring).

  Attributes:
    devices_per_node, nvlink_bandwidth, nic_bandwidth (bytes/s per GPU per
    direction), nvlink_latency, nic_latency (seconds per ring step).
  """

  def __init__(self, devices_per_node, nvlink_bandwidth, nic_bandwidth,
               nvlink_latency, nic_latency):
    self.devices_per_node = devices_per_node
    self.nvlink_bandwidth = nvlink_bandwidth
    self.nic_bandwidth = nic_bandwidth
    self.nvlink_latency = nvlink_latency
    self.nic_latency = nic_latency

  def place(self, mesh_shape, mesh_axes):
    """The Group of processor 0 over mesh_axes: its GPUs per node (dim
    "nvlink") and its nodes (dim "node")."""
    devices = _group_devices(mesh_shape, mesh_axes)
    per = self.devices_per_node
    nodes = len({d // per for d in devices})
    local = len(devices) // nodes
    dims = []
    if local > 1:
      dims.append(DimUse("nvlink", local, 1, True, "nvlink"))
    if nodes > 1:
      dims.append(DimUse("node", nodes, 1, True, "node"))
    return Group(len(devices), dims, mesh_shape.size)

  def _split(self, group):
    local = nodes = 1
    for u in group.dims:
      if u.kind == "nvlink":
        local = u.members
      else:
        nodes = u.members
    return local, nodes

  def _reduce_scatter(self, group, slice_bytes):
    local, nodes = self._split(group)
    t = (slice_bytes * (local - 1) / local / self.nvlink_bandwidth +
         (local - 1) * self.nvlink_latency)
    # Across nodes: the l GPUs of a node each ring their 1/l over their
    # own NIC.
    left = slice_bytes / local
    t += (left * (nodes - 1) / nodes / self.nic_bandwidth +
          (nodes - 1) * self.nic_latency)
    return t

  def collective_seconds(self, kind, group, slice_bytes):
    """Seconds of one collective (see the module docstring)."""
    if group.size <= 1:
      return 0.0
    kind = CollectiveKind(kind)
    if kind.is_allreduce:
      return 2 * self._reduce_scatter(group, slice_bytes)
    if kind is CollectiveKind.REDUCE_SCATTER:
      return self._reduce_scatter(group, slice_bytes)
    if kind is CollectiveKind.ALLCONCAT:
      return self._reduce_scatter(group, slice_bytes * group.size)
    local, nodes = self._split(group)
    n = group.size
    if kind is CollectiveKind.ALLTOALL:
      within = slice_bytes * (local - 1) / n / self.nvlink_bandwidth
      across = slice_bytes * (n - local) / n / self.nic_bandwidth
      return (max(within, across) + self.nvlink_latency +
              (self.nic_latency if nodes > 1 else 0.0))
    bandwidth = self.nic_bandwidth if nodes > 1 else self.nvlink_bandwidth
    return slice_bytes / bandwidth + self.nvlink_latency


class SharedBus(object):
  """Virtual devices of one process: latency + bytes sent / bandwidth,
  one latency per collective whatever its group (TF's collective
  executor hands the pieces between threads)."""

  def __init__(self, bandwidth, latency):
    self.bandwidth = bandwidth
    self.latency = latency

  def place(self, mesh_shape, mesh_axes):
    devices = _group_devices(mesh_shape, mesh_axes)
    return Group(len(devices), [], mesh_shape.size)

  def collective_seconds(self, kind, group, slice_bytes):
    n = group.size
    if n <= 1:
      return 0.0
    kinds = CollectiveKind
    factor = {kinds.ALLCONCAT: n - 1, kinds.ALLTOALL: (n - 1.0) / n,
              kinds.REDUCE_SCATTER: (n - 1.0) / n, kinds.PERMUTE: 1.0}.get(
                  CollectiveKind(kind), 2.0 * (n - 1) / n)
    return self.latency + slice_bytes * factor / self.bandwidth
