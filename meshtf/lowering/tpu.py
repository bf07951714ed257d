"""TpuMeshImpl: the SPMD backend with TPU collectives, for TPUStrategy.

The per-replica program is the SimdMeshImpl program; only the collectives
change to the TPU (XLA) ops, whose groups are static replica-id lists:

  allreduce SUM   CrossReplicaSum(group_assignment = groups along the axes)
  allreduce MAX/MIN, allconcat
                  AllToAll of the slice tiled once per peer, then a local
                  reduce / concatenation (TPUs have no gather or max-reduce op
                  in TensorFlow's raw ops)
  alltoall        AllToAll(split_dimension, concat_dimension, group_assignment)
  receive/shift   CollectivePermute(source_target_pairs)

Processor p is TPU replica p (the strategy's device assignment must list
the cores in processor order). This backend is traced and checked here on
CPU (the emitted ops, group assignments and source-target pairs); it has
not run on TPU hardware.

Example:
  >>> impl = mtf.TpuMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
  ...                        ["/device:TPU:%d" % i for i in range(8)])
  >>> lowering = mtf.Lowering(graph, {mesh: impl}, launch=False)
"""
import numpy as np
import tensorflow as tf

from meshtf.lowering import simd
from meshtf.lowering import simd_collectives


class TpuMeshImpl(simd.SimdMeshImpl):
  """SPMD mesh implementation whose collectives are TPU ops."""

  uses_ordering_token = False  # XLA orders the collectives itself
  compiled_by_xla = True        # a TPU runs only what XLA compiled

  def group_assignment(self, mesh_axes):
    """[num_groups, group_size] replica ids of the groups along mesh_axes."""
    return self.processor_group_array(mesh_axes).astype(np.int32)

  def _allreduce_slice(self, t, mesh_axes, reduction_fn_string):
    groups = self.group_assignment(mesh_axes)
    if reduction_fn_string == "SUM":
      wire, back = simd_collectives._to_wire(t)
      return back(tf.raw_ops.CrossReplicaSum(input=wire,
                                             group_assignment=groups))
    fn = {"MAX": tf.reduce_max, "MIN": tf.reduce_min}[reduction_fn_string]
    return fn(self._gather(t, groups), axis=0)

  def _gather(self, t, groups):
    """[group_size, *t.shape]: every member's slice, in group order."""
    n = groups.shape[1]
    tiled = tf.tile(tf.expand_dims(t, 0), [n] + [1] * t.shape.rank)
    return tf.raw_ops.AllToAll(input=tiled, group_assignment=groups,
                               concat_dimension=0, split_dimension=0,
                               split_count=n)

  def _allconcat_slice(self, t, mesh_axis, concat_axis):
    groups = self.group_assignment([mesh_axis])
    return simd_collectives._merge_leading(self._gather(t, groups),
                                           concat_axis, groups.shape[1])

  def _alltoall_slice(self, t, mesh_axis, split_axis, concat_axis):
    axes = list(mesh_axis) if isinstance(mesh_axis, tuple) else [mesh_axis]
    groups = self.group_assignment(axes)
    return tf.raw_ops.AllToAll(
        input=t, group_assignment=groups, concat_dimension=concat_axis,
        split_dimension=split_axis, split_count=groups.shape[1])

  def source_target_pairs(self, mesh_axis, source_pcoord):
    """[[source replica, target replica], ...] for a permute along an axis."""
    pairs = []
    for group in self.processor_group_array([mesh_axis]):
      for target, source in enumerate(source_pcoord):
        if source is not None:
          pairs.append([int(group[source]), int(group[target])])
    return np.array(pairs, np.int32).reshape([-1, 2])

  def _permute_slice(self, t, mesh_axis, source_pcoord):
    # Replicas that are nobody's target receive zeros, as a shift without
    # wrap-around expects.
    return tf.raw_ops.CollectivePermute(
        input=t, source_target_pairs=self.source_target_pairs(
            mesh_axis, source_pcoord))

  def launch(self, program, per_device_args):
    """Runs the program as the replica function of the current
    tf.distribute.TPUStrategy (call inside strategy.scope()). Not run on
    TPU hardware by the project's tests."""
    strategy = tf.distribute.get_strategy()
    if "TPU" not in type(strategy).__name__:
      raise ValueError(
          "TpuMeshImpl runs its program under tf.distribute.TPUStrategy: "
          "call it inside strategy.scope() (or use SimdMeshImpl on CPU/GPU)")
    if strategy.num_replicas_in_sync != self.size:
      raise ValueError(
          "The TPUStrategy has %d replicas but mesh %s has %d processors"
          % (strategy.num_replicas_in_sync, self.shape, self.size))
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: tuple(per_device_args[ctx.replica_id_in_sync_group]))

    def replica_fn(args):
      pnum = tf.distribute.get_replica_context().replica_id_in_sync_group
      return program(tf.cast(pnum, tf.int32), *args)

    results = strategy.run(replica_fn, args=(per_replica,))
    per_output = [strategy.experimental_local_results(r) for r in results]
    return [[values[p] for values in per_output] for p in range(self.size)]
