"""A training step: model loss, gradients and optimizer update, lowered
once with mtf.MeshFunction and run many times under tf.function.

The loss function builds the model in each trace:
loss_fn(mesh, features, step) -> (scalar loss, {name: scalar metric}),
where features is the nest of TF tensors given to the step and step is the
global-step variable's value (an int64 scalar meshtf Tensor: the updates
done before this one; pass it on for step-dependent dropout or schedules).
The step then adds gradients of the loss w.r.t. every trainable variable,
optional global-norm clipping, the optimizer's update and the step
increment; the variables live in a VariableStore that outlives the traces.

Example:
  >>> from meshtf.models import optimize, training, transformer
  >>> lm = transformer.make_unitransformer(vocab_size=16, d_model=16,
  ...     num_layers=1, num_heads=2, d_kv=4, d_ff=32, max_length=8)
  >>> step = training.TrainStep(transformer.loss_fn(lm), impl,
  ...                           optimize.AdamWeightDecayOptimizer(1e-2))
  >>> out = step({"targets": ids})      # ids: int32 [batch, length]
  >>> sorted(out)[:3]
  ['accuracy', 'loss', 'num_tokens']
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.lowering import mesh_function
from meshtf.models import optimize


class TrainStep(object):
  """Callable running one training step per call on mesh_impl.

  Args:
    loss_fn: loss_fn(mesh, features, step) -> (loss, metrics dict).
    mesh_impl: the MeshImpl (mesh shape, layout, devices).
    optimizer: an optimize.Optimizer (its hyperparameters may be schedules
      of the step).
    variable_store: where variables live (a new VariableStore by default).
    seed: graph seed: initial values and random ops depend only on it.
    clip_gradient_norm: clip the gradients' global norm to this (adds the
      "gradient_norm" metric).
    use_tf_function: False runs eagerly (for debugging).
    bucket_bytes: cap of a fused gradient-allreduce bucket (see
      meshtf/lowering/bucketing.py; None: 1 MiB, 0: one allreduce per
      gradient).
    communication_hint, jit_compile, grappler: the SPMD backend's program
      options (mtf.SimdMeshImpl's; None: the impl's), e.g.
      jit_compile="segments", grappler="default".

  Calling it with the features returns {"loss", "step", metrics...} as TF
  tensors ("step" is the count before this update).

  Example:
    >>> train = TrainStep(transformer.loss_fn(model), impl,
    ...                   optimize.AdafactorOptimizer(), clip_gradient_norm=1.0)
    >>> for batch in batches:
    ...   out = train(batch)
  """

  def __init__(self, loss_fn, mesh_impl, optimizer, variable_store=None,
               seed=0, clip_gradient_norm=None, use_tf_function=True,
               bucket_bytes=None, communication_hint=None, jit_compile=None,
               grappler=None):
    if not callable(loss_fn):
      raise TypeError("TrainStep: loss_fn %r is not callable" % (loss_fn,))
    if not isinstance(optimizer, optimize.Optimizer):
      raise TypeError("TrainStep: optimizer %r is not an optimize.Optimizer"
                      % (optimizer,))
    self._loss_fn = loss_fn
    self._optimizer = optimizer
    self._clip = clip_gradient_norm
    self.mesh_function = mesh_function.MeshFunction(
        self._build, mesh_impl, variable_store=variable_store, seed=seed,
        use_tf_function=use_tf_function, bucket_bytes=bucket_bytes,
        communication_hint=communication_hint, jit_compile=jit_compile,
        grappler=grappler)

  @property
  def variable_store(self):
    return self.mesh_function.variable_store

  @property
  def graph(self):
    """The meshtf graph of the latest trace."""
    return self.mesh_function.graph

  def _build(self, mesh, features):
    return build_step(mesh, features, self._loss_fn, self._optimizer,
                      self._clip)

  def __call__(self, features):
    return self.mesh_function(features)

  def variable_value(self, name):
    """Full value of a variable as a numpy array."""
    return self.mesh_function.variable_value(name)


def build_step(mesh, features, loss_fn, optimizer, clip_gradient_norm=None):
  """The symbolic training step on mesh: the loss (loss_fn(mesh, features,
  step)), gradients of it w.r.t. every trainable variable, optional
  global-norm clipping, the optimizer's update and the step increment.
  Returns {"loss", "step", "gradient_norm" (when clipping), metrics...} as
  meshtf Tensors. The one builder of the step: TrainStep traces it with TF
  features, and the training binary's symbolic graph (preflight, header,
  --mode=plan; meshtf/train/experiment.py) builds it on imported ones.

  Example:
    >>> outputs = build_step(mesh, features, transformer.loss_fn(lm),
    ...                      optimize.AdamWeightDecayOptimizer(1e-2))
    >>> outputs["loss"].shape.ndims
    0
  """
  step, _ = optimize.get_global_step(mesh)
  loss, metrics = loss_fn(mesh, features, step)
  if loss.shape.ndims != 0:
    raise ValueError("TrainStep: the loss %s has shape %s; it must be a "
                     "scalar" % (loss.name, loss.shape))
  variables = [v.outputs[0] for v in mesh.graph.trainable_variables]
  if not variables:
    raise ValueError("TrainStep: the model has no trainable variables")
  grads = optimize.in_variable_layouts(mtf.gradients([loss], variables),
                                       variables)
  outputs = dict(metrics or {})
  if clip_gradient_norm:
    grads, outputs["gradient_norm"] = optimize.clip_by_global_norm(
        grads, clip_gradient_norm)
  optimizer.apply_grads(grads, variables, step=step)
  outputs["loss"] = loss
  outputs["step"] = step
  return outputs


def run_steps(train_step, batches):
  """Runs train_step on each batch; returns the per-step outputs as floats
  (a list of dicts).

  Example:
    >>> history = run_steps(train, [batch] * 10)
    >>> history[-1]["loss"] < history[0]["loss"]
    True
  """
  history = []
  for batch in batches:
    out = train_step(batch)
    history.append({k: float(tf.cast(v, tf.float64)) for k, v in out.items()})
  return history


__all__ = ["TrainStep", "run_steps"]
