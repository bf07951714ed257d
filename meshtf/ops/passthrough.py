"""depend and Print: ops that pass a value through unchanged while ordering
it after other work (depend) or printing data when it is computed (Print);
gradients pass straight through both.

Example:
  >>> update = mtf.assign(w, w * 0.5)
  >>> y = mtf.depend(x, [update])        # x, lowered after the assign
  >>> y = mtf.Print(y, [mtf.reduce_sum(y)], "sum of y:")
"""
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as tf2xla

from meshtf import graph as graph_lib
from meshtf.op_kinds import CostKind


class DependOperation(graph_lib.Operation):
  """x, lowered after `dependencies` (Operations or Tensors) have been:
  its slices carry TensorFlow control dependencies on them (Mesh
  TensorFlow's Depend). The gradient passes through to x."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, x, dependencies, name=None):
    deps = list(dependencies)
    for d in deps:
      if not isinstance(d, (graph_lib.Operation, graph_lib.Tensor)):
        raise TypeError("depend: dependencies must be meshtf Operations or "
                        "Tensors, got %r" % (d,))
    tensors = [d for d in deps if isinstance(d, graph_lib.Tensor)]
    super().__init__([x] + tensors, name=name or "depend")
    self._control_ops = [d for d in deps if isinstance(d, graph_lib.Operation)]
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  control_operations = property(lambda self: list(self._control_ops))
  # Its output is x's buffer (a TF identity): the plan counts it once.
  output_aliases = property(lambda self: {0: 0})

  def gradient(self, grad_ys):
    return [grad_ys[0]] + [None] * (len(self._inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    waited = [lowering.tensors[t] for t in self._inputs[1:]]
    if (getattr(impl, "compiled_by_xla", False) and waited and
        not self._control_ops and not tf.executing_eagerly()):
      # XLA ignores control dependencies and merges identical
      # computations: a rematerialization (ops/control/gradients.py copies
      # the forward ops onto depend(input, output gradients)) would be
      # merged back into the forward pass, its activations kept after
      # all. An optimization barrier over x and the tensors it waits for
      # makes x opaque to XLA and available only after them (JAX's remat
      # does the same).
      def barrier(t, *after):
        return tf2xla.optimization_barrier(t, *after)[0]
      lowering.set_tensor_lowering(self._outputs[0], impl.slicewise(
          barrier, lowering.tensors[self._inputs[0]], *waited))
      return
    control = []
    for d in self._control_ops:
      lowered = lowering.operations.get(d)
      if isinstance(lowered, (list, tuple)):
        control.extend(lowered)
      for t in d.outputs:
        control.extend(lowering.tensors[t].tensor_list)
    for t in self._inputs[1:]:
      control.extend(lowering.tensors[t].tensor_list)
    control = [c for c in control if c is not None]

    def local(t):
      if tf.executing_eagerly():
        return t  # eager ops already ran in program order
      with tf.control_dependencies(control):
        return tf.identity(t)
    lowering.set_tensor_lowering(self._outputs[0], impl.slicewise(
        local, lowering.tensors[self._inputs[0]]))


def depend(x, dependencies):
  """x, computed after `dependencies` (Operations such as an assign, or
  Tensors).

  Example:
    >>> update = mtf.assign(w, w * 0.5)
    >>> y = mtf.depend(x, [update])
  """
  return DependOperation(x, dependencies).outputs[0]


class PrintOperation(graph_lib.Operation):
  """x unchanged; lowering it prints `message` and the full values of
  `data` once, on the first processor (Mesh TensorFlow's PrintOperation).
  Split data is gathered for printing (an allconcat per split mesh axis)."""

  cost_kind = CostKind.KERNEL

  def __init__(self, x, data, message, name=None, **kwargs):
    data = list(data)
    for d in data:
      if not isinstance(d, graph_lib.Tensor):
        raise TypeError("Print: data must be meshtf Tensors, got %r" % (d,))
    super().__init__([x] + data, name=name or "Print")
    self._message = message
    self._kwargs = kwargs
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [grad_ys[0]] + [None] * (len(self._inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    full = []
    for d in self._inputs[1:]:
      full.append(impl.gather_full(lowering.tensors[d], d.shape))
    message, kwargs = self._message, self._kwargs

    def local(t, pnum, *values):
      def do_print():
        printed = tf.print(message, *values, **kwargs)
        with tf.control_dependencies([p for p in [printed] if p is not None]):
          return tf.constant(True)
      done = tf.cond(tf.equal(pnum, 0), do_print, lambda: tf.constant(False))
      if tf.executing_eagerly():
        return t
      with tf.control_dependencies([done]):
        return tf.identity(t)
    lowering.set_tensor_lowering(self._outputs[0], impl.slicewise(
        local, lowering.tensors[self._inputs[0]], impl.laid_out_pnum(), *full))


def Print(x, data, message, **kwargs):  # pylint: disable=invalid-name
  """x, unchanged; prints message and data's values (on the first
  processor) when x is computed. kwargs go to tf.print (summarize,
  output_stream, ...). The gradient passes through.

  Example:
    >>> h = mtf.Print(h, [mtf.reduce_sum(h)], "sum of h:", summarize=4)
  """
  name = kwargs.pop("name", None)
  message = "%s %s" % (message, [d.name for d in data])
  return PrintOperation(x, data, message, name=name, **kwargs).outputs[0]
