"""Bucketing: the pending sums of a group go out as few, fused allreduces.

Every TF collective costs a fixed latency however small (about 3-4 ms among
8 virtual CPUs on a 2-core machine), so a data-parallel step that allreduces
each weight gradient separately pays it once per variable. A group of
tensors (mtf.reduce_together; mtf.gradients registers its results) is
instead reduced in buckets: their local slices flattened and concatenated,
one allreduce, split back (MeshImpl.allreduce_bucket), with at most
`bucket_bytes` of slice per bucket.

How buckets form, identically on every worker (the traced program is the
same everywhere, so multi-worker collectives still meet):
  * the lowering walks the top-level operations in graph order; after each
    one, the group members it produced that are still unreduced pending
    sums join the open bucket of their (mesh, mesh axes, dtype);
  * a bucket is issued as soon as it is full (the next member would pass
    the cap, or it reached the cap) or the group's last member has been
    produced. Gradients are produced in backward order, so the last layers'
    bucket is issued while the backward pass still computes the first
    layers' gradients: TensorFlow runs a collective when its inputs exist,
    and the SPMD backend's ordering token orders collectives by issue
    (= creation) order, so issuing early is what lets them overlap.
A member is left to the ordinary path (reduced where read) when it has no
reader, when a reader relays it into another layout (a reduce-scatter there
moves half the bytes: weight-update sharding), or when it was already
reduced.

Example:
  >>> lowering = mtf.Lowering(graph, {mesh: impl}, bucket_bytes=1 << 20)
  >>> [s["count"] for s in lowering.collective_stats()]   # 3 grads: one
  [1]
"""
import collections

from meshtf.layouts.reasons import Cause

# Default cap per bucket (bytes of each device's slice): measured on 8
# virtual CPUs, fusing multi-MiB gradients costs more (concat + split copies,
# and the bucket waits for its last gradient) than the collectives it saves;
# small ones gain.
DEFAULT_BUCKET_BYTES = 1 << 20


def check_bucket_bytes(bucket_bytes):
  """bucket_bytes as an int (None: the default; 0: bucketing off); one
  clear error for anything else.

  Example:
    >>> check_bucket_bytes(None) == DEFAULT_BUCKET_BYTES
    True
  """
  if bucket_bytes is None:
    return DEFAULT_BUCKET_BYTES
  if isinstance(bucket_bytes, bool) or not isinstance(
      bucket_bytes, (int, float)) or bucket_bytes < 0:
    raise ValueError("bucket_bytes must be a number of bytes >= 0 (0 turns "
                     "gradient bucketing off), got %r" % (bucket_bytes,))
  return int(bucket_bytes)


class _Bucket(object):

  def __init__(self, group):
    self.group = group
    self.members = []   # (tensor, PendingSum)
    self.nbytes = 0


class Bucketer(object):
  """Forms and issues the buckets of one Lowering (see the module doc).

  The Lowering calls after(op) once each top-level operation has lowered,
  and finish() at the end of the walk. all_operations: every operation,
  inner ones of control flow included (their reads count);
  pending_type: the lowering's PendingSum class.
  """

  def __init__(self, lowering, bucket_bytes, all_operations, pending_type):
    self._lowering = lowering
    self._cap = bucket_bytes
    self._pending_type = pending_type
    self._by_producer = collections.defaultdict(list)  # op -> [(g, tensor)]
    self._last = collections.defaultdict(list)          # op -> [g]
    self._open = collections.OrderedDict()               # key -> _Bucket
    self._queued = set()
    groups = getattr(lowering.graph, "reduce_groups", []) if bucket_bytes \
        else []
    if not groups:
      return
    position = {op: i for i, op in enumerate(lowering.graph.operations)}
    for g, tensors in enumerate(groups):
      top = [t for t in tensors if t.operation in position]
      if len(top) < 2:
        continue  # nothing to fuse
      for t in top:
        self._by_producer[t.operation].append((g, t))
      last = max(top, key=lambda t: position[t.operation])
      self._last[last.operation].append(g)
    members = {t for pairs in self._by_producer.values() for _, t in pairs}
    self._readers = collections.defaultdict(list)
    for op in all_operations:
      for t in dict.fromkeys(op.inputs):
        if t in members:
          self._readers[t].append(op)

  @property
  def active(self):
    return bool(self._by_producer)

  def after(self, op):
    """Offers op's group members; issues the buckets that are complete."""
    for g, t in self._by_producer.get(op, ()):
      self._offer(g, t)
    for g in self._last.get(op, ()):
      for key in [k for k, b in self._open.items() if b.group == g]:
        self._issue(self._open.pop(key))

  def finish(self):
    while self._open:
      self._issue(self._open.popitem(last=False)[1])

  def _eligible(self, t, raw):
    if (not isinstance(raw, self._pending_type) or raw.materialized
        or id(raw) in self._queued or not self._readers.get(t)):
      return False
    own = self._lowering.layout_of(t).tensor_layout(t.shape)
    return all(self._lowering.op_layout(r).tensor_layout(t.shape) == own
               for r in self._readers[t])

  def _offer(self, g, t):
    raw = dict.get(self._lowering.tensors, t)
    if not self._eligible(t, raw):
      return
    local = raw.laid_out.tensor_list[0]
    if not local.shape.is_fully_defined():
      return
    nbytes = local.shape.num_elements() * local.dtype.size
    key = (g, id(raw.mesh_impl), raw.mesh_axes, local.dtype)
    bucket = self._open.get(key)
    if bucket is not None and bucket.nbytes + nbytes > self._cap:
      self._issue(self._open.pop(key))
      bucket = None
    if bucket is None:
      bucket = self._open[key] = _Bucket(g)
    bucket.members.append((t, raw))
    bucket.nbytes += nbytes
    self._queued.add(id(raw))
    if bucket.nbytes >= self._cap:
      self._issue(self._open.pop(key))

  def _issue(self, bucket):
    """One allreduce for the bucket's members not reduced meanwhile."""
    sums = [raw for _, raw in bucket.members if not raw.materialized]
    for raw in sums:
      self._queued.discard(id(raw))
    if len(sums) < 2:
      for t, raw in bucket.members:
        if not raw.materialized:
          with self._lowering.cause(Cause.REDUCE, tensor=t):
            raw.to_laid_out_tensor()
      return
    impl = sums[0].mesh_impl
    tensors = [t for t, raw in bucket.members if not raw.materialized]
    with self._lowering.cause(Cause.BUCKET, tensors=tensors):
      reduced = sums[0].record_while(lambda: impl.allreduce_bucket(
          [s.laid_out for s in sums], list(sums[0].mesh_axes), "SUM"))
    for raw, value in zip(sums, reduced):
      raw.set_result(value)
