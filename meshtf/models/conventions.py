"""Model-wide conventions the layers and optimizers read.

The unit-scaling convention (Mesh TF's, gin-configured there): dense
layers divide their einsum by the square root of the contracted size,
their kernels start at stddev sqrt(scale), and Adafactor's default
learning rate drops its 0.05 factor. meshtf's models.layers and
models.adafactor read it here; Mesh TF's `mtf.layers.unit_scaling_convention`
is this function.

Example:
  >>> from meshtf.models import conventions
  >>> conventions.unit_scaling_convention()
  False
"""


_UNIT_SCALING = [False]


def unit_scaling_convention(value=None):
  """Whether the unit-scaling convention is on (us_einsum then divides by
  the square root of the contracted size); value=True / False sets it.
  (Mesh TF set it with gin; meshtf's gin-free setter is this argument.)

  Example:
    >>> unit_scaling_convention(True); unit_scaling_convention()
    True
  """
  if value is not None:
    _UNIT_SCALING[0] = bool(value)
  return _UNIT_SCALING[0]


__all__ = ["unit_scaling_convention"]
