"""meshtf operations, one module per family; each op keeps its shape rule,
gradient and lowering together.

Importing any op family attaches Tensor's arithmetic operators here, from
the elementwise family: graph.py defines Tensor without importing ops (as
JAX's numpy layer sets its array's operators), and every Tensor is the
output of an op of this package.

Example:
  >>> x = mtf.ones(mesh, "batch:4")
  >>> (2.0 * x - 1.0).shape        # mtf.subtract(mtf.multiply(2.0, x), 1.0)
  Shape([batch:4])
"""
from meshtf import graph as _graph
from meshtf.ops import elementwise as _elementwise


def _attach_tensor_operators(tensor_class, ops):
  """Tensor's + - * / ** and unary - as the elementwise family's ops."""
  tensor_class.__add__ = lambda self, other: ops.add(self, other)
  tensor_class.__radd__ = lambda self, other: ops.add(other, self)
  tensor_class.__sub__ = lambda self, other: ops.sub(self, other)
  tensor_class.__rsub__ = lambda self, other: ops.sub(other, self)
  tensor_class.__mul__ = lambda self, other: ops.multiply(self, other)
  tensor_class.__rmul__ = lambda self, other: ops.multiply(other, self)
  tensor_class.__truediv__ = lambda self, other: ops.divide(self, other)
  tensor_class.__rtruediv__ = lambda self, other: ops.divide(other, self)
  tensor_class.__neg__ = lambda self: ops.negative(self)
  tensor_class.__pow__ = lambda self, other: ops.pow(self, other)


_attach_tensor_operators(_graph.Tensor, _elementwise)
