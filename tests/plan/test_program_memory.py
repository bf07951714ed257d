"""plan/program_memory.py: each rule of the simulated executor and
allocator, exact against hand counts on small traced programs (traced,
never run), and the plan report's memory lines built from it."""
import tensorflow as tf

import meshtf as mtf
import meshtf.plan  # noqa: F401
from meshtf.plan import program_memory

F32 = tf.float32


def _graph(fn, *shapes):
  """fn(pnum, *args) traced as a per-device program is: pnum first."""
  specs = [tf.TensorSpec([], tf.int32)] + [tf.TensorSpec(s, F32)
                                           for s in shapes]
  return tf.function(fn, autograph=False).get_concrete_function(
      *specs).graph


def test_views_allocate_nothing_and_elementwise_ops_reuse_their_input():
  def fn(pnum, x):
    y = x * 2.0                      # new: x is an argument (16 KB)
    z = y + 1.0                      # y's only reader: writes into y
    r = tf.reshape(z, [4096])        # a view of the same buffer
    return tf.reduce_sum(r)          # 4 bytes
  mem = program_memory.simulate(_graph(fn, [64, 64]))
  assert mem.peak == 64 * 64 * 4 + 4
  assert mem.inputs == 64 * 64 * 4
  # Constants the unfolded ops read: 2.0, 1.0, the reshape's shape, the
  # reduction's axes.
  assert mem.constants == 4 + 4 + 4 + 4
  assert mem.scratch_at_peak == 0


def test_a_buffer_with_two_readers_is_not_reused():
  def fn(pnum, x):
    y = x * 2.0                      # 4 KB
    z = tf.exp(y)                    # y is read again below: new 4 KB
    return z + y                     # z's and y's last reader: reuses one
  mem = program_memory.simulate(_graph(fn, [1024]))
  assert mem.peak == 2 * 4096


def test_ops_run_when_ready_not_in_program_order():
  """`early` reads only an argument (as Adam's m * beta1 reads only its
  slot): the executor computes it before the chain that precedes it in
  the program, so it is live while the chain's 64 KB tile is."""
  def fn(pnum, x, v):
    h = x * 2.0                      # 1 KB
    big = tf.tile(h, [64])           # 64 KB
    s = tf.reduce_sum(big)           # 4 bytes
    early = v * 3.0                  # 4 KB, ready at the start
    return early * s
  mem = program_memory.simulate(_graph(fn, [256], [1024]))
  # At the tile: h, early and big are live (graph order would peak at
  # h + big = 65 KB, early not yet made).
  assert mem.peak == 1024 + 4096 + 65536
  assert mem.peak_op.startswith("Tile")
  assert dict(mem.at_peak) == {"Tile": 65536, "mul_1": 4096, "mul": 1024}


def test_a_ring_allreduce_holds_scratch_and_reuses_its_input():
  def fn(pnum, x):
    y = x * 2.0                      # 4 KB
    r = tf.raw_ops.CollectiveReduceV2(
        input=y, group_size=tf.constant(8), group_key=tf.constant(1),
        instance_key=tf.constant(1), ordering_token=[], merge_op="Add",
        final_op="Id")
    return r * 0.5
  mem = program_memory.simulate(_graph(fn, [1024]))
  # y's buffer carries the sum; 7 of 8 chunks are held while it runs.
  assert mem.scratch_at_peak == 4096 * 7 // 8
  assert mem.peak == 4096 + 4096 * 7 // 8
  assert mem.peak_op.startswith("CollectiveReduceV2")


def test_what_depends_only_on_constants_and_pnum_is_a_held_constant():
  def fn(pnum, x):
    mask = tf.cast(tf.range(16) < pnum * 4, F32)     # folded: 64 bytes
    zeros = tf.fill([64, 64], 0.0)                  # folded: 16 KB
    tiled = tf.tile(x * mask, [4, 4])               # 16 KB
    return tiled + zeros
  mem = program_memory.simulate(_graph(fn, [16, 16]))
  # Held: the mask and the zeros (read by ops that are not folded) and the
  # tile's multiples; the range's and fill's own inputs are folded away.
  assert mem.constants == 64 + 64 * 64 * 4 + 2 * 4
  # x * mask (1 KB) then the tile (16 KB), which the add reuses.
  assert mem.peak == 1024 + 64 * 64 * 4


def test_threads_run_ready_ops_at_once():
  def fn(pnum, x):
    s1 = tf.reduce_sum(tf.tile(x, [16]))    # a 64 KB tile, then its sum
    z = x + 1.0                             # 4 KB
    s2 = tf.reduce_max(tf.tile(z, [16]))    # another 64 KB tile
    return s1 + s2
  graph = _graph(fn, [1024])
  tile, z, scalar = 1024 * 16 * 4, 1024 * 4, 4
  # One thread: the first tile and z run, then the first sum (freeing its
  # tile) before the second tile starts.
  one = program_memory.simulate(graph, threads=1)
  assert one.peak == tile + z + scalar
  # Two threads, every op 1 s: the first tile and z run together, then
  # the first sum and the second tile, while the first tile is still read.
  two = program_memory.simulate(graph, threads=2)
  assert two.peak == 2 * tile + z + scalar


def test_roofline_seconds_follow_the_hardware_model():
  def fn(pnum, a, b):
    return tf.matmul(a, b) + 1.0
  graph = _graph(fn, [8, 16], [16, 32])
  hw = mtf.plan.HARDWARE["h100_8x_node"]
  seconds = program_memory.roofline_seconds(hw, devices=8)
  matmul = [op for op in graph.get_operations() if op.type == "MatMul"][0]
  touched = (8 * 16 + 16 * 32 + 8 * 32) * 4
  assert seconds(matmul) == max(2 * 8 * 32 * 16 / hw.peak_flops,
                                touched / hw.memory_bandwidth)
  # Virtual CPUs share one machine: an op takes the devices' count longer.
  cpu = mtf.plan.HARDWARE["cpu"]
  assert program_memory.roofline_seconds(cpu, 8)(matmul) == 8 * max(
      2 * 8 * 32 * 16 / cpu.peak_flops, touched / cpu.memory_bandwidth)


def _two_layer_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:128;io:64")
  w = mtf.get_variable(mesh, "w", "io:64;hidden:256")
  v = mtf.get_variable(mesh, "v", "hidden:256;io:64")
  h = mtf.relu(mtf.einsum([x, w], output_shape="batch:128;hidden:256"))
  loss = mtf.reduce_sum(mtf.einsum([h, v], output_shape="batch:128;io:64"))
  for var, g in zip([w, v], mtf.gradients([loss], [w, v])):
    mtf.assign_sub(var, g * 0.1)
  return graph


def test_the_plan_reports_the_executor_peak_beside_the_sequential_one():
  graph = _two_layer_graph()
  layout = mtf.MeshLayout("rows:2;cols:4", "batch:rows;hidden:cols")
  report = mtf.plan.plan(graph, layout, "cpu")
  mem = report.summary()["memory_bytes_per_device"]
  model = report.summary()["memory_model"]
  assert model["kind"] == "executor" and model["threads"] == 4
  assert mem["peak"] == (mem["parameters"] + mem["optimizer_state"] +
                         mem["program_constants"] + mem["program_inputs"] +
                         mem["activations_peak_executor"])
  assert mem["peak_sequential"] == (mem["parameters"] +
                                    mem["optimizer_state"] +
                                    mem["activations_peak"])
  # The peak is named by the meshtf op whose lowering runs then.
  scopes = {op.name.split("/")[0] for op in graph.operations}
  assert model["peak_scope"].rstrip("_0123456789") in {
      mtf.lowering.lowering.scope_name(s).rstrip("_0123456789")
      for s in scopes} | {"allreduce_buckets"}
  text = report.text()
  assert "peak under TF's executor" in text and "sequential" in text
  # XLA hardware and untraced plans keep the sequential liveness.
  for r in (mtf.plan.plan(graph, layout, "tpuv3"),
            mtf.plan.plan(graph, layout, "cpu", trace=False)):
    s = r.summary()
    assert s["memory_model"]["kind"] == "sequential"
    assert (s["memory_bytes_per_device"]["peak"] ==
            s["memory_bytes_per_device"]["peak_sequential"])
