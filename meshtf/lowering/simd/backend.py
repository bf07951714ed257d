"""SimdMeshImpl: the SPMD backend. One per-device program, traced once,
launched on every device; collectives are TensorFlow collective ops.

A LaidOutTensor is the one local slice of the processor running the program.
The program takes what differs between devices as arguments — the processor
number `pnum`, a collective ordering token, the variables' resource handles
and the imported input slices — and computes processor coordinates, slice
offsets and collective group keys from `pnum` at run time. So tracing and
graph size do not grow with the mesh; only the launcher (one call op per
device) does.

Example:
  >>> import meshtf as mtf
  >>> devices = mtf.virtual_cpu_devices(8)
  >>> impl = mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", devices)
  >>> impl.size
  8
"""
import contextlib

import numpy as np
import tensorflow as tf

from meshtf.layouts.relayout import CollectiveKind
from meshtf.lowering import cluster
from meshtf.lowering import constants
from meshtf.lowering import grappler as grappler_lib
from meshtf.lowering import lowering as lowering_lib
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.lowering import program_options as program_options_lib
from meshtf.lowering import simd_collectives
from meshtf.lowering.simd import keys as keys_lib
from meshtf.lowering.simd import slices as slices_lib
from meshtf.lowering.simd import watchdog as watchdog_lib


def _is_local_device(name):
  """True for this process's devices (a worker lists its peers' too)."""
  job_task = cluster.local_job_and_task()
  if job_task is None:
    return True
  spec = tf.DeviceSpec.from_string(name)
  return (spec.job, spec.task) == job_task


class _ProgramContext(object):
  """What the program being traced knows about 'its' device."""

  def __init__(self, pnum, token, handles, imports):
    self.pnum = pnum
    self.token = token
    self.handles = handles
    self.imports = imports


# A lowered graph of at most this many meshtf operations (inner ones
# included) is inlined into its launch: TensorFlow then runs every device's
# ops in one function instead of calling a function per device at every
# step (the paper's two-layer step, ~30 operations, on 8 virtual CPUs:
# 0.4-0.5 ms less CPU per step, and its first call is no slower), while a
# large model keeps the per-device calls that halve its first step's time
# (each device's copy instantiated by itself: see trace_program).
INLINE_PROGRAM_OPERATIONS = 128


class SimdMeshImpl(mesh_impl_lib.MeshImpl):
  """SPMD mesh implementation on TF collective ops (CPU, GPU, multi-worker).

  Args:
    shape: mesh shape, e.g. "rows:2;cols:4".
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    devices: one device name per processor, in processor order.
    collective_timeout_seconds: a program run (a launch, or a MeshFunction
      call) whose collectives have not completed after this long is aborted
      with CollectiveTimeoutError (a lost or stuck peer) instead of hanging;
      None waits forever. One watchdog thread enforces it for the whole
      process (TensorFlow's per-op timeout would start a sleeping thread per
      collective and exhaust the process's threads in a training loop).
    communication_hint: the collective ops' communication_hint: "nccl",
      "ring" or "auto"; None chooses once from the devices ("nccl" when all
      are GPUs, else "auto"; simd_collectives.default_communication_hint).
    jit_compile: XLA for the per-device program. False (default): none.
      "segments": every op but the collectives is marked for XLA
      (tf.xla.experimental.jit_scope), so TensorFlow compiles the compute
      between collectives as XLA clusters; works on CPU and GPU. "program"
      (or True): the whole program under tf.function(jit_compile=True);
      TF 2.21 compiles that only without collectives (a 1-processor mesh) or,
      on GPUs, with whole-mesh sum-allreduces only (data parallelism); other
      programs raise ValueError naming the collective when traced.
    grappler: TensorFlow's graph optimizer on the step's functions:
      "default" (TensorFlow's passes) or "off"; None: "off" on a mesh of
      CPUs without XLA, else "default" (meshtf/lowering/grappler.py: a
      T5-small-sized step's first run spent most of its time there).
    options: the three as one checked ProgramOptions (program_options.py).

  Example:
    >>> impl = mtf.SimdMeshImpl("all:2", "batch:all", mtf.gpu_devices()[:2],
    ...                         jit_compile="segments")
    >>> impl.communication_hint
    'nccl'
  """

  is_spmd = True

  def __init__(self, shape, layout, devices, collective_timeout_seconds=600.0,
               communication_hint=None, jit_compile=False, grappler=None,
               options=None):
    super().__init__(shape, layout, devices)
    if options is None:
      options = program_options_lib.ProgramOptions.checked(
          "SimdMeshImpl", communication_hint, jit_compile, grappler)
    # Decided once here; MeshFunction may override them for its traces.
    self._options = {
        "communication_hint": options.communication_hint or
        simd_collectives.default_communication_hint(self.devices),
        "jit_compile": options.jit_compile or "",
        # None: decided from the devices and jit_compile when asked.
        "grappler": options.grappler}
    self._overrides = []
    # Each processor's rank among all devices in TF's collective order.
    keys = [keys_lib.device_rank_key(d) for d in devices]
    self._rank_of = np.empty(len(devices), np.int64)
    self._rank_of[sorted(range(len(devices)), key=keys.__getitem__)] = \
        np.arange(len(devices))
    # TF's collective ops read a timeout of 0 as "no timeout".
    self._timeout = float(collective_timeout_seconds or 0.0)
    self._ctx = None
    self._local = None
    self._tokens = None
    self._tables = {}
    self._gatherers = {}   # variable_full_values' launchers

  # TF collective ops need a per-device ordering token (see _ordering_tokens).
  uses_ordering_token = True

  def local_pnums(self):
    """Processors on this process's devices. In a multi-worker mesh each
    worker launches the program on its own processors only."""
    if self._local is None:
      here = {tf.DeviceSpec.from_string(d.name).to_string()
              for d in tf.config.list_logical_devices()
              if _is_local_device(d.name)}
      local = [p for p, d in enumerate(self._devices)
               if tf.DeviceSpec.from_string(d).to_string() in here]
      self._local = local or list(range(self.size))
    return self._local

  @property
  def is_multi_worker(self):
    return len(self.local_pnums()) < self.size
  collective_timeout_seconds = property(lambda self: self._timeout)

  def _option(self, key):
    for overrides in reversed(self._overrides):
      if overrides.get(key) is not None:
        return overrides[key]
    return self._options[key]

  communication_hint = property(lambda self: self._option(
      "communication_hint"))
  jit_compile = property(lambda self: self._option("jit_compile"))
  # "segments" compiles only clusters of ops TensorFlow picks: the
  # executor keeps the control dependencies between them.
  compiled_by_xla = property(lambda self: self.jit_compile == "program")

  @property
  def grappler(self):
    """"default" or "off": Grappler on the step's functions (see
    meshtf/lowering/grappler.py)."""
    return self._option("grappler") or grappler_lib.default_grappler(
        self.devices, self.jit_compile)

  def call_options(self):
    """Context manager: tf.function calls in its body (eager calls, and
    call ops added to a graph) instantiate with this impl's Grappler mode.
    MeshFunction calls its step in it.

    Example:
      >>> with impl.call_options():
      ...   out = my_step(x)
    """
    return grappler_lib.call_options(self.grappler)

  @contextlib.contextmanager
  def program_options(self, communication_hint=None, jit_compile=None,
                      grappler=None, options=None):
    """Within the body, programs traced use these options (or `options`)
    instead of the impl's (None: the impl's). MeshFunction wraps its traces.

    Example:
      >>> with impl.program_options(jit_compile="segments"):
      ...   lowering = mtf.Lowering(graph, {mesh: impl})
    """
    if options is None:
      options = program_options_lib.ProgramOptions.checked(
          "program_options", communication_hint, jit_compile, grappler)
    self._overrides.append(options.as_dict())
    try:
      yield self
    finally:
      self._overrides.pop()

  def _context(self):
    if self._ctx is None:
      raise ValueError(
          "SimdMeshImpl computations run inside its per-device program; "
          "lower a graph with mtf.Lowering or use impl.run_on_slices")
    return self._ctx

  # --- programs ----------------------------------------------------------
  def _ordering_tokens(self):
    """One resource per device; collectives threaded through it run in
    program order on every device (else auto control deps can deadlock)."""
    if self._tokens is None:
      with tf.init_scope():
        tokens = {}
        for p in self.local_pnums():
          with tf.device(self._devices[p]):
            tokens[p] = tf.Variable(0.0, trainable=False,
                                    name="collective_ordering_token",
                                    **mesh_impl_lib.NOT_LIFTED)
        self._tokens = tokens
    return self._tokens

  def trace_program(self, body, arg_specs, handles=(), inline=False):
    """Traces body once as the per-device program; returns the concrete
    function program(pnum, [token,] *handles, *args).

    While body runs, this impl's slicewise/collective methods act on the
    local slice. handles names the variables whose resource handles the
    program takes, in order, before the other arguments. inline: the
    launch holds the program's ops itself instead of calling it on each
    device (see INLINE_PROGRAM_OPERATIONS).
    """
    n_handles = len(handles)
    n_token = 1 if self.uses_ordering_token else 0
    jit = self.jit_compile

    def program(pnum, *args):
      token = args[0] if n_token else None
      args = args[n_token:]
      self._ctx = _ProgramContext(pnum, token,
                                  dict(zip(handles, args[:n_handles])), {})
      # One Const per value and one coordinate per mesh axis in the whole
      # program (constants.py); not under XLA segments, whose clusters
      # each want their own constants.
      shared = (constants.shared_in(tf.compat.v1.get_default_graph())
                if jit != "segments" else contextlib.nullcontext())
      try:
        # call_options: function calls inside the program (the shared
        # random generators, rng.shared_function) instantiate with this
        # impl's Grappler mode too.
        with _jit_scope(jit == "segments"), shared, self.call_options():
          return list(body(*args[n_handles:]))
      finally:
        self._ctx = None

    specs = [tf.TensorSpec([], tf.int32)]
    specs += [tf.TensorSpec([], tf.resource)] * (n_token + n_handles)
    specs += list(arg_specs)
    # Not inlined into the launch: TensorFlow then instantiates and
    # optimizes (Grappler) each device's copy of the program by itself, on
    # the executor's threads, instead of one graph holding every device's
    # copy (lm_tiny's first run 72-80 s -> 40-50 s at load ~11 on 2 cores;
    # bench/first_step.py). XLA's whole-program compile keeps TF's default,
    # and so does a small program (inline): there the per-step cost of a
    # function call per device is what counts.
    attributes = ({"_noinline": True} if jit != "program" and not inline
                  else None)
    return tf.function(program, autograph=False,
                       jit_compile=True if jit == "program" else None,
                       experimental_attributes=attributes
                       ).get_concrete_function(*specs)

  def launch(self, program, per_device_args):
    """Calls the traced program on every local device; returns each
    processor's list of results (None for other workers' processors)."""
    tokens = self._ordering_tokens()
    local = self.local_pnums()

    def launch_all():
      outs = [None] * self.size
      # The call ops carry the Grappler mode that each device's program is
      # instantiated with.
      with self.call_options():
        for p in local:
          with tf.device(self._devices[p]):
            outs[p] = program(tf.constant(p, tf.int32), tokens[p].handle,
                              *per_device_args[p])
      return outs

    if tf.executing_eagerly():
      # Eager calls would run one device at a time and the first collective
      # would wait forever for its peers: launch them all in one graph.
      with self.collective_watchdog() as watch, self.call_options():
        try:
          return tf.function(launch_all, autograph=False)()
        except (tf.errors.DeadlineExceededError,
                tf.errors.CancelledError) as e:
          if watch["fired"]:
            raise watchdog_lib.explain_timeout(e, self) from e
          raise
    return launch_all()

  def launcher(self, program):
    """launch, for a program run again and again (every training step):
    the launch of every local device's call is traced into one
    tf.function once, not per call. Returns run(per_device_args,
    allowance=1.0) -> each processor's list of results (None for other
    workers' processors), under the collective watchdog.

    Example:
      >>> run = impl.launcher(impl.trace_program(body, specs))
      >>> results = run([[x] if p in impl.local_pnums() else None
      ...                for p in range(impl.size)])
    """
    tokens = self._ordering_tokens()
    local = self.local_pnums()

    @tf.function(autograph=False)
    def launch_all(per_device_args):
      outs = [None] * self.size
      for p in local:
        with tf.device(self._devices[p]):
          outs[p] = program(tf.constant(p, tf.int32), tokens[p].handle,
                            *per_device_args[p])
      return outs

    def run(per_device_args, allowance=1.0):
      with self.collective_watchdog(allowance) as watch, \
          self.call_options():
        try:
          return launch_all(per_device_args)
        except (tf.errors.DeadlineExceededError,
                tf.errors.CancelledError) as e:
          if watch["fired"]:
            raise watchdog_lib.explain_timeout(e, self) from e
          raise
    return run

  def collective_watchdog(self, allowance=1.0):
    """Context manager: collectives still running collective_timeout_seconds
    (times `allowance`) after entering it are aborted (the run raises
    DeadlineExceeded, which explain_timeout turns into a
    CollectiveTimeoutError). Launches and MeshFunction calls use it; wrap
    your own tf.function calls in it.

    Example:
      >>> with impl.collective_watchdog() as watch:
      ...   my_step()          # a tf.function that lowers on impl
    """
    return watchdog_lib.WATCHDOG.watch(
        self._timeout * allowance, "mesh %s" % ";".join(
            "%s:%d" % (d.name, d.size) for d in self.shape.dims))

  def run_program(self, body, per_device_args, arg_specs, handles=()):
    """trace_program, then launch: for each processor, its results."""
    return self.launch(self.trace_program(body, arg_specs, handles),
                       per_device_args)

  def run_on_slices(self, fn, *per_device_inputs):
    """Runs fn(LaidOutTensors...) as a program whose inputs on processor p
    are per_device_inputs[i][p]; returns the per-device results.

    Example:
      >>> sums = impl.run_on_slices(lambda x: impl.allreduce(x, [0], "SUM"),
      ...                           [tf.ones([2])] * impl.size)
    """
    local = self.local_pnums()
    per_device = [[tf.convert_to_tensor(x[p]) for x in per_device_inputs]
                  if p in local else None for p in range(self.size)]
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in per_device[local[0]]]

    def body(*local):
      return [fn(*[self.LaidOutTensor([t]) for t in local]).one_slice]
    return [None if outs is None else outs[0]
            for outs in self.run_program(body, per_device, specs)]

  def lower_graph(self, lowering, operations, outputs, launch=True):
    """Lowers `operations` as one per-device program and runs it.

    Variables are created first (their handles are program arguments) and
    imported tf.Tensors are sliced per device outside the program, so each
    device receives only its slice. Afterwards lowering.tensors maps each
    output tensor to its PerDeviceSlices. With launch=False the program is
    only traced (no variable, no device is touched): lowering.program.
    """
    entries = []
    for op in operations:
      if op.creates_variable_slices:
        with self.using_layout(lowering.op_layout(op)):
          entries.append(op.create_slices(lowering) if launch
                         else op.entry_without_slices(self))
        lowering.variables[op] = entries[-1]
    names = [e.name for e in entries]
    imports = [op for op in operations if op.imports_host_slices]
    specs = [tf.TensorSpec(self.slice_shape(op.outputs[0].shape),
                           op.outputs[0].dtype) for op in imports]
    chosen = []
    pending = {}

    def body(*local_imports):
      self._ctx.imports = dict(zip(imports, local_imports))
      for op in operations:
        lowering.lower_top_level(op)
      lowering.finish_buckets()
      chosen.extend(t for t in (outputs if outputs is not None
                                else _default_outputs(lowering, operations)))
      if self.is_multi_worker:
        # No host sees every slice: outputs leave the program whole
        # (an allgather over their split axes each).
        out = []
        for t in chosen:
          with self.using_layout(lowering.layout_of(t)):
            out.append(self.gather_full(lowering.tensors[t], t.shape
                                        ).one_slice)
        return out
      local = [lowering.tensors[t].one_slice for t in chosen]
      if outputs is None:
        # Unasked-for pending sums leave as partial slices and are summed on
        # the host only if exported, as the placement backend would.
        for t in _unmaterialized(lowering, operations):
          pending[t] = lowering.tensors.raw(t)
          local.append(pending[t].laid_out.one_slice)
      return local

    program = self.trace_program(
        body, specs, handles=names, inline=sum(
            1 for _ in lowering_lib.all_operations(operations)) <=
        INLINE_PROGRAM_OPERATIONS)
    lowering.program = program
    if not launch:
      return
    local = self.local_pnums()
    per_device = [[e.slices[p].handle for e in entries] +
                  [op.host_slice(self, p) for op in imports]
                  if p in local else None for p in range(self.size)]
    results = self.launch(program, per_device)
    lowering.tensors.clear()
    for i, t in enumerate(chosen):
      lowering.tensors[t] = slices_lib.PerDeviceSlices(
          [None if r is None else r[i] for r in results],
          whole=self.is_multi_worker)
    for i, (t, raw) in enumerate(pending.items()):
      # Made while the lowering still records: exports are counted.
      lowering.tensors[t] = slices_lib.HostPendingSum(
          self, slices_lib.PerDeviceSlices(
              [r[len(chosen) + i] for r in results]),
          raw.mesh_axes)

  # --- local computation --------------------------------------------------
  def slicewise(self, fn, *inputs):
    args = [x.one_slice if isinstance(x, self.LaidOutTensor) else x
            for x in inputs]
    out = fn(*args)
    if isinstance(out, (tuple, list)):
      return tuple(self.LaidOutTensor([o]) for o in out)
    return self.LaidOutTensor([out])

  def laid_out_pnum(self):
    return self.LaidOutTensor([self._context().pnum])

  def pcoord(self, mesh_axis):
    """This processor's coordinate along mesh_axis (int32 tensor), made
    once per program (constants.cached)."""
    stride = 1
    for d in self.shape.dims[mesh_axis + 1:]:
      stride *= d.size
    pnum = self._context().pnum
    return constants.cached(("pcoord", mesh_axis), lambda: (
        pnum // stride) % self.shape.dims[mesh_axis].size)

  def laid_out_pcoord(self, mesh_axis):
    return self.LaidOutTensor([self.pcoord(mesh_axis)])

  def local_slice_begin(self, tensor_shape):
    """int64 vector: global start of this processor's slice, per dim."""
    begin = [tf.cast(self.laid_out_shard_index(s.mesh_axes).one_slice,
                     tf.int64) * s.shard_size
             if s.is_split else tf.constant(0, tf.int64)
             for s in self.mesh_layout.dim_splits(tensor_shape)]
    return tf.stack(begin) if begin else tf.zeros([0], tf.int64)

  def laid_out_slice_begin(self, tensor_shape):
    return self.LaidOutTensor([self.local_slice_begin(tensor_shape)])

  # --- import / export -----------------------------------------------------
  def import_host_slices(self, op):
    """The local slice an import op made on the host: a program argument."""
    return self.LaidOutTensor([self._context().imports[op]])

  def import_tf_tensor(self, x, shape):
    """The local slice of full tensor x (available inside the program),
    cut with the slice offsets computed from the processor number."""
    self._context()
    sizes = self.slice_shape(shape)
    if sizes == shape.to_integer_list:
      return self.LaidOutTensor([x])
    return self.LaidOutTensor([tf.slice(self.padded_value(x, shape),
                                        self.local_slice_begin(shape), sizes)])

  def export_to_tf_tensor(self, x, shape):
    """The full tensor, assembled on the host from every device's slice
    (each device's slice is copied once to the first device)."""
    if not isinstance(x, slices_lib.PerDeviceSlices):
      raise ValueError(
          "export_to_tf_tensor on the SPMD backend works after the program "
          "ran: pass the tensor in Lowering(..., outputs=[...]) (or return it "
          "from the MeshFunction's build function)")
    if x.whole:
      p = self.local_pnums()[0]
      with tf.device(self._devices[p]):
        return tf.identity(x.tensor_list[p])
    return self.assemble_slices(x.tensor_list, shape, self._devices[0])

  def variable_full_value(self, entry):
    """Full value of a variable. Across workers this runs a small program
    that gathers the slices (every worker must call it, in the same order)."""
    if not self.is_multi_worker:
      return super().variable_full_value(entry)
    local = self.local_pnums()

    def body():
      with self.using_layout(entry.mesh_layout):
        return [self.gather_full(self.read_variable(entry), entry.shape
                                 ).one_slice]
    results = self.run_program(
        body, [[entry.slices[p].handle] if p in local else None
               for p in range(self.size)], [], handles=[entry.name])
    return tf.identity(results[local[0]][0])

  def variable_full_values(self, entries):
    """Full values of several variables, in order. Across workers one
    program gathers them all: traced at the first call for these variables
    (their names, shapes, dtypes and layouts) and run again at later calls,
    where one program per variable, traced at every call, made most of a
    multi-worker checkpoint's time (bench/cluster_faults.py
    --scenarios=save). Every worker must call it, in the same order.

    Example:
      >>> values = impl.variable_full_values(store.entries())
    """
    if not self.is_multi_worker:
      return [super(SimdMeshImpl, self).variable_full_value(e)
              for e in entries]
    key = tuple((e.name, tuple(e.shape.to_integer_list), e.dtype.name,
                 e.mesh_layout.tensor_layout(e.shape)) for e in entries)
    run = self._gatherers.get(key)
    first = run is None
    if first:
      # Only the entries' names, shapes and layouts go into the trace;
      # their slices' handles are the program's arguments.
      def body():
        outs = []
        for entry in entries:
          with self.using_layout(entry.mesh_layout):
            outs.append(self.gather_full(self.read_variable(entry),
                                         entry.shape).one_slice)
        return outs
      run = self.launcher(self.trace_program(
          body, [], handles=[e.name for e in entries]))
      self._gatherers[key] = run
    local = self.local_pnums()
    # The first run also instantiates the program (as a first step does).
    results = run([[e.slices[p].handle for e in entries] if p in local
                   else None for p in range(self.size)],
                  4.0 if first else 1.0)
    return [tf.identity(t) for t in results[local[0]]]

  # --- variables -----------------------------------------------------------
  def read_variable(self, entry):
    handle = self._context().handles[entry.name]
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=entry.dtype)
    value.set_shape(self.slice_shape(entry.shape))  # a bare handle has none
    return self.LaidOutTensor([value])

  def assign_variable(self, entry, value, mode):
    handle = self._context().handles[entry.name]
    op = {"assign": tf.raw_ops.AssignVariableOp,
          "add": tf.raw_ops.AssignAddVariableOp,
          "sub": tf.raw_ops.AssignSubVariableOp}[mode]
    return [op(resource=handle, value=value.one_slice)]

  # --- collectives -----------------------------------------------------------
  def group_tables(self, mesh_axes):
    """Static facts about the groups along mesh_axes (cached): the base
    group key, the strides that turn coordinates into a group index, and
    for each group the processor position (row-major along mesh_axes) of
    each TensorFlow rank, or None when ranks follow positions everywhere."""
    mesh_axes = tuple(sorted(mesh_axes))
    if mesh_axes not in self._tables:
      groups = self.processor_group_array(mesh_axes)
      # Sorting a group's members by their global rank gives TF's order.
      rank_to_pos = np.argsort(self._rank_of[groups], axis=1, kind="stable")
      identity = bool(np.all(rank_to_pos == np.arange(groups.shape[1])))
      # Size-1 axes are left out: their coordinate is always 0, and a group
      # index without terms is a constant (XLA wants constant group keys).
      others = [a for a in range(self.ndims) if a not in mesh_axes
                and self.shape.dims[a].size > 1]
      strides, acc = {}, 1
      for a in reversed(others):
        strides[a] = acc
        acc *= self.shape.dims[a].size
      self._tables[mesh_axes] = simd_collectives.GroupTable(
          base_key=keys_lib.group_key_base(self._devices, groups),
          group_size=int(groups.shape[1]),
          strides=strides,
          rank_to_pos=None if identity else rank_to_pos.astype(np.int32))
    return self._tables[mesh_axes]

  def _group_indices(self, table):
    """numpy int32 [size]: each processor's group index under table."""
    index = np.zeros(self.size, np.int32)
    for p in range(self.size):
      coords = self.pnum_to_processor_coordinates(p)
      index[p] = sum(coords[a] * stride for a, stride in table.strides.items())
    return index

  def _by_pnum(self, values):
    """values[pnum] for this processor: one Gather from a constant table
    (the coordinate arithmetic it replaces was 4-5 scalar ops, each run by
    the executor on every device at every step)."""
    return tf.gather(constants.constant(values, tf.int32),
                     self._context().pnum)

  def group_index(self, table):
    """Index of this processor's group (int32 tensor), made once per
    program and group table."""
    if not table.strides:
      return constants.int32(0)
    return constants.cached(
        ("group_index", tuple(sorted(table.strides.items()))),
        lambda: self._by_pnum(self._group_indices(table)))

  def _group_key(self, table):
    """This processor's group key: a constant for a group over the whole
    mesh (XLA wants constant keys), else one lookup by pnum."""
    if not table.strides:
      return constants.int32(table.base_key)
    return constants.cached(
        ("group_key", table.base_key, tuple(sorted(table.strides.items()))),
        lambda: self._by_pnum(table.base_key + self._group_indices(table)))

  def _collective_args(self, mesh_axes, kind, reduction=None):
    table = self.group_tables(mesh_axes)
    ctx = self._context()
    if self.jit_compile == "program":
      why = simd_collectives.xla_program_refusal(
          kind.family, reduction, not table.strides, self.devices,
          self.communication_hint)
      if why:
        raise ValueError(
            "jit_compile='program' cannot compile the %s over mesh axes %s "
            "of mesh %s: %s. Use jit_compile='segments' (XLA compiles the "
            "ops between the collectives)" % (
                kind,
                [self.shape.dims[a].name for a in sorted(mesh_axes)],
                self.shape, why))
    return table, dict(
        group_size=constants.int32(table.group_size),
        group_key=self._group_key(table),
        instance_key=tf.constant(keys_lib.next_instance_key(), tf.int32),
        ordering_token=[ctx.token],
        communication_hint=self.communication_hint,
        # 0: no per-op timer thread; the watchdog handles timeouts.
        timeout_seconds=0.0)

  # The collective hooks of the MeshImpl template, on the local slice; they
  # call slice-level hooks that TpuMeshImpl overrides with the TPU ops.
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    return self.LaidOutTensor([self._allreduce_slice(
        x.one_slice, mesh_axes, reduction_fn_string)])

  def _allconcat(self, x, mesh_axis, concat_axis):
    return self.LaidOutTensor([self._allconcat_slice(x.one_slice, mesh_axis,
                                                     concat_axis)])

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    return self.LaidOutTensor([self._alltoall_slice(
        x.one_slice, mesh_axis, split_axis, concat_axis)])

  def _receive(self, x, mesh_axis, source_pcoord):
    return self.LaidOutTensor([self._permute_slice(x.one_slice, mesh_axis,
                                                   source_pcoord)])

  def _allreduce_slice(self, t, mesh_axes, reduction_fn_string):
    _, args = self._collective_args(
        mesh_axes, CollectiveKind.allreduce(reduction_fn_string),
        reduction_fn_string)
    return simd_collectives.all_reduce(t, reduction_fn_string, args)

  def _allconcat_slice(self, t, mesh_axis, concat_axis):
    table, args = self._collective_args([mesh_axis],
                                       CollectiveKind.ALLCONCAT)
    return simd_collectives.all_concat(t, concat_axis, table,
                                       self.group_index(table), args)

  def _alltoall_slice(self, t, mesh_axis, split_axis, concat_axis):
    # One axis, or a tuple of axes in mesh order (one group over all).
    axes = list(mesh_axis) if isinstance(mesh_axis, tuple) else [mesh_axis]
    table, args = self._collective_args(axes, CollectiveKind.ALLTOALL)
    return simd_collectives.all_to_all(t, split_axis, concat_axis, table,
                                       self.group_index(table), args)

  def _permute_slice(self, t, mesh_axis, source_pcoord):
    # Built on all-to-all: TF has no collective permute kernel for CPU/GPU.
    table, args = self._collective_args([mesh_axis],
                                       CollectiveKind.PERMUTE)
    return simd_collectives.permute(t, source_pcoord, self.pcoord(mesh_axis),
                                    table, self.group_index(table), args)


def _not_collective(node_def):
  return node_def.op not in simd_collectives.COLLECTIVE_OPS


def _jit_scope(on):
  """Marks the ops made in the body for XLA, all but the collectives (TF's
  clustering then compiles the compute between them; TF 2.21 cannot compile
  CollectiveGatherV2 / AllToAllV2 at all, nor any collective on CPU)."""
  if not on:
    return contextlib.nullcontext()
  return tf.xla.experimental.jit_scope(compile_ops=_not_collective,
                                       separate_compiled_gradients=False)


def _default_outputs(lowering, operations):
  """Without an explicit list, every tensor whose value exists without
  extra communication (pending sums that nothing materialised are left out,
  so the program does no allreduce the graph did not ask for)."""
  skip = set(_unmaterialized(lowering, operations))
  return [t for op in operations for t in op.outputs if t not in skip]


def _unmaterialized(lowering, operations):
  return [t for op in operations for t in op.outputs
          if isinstance(lowering.tensors.raw(t), lowering_lib.PendingSum)
          and not lowering.tensors.raw(t).materialized]
