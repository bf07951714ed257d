"""Test helpers under Mesh TensorFlow's names (`mtf.test_utils`).

Example:
  >>> import numpy as np
  >>> from meshtf import test_utils
  >>> conv = test_utils.NumpyConverter()
  >>> x = conv.convert_np_array_to_mtf_tensor(np.arange(6).reshape(2, 3))
  >>> conv.convert_mtf_tensor_to_np_array(x).tolist()
  [[0, 1, 2], [3, 4, 5]]
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering.lowering import Lowering
from meshtf.lowering.placement import PlacementMeshImpl
from meshtf.ops import io


class NumpyConverter(object):
  """Converts numpy arrays to meshtf Tensors and back, on a one-processor
  mesh of its own (Mesh TF's test_utils.NumpyConverter)."""

  def __init__(self):
    self._graph = graph_lib.Graph()
    self._mesh = graph_lib.Mesh(self._graph, "mtf_mesh")

  graph = property(lambda self: self._graph)
  mesh = property(lambda self: self._mesh)

  def convert_np_array_to_mtf_tensor(self, x, dim_names=None,
                                     dtype=tf.int32):
    """A constant meshtf Tensor with x's values; dims dim0, dim1, ... unless
    dim_names are given."""
    names = dim_names or ["dim%d" % i for i in range(len(x.shape))]
    shape = shapes.Shape([shapes.Dimension(n, s)
                          for n, s in zip(names, x.shape)])
    return io.constant(self._mesh, x, shape=shape, dtype=dtype)

  def convert_mtf_tensor_to_tf_tensor(self, mtf_tensor):
    """(lowering, tf tensor): the graph lowered on one processor."""
    impl = PlacementMeshImpl(shape=[], layout={}, devices=[""])
    lowering = Lowering(self._graph, {self._mesh: impl})
    return lowering, lowering.export_to_tf_tensor(mtf_tensor)

  def convert_mtf_tensor_to_np_array(self, x_mtf):
    """x's value as a numpy array (eager; in a TF1 graph, via a Session)."""
    _, x_tf = self.convert_mtf_tensor_to_tf_tensor(x_mtf)
    if tf.executing_eagerly():
      return x_tf.numpy()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(x_tf)
