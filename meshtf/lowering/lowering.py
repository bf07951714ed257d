"""The Lowering engine: walks a meshtf graph in order and turns every
operation into TensorFlow through its mesh's MeshImpl.

All tensor layouts are computed and validated first (pure Python), so a bad
layout raises before any TensorFlow work. In eager mode the lowering runs the
computation; inside tf.function it builds the traced graph.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "mesh")
  >>> x = mtf.import_tf_tensor(mesh, tf.ones([4, 2]), "batch:4;io:2")
  >>> s = mtf.reduce_sum(x)
  >>> impl = mtf.PlacementMeshImpl("all:1", "", ["/cpu:0"])
  >>> float(mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(s))
  8.0
"""
import collections
import contextlib
import re

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf.layouts import reasons as reasons_lib
from meshtf.layouts.reasons import Cause
from meshtf.layouts import relayout as relayout_lib
from meshtf.lowering import bucketing
from meshtf.lowering.pending import PendingSum
from meshtf.lowering import variables as variables_lib


_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


def scope_name(op_name):
  """The TF name scope of a meshtf op's lowering: its name with '/' and
  each character TF does not allow in a scope as '_'."""
  name = _SCOPE_CHARS.sub("_", op_name)
  return name if name[:1].isalnum() else "op" + name


# The graph walk lives with the graph; the engine's callers keep this name.
all_operations = graph_lib.all_operations


def renamed_source(tensor, layout_of):
  """x when tensor is a rename of x (a reshape that keeps every size in
  order: only names change) laid out alike, dim by dim, so that relaying
  one is relaying the other; else None. layout_of: tensor -> MeshLayout."""
  op = tensor.operation
  if len(op.inputs) != 1 or len(op.outputs) != 1 or not op.layout_factors():
    return None
  x = op.inputs[0]
  if x.shape.to_integer_list != tensor.shape.to_integer_list:
    return None
  if layout_of(x).tensor_layout(x.shape) != layout_of(tensor).tensor_layout(
      tensor.shape):
    return None
  return x


class _TensorMap(dict):
  """tensor -> laid-out value in the tensor's own layout; reading
  materialises pending sums. While an operation lowers under a computation
  layout (`current`), reading an input gives its value relaid into that
  layout (Lowering.lower_operation makes them). Relaid values are kept per
  tensor layout, so every reader that wants one layout of a tensor shares
  one relayout (the forward's gathers serve the backward pass too)."""

  def __init__(self, lowering=None):
    super().__init__()
    self.current = None
    self.relaid = {}   # tensor -> {TensorLayout: laid-out value}
    self._lowering = lowering

  def __getitem__(self, key):
    value = self.raw(key)
    if isinstance(value, PendingSum):
      if value.materialized or self._lowering is None:
        return value.to_laid_out_tensor()
      with self._lowering.cause(Cause.REDUCE, tensor=key):
        return value.to_laid_out_tensor()
    return value

  def relaid_value(self, key, layout):
    """The value of tensor key relaid into MeshLayout layout, or None."""
    values = self.relaid.get(key)
    if not values or layout is None:
      return None
    return values.get(layout.tensor_layout(key.shape))

  def raw(self, key):
    relaid = self.relaid_value(key, self.current)
    if relaid is not None:
      return relaid
    return dict.__getitem__(self, key)

  def __setitem__(self, key, value):
    dict.__setitem__(self, key, value)
    self.relaid.pop(key, None)

  def clear(self):
    dict.clear(self)
    self.relaid.clear()


class Lowering(object):
  """Lowers `graph` with one MeshImpl per Mesh.

  Args:
    graph: a meshtf Graph.
    mesh_to_impl: {Mesh: MeshImpl}.
    variable_store: a VariableStore holding the variables' slices; pass the
      same store to each step's Lowering so variables persist. A new store is
      made if None.
    outputs: for SPMD backends, the tensors export_to_tf_tensor will be
      asked for (default: every tensor the program computes anyway).
    launch: for SPMD backends, False only traces the per-device program
      (`lowering.program`, a ConcreteFunction) without running it.
    bucket_bytes: cap (bytes of each device's slice) of a fused allreduce
      bucket for the pending sums of a group (the gradients of
      mtf.gradients, mtf.reduce_together): see meshtf/lowering/bucketing.py.
      None: 1 MiB; 0: off (each sum reduced where it is read).
    graph_layout: the GraphLayout of a one-mesh graph the caller completed
      already (its impl's mesh_layout.assign of the graph's operations),
      used as it is (see validate_layouts).
  """

  def __init__(self, graph, mesh_to_impl, variable_store=None, autostack=False,
               outputs=None, launch=True, bucket_bytes=None,
               graph_layout=None):
    del autostack  # Mesh TensorFlow's option; variables are per slice here.
    self.bucket_bytes = bucketing.check_bucket_bytes(bucket_bytes)
    self.graph = graph
    self.mesh_to_impl = dict(mesh_to_impl)
    self.variable_store = (variable_store if variable_store is not None
                           else variables_lib.VariableStore())
    self.tensors = _TensorMap(self)
    self._causes = []   # what the lowering is doing: reasons of collectives
    self.variables = {}
    self.operations = {}
    self._collectives = []
    self.program = None
    every_op = list(all_operations(graph.operations))
    self._lowered_operations = set(every_op)
    self._consumers = collections.Counter(
        t for op in every_op for t in op.inputs)
    self.validate_layouts(graph_layout)
    self._bucketer = bucketing.Bucketer(self, self.bucket_bytes, every_op,
                                        PendingSum)
    for impl in self.mesh_to_impl.values():
      impl._recorder = self._record
    try:
      program_impl = self._program_impl()
      if program_impl is not None:
        program_impl.lower_graph(self, list(graph.operations), outputs, launch)
      elif not launch:
        raise ValueError("launch=False traces a per-device program; only "
                         "SPMD backends (SimdMeshImpl) have one")
      else:
        for op in graph.operations:
          self.lower_top_level(op)
        self._bucketer.finish()
    finally:
      for impl in self.mesh_to_impl.values():
        impl._recorder = None

  def _program_impl(self):
    """The SPMD impl, if any: its graph becomes one per-device program."""
    program = [i for i in self.mesh_to_impl.values() if i.is_spmd]
    if not program:
      return None
    if len(self.mesh_to_impl) != 1:
      raise ValueError("An SPMD MeshImpl lowers one mesh per Lowering; this "
                       "graph has meshes %s" % sorted(
                           m.name for m in self.mesh_to_impl))
    return program[0]

  def validate_layouts(self, graph_layout=None):
    """Computes every tensor's layout (annotations and their propagation
    included); raises LayoutError on the first bad one, before any
    TensorFlow op is created (MeshLayout.assign, which the training
    binary's preflight runs too). A layout rule naming a dim no tensor of
    the graph has is a LayoutError too (MeshLayout.check_rule_dims).
    graph_layout: the one mesh's GraphLayout when the caller completed it
    already (its mesh layout's assign of these operations: --mode=plan's
    preflight), kept instead of completing it again."""
    by_mesh = collections.OrderedDict()
    for op in all_operations(self.graph.operations):
      by_mesh.setdefault(op.mesh, []).append(op)
    for mesh, ops in by_mesh.items():
      self.mesh_impl(mesh).mesh_layout.check_rule_dims(ops)
    if graph_layout is not None and len(by_mesh) != 1:
      raise ValueError("Lowering: graph_layout is one mesh's, but the graph "
                       "has %d meshes: leave it None" % len(by_mesh))
    self._graph_layouts = {
        mesh: graph_layout if graph_layout is not None else
        self.mesh_impl(mesh).mesh_layout.assign(ops)
        for mesh, ops in by_mesh.items()}

  @property
  def graph_layout(self):
    """The GraphLayout (layouts/assignment.py) of the graph's one mesh:
    every operation's layout and the origin of each of its dims."""
    if len(self._graph_layouts) != 1:
      raise ValueError("graph_layout: this Lowering has %d meshes; use "
                       "op_layout(op)" % len(self._graph_layouts))
    return next(iter(self._graph_layouts.values()))

  def op_layout(self, op):
    """The MeshLayout (computation layout) op lowers under."""
    graph_layout = self._graph_layouts.get(op.mesh)
    return (graph_layout.op_layout(op) if graph_layout is not None
            else self.mesh_impl(op).mesh_layout)

  def layout_of(self, tensor):
    """The MeshLayout whose rules lay out tensor (its producer's)."""
    return self.op_layout(tensor.operation)

  def lower_operation(self, op):
    """Lowers op under its computation layout: inputs laid out otherwise
    are relaid first (the MeshLayout's relayout plan), and so are the
    tensors its inner operations read from outside."""
    impl = self.mesh_impl(op)
    layout = self.op_layout(op)
    saved = self.tensors.current
    with impl.using_layout(layout), self.cause(Cause.COMPUTES, op):
      for t in dict.fromkeys(op.inputs):
        with self.cause(Cause.RELAYOUT, op, t):
          self._relay(impl, t, layout)
      for t, inner_layout in self._captured(op):
        with self.cause(Cause.RELAYOUT, op, t):
          self._relay(impl, t, inner_layout)
      self.tensors.current = layout
      try:
        op.lower(self)
      finally:
        self.tensors.current = saved

  def lower_top_level(self, op):
    """Lowers a top-level operation (graph order), then issues the fused
    allreduce buckets its outputs complete (bucketing.Bucketer). Each in
    its own TF name scope (the op's name, "allreduce_buckets"): TF's
    profiler and the plan's memory simulation name TF ops by them."""
    with tf.name_scope(scope_name(op.name)):
      self.lower_operation(op)
    with tf.name_scope("allreduce_buckets"):
      self._bucketer.after(op)

  def finish_buckets(self):
    """Issues the buckets still open (the end of the walk)."""
    with tf.name_scope("allreduce_buckets"):
      self._bucketer.finish()

  def _captured(self, op):
    """(tensor, layout) for the tensors op's inner operations read that
    are made outside them, each with the layout its reader lowers under."""
    if not op.inner_operations:
      return []
    inner = list(all_operations(op.inner_operations))
    made = {t for o in inner for t in o.outputs}
    out = []
    for o in inner:
      for t in o.inputs:
        if t not in made and t in self.tensors:
          out.append((t, self.op_layout(o)))
    return list(dict.fromkeys(out))

  def value_in(self, tensor, mesh_layout):
    """tensor's laid-out value in mesh_layout's layout of it (relaid if its
    own layout differs; pending sums reduced), for an operation that needs
    one input in a given layout (an assignment: the variable's)."""
    self._relay(self.mesh_impl(tensor), tensor, mesh_layout)
    saved = self.tensors.current
    self.tensors.current = mesh_layout
    try:
      return self.tensors[tensor]
    finally:
      self.tensors.current = saved

  def _relay(self, impl, tensor, layout):
    """Makes tensor's value in `layout` available to readers under it."""
    own = self.layout_of(tensor)
    if own is layout:
      return
    old = own.tensor_layout(tensor.shape)
    new = layout.tensor_layout(tensor.shape)
    if old != new:
      self._relay_to(impl, tensor, old, new)

  def _relay_to(self, impl, tensor, old, new):
    """tensor's value relaid from TensorLayout old (its own) to new, made
    once and kept for every reader that wants new."""
    kept = self.tensors.relaid.setdefault(tensor, {})
    if new in kept:
      return kept[new]
    raw = dict.__getitem__(self.tensors, tensor)
    source = renamed_source(tensor, self.layout_of)
    if source is not None and not isinstance(raw, PendingSum) and \
        not isinstance(dict.__getitem__(self.tensors, source), PendingSum):
      # A rename's output relaid is its input relaid (the dims line up):
      # one gather serves the readers of both (self-attention's keys and
      # values read the gathered input of its queries).
      kept[new] = self._relay_to(impl, source, old, new)
      return kept[new]
    plan = impl.mesh_layout.relayout_plan(
        tensor.shape, tensor.shape, tensor.dtype.size, old, new)
    if isinstance(raw, PendingSum) and not raw.materialized:
      # Partial sums whose new layout splits a summed axis: reduce-scatter
      # instead of allreduce + split (GSPMD Figure 7).
      fused, rest = relayout_lib.fuse_reduce_scatter(
          plan, raw.mesh_axes, tensor.dtype.size)
      if len(rest) < len(raw.mesh_axes):
        with self.cause(Cause.REDUCE_SCATTER, tensor=tensor):
          kept[new] = raw.record_while(lambda: impl.allreduce(
              impl.execute_relayout(raw.laid_out, fused), rest, "SUM"))
        return kept[new]
    saved = self.tensors.current
    self.tensors.current = None
    try:
      value = self.tensors[tensor]
    finally:
      self.tensors.current = saved
    kept[new] = impl.execute_relayout(value, plan)
    return kept[new]

  def mesh_impl(self, m):
    """The MeshImpl of a Mesh, Tensor or Operation."""
    mesh = m if isinstance(m, graph_lib.Mesh) else m.mesh
    try:
      return self.mesh_to_impl[mesh]
    except KeyError:
      raise ValueError("Mesh %r has no MeshImpl in this Lowering; pass "
                       "{mesh: impl} for every mesh of the graph" % mesh.name)

  # --- for op lowerings ----------------------------------------------------
  def set_tensor_lowering(self, tensor, laid_out):
    self.tensors[tensor] = laid_out

  def pending_or_laid_out(self, tensor):
    """The lowered value for an op that can keep a sum pending (a linear
    op): the PendingSum while deferring still saves work, i.e. it is not yet
    reduced and this op is the tensor's only consumer; else the reduced
    LaidOutTensor (a second consumer would otherwise allreduce it again)."""
    raw = self.tensors.raw(tensor)
    if isinstance(raw, PendingSum) and (raw.materialized or
                                        self._consumers[tensor] > 1):
      with self.cause(Cause.REDUCE, tensor=tensor):
        return raw.to_laid_out_tensor()
    return raw

  # --- why each collective exists -----------------------------------------
  @contextlib.contextmanager
  def cause(self, kind, op=None, tensor=None, tensors=None):
    """Within the block, collectives are recorded with a Reason of `kind`
    (layouts/reasons.py): op is the operation being lowered (by default
    the enclosing cause's), tensor / tensors the ones moved."""
    if self._causes:
      outer = self._causes[-1]
      if kind is Cause.REDUCE and outer[0] is Cause.EXPORT:
        kind = Cause.EXPORT   # the export's own reduction
      if op is None:
        op = outer[1]
    self._causes.append((kind, op, tensor, tensors))
    try:
      yield
    finally:
      self._causes.pop()

  def _record(self, record):
    self._collectives.append((record, self._reason()))

  def _reason(self):
    """The Reason of a collective recorded now (None outside any cause)."""
    if not self._causes:
      return None
    kind, op, tensor, tensors = self._causes[-1]
    anchor = op or tensor or (tensors[0] if tensors else None)
    graph_layout = self._graph_layouts.get(getattr(anchor, "mesh", None))
    if graph_layout is None:
      return None
    if kind is Cause.RELAYOUT:
      return reasons_lib.relayout(graph_layout, op, tensor)
    if kind in (Cause.REDUCE, Cause.REDUCE_SCATTER):
      return reasons_lib.reduce(graph_layout, op, tensor,
                                kind is Cause.REDUCE_SCATTER)
    if kind is Cause.BUCKET:
      return reasons_lib.bucket(graph_layout, tensors)
    if kind is Cause.EXPORT:
      return reasons_lib.reduce(graph_layout, None, tensor, where="(export)")
    return reasons_lib.computes(graph_layout, op,
                                Cause.RESHAPE if op.reshapes else kind)

  def explain(self, top=10):
    """The collectives that send the most bytes, each with its reason: the
    operation that emitted it and the two layouts that met, with their
    origins (layouts/reasons.py).

    Example:
      >>> print(lowering.explain(top=5))
    """
    return reasons_lib.explain(self.collective_stats(), top)

  def lowered_operation(self, op):
    return self.operations.get(op)

  # Mesh TensorFlow kept a master copy of each variable besides its slices
  # and copied between them; meshtf keeps only the slices, so both copies
  # are no-ops (returned as ops so that TF1-style code can run them).
  def copy_masters_to_slices(self):
    """A no-op: meshtf stores no master copies (Mesh TF compatibility).

    Example:
      >>> lowering.copy_masters_to_slices()   # doctest: +SKIP
    """
    return tf.no_op(name="copy_masters_to_slices")

  def copy_slices_to_masters(self):
    """A no-op: meshtf stores no master copies (Mesh TF compatibility)."""
    return tf.no_op(name="copy_slices_to_masters")

  # --- results -----------------------------------------------------------
  def export_to_tf_tensor(self, x):
    """The full value of meshtf Tensor x as a tf.Tensor."""
    if x not in self.tensors:
      raise ValueError("%s has no lowered value here: %s" % (
          x.name, self._why_not_lowered(x)))
    impl = self.mesh_impl(x)
    with impl.using_layout(self.layout_of(x)), self.cause(Cause.EXPORT,
                                                          tensor=x):
      return impl.export_to_tf_tensor(self.tensors[x], x.shape)

  def _why_not_lowered(self, x):
    """Why export_to_tf_tensor has no value for x, with the fix."""
    if getattr(x, "graph", None) is not self.graph:
      return ("it belongs to another mtf.Graph than this Lowering's: lower "
              "its own graph (mtf.Lowering(its graph, ...)), or build it in "
              "this one")
    if x.operation not in self._lowered_operations:
      return ("it was made after this Lowering (which lowered the %d "
              "operations its graph had then): build it before "
              "mtf.Lowering(...), or lower the graph again" % len(
                  self._lowered_operations))
    if self.program is not None:
      return ("it was not an output of the SPMD program; list it in "
              "Lowering(..., outputs=[...])")
    return "it is not a tensor of this Lowering's graph"

  def variable_value(self, var):
    """Full value of a variable (Variable op, its tensor, or its name) as of
    now (after this lowering's assignments, in eager mode)."""
    if isinstance(var, graph_lib.Tensor):
      var = var.operation
    name = var if isinstance(var, str) else var.name
    return self.variable_store.entry(name).full_value()

  def collective_stats(self):
    """Every collective this lowering emitted, grouped.

    Returns a list of dicts with keys kind, mesh_axes, group_size,
    elements_per_device (of the slice each device puts in),
    bytes_per_device (what each device sends: relayout.collective_bytes),
    count, and reasons: one layouts.reasons.Reason per occurrence (the
    operation that emitted it, the tensor, the layout it was held in and
    the one wanted, with their origins; see explain()), ordered by first
    emission.
    """
    counts = collections.OrderedDict()
    for rec, reason in self._collectives:
      counts.setdefault(rec, []).append(reason)
    return [dict(rec._asdict(), count=len(why), reasons=why)
            for rec, why in counts.items()]

  def collective_summary(self):
    """A short human-readable table of collective_stats()."""
    lines = ["%-16s %-14s %6s %12s %12s %6s" % (
        "collective", "mesh axes", "group", "elems/dev", "bytes sent/dev",
        "count")]
    total = sent = 0
    for s in self.collective_stats():
      lines.append("%-16s %-14s %6d %12d %12d %6d" % (
          s["kind"], ",".join(s["mesh_axes"]), s["group_size"],
          s["elements_per_device"], s["bytes_per_device"], s["count"]))
      total += s["elements_per_device"] * s["count"]
      sent += s["bytes_per_device"] * s["count"]
    lines.append("total elements per device: %d, bytes sent per device: %d"
                 % (total, sent))
    padding = self.padding_stats()
    if padding["tensors"]:
      lines.append(
          "uneven splits: %d tensors padded (%s); their slices hold %.1f%% "
          "padding" % (padding["tensors"], ", ".join(padding["dims"]),
                       100.0 * padding["padding_fraction"]))
    return "\n".join(lines)

  def padding_stats(self):
    """What the uneven splits of this graph's tensors cost: a dict with
    "tensors" (how many are padded), "dims" (each padded dim, e.g.
    "vocab:250/4 -> 63") and "padding_fraction" (of those tensors' global
    padded elements, the share that is padding)."""
    tensors, dims, real, padded = 0, [], 0, 0
    for op in all_operations(self.graph.operations):
      layout = self.mesh_impl(op).mesh_layout
      for t in op.outputs:
        uneven = layout.uneven_dims(t.shape)
        if not uneven:
          continue
        tensors += 1
        report = layout.padding_report(t.shape)
        real += report["elements"]
        padded += report["padded_elements"]
        for u in uneven:
          text = "%s:%d/%d -> %d" % (u.name, u.size, u.num_shards,
                                     u.shard_size)
          if text not in dims:
            dims.append(text)
    return {"tensors": tensors, "dims": dims,
            "padding_fraction": 1.0 - real / padded if padded else 0.0}
