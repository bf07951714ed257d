"""Adafactor (Shazeer and Stern, 2018), as in Mesh TensorFlow, with its
decay-rate schedules and Mesh TF's hparams constructor.

Adafactor's parameter scale and update clipping need one RMS value per
variable, and its factored accumulators need row / column means: reductions
that the lowering allreduces over the mesh axes of the reduced dims. Built
variable by variable, a model pays one small collective per reduction
(28 scalars of the 57 collectives of bench/transformer_step.py's dense LM
step on 2x4 devices). apply_grads instead builds every variable's update in
four phases and hands each phase's reductions to the lowering as one group
(mtf.reduce_together), which fuses them into one allreduce per mesh axes
and dtype (Lowering(bucket_bytes=...); 0 turns fusing off).

Example:
  >>> opt = AdafactorOptimizer(beta1=0.9)
  >>> ops = opt.apply_grads(mtf.gradients([loss], variables), variables)
"""
import math

from meshtf import graph as graph_lib
from meshtf.models import conventions
from meshtf.models import optimizer_base
from meshtf.models.schedules import _minimum
from meshtf.models.schedules import _rsqrt
from meshtf.models.schedules import step_num
from meshtf.ops import elementwise
from meshtf.ops import reductions
from meshtf.ops import variables as variables_lib

_pow = optimizer_base._pow


class AdafactorOptimizer(optimizer_base.Optimizer):
  """Adafactor (Shazeer and Stern, 2018) as in Mesh TensorFlow.

  The second moment of a parameter with two dims of size >=
  min_dim_size_to_factor is factored over its two largest dims d0, d1: a row
  accumulator '<var>/slot_vr' (shape without d0) and a column accumulator
  '<var>/slot_vc' (shape without d1), v ~ vr * vc / mean_d1(vr). Other
  parameters keep a full '<var>/slot_v'. The update is clipped to RMS
  clipping_threshold, scaled by max(rms(var), epsilon2) when
  multiply_by_parameter_scale, and, with beta1 > 0, averaged in '<var>/slot_m'.

  Dims named in stacked_dim_names (Mesh TF's option) are never factored
  nor reduced over: a stack of independent weights gets one pair of
  accumulators and one parameter scale per member. Dims named in
  not_factored (meshtf's; default: "experts") are only never factored: an
  MoE layer's experts get their own accumulators, which keep the experts'
  split (factoring over 2,048 experts instead would average the experts'
  statistics together and replicate a [d_model, hidden] accumulator on
  every device; the plan report found it), and share one parameter scale.
  Variables whose name contains a string in exclude_from_parameter_scale
  are updated at learning_rate, not scaled by their RMS. Each tuple of dim
  names in factor_dims_together counts as one dim of their sizes' product
  when choosing and reducing over d0 and d1: ("heads", "d_kv") factors an
  attention weight [d_model, heads, d_kv] as Mesh TF factors its
  [d_model, heads*d_kv] variable (T5's checkpoints), so the two give the
  same accumulators and updates.

  Defaults depend on the step s (updates already applied):
  decay_rate = 1 - (s + 1)^-0.8, learning_rate = min(0.01, 1/sqrt(s + 1))
  (times 0.05 without parameter scale unless the unit-scaling convention
  is on when the optimizer is made, as in Mesh TensorFlow).

  Example:
    >>> opt = AdafactorOptimizer(beta1=0.9, stacked_dim_names=["layers"],
    ...                          exclude_from_parameter_scale=["bias"])
    >>> ops = opt.apply_grads(grads, graph_variables)
    >>> t5 = AdafactorOptimizer(factor_dims_together=[("heads", "d_kv")])
  """

  def __init__(self, multiply_by_parameter_scale=True, learning_rate=None,
               decay_rate=None, beta1=0.0, clipping_threshold=1.0,
               factored=True, epsilon1=1e-30, epsilon2=1e-3,
               min_dim_size_to_factor=128, stacked_dim_names=None,
               exclude_from_parameter_scale=None, not_factored=("experts",),
               factor_dims_together=()):
    self._multiply_by_parameter_scale = multiply_by_parameter_scale
    if learning_rate is None:
      learning_rate = self._learning_rate_default(multiply_by_parameter_scale)
    self._learning_rate = learning_rate
    self._decay_rate = (adafactor_decay_rate_pow() if decay_rate is None
                        else decay_rate)
    self._beta1 = beta1
    self._clipping_threshold = clipping_threshold
    self._factored = factored
    self._epsilon1 = epsilon1
    self._epsilon2 = epsilon2
    self._min_dim_size_to_factor = min_dim_size_to_factor
    self._stacked_dim_names = list(stacked_dim_names or ())
    self._exclude_from_parameter_scale = list(
        exclude_from_parameter_scale or ())
    self._not_factored = (frozenset(not_factored or ())
                          | frozenset(self._stacked_dim_names))
    self._factor_dims_together = [tuple(g) for g in factor_dims_together or ()]
    for group in self._factor_dims_together:
      if len(group) < 2 or set(group) & self._not_factored:
        raise ValueError(
            "AdafactorOptimizer: factor_dims_together %r: each group names "
            "two or more dims that may be factored (not in not_factored or "
            "stacked_dim_names %s)" % (group, sorted(self._not_factored)))

  @staticmethod
  def _learning_rate_default(multiply_by_parameter_scale):
    # As Mesh TF: no 0.05 under the unit-scaling convention (read here).
    scale = (1.0 if multiply_by_parameter_scale
             or conventions.unit_scaling_convention() else 0.05)
    return lambda step: _minimum(_rsqrt(step + 1.0), 0.01) * scale

  def _factored_dims(self, shape):
    """(d0, d1): the two largest dims (not in not_factored or
    stacked_dim_names; a factor_dims_together group is one dim, at its first
    member's place), each a list of dims, if both are >=
    min_dim_size_to_factor; else None. Ties keep the shape's order, as Mesh
    TF's stable sort."""
    units = []
    for d in shape.dims:
      if d.name in self._not_factored:
        continue
      group = next((g for g in self._factor_dims_together if d.name in g), None)
      members = [e for e in shape.dims if group and e.name in group] or [d]
      if members[0] is d:
        units.append(members)
    if not self._factored or len(units) < 2:
      return None
    size = lambda unit: math.prod(e.size for e in unit)  # noqa: E731
    units.sort(key=lambda unit: -size(unit))
    if size(units[1]) < self._min_dim_size_to_factor:
      return None
    return units[0], units[1]

  def _scales_by_parameter(self, var):
    return self._multiply_by_parameter_scale and not any(
        s in var.name for s in self._exclude_from_parameter_scale)

  def _update(self, grad, var, value):
    return self._update_all([(grad, var, value)])

  def _update_all(self, items):
    """All variables' updates, built in four phases. Each phase's
    reductions over split dims read only what earlier phases made, and go
    to the lowering as one group (mtf.reduce_together): a few fused
    allreduces per phase instead of up to four per variable (one scalar
    each for the parameter scale and the clipping RMS, one row or column
    mean for each factored accumulator). The arithmetic is the per-variable
    one, operation for operation."""
    updates = [_VariableUpdate(self, *item) for item in items]
    for phase in ("statistics", "factors", "direction", "apply"):
      pending = []
      for u in updates:
        pending.extend(getattr(u, phase)())
      graph_lib.reduce_together(pending)   # skips the None entries
    return [op for u in updates for op in u.ops]


class _VariableUpdate(object):
  """One variable's Adafactor update, phase by phase (see
  AdafactorOptimizer._update_all). Each phase returns the reductions it
  made, for the lowering to fuse with the other variables' ones."""

  def __init__(self, optimizer, grad, var, value):
    self.opt, self.grad, self.var, self.value = optimizer, grad, var, value
    dtype = grad.dtype
    self.decay_rate = optimizer._hparam(var.mesh, "decay_rate",
                                        optimizer._decay_rate, dtype)
    self.learning_rate = optimizer._lr_for(var, optimizer._learning_rate,
                                           dtype)
    self.mixing_rate = 1.0 - self.decay_rate
    self.factored_dims = optimizer._factored_dims(var.shape)
    self.ops = []

  def statistics(self):
    """The squared gradient's row and column means (factored) and the
    parameter's mean square (the parameter scale): read grad and value."""
    opt, var = self.opt, self.var
    self.grad_squared = elementwise.square(self.grad) + opt._epsilon1
    self.vr_mean = self.vc_mean = self.value_mean_square = None
    if self.factored_dims:
      d0, d1 = self.factored_dims
      self.vr_mean = reductions.reduce_mean(self.grad_squared,
                                            output_shape=_without(var, d0))
      self.vc_mean = reductions.reduce_mean(self.grad_squared,
                                            output_shape=_without(var, d1))
    if opt._scales_by_parameter(var):
      stacked = [d for d in self.value.shape.dims
                 if d.name in opt._stacked_dim_names]
      self.value_mean_square = reductions.reduce_mean(
          elementwise.square(self.value), output_shape=stacked)
    return [self.vr_mean, self.vc_mean, self.value_mean_square]

  def factors(self):
    """The new accumulators and, factored, the row accumulator's mean."""
    var, dtype = self.var, self.grad.dtype
    if self.factored_dims:
      d0, d1 = self.factored_dims
      vr = optimizer_base._slot(var, "vr", _without(var, d0), dtype)
      vc = optimizer_base._slot(var, "vc", _without(var, d1), dtype)
      self.new_vr = vr * self.decay_rate + self.vr_mean * self.mixing_rate
      self.new_vc = vc * self.decay_rate + self.vc_mean * self.mixing_rate
      self.ops += [variables_lib.assign(vr, self.new_vr),
                   variables_lib.assign(vc, self.new_vc)]
      self.long_term_mean = reductions.reduce_mean(
          self.new_vr, output_shape=_without(self.new_vr, d1))
      return [self.long_term_mean]
    v = optimizer_base._slot(var, "v", dtype=dtype)
    self.new_v = v * self.decay_rate + self.grad_squared * self.mixing_rate
    self.ops.append(variables_lib.assign(v, self.new_v))
    return []

  def direction(self):
    """The unclipped update x and, with clipping, its mean square."""
    if self.factored_dims:
      r_factor = elementwise.rsqrt(self.new_vr / self.long_term_mean)
      c_factor = elementwise.rsqrt(self.new_vc)
      self.x = self.grad * r_factor * c_factor
    else:
      self.x = self.grad * elementwise.rsqrt(self.new_v)
    self.x_mean_square = None
    if self.opt._clipping_threshold is not None:
      self.x_mean_square = reductions.reduce_mean(elementwise.square(self.x))
    return [self.x_mean_square]

  def apply(self):
    """Clip, scale by the parameter's RMS, average in m; assign."""
    opt, var, x = self.opt, self.var, self.x
    if self.x_mean_square is not None:
      x = x / elementwise.maximum(
          elementwise.sqrt(self.x_mean_square)
          * (1.0 / opt._clipping_threshold), 1.0)
    update_scale = self.learning_rate
    if self.value_mean_square is not None:
      update_scale = elementwise.maximum(
          elementwise.sqrt(self.value_mean_square),
          opt._epsilon2) * self.learning_rate
    subtrahend = x * update_scale
    if opt._beta1:
      m = optimizer_base._slot(var, "m", dtype=self.grad.dtype)
      subtrahend = m * opt._beta1 + subtrahend * (1.0 - opt._beta1)
      self.ops.append(variables_lib.assign(m, subtrahend))
    # assign_sub, not assign(var - ...): see SgdOptimizer.
    self.ops.append(variables_lib.assign_sub(var, subtrahend))
    return []


def _without(tensor, dims):
  """tensor's shape less dims (a factored unit: one dim or a group)."""
  return tensor.shape - list(dims)


def adafactor_decay_rate_pow(exponent=0.8, offset=0):
  """Decay rate 1 - (step - offset + 1)^-exponent: memory grows as
  step^exponent. For fine-tuning, offset is the fine-tuning's first step.
  Returns a function of the step, for AdafactorOptimizer(decay_rate=...)
  (Mesh TF returned the value at its TF1 global step).

  Example:
    >>> adafactor_decay_rate_pow()(0.0)
    0.0
    >>> opt = AdafactorOptimizer(decay_rate=adafactor_decay_rate_pow(
    ...     offset=10000))
  """
  return lambda step: 1.0 - _pow(step_num(step) - offset + 1.0, -exponent)


def adafactor_decay_rate_adam(beta2):
  """Adam-like decay rate beta2 (1 - beta2^(t-1)) / (1 - beta2^t), t = step
  + 1: folds Adam's bias correction into the decay. A function of the step
  (Mesh TF returned the value at its TF1 global step).

  Example:
    >>> opt = AdafactorOptimizer(decay_rate=adafactor_decay_rate_adam(0.999))
  """
  def decay(step):
    t = step_num(step) + 1.0
    return beta2 * (1.0 - _pow(beta2, t - 1.0)) / (1.0 - _pow(beta2, t))
  return decay


def adafactor_optimizer_from_hparams(hparams, lr):
  """An AdafactorOptimizer from Mesh TF (tensor2tensor) hparams, with
  learning rate lr. hparams.optimizer_adafactor_decay_type "Adam" decays
  like adafactor_decay_rate_adam(optimizer_adafactor_beta2), "pow" like
  adafactor_decay_rate_pow(optimizer_adafactor_memory_exponent);
  optimizer_adafactor_multiply_by_parameter_scale, _beta1,
  _clipping_threshold and _factored set the options of the same names.

  Example:
    >>> hp = types.SimpleNamespace(
    ...     optimizer_adafactor_decay_type="pow",
    ...     optimizer_adafactor_memory_exponent=0.8,
    ...     optimizer_adafactor_multiply_by_parameter_scale=True,
    ...     optimizer_adafactor_beta1=0.0,
    ...     optimizer_adafactor_clipping_threshold=1.0,
    ...     optimizer_adafactor_factored=True)
    >>> opt = adafactor_optimizer_from_hparams(hp, 0.01)
  """
  decay_type = hparams.optimizer_adafactor_decay_type
  if decay_type == "Adam":
    decay_rate = adafactor_decay_rate_adam(hparams.optimizer_adafactor_beta2)
  elif decay_type == "pow":
    decay_rate = adafactor_decay_rate_pow(
        hparams.optimizer_adafactor_memory_exponent)
  else:
    raise ValueError("adafactor_optimizer_from_hparams: unknown "
                     "optimizer_adafactor_decay_type %r (use 'Adam' or "
                     "'pow')" % (decay_type,))
  return AdafactorOptimizer(
      multiply_by_parameter_scale=(
          hparams.optimizer_adafactor_multiply_by_parameter_scale),
      learning_rate=lr, decay_rate=decay_rate,
      beta1=hparams.optimizer_adafactor_beta1,
      clipping_threshold=hparams.optimizer_adafactor_clipping_threshold,
      factored=hparams.optimizer_adafactor_factored)



class AdafactorWithMultiLRSchedule(optimizer_base._MultiLRSchedule,
                                   AdafactorOptimizer):
  """Adafactor with other learning-rate schedules for some variables.

  variable_search: regexes; alt_lr_schedules: one product_learning_rate
  factor list per regex (None: the optimizer's learning_rate), evaluated at
  the optimizer's step with total_train_steps = train_steps (Mesh TF's
  gin-configured compute_lr_for_step.train_steps). Without both, plain
  Adafactor. Other keyword arguments are AdafactorOptimizer's.

  Example:
    >>> opt = AdafactorWithMultiLRSchedule(
    ...     variable_search=["^decoder/"],
    ...     alt_lr_schedules=[[0.001, lambda s, total: 1.0 - s / total]],
    ...     train_steps=10000, learning_rate=0.01)
    >>> ops = opt.apply_grads(grads, variables)
  """

  def __init__(self, variable_search=None, alt_lr_schedules=None,
               train_steps=524288, **kwargs):
    super().__init__(**kwargs)
    self._init_schedules(variable_search, alt_lr_schedules, train_steps)

