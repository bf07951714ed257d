"""The compiler models (meshtf/plan/fusion.py, timeline.py): XLA's fused
kernels priced by the bytes entering and leaving them, the matrix unit's
tile padding, and collectives beside the compute that does not need
them -- against hand counts on small graphs."""
import pytest

import meshtf as mtf
import meshtf.plan  # noqa: F401
from meshtf.lowering import lowering as lowering_lib
from meshtf.plan import accounting
from meshtf.plan import fusion
from meshtf.plan import hardware
from meshtf.plan import timeline

TPU = hardware.get("tpuv3")


def _names(groups):
  return [sorted(type(op).__name__ + ":" + op.name for op in g)
          for g in groups if len(g) > 1]


def _recomputed_tails(ops, gl):
  """fusion's {tensor: what its readers read instead} for ops."""
  readers = {}
  for op in ops:
    for t in op.inputs:
      readers.setdefault(t, []).append(op)
  # pylint: disable=protected-access
  return fusion._recomputed_tails(ops, fusion._Fusions(ops, gl), readers, gl)


def _graph(build, mesh_shape="all:1", layout=""):
  graph = mtf.Graph()
  out = build(mtf.Mesh(graph, "m"))
  mesh_layout = mtf.MeshLayout(mesh_shape, layout)
  graph_layout = mesh_layout.assign(
      lowering_lib.all_operations(graph.operations))
  return graph, graph_layout, out


def test_an_elementwise_chain_is_one_kernel_reading_once():
  """relu(x) * 2 + 1: one kernel reads x and writes the result (2 x 4 MB
  of float32), where one kernel per op moves 3 x 8 MB (and TF's import of
  x 4 MB more)."""
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, __import__("tensorflow").zeros(
        [1024, 1024]), "a:1024;b:1024")
    return mtf.relu(x) * 2.0 + 1.0
  graph, gl, _ = _graph(build)
  groups = [g for g in fusion.fusions(graph.operations, gl) if len(g) > 1]
  assert len(groups) == 1 and len(groups[0]) == 3
  fused = sum(fusion.op_seconds(graph.operations, gl, TPU).values())
  assert fused == pytest.approx(2 * 4 * 2 ** 20 / TPU.memory_bandwidth)
  unfused = sum(fusion.op_seconds(graph.operations, gl,
                                  TPU.with_compiler("tf")).values())
  assert unfused == pytest.approx(7 * 4 * 2 ** 20 / TPU.memory_bandwidth)


def test_reductions_end_a_kernel_and_einsums_stand_alone():
  """softmax = exp(x - max) / sum(exp(x - max)): the reductions fuse with
  their producers, their consumers start new kernels (XLA's input
  fusion); an einsum is a kernel of its own, and the residual add after
  it cannot join the norm before it (that would be a cycle)."""
  def build(mesh):
    x = mtf.random_normal(mesh, "b:64;d:128")
    w = mtf.get_variable(mesh, "w", "d:128;e:128")
    s = mtf.softmax(x, reduced_dim=mtf.Dimension("d", 128))
    y = mtf.einsum([s, w], output_shape="b:64;e:128")
    return mtf.rename_dimension(y, "e", "d") + x
  graph, gl, _ = _graph(build)
  groups = fusion.fusions(graph.operations, gl)
  einsum = [g for g in groups if any(
      type(op).__name__ == "EinsumOperation" for op in g)]
  assert len(einsum) == 1 and len(einsum[0]) == 1
  kinds = [sorted({type(op).__name__ for op in g}) for g in groups
           if len(g) > 1]
  # No group holds ops on both sides of the einsum.
  position = {op: i for i, op in enumerate(graph.operations)}
  at = position[einsum[0][0]]
  for g in groups:
    if g == einsum[0]:
      continue
    assert (all(position[op] < at for op in g) or
            all(position[op] > at for op in g)), kinds
  assert any("ReduceOperation" in k for k in kinds), kinds


def test_a_relayout_between_two_ops_cuts_the_kernel():
  def build(mesh):
    x = mtf.random_normal(mesh, "b:64;d:128")
    # Two annotations in a row: the second is a relayout (the sharding
    # completion lays out exp like the first, negative like the second).
    y = mtf.shard(mtf.exp(x), "d:all")
    return mtf.negative(mtf.shard(y, "b:all"))
  graph, gl, _ = _graph(build, "all:4", "b:all")
  groups = _names(fusion.fusions(graph.operations, gl))
  assert not any(any("negative" in n for n in g) and
                 any("exp" in n for n in g) for g in groups), groups


def test_einsums_pad_to_the_matrix_units_tile():
  """A [64, 64] x [64, 256] matmul on a 128x128 matrix unit: the
  contraction pads 64 -> 128; the weight [64, 256] stays in the unit (its
  256 columns fill whole tiles) and the 64 rows stream through unpadded
  (staying in the unit, x would pad them too)."""
  def build(mesh):
    x = mtf.random_normal(mesh, "b:64;d:64")
    w = mtf.get_variable(mesh, "w", "d:64;e:256")
    return mtf.einsum([x, w], output_shape="b:64;e:256")
  graph, gl, y = _graph(build)
  op = y.operation
  layout = gl.op_layout(op)
  assert op.flops(layout) == 2 * 64 * 64 * 256
  assert op.flops(layout, 128) == 2 * 64 * 128 * 256


def test_collectives_overlap_the_compute_that_does_not_need_them():
  ops = [1.0, 1.0, 1.0]
  price = lambda e: e["seconds"]  # noqa: E731
  # Ready after op 0, needed by op 2: hidden behind op 1.
  t = timeline.simulate(ops, [dict(ready=0, needed=2, seconds=0.5)], price)
  assert t.step == pytest.approx(3.0) and t.exposed == pytest.approx(0.0)
  # Needed by the next op: op 1 waits for it.
  t = timeline.simulate(ops, [dict(ready=0, needed=1, seconds=0.5)], price)
  assert t.step == pytest.approx(3.5) and t.exposed == pytest.approx(0.5)
  # One interconnect: two collectives ready together run one after the
  # other, the one needed first first (op 1 waits 1 s, the other runs
  # beside op 1; the other order would make op 1 wait 2 s).
  t = timeline.simulate(ops, [dict(ready=0, needed=3, seconds=1.0),
                              dict(ready=0, needed=1, seconds=1.0)], price)
  assert t.step == pytest.approx(4.0)
  # A collective of the step's exports runs after the last op.
  t = timeline.simulate(ops, [dict(ready=2, needed=3, seconds=2.0)], price)
  assert t.step == pytest.approx(5.0) and t.collectives == 2.0


def test_the_data_parallel_gradient_allreduce_hides_behind_the_backward():
  """Data parallel on tpuv3, four layers of 64 MB weights (each its own
  gradient bucket): a layer's gradient allreduce starts when its gradient
  is computed and is needed only by the update, so all but the first
  layer's run beside the rest of the backward pass."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.random_normal(mesh, "batch:524288;d:4096")
  weights = [mtf.get_variable(mesh, "w%d" % i, "d:4096;e:4096")
             for i in range(4)]
  for w in weights:
    x = mtf.rename_dimension(mtf.relu(mtf.einsum(
        [x, w], output_shape="batch:524288;e:4096")), "e", "d")
  loss = mtf.reduce_sum(x)
  grads = mtf.gradients([loss], weights)
  for w, g in zip(weights, grads):
    mtf.assign_sub(w, g * 0.1)
  s = mtf.plan.plan(graph, mtf.MeshLayout("all:64", "batch:all"),
                    "tpuv3", trace=False).summary()
  assert [(r["kind"], r["count"]) for r in s["collectives"]] == [
      ("allreduce_sum", 4), ("allreduce_sum", 1)]   # gradients, the loss
  assert s["collective_seconds"] > 0.1 * s["compute_seconds"]
  assert s["exposed_collective_seconds"] < 0.3 * s["collective_seconds"]
  assert "beside the compute" in s["assumptions"][-1]


def test_an_effectively_unary_producer_is_recomputed_not_written():
  """logits + mask -> softmax (XLA's duplication of effectively unary
  producers, seen in TF 2.21's CPU HLO of this block): the masked logits
  [8, 128, 128] leave the max's kernel but are not written; the two
  kernels that read them read the einsum's output and the [128, 128]
  mask instead. Saving: one write of X = 512 KiB less two re-reads of the
  mask (X / 8 each): 0.75 X."""
  def build(mesh):
    q = mtf.random_normal(mesh, "b:8;l:128;d:64")
    k = mtf.random_normal(mesh, "b:8;m:128;d:64")
    mask = mtf.random_normal(mesh, "l:128;m:128")
    logits = mtf.einsum([q, k], output_shape="b:8;l:128;m:128")
    x = mtf.add(logits, mask, output_shape=logits.shape)
    return mtf.softmax(x, reduced_dim=mtf.Dimension("m", 128))
  graph, gl, _ = _graph(build)
  ops = list(lowering_lib.all_operations(graph.operations))
  recomputed = _recomputed_tails(ops, gl)
  add = [op for op in ops if op.name == "add"][0]
  assert set(recomputed) == {add.outputs[0]}
  assert {t.operation.name for t in recomputed[add.outputs[0]]} == {
      "einsum", "random_normal_2"}
  x_bytes = 8 * 128 * 128 * 4
  with_dup = sum(fusion.op_seconds(graph.operations, gl, TPU).values())
  without = sum(fusion._fused_seconds(  # pylint: disable=protected-access
      ops, gl, TPU, {op: accounting.op_cost(op, gl.op_layout(op), gl)
                     for op in ops}, recompute=False).values())
  assert (without - with_dup) * TPU.memory_bandwidth == pytest.approx(
      0.75 * x_bytes)


def test_a_producer_of_two_full_size_operands_is_written_once():
  """(a + b) read by two reductions: the add has two operands of its
  size, so recomputing it would read both twice (XLA keeps such
  producers: instruction_fusion.cc, "more than unary")."""
  def build(mesh):
    a = mtf.random_normal(mesh, "b:64;d:128")
    b = mtf.random_normal(mesh, "b:64;d:128")
    y = mtf.exp(a + b)
    return mtf.reduce_sum(y * mtf.reduce_max(y, reduced_dim=mtf.Dimension(
        "d", 128)), reduced_dim=mtf.Dimension("d", 128))
  graph, gl, _ = _graph(build)
  ops = list(lowering_lib.all_operations(graph.operations))
  assert not _recomputed_tails(ops, gl)


def test_a_loops_sums_cost_a_read_and_write_of_the_accumulator_per_iteration():
  """while_loop with an accumulator: each of the 5 iterations adds
  relu(h) * 2 (1M float32) to a sum the lowering keeps (a tf.add, not a
  meshtf op). One kernel per op: the add reads the body tensor and the
  accumulator and writes it, 3 x 4 MB a run. XLA: the add joins the
  fused kernel that makes the body tensor, which reads and writes the
  accumulator instead of writing the tensor: 4 MB more a run."""
  import tensorflow as tf
  def build(mesh):
    h0 = mtf.import_tf_tensor(mesh, tf.zeros([1024, 1024]), "a:1024;b:1024")
    def body(i, h):
      return [i + 1, h, mtf.relu(h) * 2.0]
    return mtf.while_loop(lambda i, h: mtf.less(i, 5), body,
                          [mtf.constant(mesh, 0, dtype=tf.int32), h0],
                          has_accumulators=True, maximum_iterations=5)[2]
  graph, gl, _ = _graph(build)
  ops = list(lowering_lib.all_operations(graph.operations))
  loop = [op for op in ops if op.inner_operations][0]
  mb = 4 * 2 ** 20
  cpu = hardware.get("cpu")
  unfused = fusion.op_seconds(graph.operations, gl, cpu)
  costs = {op: accounting.op_cost(op, gl.op_layout(op), gl) for op in ops}
  # pylint: disable=protected-access
  own = fusion._roofline(costs[loop].flops, costs[loop].bytes, cpu)
  sums = fusion._roofline(5 * 2 ** 20, 5 * 3 * mb, cpu)
  assert unfused[loop] == pytest.approx(
      own + sums + cpu.kernel_overhead * (1 + 5))
  kernels = fusion.kernels(graph.operations, gl, TPU)
  fused = [k for k in kernels if k.kind == "fused" and
           any(type(op).__name__ == "ScalarMultiplyOperation"
               for op in k.ops)]
  assert len(fused) == 1
  acc, = [t for t in fused[0].writes if t.operation is loop]
  assert fused[0].reads[acc] == fused[0].writes[acc] == 5 * mb
  assert not [t for t in fused[0].writes if t is not acc]
