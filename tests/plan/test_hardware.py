"""The interconnect models (meshtf/plan/hardware): where a collective's
group lands on the machine, what its algorithm costs there, GShard's
Figure 9 on the TPU v3 model, and every constant's source printed."""
import pytest

import meshtf as mtf
from meshtf.plan import hardware

MB = 1 << 20


def _seconds(name, mesh, axes, kind, nbytes):
  hw = hardware.get(name)
  shape = mtf.convert_to_shape(mesh)
  group = hw.interconnect.place(shape, [shape.dimension_names.index(a)
                                        for a in axes])
  return hw.interconnect.collective_seconds(kind, group, nbytes)


def test_mesh_axes_land_on_torus_dimensions():
  """GSPMD's (X, Y) = (32, 64) on a TPU v3 pod: Y spans one ring of 32
  chips and the chips' two cores, X the other ring; (16, 32) is a 16x16
  slice, lines (no wraparound: it spans half the pod)."""
  net = hardware.get("tpuv3").interconnect
  shape = mtf.convert_to_shape("x:32;y:64")
  y = net.place(shape, [1])
  assert [(u.members, u.ring, u.kind) for u in y.dims] == [
      (32, True, "chip"), (2, False, "core")]
  x = net.place(shape, [0])
  assert [(u.members, u.stride, u.ring) for u in x.dims] == [(32, 1, True)]
  half = net.place(mtf.convert_to_shape("x:16;y:32"), [0, 1])
  assert [(u.members, u.ring) for u in half.dims] == [
      (16, False), (16, False), (2, False)]
  # A minor axis of 4 over chips of 2 cores: the other axis interleaves
  # (stride 2 along the chips' dimension).
  inter = net.place(mtf.convert_to_shape("x:16;y:4"), [0])
  assert sorted((u.members, u.stride) for u in inter.dims) == [(4, 1),
                                                               (4, 2)]


def test_allreduce_is_per_dimension_rings_not_one_long_ring():
  """An allreduce over all 2,048 cores costs about a slice over one
  link's bandwidth (rings per dimension), not 2 * 2047 ring steps."""
  t = _seconds("tpuv3", "all:2048", ["all"], "allreduce_sum", 4)
  assert t < 200e-6          # latency only: 2 (31 + 31 + 1) transfers
  big = _seconds("tpuv3", "all:2048", ["all"], "allreduce_sum", 32 * MB)
  link = hardware.get("tpuv3").interconnect.link_bandwidth
  assert 32 * MB / link < big < 2 * 32 * MB / link
  # Reduce-scatter and allgather are half an allreduce each.
  rs = _seconds("tpuv3", "x:32;y:64", ["y"], "reduce_scatter", 32 * MB)
  ar = _seconds("tpuv3", "x:32;y:64", ["y"], "allreduce_sum", 32 * MB)
  ag = _seconds("tpuv3", "x:32;y:64", ["y"], "allconcat", 32 * MB // 64)
  assert rs == pytest.approx(ar / 2) and ag == pytest.approx(rs)


@pytest.mark.parametrize("nbytes", [8 * MB, 32 * MB])
def test_gshard_figure_9(nbytes):
  """GShard Figure 9 on the TPU v3 model, 16 -> 2,048 partitions: the
  allreduce about flat (<= 2x), the alltoall within 1.5x of the paper's
  ~9x (O(sqrt(D)): the pieces cross the middle of each line of chips)."""
  def ratio(kind):
    return (_seconds("tpuv3", "all:2048", ["all"], kind, nbytes) /
            _seconds("tpuv3", "all:16", ["all"], kind, nbytes))
  assert ratio("allreduce_sum") <= 2.0
  assert 9 / 1.5 <= ratio("alltoall") <= 9 * 1.5


def test_gpu_groups_use_nvlink_within_a_node_and_the_nic_across():
  within = _seconds("h100_8x_node", "node:2;gpu:8", ["gpu"],
                    "allreduce_sum", 64 * MB)
  across = _seconds("h100_8x_node", "node:2;gpu:8", ["node"],
                    "allreduce_sum", 64 * MB)
  both = _seconds("h100_8x_node", "node:2;gpu:8", ["node", "gpu"],
                  "allreduce_sum", 64 * MB)
  net = hardware.get("h100_8x_node").interconnect
  assert within == pytest.approx(
      2 * (64 * MB * 7 / 8 / net.nvlink_bandwidth + 7 * net.nvlink_latency))
  assert across == pytest.approx(
      2 * (64 * MB / 2 / net.nic_bandwidth + net.nic_latency))
  # Hierarchical: the NIC carries 1/8 of what a flat ring would send.
  assert within < both < across


def test_every_constant_prints_its_source():
  for hw in hardware.HARDWARE.values():
    lines = hw.describe()
    assert lines[0].startswith(hw.name + ": ")
    assert hw.sources and all(s.source for s in hw.sources)
    assert any("[" in line for line in lines[1:])
  with pytest.raises(ValueError, match="unknown hardware model 'tpu9'"):
    hardware.get("tpu9")
  assert hardware.get("h100_8x_node", "xla").compiler == "xla"
  assert hardware.get("h100_8x_node").compiler == "tf"


def test_collective_seconds_reads_a_collective_stats_record():
  shape = mtf.convert_to_shape("x:32;y:64")
  record = {"kind": "allreduce_sum", "mesh_axes": ["y"], "group_size": 64,
            "elements_per_device": 1 << 20,
            "bytes_per_device": int(2 * (1 << 20) * 63 / 64 * 2)}
  assert hardware.slice_bytes(record) == 2 << 20   # bfloat16 elements
  assert hardware.collective_seconds(
      hardware.get("tpuv3"), shape, record) == pytest.approx(
          _seconds("tpuv3", "x:32;y:64", ["y"], "allreduce_sum", 2 << 20))
