"""Mesh TensorFlow's `mtf.utils` helpers that mean something on TF2.

Example:
  >>> placer = BalancedVariablePlacer(["cpu:0", "cpu:1"])
  >>> placer.least_used_device()
  'cpu:0'
"""
import contextlib
import heapq

import tensorflow as tf

SCALAR_SUMMARIES_COLLECTION_KEY = "mtf_scalar_summaries"


@contextlib.contextmanager
def outside_all_rewrites():
  """A scope outside any control dependencies (Mesh TF's TPU helper)."""
  with tf.control_dependencies(None):
    yield


class BalancedVariablePlacer(object):
  """Puts each new variable on the device with the fewest bytes so far.

  Used as `tf.device(placer.device_function)` around TF1 variable creation
  (Mesh TF passed it to mtf.Mesh). meshtf places variable slices per
  processor at lowering, so a Mesh accepts and ignores it.

  Example:
    >>> p = BalancedVariablePlacer(["a", "b"], [100, 0])
    >>> p.least_used_device()
    'b'
  """

  def __init__(self, devices, init_usage=None):
    init_usage = list(init_usage) if init_usage else [0] * len(devices)
    if len(init_usage) != len(devices):
      raise ValueError("BalancedVariablePlacer: %d devices but %d usages" %
                       (len(devices), len(init_usage)))
    # (bytes, position, device): position breaks ties in device order.
    self._heap = [(u, i, d) for i, (u, d) in
                  enumerate(zip(init_usage, devices))]
    heapq.heapify(self._heap)
    self._last_device = devices[0]

  def least_used_device(self):
    return self._heap[0][2]

  def device_function(self, op):
    """The device for TF op `op`: a variable goes where the fewest bytes
    are (and is counted there); any other op follows the last variable."""
    if op.type not in ("Variable", "VariableV2", "VarHandleOp"):
      return self._last_device
    shape = tf.TensorShape(op.get_attr("shape"))
    nbytes = shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
    used, pos, device = heapq.heappop(self._heap)
    heapq.heappush(self._heap, (used + nbytes, pos, device))
    self._last_device = device
    return device


def create_host_call(model_dir):
  """Mesh TF's TPUEstimator host_call writing the graph's scalar summaries
  to model_dir: (fn, args), or None when there are none. meshtf records no
  summaries (mtf.scalar_summary is accepted and ignored; TF >= 2.16 has no
  Estimator to call a host_call), so the answer is None, Mesh TF's answer
  for a graph without summaries.

  Example:
    >>> create_host_call("/tmp/model") is None
    True
  """
  del model_dir
  return None


def topology_rank(topology):
  """The number of dims of a TPU topology's mesh shape ([x, y, z, cores]:
  4). topology: a tf.tpu.experimental.Topology or its serialized
  TopologyProto (bytes).

  Example:
    >>> topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    >>> topology_rank(topology)
    4
  """
  if isinstance(topology, bytes):
    topology = tf.tpu.experimental.Topology(serialized=topology)
  if not isinstance(topology, tf.tpu.experimental.Topology):
    raise ValueError("topology_rank: topology is not a Topology or a "
                     "serialized TopologyProto; got %s" % type(topology))
  return len(topology.mesh_shape)


def remove_summaries():
  """Mesh TF cleared its scalar-summary collection here; meshtf keeps no
  such collection (summaries are TF2 tf.summary calls): a no-op."""
