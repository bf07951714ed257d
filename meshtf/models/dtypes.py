"""Mixed precision: Mesh TensorFlow's VariableDType.

A variable has three dtypes: `master_dtype` (the precision the model is
defined in, and what the optimizers compute updates in), `slice_dtype` (what
each processor stores; defaults to master_dtype) and `activation_dtype`
(what get_variable returns for the forward pass; defaults to master_dtype).
meshtf keeps no master copy besides the slices, so a float32 master with the
default slice_dtype keeps the variables in float32 while the model computes
in bfloat16.

Example:
  >>> import tensorflow as tf
  >>> vdt = VariableDType(tf.float32, activation_dtype=tf.bfloat16)
  >>> vdt.slice_dtype.name, vdt.activation_dtype.name
  ('float32', 'bfloat16')
"""
import tensorflow as tf

from meshtf.ops import variables


# Defined with the variables (mtf.get_variable takes it too); here for the
# models' imports.
VariableDType = variables.VariableDType


def get_variable(mesh, name, shape, dtype=tf.float32, initializer=None,
                 trainable=True, **kwargs):
  """mtf.get_variable that also takes a VariableDType as dtype.

  The slices are stored in dtype.slice_dtype and the returned Tensor is in
  dtype.activation_dtype (a cast of the stored value, so gradients flow back
  to the variable in its own dtype).

  Example:
    >>> w = get_variable(mesh, "w", "io:8;hidden:16",
    ...                  dtype=VariableDType(activation_dtype=tf.bfloat16))
    >>> w.dtype.name, w.operation.inputs[0].dtype.name
    ('bfloat16', 'float32')
  """
  return variables.get_variable(mesh, name, shape, dtype=dtype,
                                initializer=initializer, trainable=trainable,
                                **kwargs)
