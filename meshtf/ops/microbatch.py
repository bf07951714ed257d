"""serialize_training_step: microbatching (Mesh TensorFlow's name). The
batch is split into num_splits microbatches run one after another in a
mtf.while_loop; gradients and outputs are accumulated, so peak activation
memory is that of one microbatch.

Example:
  >>> var_grads, loss = mtf.serialize_training_step(
  ...     {"x": x}, model_fn, batch_dim, num_splits=4)
"""
import tensorflow as tf

from meshtf import autodiff
from meshtf import shapes
from meshtf.ops.control import while_loop


def serialize_training_step(features, model_fn, batch_dim, num_splits):
  """Microbatching (Mesh TensorFlow's serialize_training_step): splits the
  batch into num_splits microbatches, runs model_fn on each in a
  while_loop and accumulates.

  features: {name: Tensor with batch_dim}. model_fn(features) returns a dict
  of Tensors holding "loss". Microbatch k holds the batch rows k, k +
  num_splits, k + 2 * num_splits, ... Returns (grads, outputs): grads are the
  gradients of the summed loss on graph.trainable_variables (in that order),
  summed over microbatches; outputs are model_fn's, summed over microbatches
  (or, with a batch dim, reassembled into the full batch).

  Example:
    >>> grads, outputs = mtf.serialize_training_step(
    ...     {"x": x}, model_fn, batch_dim, num_splits=4)
  """
  from meshtf.ops import einsum as einsum_lib
  from meshtf.ops import elementwise
  from meshtf.ops import index
  from meshtf.ops import io
  from meshtf.ops import shape_ops
  if not features:
    raise ValueError("serialize_training_step: features is empty")
  batch_dim = shapes.convert_to_dimension(batch_dim)
  for k, v in features.items():
    if batch_dim not in v.shape.dims:
      raise ValueError("serialize_training_step: feature %r has shape %s "
                       "without the batch dim %s" % (k, v.shape, batch_dim))
  if num_splits < 1 or batch_dim.size % num_splits:
    raise ValueError("serialize_training_step: num_splits=%d must divide the "
                     "batch dim %s:%d" % (num_splits, batch_dim.name,
                                          batch_dim.size))
  first = next(iter(features.values()))
  mesh, graph = first.mesh, first.graph
  micro_dim = shapes.Dimension("microbatch", num_splits)
  small_dim = shapes.Dimension(batch_dim.name, batch_dim.size // num_splits)
  keys = []

  def select(t, k):
    return index.gather(shape_ops.replace_dimensions(
        t, batch_dim, [small_dim, micro_dim]), k, micro_dim)

  def body_fn(k):
    outputs = model_fn({name: select(v, k) for name, v in features.items()})
    if "loss" not in outputs:
      raise ValueError("serialize_training_step: model_fn must return a dict "
                       "with a 'loss' entry; it returned keys %s"
                       % sorted(outputs))
    variables = list(graph.trainable_variables)
    grads = autodiff.gradients([outputs["loss"]],
                               [v.outputs[0] for v in variables])
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    if missing:
      raise ValueError("serialize_training_step: the loss does not depend on "
                       "the trainable variables %s" % missing)
    keys[:] = list(outputs)
    ret = [k + 1]
    for t in outputs.values():
      if small_dim in t.shape.dims:
        # Put the microbatch in its rows; the sum over iterations then holds
        # the full batch.
        t = einsum_lib.einsum(
            [t, index.one_hot(k, micro_dim, dtype=t.dtype)],
            output_shape=shape_ops.replace_dimensions(
                t.shape, small_dim, [small_dim, micro_dim]))
        t = shape_ops.replace_dimensions(t, [small_dim, micro_dim], batch_dim)
      ret.append(t)
    return ret + grads

  out = while_loop(lambda k: elementwise.less(k, num_splits), body_fn,
                   [io.constant(mesh, 0, dtype=tf.int32)],
                   has_accumulators=True, name="serialize_training_step")
  combined_outputs = dict(zip(keys, out[1:1 + len(keys)]))
  return out[1 + len(keys):], combined_outputs
