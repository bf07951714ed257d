"""Learning-rate schedules: functions of the step, composed by product.

Each schedule takes the step (the updates already applied: a scalar meshtf
Tensor or a Python number) and returns a factor or a rate of the same kind,
so schedules compose by product and give plain floats for plain numbers.
meshtf's optimizers (meshtf/models/optimize.py, which re-exports every name
here) take such functions as hyperparameters and call them with their step.

Mesh TensorFlow's form is here too: `product_learning_rate(step,
total_train_steps, factors)` multiplies numbers and functions f(step,
total_train_steps) (the signature of Mesh TF's
transformer/learning_rate_schedules.py), and `compute_lr_for_step` gives
the rates of several such schedules (AdafactorWithMultiLRSchedule's).

Example:
  >>> from meshtf.models import schedules
  >>> sched = schedules.warmup_then_decay(0.01, 100, "rsqrt")
  >>> sched(50.0), sched(400.0)
  (0.005, 0.005)
  >>> schedules.product_learning_rate(50.0, 100, factors=[
  ...     0.1, lambda step, total: step / total])
  0.05
"""
import functools
import math

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf.ops import elementwise


def _is_tensor(x):
  return isinstance(x, graph_lib.Tensor)


def _minimum(a, b):
  return elementwise.minimum(a, b) if _is_tensor(a) or _is_tensor(b) \
      else min(a, b)


def _maximum(a, b):
  return elementwise.maximum(a, b) if _is_tensor(a) or _is_tensor(b) \
      else max(a, b)


def _rsqrt(x):
  return elementwise.rsqrt(x) if _is_tensor(x) else 1.0 / math.sqrt(x)


def step_num(step):
  """The step as a float32 scalar (Python numbers pass through as floats).

  Example:
    >>> t = step_num(step) + 1.0
  """
  return elementwise.cast(step, tf.float32) if _is_tensor(step) \
      else float(step)


# --- learning-rate schedules --------------------------------------------------
# Each takes the step (completed updates; a scalar Tensor or a number) and
# returns a factor or a rate of the same kind, so they compose by product
# and can be checked against their closed forms with plain numbers.
def constant(step, value=1.0):
  """A constant: `value` at every step.

  Example:
    >>> constant(step_num(step), 0.01)
  """
  del step
  return value


def linear_warmup(step, warmup_steps):
  """min(1, step / warmup_steps): 0 at step 0, 1 from warmup_steps on.

  Example:
    >>> linear_warmup(50.0, 100)
    0.5
  """
  if warmup_steps <= 0:
    return 1.0
  return _minimum(1.0, step_num(step) * (1.0 / warmup_steps))


def rsqrt_decay(step, warmup_steps=10000):
  """1 / sqrt(max(step, warmup_steps)): constant during warmup, then
  decaying as step^-0.5 (the Transformer's and T5's rsqrt schedule).

  Example:
    >>> rsqrt_decay(400.0, 100)
    0.05
  """
  return _rsqrt(_maximum(step_num(step), float(max(warmup_steps, 1))))


def linear_decay(step, total_steps, steps_or_fraction=0.1):
  """Linear decay to 0 over the last steps of training.

  min(1, (total_steps - step) / decay_steps), at least 0, where decay_steps
  is steps_or_fraction if >= 1, else that fraction of total_steps.

  Example:
    >>> linear_decay(950.0, 1000, 0.1)
    0.5
  """
  decay_steps = (float(steps_or_fraction) if steps_or_fraction >= 1
                 else steps_or_fraction * total_steps)
  remaining = (float(total_steps) - step_num(step)) * (1.0 / decay_steps)
  return _maximum(0.0, _minimum(1.0, remaining))


def product_schedule(*factors):
  """A schedule step -> product of factors(step) (numbers count as
  constants).

  Example:
    >>> sched = product_schedule(0.1, lambda s: linear_warmup(s, 10))
    >>> sched(5.0)
    0.05
  """
  def schedule(step):
    out = 1.0
    for f in factors:
      out = out * (f(step) if callable(f) else f)
    return out
  return schedule


def warmup_then_decay(learning_rate, warmup_steps, decay="rsqrt",
                      total_steps=None, steps_or_fraction=0.1):
  """Linear warmup to learning_rate at warmup_steps, then a decay.

  decay "rsqrt": learning_rate * sqrt(warmup_steps / step) after warmup;
  "linear": linear_decay(step, total_steps, steps_or_fraction);
  "constant": none. Returns a schedule (a function of the step).

  Example:
    >>> sched = warmup_then_decay(0.01, 100, "rsqrt")
    >>> sched(50.0), sched(400.0)
    (0.005, 0.005)
  """
  if decay == "rsqrt":
    # Scaled so the peak, at step = warmup_steps, is learning_rate.
    norm = math.sqrt(max(warmup_steps, 1))
    decay_fn = lambda s: norm * rsqrt_decay(s, warmup_steps)
  elif decay == "linear":
    if total_steps is None:
      raise ValueError("warmup_then_decay(decay='linear') needs total_steps")
    decay_fn = lambda s: linear_decay(s, total_steps, steps_or_fraction)
  elif decay == "constant":
    decay_fn = lambda s: 1.0
  else:
    raise ValueError("warmup_then_decay: decay %r is not one of 'rsqrt', "
                     "'linear', 'constant'" % (decay,))
  return product_schedule(learning_rate,
                          lambda s: linear_warmup(s, warmup_steps), decay_fn)


# --- Mesh TensorFlow's product form -------------------------------------------
def product_learning_rate(step, total_train_steps, factors=None, offset=0):
  """The product of factors: numbers, and functions f(step,
  total_train_steps) called with the step and total_train_steps less
  offset (Mesh TF's learning-rate functions take these two arguments).

  step may be a scalar meshtf Tensor (the product is then a Tensor) or a
  number. factors is required (Mesh TF's gin.REQUIRED); offset moves the
  start, e.g. to the first step of fine-tuning.

  Example:
    >>> product_learning_rate(1100, 2000, factors=[
    ...     0.5, lambda s, total: 1.0 - s / total], offset=1000)
    0.45
  """
  if factors is None:
    raise ValueError("product_learning_rate: factors is required: a list "
                     "of numbers and functions f(step, total_train_steps)")
  rate = 1.0
  for factor in factors:
    if callable(factor):
      factor = factor(step - offset, total_train_steps - offset)
    rate = rate * factor
  return rate


def compute_lr_for_step(schedules, learning_rate, train_steps=524288,
                        step=None):
  """One learning rate per schedule: learning_rate where the schedule is
  None, else product_learning_rate(step, train_steps, factors=schedule).

  Mesh TF evaluated them at the TF1 global step (and logged each as an
  "alt_learning_rate" summary). meshtf has no global step: given `step` (a
  scalar Tensor or a number) the rates are values; without it each is a
  function of the step, the form meshtf's optimizers take as a
  hyperparameter (they call it with their own step).

  Example:
    >>> rates = compute_lr_for_step([None, [2.0, lambda s, total: s]],
    ...                             0.1, train_steps=1000, step=3.0)
    >>> rates
    [0.1, 6.0]
    >>> compute_lr_for_step([[0.5]], 0.1)[0](7.0)   # a function of the step
    0.5
  """
  rates = []
  for factors in schedules:
    if factors is None:
      rates.append(learning_rate)
      continue
    rate = functools.partial(product_learning_rate,
                             total_train_steps=train_steps, factors=factors)
    rates.append(rate if step is None else rate(step))
  return rates


__all__ = [
    "step_num", "constant", "linear_warmup", "rsqrt_decay", "linear_decay",
    "product_schedule", "warmup_then_decay", "product_learning_rate",
    "compute_lr_for_step",
]
