"""Per-device memory of the traced SPMD program as TensorFlow runs it: a
simulation of TensorFlow's dataflow executor and of what its kernels
allocate, over the per-device program the plan traces (the one a run
launches on every device), without running it.

Why it exists. accounting.py's liveness walks the meshtf graph one
operation at a time in graph order and counts each meshtf tensor once. A
training step on 8 virtual CPUs allocated 1.12-1.53x (lm_tiny) and
1.28-2.19x (moe_tiny) of that (bench/plan_validation.py, TF's BFC
allocator). TensorFlow's profiler names the op behind every allocation;
with one name scope per meshtf operation (the SPMD lowering adds them)
the allocations at the measured peak were attributed, and these are the
mechanisms they showed, each modelled below:

  1. Order. TF's executor runs an op as soon as its inputs are ready, not
     in graph order: Adam's `m * beta1` and `v * beta2` (they read only
     the slots) run at the start of the step and live until the
     gradients arrive, as do the one-hots of the targets; gathered
     weights (weight-update sharding) are gathered at the start. One
     device, one inter-op thread, lm_tiny: the plan's own tensors, laid
     out in the measured order, peaked at 36.0 MB against 30.0 MB in
     graph order.
  2. Lowering intermediates: a meshtf op lowers to several TF ops (an
     einsum's transposes of operands and of its matmul's result, masks,
     bucket concats for fused allreduces); each allocates.
  3. In-place reuse: an elementwise kernel writes into its input's
     buffer when it is the last reader of it (TF's
     forward_input_or_allocate_output), so `exp(x - max)` costs one
     buffer, not three.
  4. Collective buffers: a ring allreduce holds temporary chunks of
     (n-1)/n of its input until it finishes (measured: 7 chunks of N/8
     per device for an N-byte bucket on 8 devices, all live at once); its
     output reuses the input buffer.
  5. Constants: what depends only on constants and the processor number
     is folded into constants when TF compiles each device's program (the
     launcher passes the processor number as a constant), and held as
     long as the program lives (zeros_like of a gathered embedding:
     512 KB per device; verified in the per-device partition graphs).

The rules, per TF op of the program (the traced FuncGraph):
  * executor: an op is ready when its data and control inputs are done
    (the collectives' ordering token included); ready ops start in the
    order they became ready (the roots in program order) as soon as one
    of `threads` inter-op threads is free, and run for op_seconds(op)
    (roofline_seconds: the report's own timing); collectives are
    asynchronous kernels: they hold no thread while they wait. TF's
    executor continues on its thread with one of the ops a finished op
    readied and hands the others to the pool, where idle threads take
    them; starting ready ops in the order they became ready is that
    policy without its thread bookkeeping (the two gave the same peaks
    within 6% on the bench's 15 runs; this one closer to measured).
    Measured on one device: with 16 inter-op threads a step's peak of
    requested bytes was 2.1 MB (lm_tiny) and 2.7 MB (moe_tiny) above
    the one-thread runs' (33.7 and 47.0 MB); 16 simulated threads add
    2.1 MB to each.
  * views allocate nothing (Reshape, Identity, StopGradient,
    EnsureShape, Squeeze, ExpandDims); ReadVariableOp aliases the
    variable (counted as parameters / optimizer state).
  * an op's outputs are allocated when it starts; a buffer is freed when
    its last reader (through any view of it) has finished; an output
    nobody reads is freed at once; the program's results live to the end.
  * elementwise kernels (ELEMENTWISE) and CollectiveReduceV2 reuse an
    input buffer of the output's dtype and size that no other pending
    reader holds; constants, variables and arguments are never reused.
  * CollectiveReduceV2 over n devices holds (n-1)/n of its input as
    scratch while it runs.
  * constant folding: Const, the processor number, and every stateless
    op whose inputs are all foldable (outputs up to 10 MiB, Grappler's
    limit) are folded; a folded tensor read by an op that is not folded
    is a constant the program holds.
  * sizes: static shapes (a collective whose group size is a tensor has
    an unknown first dim: its size is the view or EnsureShape after it).

Not modelled (bench/plan_validation.py measures what remains): Grappler's
arithmetic rewrites (it reassociated `x * (broadcast(s) * c)` into
`broadcast(s) * (x * c)`, which moved `x * c` into the forward pass, one
activation-sized tensor per RMS norm kept to the backward; square's
gradient no longer gives it that product: ops/elementwise.py), its
per-device folding of data (a padding mask that is all false on a device
turns a masked operand into a constant of zeros), kernels' own
temporaries (reductions' small ones), and the allocator's rounding of
each block (BFC: up to 2x for a block it does not split).

Example:
  >>> mem = simulate(lowering.program.graph)
  >>> mem.peak, mem.constants, mem.peak_scope
"""
import collections
import heapq
import re

import numpy as np
import tensorflow as tf

# Ops whose output shares its input's buffer (kernels that set_output the
# input tensor or CopyFrom it with a new shape).
VIEWS = frozenset(["Reshape", "Identity", "IdentityN", "StopGradient",
                   "PreventGradient", "EnsureShape", "Squeeze",
                   "ExpandDims"])
# Kernels built on TF's cwise UnaryOp / BinaryOp (and Select, AddN,
# BiasAdd, Relu...): they forward an input buffer to the output when they
# hold its only reference.
ELEMENTWISE = frozenset([
    "Abs", "Add", "AddN", "AddV2", "BiasAdd", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor", "Ceil", "Cos", "Div", "DivNoNan", "Elu", "Erf", "Exp",
    "Expm1", "Floor", "FloorDiv", "FloorMod", "LeftShift", "Log", "Log1p",
    "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mul",
    "MulNoNan", "Neg", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6",
    "ReluGrad", "RightShift", "Round", "Rsqrt", "RsqrtGrad", "Select",
    "SelectV2", "Selu", "Sigmoid", "SigmoidGrad", "Sign", "Sin", "Softplus",
    "Sqrt", "SqrtGrad", "Square", "SquaredDifference", "Sub", "Tanh",
    "TanhGrad", "TruncateDiv"])
COLLECTIVE_REDUCE = "CollectiveReduceV2"
# Grappler's constant folding leaves larger results unfolded
# (RewriterConfig's max_constant_size_in_bytes default).
MAX_FOLDED_BYTES = 10 * 1024 * 1024
_BUCKETS = re.compile(r"^allreduce_buckets_\d+$")
_NEVER_FOLDED = frozenset(["Placeholder", "ReadVariableOp", "VarHandleOp",
                           "NoOp"])


class ProgramMemory(collections.namedtuple("ProgramMemory", [
    "peak",                # bytes: activations + scratch at the peak
    "constants",           # bytes the program holds as (folded) constants
    "inputs",              # bytes of its input arguments (imported slices)
    "peak_op",             # the TF op running at the peak
    "peak_scope",          # its top name scope (the meshtf op, if scoped)
    "scratch_at_peak",     # of peak: collective scratch
    "at_peak",             # [(scope, bytes)] live at the peak, largest first
    "ops"])):              # TF ops simulated
  """What simulate() found (bytes per device)."""


def nbytes(t, _depth=0):
  """Bytes of a TF tensor of the traced program (0 for resources)."""
  if t.dtype in (tf.resource, tf.variant):
    return 0
  if t.shape.is_fully_defined():
    return int(t.shape.num_elements()) * t.dtype.size
  # A collective whose group size is a tensor has an unknown first dim; the
  # lowering pins the shape right after it.
  if _depth < 4:
    for c in t.consumers():
      if c.type in VIEWS or c.type == "Transpose":
        b = nbytes(c.outputs[0], _depth + 1)
        if b:
          return b
  return 0


def _scope(op_name):
  """The top name scope: the meshtf op (the lowering's scopes), with the
  fused-allreduce buckets' scopes (allreduce_buckets_<k>) as one."""
  scope = op_name.split("/", 1)[0]
  return _BUCKETS.sub("allreduce_buckets", scope)


def _const_value(t):
  if t.op.type != "Const":
    return None
  return np.asarray(tf.make_ndarray(t.op.get_attr("value")))


def _group_size(op):
  """A collective's group size (its group_size input is a constant)."""
  for t in op.inputs[1:2]:
    v = _const_value(t)
    if v is not None and v.size == 1:
      return int(v.reshape(()))
  return 1


def _foldable(ops, pnum):
  """The ops Grappler folds into constants on each device."""
  folded = set()
  for op in ops:
    if op.type == "Const" or op is pnum:
      folded.add(op)
      continue
    if (op.type in _NEVER_FOLDED or op.control_inputs or not op.inputs or
        op.op_def.is_stateful):
      continue
    if (all(t.op in folded for t in op.inputs) and
        all(nbytes(o) <= MAX_FOLDED_BYTES for o in op.outputs)):
      folded.add(op)
  return folded


def _successors(ops):
  """Each op's successors (data and control), each once, in program
  order; and each op's number of distinct predecessors."""
  succ = collections.defaultdict(list)
  pending = {}
  for op in ops:
    preds = {t.op for t in op.inputs} | set(op.control_inputs)
    pending[op] = len(preds)
    for p in preds:
      succ[p].append(op)
  return succ, pending


def simulate(graph, outputs=None, pnum=None, threads=1, op_seconds=None,
             top=12):
  """ProgramMemory of one run of graph (a traced per-device program's
  FuncGraph) under the rules of the module docstring.

  Args:
    graph: the FuncGraph (lowering.program.graph).
    outputs: its result tensors (default graph.outputs).
    pnum: the placeholder of the processor number (default: the first
      input).
    threads: inter-op threads running this device's ops; 1: one op at a
      time, in the order they became ready.
    op_seconds: op -> seconds it runs (only the order of events matters;
      default: every op 1 s, collectives none: see roofline_seconds).
    top: how many scopes to list in at_peak.
  """
  ops = list(graph.get_operations())
  if outputs is None:
    outputs = list(getattr(graph, "outputs", []))
  inputs = list(getattr(graph, "inputs", []))
  if pnum is None and inputs:
    pnum = inputs[0].op
  folded = _foldable(ops, pnum)
  constants = sum(nbytes(t) for op in folded for t in op.outputs
                  if any(c not in folded for c in t.consumers()))
  input_bytes = sum(nbytes(t) for t in inputs if t.op is not pnum)
  results = {t.name for t in outputs}
  run = _Run(ops, folded, results, threads, op_seconds or _unit_seconds)
  live_peak, step = run.peak()
  if step is None:
    return ProgramMemory(0, constants, input_bytes, "", "", 0, [], len(ops))
  op, scratch, held = _Run(ops, folded, results, threads, op_seconds or
                           _unit_seconds).snapshot(step, top)
  return ProgramMemory(
      peak=live_peak, constants=constants, inputs=input_bytes,
      peak_op=op.name, peak_scope=_scope(op.name), scratch_at_peak=scratch,
      at_peak=held, ops=len(ops))


def _free(op):
  """Ops that take no time and no thread: constants, arguments, views."""
  return (op.type in VIEWS or op.type in _NEVER_FOLDED or
          op.type == "Const" or not op.outputs and not op.inputs)


def _unit_seconds(op):
  return 0.0 if _free(op) or op.type.startswith("Collective") else 1.0


def _matmul_depth(op):
  """The contracted size of a MatMul / BatchMatMul."""
  a = op.inputs[0].shape
  if op.type == "MatMul":
    return int(a[0] if op.get_attr("transpose_a") else a[1])
  return int(a[-2] if op.get_attr("adj_x") else a[-1])


def roofline_seconds(hw, devices):
  """op -> seconds on a hardware model (plan/hardware/), as the report
  times ops: max(flops / peak, bytes / memory bandwidth), times the
  device count where devices share the compute; a collective: its
  latency plus its input's bytes over the fast links."""
  share = devices if hw.shared_compute else 1

  def seconds(op):
    if _free(op):
      return 0.0
    if op.type.startswith("Collective"):
      return hw.latency + nbytes(op.inputs[0]) / hw.fast_bandwidth
    out = sum(int(t.shape.num_elements()) for t in op.outputs
              if t.dtype not in (tf.resource, tf.variant) and
              t.shape.is_fully_defined())
    if op.type in ("MatMul", "BatchMatMul", "BatchMatMulV2"):
      flops = 2 * out * _matmul_depth(op)
    elif op.type in ("Sum", "Max", "Min", "Mean", "Prod", "All", "Any"):
      flops = nbytes(op.inputs[0]) // max(op.inputs[0].dtype.size, 1)
    else:
      flops = out
    touched = sum(nbytes(t) for t in list(op.inputs) + op.outputs)
    return share * max(flops / hw.peak_flops,
                       touched / hw.memory_bandwidth)
  return seconds


class _Run(object):
  """One simulated run: TF's executor with `threads` inter-op threads
  (ready ops start in the order they became ready, when a thread is
  free; collectives are asynchronous kernels and hold no thread), and the
  buffers' lives."""

  def __init__(self, ops, folded, results, threads, op_seconds):
    self.ops = ops
    self.folded = folded
    self.results = results
    self.threads = max(int(threads), 1)
    self.op_seconds = op_seconds

  def _steps(self):
    """Yields (op, live bytes once it started, its scratch) each time an
    op starts, in run order."""
    succ, pending = _successors(self.ops)
    buffer_of = {}      # tensor name -> buffer id
    size = []           # buffer id -> bytes (0: not an activation)
    scope = []          # buffer id -> name scope of the op that made it
    refs = collections.Counter()   # buffer id -> pending reads
    self._state = (buffer_of, size, scope, refs)
    live = 0
    ready = collections.deque(op for op in self.ops if pending[op] == 0)
    running = []        # heap of (finish time, start order, op, ...)
    now, started, busy, done = 0.0, 0, 0, 0
    while ready or running:
      while ready and busy < self.threads:
        op = ready.popleft()
        input_buffers = [buffer_of.get(t.name) for t in op.inputs]
        for t in op.outputs:
          b = self._buffer_for(op, t, input_buffers)
          if b is None:
            b = self._new(nbytes(t), op)
            live += size[b]
          buffer_of[t.name] = b
          refs[b] += len(t.consumers()) + (1 if t.name in self.results
                                           else 0)
        scratch = 0
        if op.type == COLLECTIVE_REDUCE:
          n = _group_size(op)
          scratch = nbytes(op.inputs[0]) * (n - 1) // max(n, 1)
        live += scratch
        yield op, live, scratch
        seconds = self.op_seconds(op)
        holds = 1 if seconds > 0 and not op.type.startswith(
            "Collective") else 0
        busy += holds
        heapq.heappush(running, (now + seconds, started, op, input_buffers,
                                 scratch, holds))
        started += 1
      now, _, op, input_buffers, scratch, holds = heapq.heappop(running)
      busy -= holds
      done += 1
      live -= scratch
      for b in input_buffers:
        if b is not None:
          refs[b] -= 1
          if refs[b] == 0:
            live -= size[b]
      for t in op.outputs:
        b = buffer_of[t.name]
        if refs[b] == 0 and b not in input_buffers:
          live -= size[b]
          refs[b] = -1     # freed: nothing reads it
      for r in succ[op]:
        pending[r] -= 1
        if pending[r] == 0:
          ready.append(r)
    if done != len(self.ops):
      raise ValueError("program_memory: %d of %d ops never became ready"
                       % (len(self.ops) - done, len(self.ops)))

  def _new(self, nbytes_, op):
    _, size, scope, _ = self._state
    size.append(nbytes_)
    scope.append(_scope(op.name))
    return len(size) - 1

  def _buffer_for(self, op, t, input_buffers):
    """The existing buffer t lives in (a view, a forwarded input, or a
    zero-size stand-in for constants, variables and arguments); None:
    t needs a new one."""
    buffer_of, size, _, refs = self._state
    if op in self.folded or op.type in ("Placeholder", "ReadVariableOp",
                                        "VarHandleOp"):
      return self._new(0, op)
    if op.type in VIEWS and op.inputs:
      b = buffer_of.get(op.inputs[0].name)
      return self._new(0, op) if b is None else b
    if op.type in ELEMENTWISE or op.type == COLLECTIVE_REDUCE:
      candidates = op.inputs[:1] if op.type == COLLECTIVE_REDUCE \
          else op.inputs
      for x, xb in zip(candidates, input_buffers):
        if (xb is not None and size[xb] and refs[xb] == 1 and
            input_buffers.count(xb) == 1 and x.dtype == t.dtype and
            nbytes(x) == nbytes(t)):
          return xb
    return None

  def peak(self):
    """(peak live bytes, the start at which it is first reached)."""
    best, at = 0, None
    for i, (_, live, _) in enumerate(self._steps()):
      if live > best:
        best, at = live, i
    return best, at

  def snapshot(self, step, top):
    """(op, scratch, [(scope, bytes)] live) when the step-th op starts."""
    for i, (op, _, scratch) in enumerate(self._steps()):
      if i == step:
        buffer_of, size, scope, refs = self._state
        held = collections.Counter()
        for b in set(buffer_of.values()):
          if size[b] and refs[b] >= 0 and (refs[b] > 0 or any(
              buffer_of[t.name] == b for t in op.outputs)):
            held[scope[b]] += size[b]
        if scratch:
          held[_scope(op.name) + " (collective scratch)"] += scratch
        return op, scratch, held.most_common(top)
    raise ValueError("program_memory: no step %d" % step)
