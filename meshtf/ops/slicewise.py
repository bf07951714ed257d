"""Mesh TensorFlow's generic per-slice ops: slicewise and cwise.

`mtf.slicewise(tf_fn, xs, ...)` runs a TensorFlow function on each
processor's slices. It is layout-invariant only if tf_fn computes each
output position from the same positions of the inputs along every
splittable dim; dims listed as unsplittable must not be split by the
layout (checked before any TF work). Its gradient is `grad_function(op,
*dys)` if given, else the per-slice TensorFlow gradient of tf_fn
(GenericGradOperation).

Example:
  >>> y = mtf.slicewise(tf.exp, [x])                 # elementwise
  >>> z = mtf.cwise(tf.maximum, [x, y])             # same, several inputs
"""
import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import errors
from meshtf.op_kinds import CostKind


def _dim_names(shapes_list):
  return frozenset(d.name for s in shapes_list for d in s.dims)


class SlicewiseOperation(graph_lib.Operation):
  """tf_fn applied to each processor's input slices (Mesh TF's op).

  Args:
    tf_fn: slices of the inputs -> a slice (or a list of slices) of the
      outputs, with dims in each output shape's order.
    inputs: meshtf Tensors.
    output_shapes / output_dtypes: one per output.
    splittable_dims: dims the layout may split (others must be unsplit).
    grad_function: optional (op, *dys) -> one gradient per input.
  """

  cost_kind = CostKind.KERNEL

  def __init__(self, tf_fn, inputs, output_shapes, output_dtypes,
               splittable_dims, grad_function=None, name=None):
    super().__init__(inputs, name=name or "slicewise")
    self._tf_fn = tf_fn
    self._grad_function = grad_function
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(s),
                                      dtype, index=i)
                     for i, (s, dtype) in enumerate(zip(output_shapes,
                                                        output_dtypes))]
    splittable = frozenset(shapes.convert_to_dimension(d).name
                           if not isinstance(d, str) else d
                           for d in splittable_dims)
    self._unsplittable_names = (
        _dim_names([t.shape for t in self._inputs + self._outputs]) -
        splittable)

  tf_fn = property(lambda self: self._tf_fn)

  def unsplittable_dim_names(self):
    return self._unsplittable_names

  def validate_layout(self, mesh_layout):
    for t in self._inputs + self._outputs:
      for d in t.shape.dims:
        if d.name in self._unsplittable_names and mesh_layout.split_axes(d):
          raise errors.LayoutError(
              "slicewise %r: dim %r is not splittable (tf_fn needs it whole) "
              "but the layout splits it; drop its layout rule or list it in "
              "splittable_dims" % (self.name, d.name))

  @property
  def has_gradient(self):
    return any(t.dtype.is_floating for t in self._inputs)

  def gradient(self, grad_ys):
    if self._grad_function is not None:
      return self._grad_function(self, *grad_ys)
    return GenericGradOperation(self, grad_ys).outputs

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    fn = self._tf_fn
    outs = impl.slicewise(lambda *xs: _as_list(fn(*xs), len(self._outputs)),
                          *[lowering.tensors[x] for x in self._inputs])
    for t, laid_out in zip(self._outputs, outs):
      lowering.set_tensor_lowering(t, laid_out)


def _as_list(value, n):
  """tf_fn's result as a tuple of n slices (slicewise wants a tuple)."""
  if n == 1 and not isinstance(value, (list, tuple)):
    return (value,)
  return tuple(value)


class GenericGradOperation(graph_lib.Operation):
  """The gradient of a SlicewiseOperation: per slice, TensorFlow's gradient
  of its tf_fn (recomputed on the same slices, so it is exact)."""

  cost_kind = CostKind.KERNEL

  def __init__(self, forward_op, grad_ys, name=None):
    self._forward_op = forward_op
    grad_ys = list(grad_ys)
    self._has_dy = [dy is not None for dy in grad_ys]
    super().__init__(forward_op.inputs + [dy for dy in grad_ys if dy is not None],
                     mesh=forward_op.mesh,
                     name=name or forward_op.name + "/grad")
    self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype, index=i)
                     for i, x in enumerate(forward_op.inputs)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    n_in = len(self._forward_op.inputs)
    n_out = len(self._forward_op.outputs)
    fn = self._forward_op.tf_fn
    has_dy = self._has_dy

    def grad_fn(*slices):
      xs, dys = list(slices[:n_in]), iter(slices[n_in:])
      with tf.GradientTape() as tape:
        for x in xs:
          tape.watch(x)
        ys = _as_list(fn(*xs), n_out)
      pairs = [(y, next(dys)) for y, h in zip(ys, has_dy) if h]
      grads = tape.gradient([y for y, _ in pairs], xs,
                            output_gradients=[dy for _, dy in pairs])
      return tuple(tf.zeros_like(x) if g is None else g
                   for x, g in zip(xs, grads))

    outs = impl.slicewise(grad_fn, *[lowering.tensors[x]
                                     for x in self._inputs])
    for t, laid_out in zip(self._outputs, outs):
      lowering.set_tensor_lowering(t, laid_out)


def slicewise(tf_fn, xs, output_shape=None, output_dtype=None,
              splittable_dims=None, grad_function=None, name=None):
  """Mesh TF's mtf.slicewise: tf_fn on each processor's slices of xs.

  output_shape / output_dtype default to xs[0]'s; a list of them gives a
  list of outputs. splittable_dims defaults to every dim (an elementwise
  tf_fn).

  Example:
    >>> y = mtf.slicewise(lambda t: t * 2.0, [x])
  """
  multiple = isinstance(output_shape, (list, tuple)) and output_shape and (
      isinstance(output_shape[0], shapes.Shape))
  out_shapes = (list(output_shape) if multiple else
                [output_shape if output_shape is not None else xs[0].shape])
  if output_dtype is None:
    out_dtypes = [xs[0].dtype] * len(out_shapes)
  elif isinstance(output_dtype, (list, tuple)):
    out_dtypes = list(output_dtype)
  else:
    out_dtypes = [output_dtype] * len(out_shapes)
  if splittable_dims is None:
    splittable_dims = _dim_names([x.shape for x in xs] +
                                 [shapes.convert_to_shape(s)
                                  for s in out_shapes])
  op = SlicewiseOperation(tf_fn, xs, out_shapes, out_dtypes, splittable_dims,
                          grad_function, name=name)
  return op.outputs if multiple else op.outputs[0]


def cwise(tf_fn, xs, output_dtype=None, grad_function=None, name=None):
  """Mesh TF's mtf.cwise: an elementwise tf_fn of tensors of one shape.

  Example:
    >>> y = mtf.cwise(tf.math.softplus, [x])
  """
  shape = xs[0].shape
  for x in xs[1:]:
    if x.shape != shape:
      raise ValueError("cwise: %s has shape %s, %s has %s; broadcast them to "
                       "one shape first (mtf.broadcast)" % (
                           xs[0].name, shape, x.name, x.shape))
  return slicewise(tf_fn, xs, output_dtype=output_dtype,
                   grad_function=grad_function, name=name or "cwise")
