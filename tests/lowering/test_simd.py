"""SPMD-specific behaviour: one program whatever the mesh size, rank order,
group keys, timeouts."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.lowering import simd


def mlp_graph(n):
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  batch, io, hidden = (mtf.Dimension("batch", 8 * n), mtf.Dimension("io", 8),
                       mtf.Dimension("hidden", 4 * n))
  with tf.Graph().as_default():
    x = mtf.import_tf_tensor(mesh, tf.compat.v1.placeholder(
        tf.float32, [8 * n, 8]), [batch, io])
  w = mtf.get_variable(mesh, "w", [io, hidden])
  v = mtf.get_variable(mesh, "v", [hidden, io])
  y = mtf.einsum([mtf.relu(mtf.einsum([x, w], output_shape=[batch, hidden])),
                  v], output_shape=[batch, io])
  loss = mtf.reduce_mean(mtf.square(y))
  for var, g in zip([w, v], mtf.gradients([loss], [w, v])):
    mtf.assign_sub(var, g * 0.1)
  return graph, mesh, loss


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_program_size_does_not_grow_with_the_mesh(n):
  graph, mesh, loss = mlp_graph(n)
  devices = ["/job:worker/replica:0/task:%d/device:CPU:%d" % (i // 8, i % 8)
             for i in range(n)]
  impl = mtf.SimdMeshImpl("rows:2;cols:%d" % (n // 2),
                          "batch:rows;hidden:cols", devices)
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[loss], launch=False)
  nodes = len(lowering.program.graph.as_graph_def().node)
  assert nodes == NODES.setdefault("mlp", nodes)
  assert {s["kind"] for s in lowering.collective_stats()} == {"allreduce_sum"}

NODES = {}


def test_device_rank_key_orders_numerically():
  names = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i
           for i in (10, 2, 1)]
  assert sorted(names, key=simd.device_rank_key) == [names[2], names[1],
                                                     names[0]]
  assert simd.device_rank_key("/job:w/replica:0/task:1/device:GPU:0") > \
      simd.device_rank_key("/job:w/replica:0/task:0/device:GPU:7")


def test_devices_in_any_order_give_the_same_numbers():
  """Processor p may sit on any device: results follow processor order,
  not TensorFlow's rank order inside collective groups."""
  shuffled = [harness.DEVICES[i] for i in (5, 2, 7, 0, 3, 6, 1, 4)]
  values = [np.array([float(p), 10.0 + p], np.float32) for p in range(8)]
  ordered = mtf.SimdMeshImpl("a:2;b:4", "", harness.DEVICES)
  mixed = mtf.SimdMeshImpl("a:2;b:4", "", shuffled)
  for fn in [lambda impl: lambda x: impl.allconcat(x, 1, 0),
             lambda impl: lambda x: impl.alltoall(
                 impl.allconcat(x, 1, 0), 1, 0, 0),
             lambda impl: lambda x: impl.shift_by_n_processors(x, 1, 1, True),
             lambda impl: lambda x: impl.allreduce(x, [0, 1], "MAX")]:
    a = [t.numpy() for t in ordered.run_on_slices(fn(ordered), values)]
    b = [t.numpy() for t in mixed.run_on_slices(fn(mixed), values)]
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  table = mixed.group_tables([1])
  assert table.rank_to_pos is not None  # the reordering was exercised


def test_two_meshes_on_the_same_devices_get_distinct_group_keys():
  a = mtf.SimdMeshImpl("rows:2;cols:4", "", harness.DEVICES)
  b = mtf.SimdMeshImpl("x:4;y:2", "", harness.DEVICES)
  ka = a.group_tables([1])
  kb = b.group_tables([1])
  keys_a = set(range(ka.base_key, ka.base_key + 2))
  keys_b = set(range(kb.base_key, kb.base_key + 4))
  assert not keys_a & keys_b
  # The same partition from another mesh object reuses its keys.
  assert mtf.SimdMeshImpl("r:2;c:4", "", harness.DEVICES).group_tables(
      [1]).base_key == ka.base_key


def test_bool_and_int_tensors_cross_the_wire():
  impl = mtf.SimdMeshImpl("all:8", "", harness.DEVICES)
  flags = [np.array([p % 2 == 0, True]) for p in range(8)]
  out = impl.run_on_slices(lambda x: impl.allconcat(x, 0, 0), flags)
  np.testing.assert_array_equal(out[3].numpy(), np.concatenate(flags))
  ints = [np.array([p], np.int32) for p in range(8)]
  out = impl.run_on_slices(lambda x: impl.allreduce(x, [0], "MAX"), ints)
  assert out[0].numpy().tolist() == [7]


def test_export_needs_a_program_output():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.ones(mesh, "k:8")
  b = a * 2.0
  impl = mtf.SimdMeshImpl("all:8", "k:all", harness.DEVICES)
  lowering = mtf.Lowering(graph, {mesh: impl}, outputs=[b])
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(b).numpy(),
                                [2.0] * 8)
  with pytest.raises(ValueError, match="outputs="):
    lowering.export_to_tf_tensor(a)


def test_lost_peer_raises_a_clear_error_instead_of_hanging():
  # A failed collective poisons the process's collective executor, so this
  # runs in its own process: 7 of 8 devices run the program.
  code = textwrap.dedent("""
      import tensorflow as tf, meshtf as mtf
      from meshtf.lowering import simd
      devices = mtf.virtual_cpu_devices(8)
      impl = mtf.SimdMeshImpl("all:8", "", devices,
                              collective_timeout_seconds=2)
      program = impl.trace_program(
          lambda x: [impl.allreduce(impl.LaidOutTensor([x]), [0],
                                    "SUM").one_slice],
          [tf.TensorSpec([2], tf.float32)])
      tokens = impl._ordering_tokens()
      def launch7():
        outs = []
        for p in range(7):
          with tf.device(devices[p]):
            outs.append(program(tf.constant(p), tokens[p].handle,
                                tf.ones([2])))
        return outs
      try:
        with impl.collective_watchdog():
          tf.function(launch7)()
      # The abort surfaces as either, as in MeshFunction: the collective's
      # deadline, or a transfer it cancelled.
      except (tf.errors.DeadlineExceededError, tf.errors.CancelledError) as e:
        print("RAISED", type(simd.explain_timeout(e, impl)).__name__)
        print(simd.explain_timeout(e, impl))
      """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                     text=True, timeout=300)
  assert "RAISED CollectiveTimeoutError" in r.stdout, r.stderr[-2000:]
  assert "did not complete within 2.0 s" in r.stdout


def test_collective_timeout_starts_no_thread_per_collective():
  """TensorFlow's per-op collective timeout sleeps in a new thread per
  collective; the watchdog must not (a training loop would run out of
  threads)."""
  impl = harness.make_impl("simd", "all:8", "batch:all")

  def build(mesh, x):
    x = mtf.import_tf_tensor(mesh, x, "batch:8;io:4")
    w = mtf.get_variable(mesh, "w", "io:4;h:4")
    loss = mtf.reduce_sum(mtf.einsum([x, w], output_shape="batch:8;h:4"))
    g, = mtf.gradients([loss], [w])
    mtf.assign_sub(w, 0.01 * g)
    return loss
  step = mtf.MeshFunction(build, impl)
  x = tf.ones([8, 4])
  step(x)
  before = len(os.listdir("/proc/self/task"))
  for _ in range(20):
    step(x)
  assert impl.collective_timeout_seconds == 600.0
  assert len(os.listdir("/proc/self/task")) - before < 8


def test_watchdog_fires_a_short_deadline_after_a_long_watch_ended():
  """The watchdog's thread sleeps until the deadline it last saw, so a
  step's watch with the same timeout need not wake it; a watch with an
  earlier deadline than that must, and still fires on time."""
  import time  # pylint: disable=g-import-not-at-top
  from meshtf.lowering.simd import watchdog  # pylint: disable=g-import-not-at-top
  aborted = []
  dog = watchdog.CollectiveWatchdog(abort=aborted.append)
  for _ in range(50):       # a training loop's steps: nothing fires
    with dog.watch(600.0, "long") as state:
      pass
  assert not state["fired"] and not aborted
  with dog.watch(0.2, "short") as state:
    waited = time.monotonic()
    while not state["fired"] and time.monotonic() - waited < 30:
      time.sleep(0.05)
  assert state["fired"]
  assert aborted == ["meshtf: collectives of short did not complete in time"]
