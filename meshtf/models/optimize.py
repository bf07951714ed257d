"""Optimizers, learning-rate schedules, gradient clipping and a global step.

Mesh TensorFlow's optimizers built from meshtf ops. Every state ("slot")
variable has its parameter's shape, so it gets the parameter's layout and the
update is computed slice by slice: SGD, momentum and Adam add no
communication to what the gradient itself needs. Adafactor's parameter scale
and update clipping need scalar RMS values and its factored accumulators
need row/column means: reductions that the lowering allreduces over the mesh
axes of the reduced dims (small: one scalar, or one row/column per slice).

Updates are computed in float32 (float64 for float64 variables) whatever the
variable's stored or activation dtype, and applied with assign / assign_sub,
which cast back to the variable's dtype.

Steps. Hyperparameters may be numbers, scalar meshtf Tensors, or functions of
the step (a float32 scalar Tensor counting the updates applied before this
one). `apply_grads(..., step=s)` uses your step (e.g. from get_global_step);
otherwise an optimizer that needs a step makes its own counter variable
"optimizer_step" and increments it (a second optimizer in the same graph
gets "optimizer_step_1": pass one step to both to share it). The
schedules live in meshtf/models/schedules.py, the Optimizer base class and
its kit in optimizer_base.py, Adafactor in adafactor.py; optimize re-exports
them all (Mesh TF's optimize.py held them).

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import optimize
  >>> def build(mesh, x_tf):
  ...   w = mtf.get_variable(mesh, "w", "io:4;hidden:8")
  ...   x = mtf.import_tf_tensor(mesh, x_tf, "batch:2;io:4")
  ...   loss = mtf.reduce_mean(mtf.square(
  ...       mtf.einsum([x, w], output_shape="batch:2;hidden:8")))
  ...   grads = mtf.gradients([loss], [w])
  ...   optimize.AdamWeightDecayOptimizer(1e-3).apply_grads(grads, [w])
  ...   return loss
  >>> step = mtf.MeshFunction(build, impl)   # slot variables "w/slot_m", ...
"""
import re

# The shared kit (optimizer_base.py) and Adafactor (adafactor.py): optimize
# keeps their names, Mesh TF's optimize.py held them all.
from meshtf.models.adafactor import AdafactorOptimizer
from meshtf.models.adafactor import AdafactorWithMultiLRSchedule
from meshtf.models.adafactor import adafactor_decay_rate_adam
from meshtf.models.adafactor import adafactor_decay_rate_pow
from meshtf.models.adafactor import adafactor_optimizer_from_hparams
from meshtf.models.optimizer_base import Optimizer
from meshtf.models.optimizer_base import _MultiLRSchedule
from meshtf.models.optimizer_base import _cast
from meshtf.models.optimizer_base import _pow
from meshtf.models.optimizer_base import _slot
from meshtf.models.optimizer_base import clip_by_global_norm
from meshtf.models.optimizer_base import get_global_step
from meshtf.models.optimizer_base import in_variable_layouts
from meshtf.models.optimizer_base import reduce_rms
from meshtf.ops import elementwise
from meshtf.ops import variables as variables_lib
# The schedules are optimize's names too (Mesh TF's optimize.py held
# product_learning_rate and compute_lr_for_step).
from meshtf.models.schedules import compute_lr_for_step
from meshtf.models.schedules import constant
from meshtf.models.schedules import linear_decay
from meshtf.models.schedules import linear_warmup
from meshtf.models.schedules import product_learning_rate
from meshtf.models.schedules import product_schedule
from meshtf.models.schedules import rsqrt_decay
from meshtf.models.schedules import step_num
from meshtf.models.schedules import warmup_then_decay


class SgdOptimizer(Optimizer):
  """Plain SGD: var -= lr * grad.

  Example:
    >>> ops = SgdOptimizer(0.1).apply_grads(grads, [w, b])
  """

  def __init__(self, lr):
    self._lr = lr

  lr = property(lambda self: self._lr)

  def _update(self, grad, var, value):
    lr = self._lr_for(var, self._lr, grad.dtype)
    # assign_sub rather than assign(var - ...): a low-precision variable
    # rounds only the increment, as in Mesh TensorFlow.
    return [variables_lib.assign_sub(var, grad * lr)]


class MomentumOptimizer(Optimizer):
  """SGD with momentum, in Mesh TensorFlow's form:
  velocity = momentum * velocity - lr * grad;  var += velocity.
  State: '<var>/slot_velocity'. (With a constant lr this is TensorFlow's
  momentum; with a schedule, lr scales each gradient when it enters.)

  Example:
    >>> ops = MomentumOptimizer(0.1, 0.9).apply_grads(grads, [w, b])
  """

  def __init__(self, learning_rate, momentum):
    self._lr = learning_rate
    self._momentum = momentum

  lr = property(lambda self: self._lr)
  momentum = property(lambda self: self._momentum)

  def _update(self, grad, var, value):
    lr = self._lr_for(var, self._lr, grad.dtype)
    momentum = self._hparam(var.mesh, "momentum", self._momentum, grad.dtype)
    velocity = _slot(var, "velocity", dtype=grad.dtype)
    new_velocity = velocity * momentum - grad * lr
    return [variables_lib.assign(velocity, new_velocity),
            variables_lib.assign_add(var, new_velocity)]


class AdamWeightDecayOptimizer(Optimizer):
  """Adam with decoupled weight decay (AdamW), as Mesh TensorFlow / BERT,
  plus meshtf's optional bias correction (off by default, as Mesh TF).

    m = beta_1 m + (1 - beta_1) g;   v = beta_2 v + (1 - beta_2) g^2
    by default m_hat = m, v_hat = v (Mesh TensorFlow's update); with
    bias_correction=True (t = step + 1):
      m_hat = m / (1 - beta_1^t),  v_hat = v / (1 - beta_2^t)
    var -= learning_rate * (m_hat / (sqrt(v_hat) + epsilon)
                            + weight_decay_rate * var)

  Weight decay is skipped for variables whose name matches a regex in
  exclude_from_weight_decay. State: '<var>/slot_m', '<var>/slot_v', and the
  step counter when bias_correction is on and no step is given.

  Example:
    >>> opt = AdamWeightDecayOptimizer(1e-3, weight_decay_rate=0.01,
    ...                                exclude_from_weight_decay=["bias"],
    ...                                bias_correction=True)
    >>> ops = opt.apply_grads(grads, [w, b])
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               bias_correction=False):
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay
    self.bias_correction = bias_correction

  def _do_use_weight_decay(self, param_name):
    if not self.weight_decay_rate:
      return False
    for r in self.exclude_from_weight_decay or ():
      if re.search(r, param_name) is not None:
        return False
    return True

  def _bias_corrections(self, mesh, dtype):
    """(1 - beta_1^t, 1 - beta_2^t), t = step + 1: scalars made once per
    graph and shared by all variables."""
    cache = self._state(mesh.graph).hparams
    key = ("bias_corrections", dtype)
    if key not in cache:
      t = _cast(self.step(mesh), dtype) + 1.0
      cache[key] = tuple(1.0 - _pow(beta, t)
                         for beta in (self.beta_1, self.beta_2))
    return cache[key]

  def _update(self, grad, var, value):
    mesh, dtype = var.mesh, grad.dtype
    lr = self._lr_for(var, self.learning_rate, dtype)
    m = _slot(var, "m", dtype=dtype)
    v = _slot(var, "v", dtype=dtype)
    next_m = m * self.beta_1 + grad * (1.0 - self.beta_1)
    next_v = v * self.beta_2 + elementwise.square(grad) * (1.0 - self.beta_2)
    m_hat, v_hat = next_m, next_v
    if self.bias_correction:
      c1, c2 = self._bias_corrections(mesh, dtype)
      m_hat, v_hat = next_m / c1, next_v / c2
    update = m_hat / (elementwise.sqrt(v_hat) + self.epsilon)
    # Decoupled decay: adding |w|^2 to the loss would be rescaled by Adam's
    # second moment, which is not weight decay.
    if self._do_use_weight_decay(var.name):
      update += value * self.weight_decay_rate
    return [variables_lib.assign_sub(var, update * lr),
            variables_lib.assign(m, next_m),
            variables_lib.assign(v, next_v)]


class AdamWithMultiLRSchedule(_MultiLRSchedule, AdamWeightDecayOptimizer):
  """AdamWeightDecayOptimizer with other learning-rate schedules for some
  variables (see AdafactorWithMultiLRSchedule); learning_rate and the other
  Adam options are keyword arguments.

  Example:
    >>> opt = AdamWithMultiLRSchedule(
    ...     variable_search=["bias"], alt_lr_schedules=[[0.1]],
    ...     learning_rate=1e-3)
    >>> ops = opt.apply_grads(grads, variables)
  """

  def __init__(self, variable_search=None, alt_lr_schedules=None,
               train_steps=524288, **kwargs):
    super().__init__(**kwargs)
    self._init_schedules(variable_search, alt_lr_schedules, train_steps)


def make_optimizer(name, learning_rate, **kwargs):
  """An optimizer by name: 'sgd', 'momentum', 'adam' or 'adafactor'; or,
  as Mesh TF's make_optimizer(hparams, lr), by hparams.optimizer: "SGD",
  or "Adafactor" (adafactor_optimizer_from_hparams).

  Example:
    >>> opt = make_optimizer("adam", 1e-3, weight_decay_rate=0.01)
  """
  if not isinstance(name, str):
    hparams = name
    if hparams.optimizer == "SGD":
      return SgdOptimizer(learning_rate)
    if hparams.optimizer == "Adafactor":
      return adafactor_optimizer_from_hparams(hparams, learning_rate)
    raise ValueError("make_optimizer: unknown hparams.optimizer %r (Mesh "
                     "TF's hparams form takes 'SGD' or 'Adafactor')"
                     % (hparams.optimizer,))
  classes = {"sgd": SgdOptimizer, "momentum": MomentumOptimizer,
             "adam": AdamWeightDecayOptimizer,
             "adafactor": AdafactorOptimizer}
  key = name.lower()
  if key not in classes:
    raise ValueError("Unknown optimizer %r; use one of %s" %
                     (name, sorted(classes)))
  if key == "adafactor":
    return AdafactorOptimizer(learning_rate=learning_rate, **kwargs)
  return classes[key](learning_rate, **kwargs)


__all__ = [
    "Optimizer", "SgdOptimizer", "MomentumOptimizer",
    "AdamWeightDecayOptimizer", "AdafactorOptimizer",
    "AdafactorWithMultiLRSchedule", "AdamWithMultiLRSchedule",
    "adafactor_decay_rate_pow", "adafactor_decay_rate_adam",
    "adafactor_optimizer_from_hparams", "make_optimizer",
    "clip_by_global_norm", "in_variable_layouts", "reduce_rms",
    "get_global_step", "step_num", "constant", "linear_warmup",
    "rsqrt_decay", "linear_decay", "product_schedule", "warmup_then_decay",
    "product_learning_rate", "compute_lr_for_step",
]
