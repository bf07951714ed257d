"""The hardware models the plan prices a step on: compute, memory, the
interconnect (interconnect.py) and the compiler that runs the program,
each constant with where it comes from.

A device is what a mesh processor runs on: a TPU core (v2, v3: two per
chip, sharing the chip's links), a TPU v4 chip (one device, as JAX and
TF present it), a GPU, or one virtual CPU device of this machine.

compiler "xla": XLA compiles the per-device program (TPU; GPU with
jit_compile): chains of elementwise ops are fused (plan/fusion.py) and
collectives run asynchronously beside the compute that does not need them
(plan/timeline.py). compiler "tf": TensorFlow's executor launches one
kernel per op (unfused), collectives asynchronous on their own stream.

Example:
  >>> print("\\n".join(HARDWARE["tpuv3"].describe()))
"""
import collections
import copy
import enum

from meshtf.plan.hardware import interconnect

Source = collections.namedtuple("Source", ["what", "value", "source"])


class Compiler(enum.StrEnum):
  """What runs a hardware model's per-device program (the module
  docstring): a closed vocabulary the plan's fusion, memory and step
  rules dispatch on."""
  XLA = "xla"
  TF = "tf"


class Hardware(object):
  """One hardware model.

  Attributes:
    name, summary: what it is.
    peak_flops: per device, the dtype the matmuls run in (bf16 on TPU).
    memory_bytes, memory_bandwidth: HBM per device.
    interconnect: a Torus, NodeNetwork or SharedBus (interconnect.py).
    compiler: a Compiler, XLA or TF (module docstring).
    overlap: collectives overlap the compute that does not depend on them.
    matmul_tile: the matrix unit's tile (TPU MXU 128x128): an einsum's
      contracted and output sizes are padded up to it; 0: none.
    kernel_overhead: seconds per kernel launched (the "tf" compiler).
    shared_compute: all devices share peak_flops (virtual CPUs).
    step_overhead: seconds per step besides ops and collectives.
    executor_threads: inter-op threads per device for the memory model
      (plan/program_memory.py); 0: virtual CPUs' max(16, 4n) shared;
      None: XLA schedules the program.
    sources: [Source(what, value, source)] behind the constants.
    assumptions: [str] the model rests on.
  """

  def __init__(self, name, summary, peak_flops, memory_bytes,
               memory_bandwidth, network, compiler, overlap, matmul_tile,
               kernel_overhead, shared_compute, step_overhead,
               executor_threads, sources, assumptions):
    self.name = name
    self.summary = summary
    self.peak_flops = peak_flops
    self.memory_bytes = memory_bytes
    self.memory_bandwidth = memory_bandwidth
    self.interconnect = network
    self.compiler = Compiler(compiler)
    self.overlap = overlap
    self.matmul_tile = matmul_tile
    self.kernel_overhead = kernel_overhead
    self.shared_compute = shared_compute
    self.step_overhead = step_overhead
    self.executor_threads = executor_threads
    self.sources = list(sources)
    self.assumptions = list(assumptions)

  @property
  def latency(self):
    """Seconds one transfer of a collective costs on the fastest links
    (the memory model's collective timing)."""
    net = self.interconnect
    return getattr(net, "transfer_latency", None) or getattr(
        net, "nvlink_latency", None) or net.latency

  @property
  def fast_bandwidth(self):
    """Bytes/s one device sends on its fastest links."""
    net = self.interconnect
    return getattr(net, "link_bandwidth", None) or getattr(
        net, "nvlink_bandwidth", None) or net.bandwidth

  def with_compiler(self, compiler):
    """This model with another compiler ("xla" for GPUs with
    jit_compile); the same object when unchanged."""
    if compiler in (None, self.compiler):
      return self
    if compiler not in tuple(Compiler):
      raise ValueError("compiler %r: use 'xla' or 'tf'" % compiler)
    out = copy.copy(self)
    out.compiler = Compiler(compiler)
    out.overlap = self.overlap or out.compiler is Compiler.XLA
    return out

  def describe(self):
    """Its name, summary, constants with their sources, and assumptions,
    one line each."""
    return (["%s: %s (compiler %s%s)" % (
        self.name, self.summary, self.compiler,
        ", collectives overlap compute" if self.overlap else "")] +
            ["  %s = %s  [%s]" % s for s in self.sources] +
            ["  " + a for a in self.assumptions])

  def __repr__(self):
    return "Hardware(%r)" % self.name


def _hardware(**kwargs):
  kwargs.setdefault("overlap", kwargs["compiler"] is Compiler.XLA)
  kwargs.setdefault("matmul_tile", 0)
  kwargs.setdefault("kernel_overhead", 0.0)
  kwargs.setdefault("shared_compute", False)
  kwargs.setdefault("step_overhead", 0.0)
  return Hardware(**kwargs)


_TPU_DOCS = "cloud.google.com/tpu/docs/%s, 'Key specifications'"
_ICI = ("the docs' 'All-reduce bandwidth per Pod' is every chip's links "
        "in one direction (v5e: 51.2 TB/s = 256 chips x 4 links x 50 GB/s)"
        ", so %s / %d chips / %d links")
_LATENCY = ("How To Scale Your Model (Austin et al., 2025), 'A note on ICI "
            "latency': one byte costs what ~45 kB do, ~1 us")
_XLA_ASSUMPTIONS = [
    "XLA fuses chains of elementwise, broadcast, cast and reduce ops: a "
    "fused chain reads its inputs and writes its outputs once "
    "(plan/fusion.py); einsums read and write their operands",
    "einsums run at peak, their contracted and output sizes padded to the "
    "matrix unit's tile; memory-bound ones at the HBM bandwidth",
    "a collective runs beside the compute that does not need it, one "
    "collective at a time, issued when its input is ready "
    "(plan/timeline.py)"]


def _tpu_torus(pod_dims, cores, links, link_bw, core_bw, ring_rule,
               alltoall_rings=False):
  return interconnect.Torus(cores, links, link_bw, core_bw, 1e-6, pod_dims,
                            ring_rule, alltoall_rings)


HARDWARE = {
    "tpuv2": _hardware(
        name="tpuv2", summary="TPU v2 cores, 2 per chip, chips on a 16x16 "
        "2-D torus (the Mesh-TensorFlow paper's)",
        peak_flops=22.5e12, memory_bytes=8 * 2 ** 30,
        memory_bandwidth=300e9,
        network=_tpu_torus([16, 16], 2, 4, 62e9, 300e9, "pod"),
        compiler=Compiler.XLA, matmul_tile=128, executor_threads=None,
        sources=[
            Source("peak per core", "22.5 TFLOP/s bf16",
                   "Mesh-TensorFlow paper: 11.5 PFLOP/s on 512 cores"),
            Source("HBM per core", "8 GiB, 300 GB/s",
                   "16 GiB and 600 GB/s per chip of 2 cores (Cloud TPU v2 "
                   "documentation; not in our copies)"),
            Source("ICI link", "62 GB/s per direction, 4 per chip",
                   "496 Gbit/s per link (Jouppi et al., CACM 2020; not in "
                   "our copies)"),
            Source("pod", "16x16 chips, rings where a slice spans 16",
                   "256-chip pod, 2-D torus"),
            Source("transfer latency", "1 us", _LATENCY)],
        assumptions=_XLA_ASSUMPTIONS),
    "tpuv3": _hardware(
        name="tpuv3", summary="TPU v3 cores, 2 per chip, chips on a 32x32 "
        "2-D torus (as in GShard and GSPMD)",
        peak_flops=61.5e12, memory_bytes=16 * 2 ** 30,
        memory_bandwidth=450e9,
        network=_tpu_torus([32, 32], 2, 4, 340e12 / 1024 / 4, 450e9, "pod"),
        compiler=Compiler.XLA, matmul_tile=128, executor_threads=None,
        sources=[
            Source("peak per core", "61.5 TFLOP/s bf16",
                   "123 TFLOP/s per chip of 2 cores, " + _TPU_DOCS % "v3"),
            Source("HBM per core", "16 GiB, 450 GB/s",
                   "32 GiB, 900 GB/s per chip, " + _TPU_DOCS % "v3"),
            Source("ICI link", "83 GB/s per direction, 4 per chip",
                   _ICI % ("340 TB/s", 1024, 4) +
                   " (656 Gbit/s, Jouppi et al., CACM 2020)"),
            Source("pod", "32x32 chips, rings where a slice spans 32",
                   "1024-chip pod, 2-D torus, " + _TPU_DOCS % "v3"),
            Source("between a chip's 2 cores", "450 GB/s",
                   "assumed: one core's HBM bandwidth"),
            Source("transfer latency", "1 us", _LATENCY),
            Source("alltoall routing", "along lines (no wraparound)",
                   "GShard Figure 9 (alltoall ~9x from 16 to 2,048 cores) "
                   "and Figure 8 (dispatch/combine 3.75x from 128 to "
                   "2,048): the bisection of rings would give half that "
                   "growth")],
        assumptions=_XLA_ASSUMPTIONS),
    "tpuv4": _hardware(
        name="tpuv4", summary="TPU v4 chips (one device each) on a 3-D "
        "torus of 4x4x4 cubes",
        peak_flops=275e12, memory_bytes=32 * 2 ** 30,
        memory_bandwidth=1200e9,
        network=_tpu_torus([16, 16, 16], 1, 6, 1.1e15 / 4096 / 6, 1200e9,
                           "cube", alltoall_rings=True),
        compiler=Compiler.XLA, matmul_tile=128, executor_threads=None,
        sources=[
            Source("peak per chip", "275 TFLOP/s bf16", _TPU_DOCS % "v4"),
            Source("HBM per chip", "32 GiB, 1.2 TB/s", _TPU_DOCS % "v4"),
            Source("ICI link", "45 GB/s per direction, 6 per chip",
                   _ICI % ("1.1 PB/s", 4096, 6)),
            Source("pod", "4096 chips; slices of whole 4x4x4 cubes are "
                   "tori (optical switches close the rings)",
                   _TPU_DOCS % "v4"),
            Source("transfer latency", "1 us", _LATENCY)],
        assumptions=_XLA_ASSUMPTIONS),
    "h100_8x_node": _hardware(
        name="h100_8x_node",
        summary="8x NVIDIA H100 SXM per node, NVLink within, InfiniBand "
        "across",
        peak_flops=989e12, memory_bytes=80 * 2 ** 30,
        memory_bandwidth=3.35e12,
        network=interconnect.NodeNetwork(8, 450e9, 50e9, 3e-6, 8e-6),
        compiler=Compiler.TF, overlap=True, kernel_overhead=0.0,
        executor_threads=1,
        sources=[
            Source("peak per GPU", "989 TFLOP/s bf16 dense",
                   "NVIDIA H100 SXM datasheet"),
            Source("HBM per GPU", "80 GiB HBM3, 3.35 TB/s",
                   "NVIDIA H100 SXM datasheet"),
            Source("NVLink", "450 GB/s per GPU per direction",
                   "NVLink 4, 900 GB/s bidirectional (datasheet)"),
            Source("network", "50 GB/s per GPU per direction",
                   "one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100)"),
            Source("ring step latency", "3 us NVLink, 8 us InfiniBand",
                   "assumed (NCCL's protocol latency; not measured here)")],
        assumptions=[
            "compiler tf (jit_compile off): one kernel per TF op at its "
            "roofline, unfused, launch overheads not modelled; "
            "--config.jit_compile=program: XLA as on TPU (fused chains, no "
            "tile padding)",
            "checked on one H100 (bench/papers.py --only=h100): 0.87-0.97x "
            "the measured step with XLA, 0.70x without",
            "collectives (NCCL) run on their own stream beside the compute "
            "that does not need them",
            "memory: TF's executor queues each device's kernels on one "
            "stream in the order they become ready (one at a time)"]),
    "cpu": _hardware(
        name="cpu", summary="this 2-core machine's CPU split into virtual "
        "devices (the tests' mesh)",
        peak_flops=5.8e10, memory_bytes=24 * 2 ** 30,
        memory_bandwidth=1e12,
        network=interconnect.SharedBus(2e9, 0.94e-3),
        compiler=Compiler.TF, overlap=False, shared_compute=True,
        step_overhead=9e-3, executor_threads=0,
        sources=[
            Source("compute", "58 GFLOP/s shared by all virtual devices",
                   "bench/plan_validation.py: least-squares fit over 13 "
                   "runs of lm_tiny / moe_tiny layouts on this machine"),
            Source("collectives", "0.94 ms each whatever the group, copies "
                   "at 2 GB/s", "the same fit"),
            Source("step overhead", "9 ms (launch)", "the same fit")],
        assumptions=[
            "the devices' flops add up; memory traffic does not bound "
            "these small ops; no overlap (the fit has none)",
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


def get(name, compiler=None):
  """The Hardware called `name` (with `compiler`, if given); one
  ValueError line naming the choices."""
  if isinstance(name, Hardware):
    return name.with_compiler(compiler)
  if name not in HARDWARE:
    raise ValueError("unknown hardware model %r: use one of %s" % (
        name, ", ".join(sorted(HARDWARE))))
  return HARDWARE[name].with_compiler(compiler)
