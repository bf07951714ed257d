"""The plan report: what a model needs per device under a mesh layout --
memory, flops by op family, collectives (from the traced per-device SPMD
program: exactly what a run emits) and an estimated step time on a
hardware model -- without devices and without running anything.

Step time: every op (or, where XLA compiles the program, every fused
kernel: plan/fusion.py) at its roofline, max(flops / peak, bytes / memory
bandwidth); every collective priced where its group sits on the
hardware's interconnect (plan/hardware/); where the runtime runs
collectives asynchronously, the collectives beside the compute that does
not need them (plan/timeline.py), else after it. The hardware's
constants, their sources and the assumptions are printed with it.

Example:
  >>> report = plan(graph, mtf.MeshLayout("rows:2;cols:4", "batch:rows"),
  ...               hardware="tpuv3", backward_start=n_forward_ops)
  >>> report.summary()["step_seconds"]
"""
import functools
import json

from meshtf.layouts import reasons as reasons_lib
from meshtf.layouts.completion import engine
from meshtf.lowering import lowering as lowering_lib
from meshtf.lowering import simd
from meshtf.plan import accounting
from meshtf.plan import estimate
from meshtf.plan import fusion
from meshtf.plan import hardware as hardware_lib
from meshtf.plan import program_memory
from meshtf.plan import timeline as timeline_lib


def _without_cyclic_gc(function):
  """function run with Python's cyclic collector off: the plan's passes
  make a few small objects per operation and free almost none, so the
  collector would rescan the whole (large) graph again and again (on the
  papers' 256-layer rows about a third of the planning time;
  the layout completion does the same)."""
  @functools.wraps(function)
  def run(*args, **kwargs):
    with engine.cyclic_collector_off():
      return function(*args, **kwargs)
  return run


def notional_devices(n, per_host=8):
  """Device names for a mesh of n processors that only gets traced."""
  return ["/job:worker/replica:0/task:%d/device:CPU:%d" % (i // per_host,
                                                           i % per_host)
          for i in range(n)]


class PlanReport(object):
  """Per-device needs of one graph on one mesh layout and hardware model.

  Attributes:
    mesh_layout, hardware, accounting (plan/accounting.py),
    collectives: the traced program's collective_stats() (or their
      estimate from the layouts: plan/estimate.py),
    collectives_source: "traced" or "estimated",
    graph_layout: every tensor's layout (layouts/assignment.py),
    program_memory: the traced program under TF's executor
      (plan/program_memory.py), or None (not traced, or XLA hardware).
    operations: the graph's operations (for the fused kernels' timing);
      None: each op priced alone.
    timeline_events: one collective record per collective with the op
      positions it is ready after and needed before
      (estimate_collectives(timeline=...)), for the overlap; None: no
      overlap.
    fusions: the ops that fuse (fusion.union_find), where plan() found
      them already; None: found when the time is asked for.
  """

  def __init__(self, mesh_layout, hw, acc, collectives, graph_layout=None,
               collectives_source="traced", program_memory=None,
               executor_threads=None, operations=None,
               timeline_events=None, fusions=None):
    self.mesh_layout = mesh_layout
    self.hardware = hw
    self.accounting = acc
    self.collectives = collectives
    self.graph_layout = graph_layout
    self.collectives_source = collectives_source
    self.program_memory = program_memory
    self.executor_threads = executor_threads
    self.operations = operations
    self.timeline_events = timeline_events
    self._fusions = fusions
    self._op_seconds = None
    self._timeline = None

  def memory(self):
    """Bytes per device: the accounting's (parameters, optimizer state,
    activations kept for backward, padding, the activation peak in graph
    order) with "peak_sequential" = parameters + optimizer state + that
    peak, and "peak" = the model that fits the hardware: under TF's
    executor (the traced program's activation peak + its constants and
    inputs + parameters + optimizer state) when simulated, else the
    sequential one."""
    mem = dict(self.accounting.memory)
    mem["peak_sequential"] = mem["peak"]
    pm = self.program_memory
    if pm is not None:
      mem["activations_peak_executor"] = pm.peak
      mem["collective_scratch_at_peak"] = pm.scratch_at_peak
      mem["program_constants"] = pm.constants
      mem["program_inputs"] = pm.inputs
      mem["peak"] = (mem["parameters"] + mem["optimizer_state"] +
                     pm.constants + pm.inputs + pm.peak)
    return mem

  def memory_model(self):
    """How "peak" was predicted, with its assumptions (the summary's
    "memory_model")."""
    pm = self.program_memory
    if pm is None:
      return {"kind": "sequential", "assumptions": [
          "the meshtf graph's ops run one at a time in graph order; each "
          "meshtf tensor lives from its op to its last reader; lowering "
          "intermediates, in-place reuse, collective buffers and the "
          "executor's order are not modelled" + (
              " (trace the program for them)" if
              self.hardware.executor_threads is not None else
              " (XLA schedules the program)")]}
    return {
        "kind": "executor", "threads": self.executor_threads,
        "peak_op": pm.peak_op, "peak_scope": pm.peak_scope,
        "at_peak": [list(kv) for kv in pm.at_peak], "tf_ops": pm.ops,
        "assumptions": [
            "the traced per-device program as TF's executor runs it "
            "(plan/program_memory.py): ready ops start in the order they "
            "become ready on %d inter-op thread(s), timed by the hardware "
            "model; collectives run asynchronously" % self.executor_threads,
            "every TF op's outputs are allocated when it starts and freed "
            "after their last reader; views allocate nothing; elementwise "
            "ops and allreduces reuse an input buffer nobody else reads",
            "a ring allreduce over n devices holds (n-1)/n of its input as "
            "scratch; what depends only on constants and the processor "
            "number is folded into constants the program holds",
            "not modelled: Grappler's arithmetic rewrites, its per-device "
            "folding of padding masks, kernels' own temporaries, the "
            "allocator's block rounding"]}

  @_without_cyclic_gc
  def op_seconds(self):
    """[seconds] of each op in accounting.costs' order (plan/fusion.py:
    fused kernels' time spread over their ops where XLA compiles)."""
    if self._op_seconds is None:
      hw = self.hardware
      share = self.mesh_layout.size if hw.shared_compute else 1
      if self.operations is not None and self.graph_layout is not None:
        by_op = fusion.op_seconds(
            self.operations, self.graph_layout, hw,
            {c.op: c for c in self.accounting.costs}, found=self._fusions)
        self._op_seconds = [by_op[c.op] * share
                            for c in self.accounting.costs]
      else:
        self._op_seconds = [
            share * max(c.flops / hw.peak_flops,
                        c.bytes / hw.memory_bandwidth)
            for c in self.accounting.costs]
    return self._op_seconds

  def compute_seconds(self):
    """Seconds of the step's ops (fused where XLA compiles), without the
    hardware's step overhead."""
    return sum(self.op_seconds())

  def collective_seconds(self):
    """Seconds of the step's collectives, one after another."""
    mesh = self.mesh_layout.mesh_shape
    return sum(r["count"] * hardware_lib.collective_seconds(
        self.hardware, mesh, r) for r in self.collectives)

  @_without_cyclic_gc
  def timeline(self):
    """The step's Timeline (plan/timeline.py) where the hardware overlaps
    collectives with compute and the events are known; None otherwise."""
    if (self._timeline is None and self.hardware.overlap and
        self.timeline_events is not None):
      mesh = self.mesh_layout.mesh_shape
      hw = self.hardware
      prices = {}

      def price(r):
        # A collective repeated per layer is priced once.
        key = (r["kind"], tuple(r["mesh_axes"]), r["group_size"],
               r["elements_per_device"], r["bytes_per_device"])
        if key not in prices:
          prices[key] = hardware_lib.collective_seconds(hw, mesh, r)
        return prices[key]

      self._timeline = timeline_lib.simulate(
          self.op_seconds(), self.timeline_events, price)
    return self._timeline

  def step_seconds(self):
    """The step's seconds: compute, collectives (beside the compute where
    the hardware overlaps them, else after it) and the step overhead."""
    t = self.timeline()
    if t is not None:
      return t.step + self.hardware.step_overhead
    return (self.compute_seconds() + self.collective_seconds() +
            self.hardware.step_overhead)

  def summary(self):
    """The report as a dict (what the JSON file holds)."""
    acc = self.accounting
    return self._summary_of(
        self.memory(), acc.flops, acc.bytes, dict(acc.flops_by_family),
        self.compute_seconds() + self.hardware.step_overhead,
        self.step_seconds())

  def _summary_of(self, mem, flops, touched, flops_by_family, compute, step):
    """summary() from its totals (memory, flops, bytes touched, flops by
    family, compute seconds with the step overhead, step seconds): what
    derives from them and from the collectives is derived here, for a
    counted plan (plan/repeated.py) as for this one."""
    comm = self.collective_seconds()
    by_kind = {}
    for r in self.collectives:
      entry = by_kind.setdefault(r["kind"], {"count": 0, "bytes": 0})
      entry["count"] += r["count"]
      entry["bytes"] += r["count"] * r["bytes_per_device"]
    return {
        "mesh": ";".join("%s:%d" % (d.name, d.size)
                         for d in self.mesh_layout.mesh_shape.dims),
        "layout": ";".join("%s:%s" % p
                           for p in self.mesh_layout.layout_rules.pairs),
        "hardware": self.hardware.name,
        "memory_bytes_per_device": mem,
        "memory_model": self.memory_model(),
        "fits_in_memory": mem["peak"] <= self.hardware.memory_bytes,
        "flops_per_device": flops,
        "flops_by_family": flops_by_family,
        "arithmetic_intensity": flops / touched if touched else 0.0,
        # Every collective with its count; the reasons of the ones that
        # send the most in "top_collectives" (all of them: explain()).
        "collectives": [{k: v for k, v in r.items() if k != "reasons"}
                        for r in self.collectives],
        "top_collectives": self.top_collectives(),
        "collective_bytes_per_device": sum(
            r["count"] * r["bytes_per_device"] for r in self.collectives),
        "collectives_by_kind": by_kind,
        "collectives_source": self.collectives_source,
        "compute_seconds": compute,
        "collective_seconds": comm,
        "exposed_collective_seconds": step - compute,
        "step_seconds": step,
        "flops_utilization": (
            flops / (step * self.hardware.peak_flops) if step and not
            self.hardware.shared_compute else None),
        "assumptions": self.hardware.describe() + [self._step_rule()],
    }

  def top_collectives(self, top=5):
    """The `top` groups of collectives that send the most bytes (a
    collective repeated per layer is one group), each with its count,
    bytes and one reason: the operation that emitted it and the layouts
    that met, with their origins (layouts/reasons.py)."""
    groups = {}
    for r in self.collectives:
      for reason in r.get("reasons") or [None] * r["count"]:
        key = (r["kind"], tuple(r["mesh_axes"]), r["bytes_per_device"],
               reason.pattern if reason else None)
        entry = groups.setdefault(key, {
            "kind": r["kind"], "mesh_axes": list(r["mesh_axes"]),
            "bytes_per_device": r["bytes_per_device"], "count": 0,
            "reason": reason._asdict() if reason else None})
        entry["count"] += 1
    ranked = sorted(groups.values(),
                    key=lambda e: -e["bytes_per_device"] * e["count"])
    return ranked[:top]

  def explain(self, top=10):
    """The collectives that send the most bytes per device, grouped where
    they repeat, each with why it exists: the operation that emitted it,
    the tensor, the layout it was held in and the one wanted, each dim
    with the annotation, variable layout or rule behind it.

    Example:
      >>> print(mtf.plan.plan(graph, layout, trace=False).explain(5))
    """
    return reasons_lib.explain(self.collectives, top)

  def _step_rule(self):
    hw = self.hardware
    ops = ("fused kernels' rooflines (plan/fusion.py)"
           if hw.compiler is hardware_lib.Compiler.XLA and
           self.operations is not None
           else "ops' rooflines, one kernel each")
    if self.timeline() is not None:
      return ("step time = the %s in graph order, with each collective "
              "(priced on the interconnect) beside the compute that does "
              "not need it (plan/timeline.py; the timeline from the "
              "layouts' estimate)" % ops)
    return ("step time = sum of the %s + sum of the collectives' times "
            "on the interconnect, without overlap" % ops)

  def to_json(self):
    return json.dumps(self.summary(), indent=1, sort_keys=True,
                      default=str)

  def text(self):
    """One screen: memory, flops, collectives, step time, assumptions."""
    s = self.summary()
    mem = s["memory_bytes_per_device"]
    mb = lambda b: "%.3f MB" % (b / 1e6)  # noqa: E731
    lines = [
        "plan: mesh %s, layout %s, hardware %s" % (s["mesh"], s["layout"],
                                                   s["hardware"]),
        "memory per device: parameters %s, optimizer state %s, activations "
        "kept for backward %s, padding %s; peak %s (%s)"
        % (mb(mem["parameters"]), mb(mem["optimizer_state"]),
           mb(mem["activations_saved"]), mb(mem["padding"]), mb(mem["peak"]),
           "fits" if s["fits_in_memory"] else "DOES NOT FIT in %s" % mb(
               self.hardware.memory_bytes))] + self._memory_lines(s, mb) + [
        "flops per device: %.4g (%s); arithmetic intensity %.2f flop/byte"
        % (s["flops_per_device"], ", ".join(
            "%s %.3g" % kv for kv in sorted(
                s["flops_by_family"].items(), key=lambda kv: -kv[1])[:5]),
           s["arithmetic_intensity"]),
        "collectives per step (%s): %s; %s sent per device" % (
            s["collectives_source"],
            ", ".join("%s x%d (%s)" % (k, v["count"], mb(v["bytes"]))
                      for k, v in sorted(s["collectives_by_kind"].items())),
            mb(s["collective_bytes_per_device"])),
        "step time estimate: %.4g s (compute %.4g s + collectives %.4g s"
        ", %.4g s of them not hidden by compute)%s"
        % (s["step_seconds"], s["compute_seconds"], s["collective_seconds"],
           s["exposed_collective_seconds"],
           "; %.1f%% of peak flops" % (100 * s["flops_utilization"])
           if s["flops_utilization"] is not None else ""),
        "assumptions:"] + ["  " + a for a in s["assumptions"]] + [
            "  " + a for a in s["memory_model"]["assumptions"]]
    return "\n".join(lines)

  def _memory_lines(self, s, mb):
    mem = s["memory_bytes_per_device"]
    model = s["memory_model"]
    lines = []
    if model["kind"] == "executor":
      scopes = ", ".join("%s %s" % (name, mb(b))
                         for name, b in model["at_peak"][:3])
      lines.append(
          "  peak under TF's executor (traced program, %d thread(s) per "
          "device): activations %s at %s (%s...), of which collective "
          "scratch %s; program constants %s, inputs %s" % (
              model["threads"], mb(mem["activations_peak_executor"]),
              model["peak_scope"], scopes,
              mb(mem["collective_scratch_at_peak"]),
              mb(mem["program_constants"]), mb(mem["program_inputs"])))
    lines.append(
        "  sequential (graph order, meshtf tensors only): activation peak "
        "%s, peak %s" % (mb(mem["activations_peak"]),
                         mb(mem["peak_sequential"])))
    return lines


def step_outputs(operations):
  """The tensors a step computes that nothing in it reads (its loss, a
  gradient the caller exports): a run exports them, so the plan reduces
  their pending sums as the export would -- a gradient nothing applies
  still costs its allreduce."""
  read = {t for op in operations for t in op.inputs}
  return [t for op in operations for t in op.outputs if t not in read]


@_without_cyclic_gc
def plan(graph, mesh_layout, hardware="cpu", backward_start=None,
         trace=True, executor_threads=None, compiler=None,
         graph_layout=None):
  """The PlanReport of graph (one mesh) under mesh_layout on a hardware
  model ("tpuv3", "h100_8x_node", "cpu"). backward_start: index in
  graph.operations of the first backward op (for the activations kept
  for the backward pass; default: where mtf.gradients began). Traces
  the per-device SPMD program on notional devices (never run) for the
  collectives and, where TF's executor runs it (not on XLA hardware),
  for its memory (plan/program_memory.py: executor_threads overrides
  the hardware's inter-op threads per device); trace=False estimates the
  collectives from the layouts instead (plan/estimate.py: the same
  records on the models here, in a fraction of the time) and keeps the
  sequential liveness; trace="auto" traces only where TF's executor runs
  the program (its memory needs the traced program) and estimates where
  XLA compiles it (the trace would give only the collectives: on the
  papers' 256-layer rows minutes of tracing, where the estimate takes
  seconds). compiler: "xla" or "tf" overrides the hardware's (a GPU with
  jit_compile runs XLA). graph_layout: the graph's mesh_layout.assign
  when the caller has it (the training binary's preflight completed it),
  else completed here. Raises LayoutError / ValueError on bad input
  before any tracing.

  Example:
    >>> print(plan(graph, mtf.MeshLayout("x:8", "batch:x")).text())
    >>> plan(graph, layout, "tpuv3", trace="auto").collectives_source
    'estimated'
  """
  hw = hardware_lib.get(hardware, compiler)
  if trace == "auto":
    trace = (executor_threads or hardware_lib.executor_threads(
        hw, mesh_layout.size)) is not None
  meshes = {op.mesh for op in graph.operations}
  if len(meshes) != 1:
    raise ValueError("plan: the graph has %d meshes; plan one mesh's graph"
                     % len(meshes))
  mesh = meshes.pop()
  operations = list(graph.operations)
  if graph_layout is None:
    graph_layout = mesh_layout.assign(lowering_lib.all_operations(
        operations))
  if backward_start is None:
    backward_start = graph.backward_start
  # Where XLA compiles the program its fused kernels' intermediates take
  # no memory (the sequential liveness the plan reports there).
  found = (fusion.union_find(operations, graph_layout)
           if hw.compiler is hardware_lib.Compiler.XLA else None)
  fused = (accounting.fused_kernels(fusion.fusions(operations, graph_layout,
                                                   found))
           if found is not None else None)
  acc = accounting.account(operations, graph_layout, backward_start, fused)
  outputs = step_outputs(operations)
  events = []
  collectives = estimate.estimate_collectives(operations, graph_layout,
                                              outputs, timeline=events)
  if not trace:
    return PlanReport(mesh_layout, hw, acc, collectives, graph_layout,
                      "estimated", operations=operations,
                      timeline_events=events, fusions=found)
  impl = simd.SimdMeshImpl(mesh_layout, None,
                           notional_devices(mesh_layout.size))
  lowering = lowering_lib.Lowering(graph, {mesh: impl}, launch=False,
                                   outputs=outputs, graph_layout=graph_layout)
  threads = executor_threads or hardware_lib.executor_threads(
      hw, mesh_layout.size)
  memory = None
  if threads is not None:
    memory = program_memory.simulate(
        lowering.program.graph, threads=threads,
        op_seconds=program_memory.roofline_seconds(hw, mesh_layout.size))
  return PlanReport(mesh_layout, hw, acc, lowering.collective_stats(),
                    graph_layout, program_memory=memory,
                    executor_threads=threads, operations=operations,
                    timeline_events=events, fusions=found)
