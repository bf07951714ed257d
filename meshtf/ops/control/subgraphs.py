"""The sub-graph machinery the control ops share: capturing a function's
operations, hoisting what must not repeat, binding a sub-graph's inputs
while lowering, the sums a loop accumulates over its iterations.

Example:
  >>> ops, outs = subgraphs._capture(graph, lambda: fn(*params))
"""
# The ops here own sub-graphs and reach into each other's parts.
# pylint: disable=protected-access
import contextlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from meshtf import graph as graph_lib
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind


# --- sub-graph helpers -------------------------------------------------------
class _Parameters(graph_lib.Operation):
  """Placeholders for values a sub-graph receives when it is lowered (a
  loop's state, a cotangent). Not in graph.operations: the op owning the
  sub-graph binds lowering.tensors[t] before lowering the sub-graph."""

  # Never lowered nor planned: the op owning the sub-graph binds them.
  cost_kind = CostKind.FREE

  def __init__(self, like, mesh, name):
    super().__init__([], mesh=mesh, name=name)
    mesh.graph.operations.pop()  # just appended by Operation.__init__
    self._outputs = [graph_lib.Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(like)]

  def lower(self, lowering):
    raise ValueError("%s stands for values bound by the op that owns it; it "
                     "is never lowered on its own" % self.name)


def is_bound_value(op):
  """Whether op stands for values the op owning its sub-graph binds while
  lowering (a while loop's state and iteration counter, a cotangent):
  such a value has no producer in the graph (meshtf/models/remat.py asks).

  Example:
    >>> is_bound_value(body_state_tensor.operation)
    True
  """
  return isinstance(op, _Parameters)


def _capture(graph, fn):
  """(fn(), the operations fn added), the latter removed from the graph."""
  n = len(graph.operations)
  out = fn()
  ops = graph.operations[n:]
  del graph.operations[n:]
  return out, ops


def _is_source(op):
  # Variables and host-side imports: a backend sets them up before lowering
  # (the SPMD program takes them as arguments), so they live at top level.
  return op.creates_variable_slices or op.imports_host_slices


def _hoist_sources(graph, ops):
  """Moves the sources among ops to the end of graph.operations (before the
  op about to own the rest); returns the rest."""
  rest = []
  for op in ops:
    if _is_source(op):
      graph.operations.append(op)
    else:
      rest.append(op)
  return rest


def _external_inputs(ops, bound=()):
  """Tensors that ops read and none of them makes (nor `bound` holds), in
  order of first use."""
  made = set(bound)
  for op in ops:
    made.update(op.outputs)
  out, seen = [], set()
  for op in ops:
    for t in op.inputs:
      if t not in made and t not in seen:
        seen.add(t)
        out.append(t)
  return out


def _live_ops(ops, needed):
  """The ops among `ops` (in order) that `needed` tensors depend on."""
  live, keep = set(needed), []
  for op in reversed(ops):
    if any(t in live for t in op.outputs):
      keep.append(op)
      live.update(op.inputs)
  keep.reverse()
  return keep


def _check_tensors(op_name, arg, xs):
  xs = list(xs)
  if not xs:
    raise ValueError("%s: %s must be a non-empty list of meshtf Tensors"
                     % (op_name, arg))
  for x in xs:
    if not isinstance(x, graph_lib.Tensor):
      raise TypeError("%s: %s holds %r, which is not a meshtf Tensor"
                      % (op_name, arg, x))
  return xs


def _bind(lowering, impl, params, slice_lists):
  for p, slices in zip(params, slice_lists):
    lowering.set_tensor_lowering(p, impl.LaidOutTensor(list(slices)))


def _zeros(impl, tensor):
  shape, dtype = impl.slice_shape(tensor.shape), tensor.dtype
  return impl.slicewise(lambda: tf.zeros(shape, dtype))


def _accumulate(lowering, impl, tensor, acc_slices, pending_axes, key):
  """acc + the value of `tensor`. A sum still pending is added unreduced
  (its mesh axes noted under `key`): the partial sums add up across
  iterations and are reduced once, after the loop."""
  raw = lowering.tensors.raw(tensor)
  if isinstance(raw, pending_lib.PendingSum) and not raw.materialized:
    pending_axes[key] = raw.mesh_axes
    part = raw.laid_out
  else:
    pending_axes.pop(key, None)
    part = lowering.tensors[tensor]
  return impl.slicewise(tf.add, part, impl.LaidOutTensor(list(acc_slices))
                        ).tensor_list


def _finish_sum(impl, slices, pending_axes, key):
  value = impl.LaidOutTensor(list(slices))
  if key in pending_axes:
    value = pending_lib.PendingSum(impl, value, pending_axes[key])
  return value


@contextlib.contextmanager
def _counted(impl, times):
  """The collectives a loop body emits (traced once) counted `times`
  times: a step runs them once per iteration (Lowering.collective_stats
  and the plan count per step)."""
  record = impl._recorder
  if not times or record is None:
    yield
    return
  impl._recorder = lambda rec: [record(rec) for _ in range(times)]
  try:
    yield
  finally:
    impl._recorder = record


def _tf_while_loop(impl, cond, body, loop_vars, **kwargs):
  """tf.while_loop that stays a functional While op in an SPMD program.

  Lowered to Switch/Merge frames, a loop's collectives would never meet:
  TensorFlow keys them by frame id, which differs between the devices'
  copies of the program (measured: allreduce in a lowered loop times out;
  kept functional, every iteration's collectives complete, reusing the
  traced instance keys in order on the ordering token).
  """
  graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  before = len(graph.get_operations()) if graph is not None else 0
  out = tf.while_loop(cond, body, loop_vars, **kwargs)
  if graph is not None and impl.is_spmd:
    for op in graph.get_operations()[before:]:
      if op.type in ("While", "StatelessWhile"):
        op._set_attr("_lower_using_switch_merge",
                     attr_value_pb2.AttrValue(b=False))
  return out
