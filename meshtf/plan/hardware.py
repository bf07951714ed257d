"""Hardware models for the plan report: peak compute, memory and the
interconnect, with the assumptions they rest on.

A collective over a group of processors costs alpha-beta time: a latency
per step of its algorithm plus the bytes each device sends over the
bandwidth of the links the group uses (relayout.collective_bytes gives
those bytes: ring allreduce 2(n-1)/n of a slice, allgather (n-1)x,
alltoall and reduce-scatter (n-1)/n). Which links a group uses depends on
where its processors sit: processor p is device p of the machine, row-major
over the mesh, so an axis whose processors are `stride` apart spans
`stride * size` consecutive devices.

Example:
  >>> HARDWARE["h100_8x_node"].describe()[0]
  'h100_8x_node: 8x NVIDIA H100 SXM per node, NVLink within, InfiniBand across'
"""
import collections

class Hardware(collections.namedtuple("Hardware", [
    "name", "summary",
    "peak_flops",          # per device, the dtype the model trains in
    "memory_bytes",        # per device
    "memory_bandwidth",    # bytes/s per device
    "devices_per_node",    # devices that share the fast links
    "fast_bandwidth",      # bytes/s one device sends within a node
    "slow_bandwidth",      # bytes/s one device sends across nodes
    "latency",             # seconds per step of a collective's algorithm
    "alltoall_factor",     # bandwidth share an alltoall gets (topology)
    "shared_compute",      # all devices share peak_flops (virtual CPUs)
    "latency_per_step",    # latency counts per step of the algorithm
    #                        (rings) or once per collective (virtual CPUs)
    "step_overhead",       # seconds per step besides ops and collectives
    "executor_threads",    # memory: inter-op threads TF's executor runs a
    #                        device's ops on (plan/program_memory.py); 0:
    #                        meshtf's default for virtual CPUs, max(16, 4n)
    #                        shared by the n devices; None: XLA compiles
    #                        the program (the sequential liveness stands)
    "assumptions"])):
  """One hardware model (see the module docstring)."""

  def describe(self):
    """Its name, summary and assumptions, one line each."""
    return ["%s: %s" % (self.name, self.summary)] + [
        "  " + a for a in self.assumptions]


HARDWARE = {
    "tpuv3": Hardware(
        "tpuv3", "TPU v3 cores on a 2-D torus (as in GShard and GSPMD)",
        peak_flops=61.5e12, memory_bytes=16 * 2 ** 30,
        memory_bandwidth=450e9, devices_per_node=2 ** 20,
        fast_bandwidth=70e9, slow_bandwidth=70e9, latency=5e-6,
        alltoall_factor=0.5, shared_compute=False, latency_per_step=True,
        step_overhead=0.0, executor_threads=None,
        assumptions=[
            "bf16 peak 61.5 TFLOP/s and 16 GiB HBM at 450 GB/s per core",
            "every mesh axis maps to a ring of the 2-D torus: 70 GB/s per "
            "core per direction, 5 us per collective step",
            "an alltoall on a 2-D torus gets half the ring bandwidth "
            "(bisection)",
            "memory: XLA compiles and schedules the whole program; the "
            "activations' liveness in graph order stands for its "
            "schedule"]),
    "h100_8x_node": Hardware(
        "h100_8x_node",
        "8x NVIDIA H100 SXM per node, NVLink within, InfiniBand across",
        peak_flops=989e12, memory_bytes=80 * 2 ** 30,
        memory_bandwidth=3.35e12, devices_per_node=8,
        fast_bandwidth=450e9, slow_bandwidth=50e9, latency=10e-6,
        alltoall_factor=1.0, shared_compute=False, latency_per_step=True,
        step_overhead=0.0, executor_threads=1,
        assumptions=[
            "bf16 dense peak 989 TFLOP/s and 80 GiB HBM3 at 3.35 TB/s per "
            "GPU",
            "NVLink 4: 450 GB/s per GPU per direction within a node of 8",
            "InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU across nodes",
            "10 us per collective step (NCCL ring)",
            "memory: TF's executor queues each device's kernels on one "
            "stream in the order they become ready (one at a time)"]),
    "cpu": Hardware(
        "cpu", "this 2-core machine's CPU split into virtual devices (the "
        "tests' mesh)",
        peak_flops=5.8e10, memory_bytes=24 * 2 ** 30,
        memory_bandwidth=1e12, devices_per_node=2 ** 20,
        fast_bandwidth=2e9, slow_bandwidth=2e9, latency=0.94e-3,
        alltoall_factor=1.0, shared_compute=True, latency_per_step=False,
        step_overhead=9e-3, executor_threads=0,
        assumptions=[
            "calibrated on this machine by bench/plan_validation.py (a "
            "least-squares fit over 13 runs of lm_tiny / moe_tiny layouts)",
            "all virtual devices share 58 GFLOP/s: the devices' flops add "
            "up; memory traffic does not bound these small ops",
            "0.94 ms per collective whatever its group (TF's collective "
            "executor), copies at 2 GB/s, 9 ms per step of launch "
            "overhead",
            "memory: TF's executor runs each device's ready ops on its "
            "share of max(16, 4n) inter-op threads (mtf.virtual_cpu_devices"
            "' default), ops timed as above"]),
}


def executor_threads(hw, devices):
  """Inter-op threads one device's ops run on (None: XLA, see Hardware)."""
  if hw.executor_threads is None:
    return None
  if hw.executor_threads == 0:
    return max(max(16, 4 * devices) // max(devices, 1), 1)
  return hw.executor_threads


def get(name):
  """The Hardware called `name`; one ValueError line naming the choices."""
  if isinstance(name, Hardware):
    return name
  if name not in HARDWARE:
    raise ValueError("unknown hardware model %r: use one of %s" % (
        name, ", ".join(sorted(HARDWARE))))
  return HARDWARE[name]


def group_bandwidth(hw, mesh_shape, mesh_axes):
  """Bytes/s one device sends in a collective over mesh_axes: the fast
  links if the group fits in one node, else the slow ones."""
  stride_end = 1
  for i, d in enumerate(mesh_shape.dims):
    if i in mesh_axes:
      span = d.size
      for later in mesh_shape.dims[i + 1:]:
        span *= later.size
      stride_end = max(stride_end, span)
  return (hw.fast_bandwidth if stride_end <= hw.devices_per_node
          else hw.slow_bandwidth)


def collective_seconds(hw, mesh_shape, record):
  """Alpha-beta time of one collective (a collective_stats entry)."""
  axes = [mesh_shape.dimension_names.index(a) for a in record["mesh_axes"]]
  n = record["group_size"]
  bandwidth = group_bandwidth(hw, mesh_shape, axes)
  kind = record["kind"]
  if kind == "alltoall":
    bandwidth *= hw.alltoall_factor
  steps = 2 * (n - 1) if kind.startswith("allreduce") else max(n - 1, 1)
  if not hw.latency_per_step:
    steps = 1
  return steps * hw.latency + record["bytes_per_device"] / bandwidth
