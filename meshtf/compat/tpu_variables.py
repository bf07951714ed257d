"""Mesh TensorFlow's `mtf.tpu_variables` module path.

Mesh TF wrapped per-core TF1 variables in a ReplicatedVariable for
TPUEstimator; meshtf's TPU backend (meshtf.lowering.tpu) keeps one
tf.Variable per slice under TPUStrategy and needs no wrapper.

Example:
  >>> from meshtf import tpu_variables
  >>> tpu_variables.ReplicatedVariable   # doctest: +ELLIPSIS
  <class ...>
"""


class ReplicatedVariable(object):
  """Refused with a migration line: TF1 TPUEstimator variables only."""

  def __init__(self, name, variables):
    del name, variables
    raise NotImplementedError(
        "tpu_variables.ReplicatedVariable wraps TF1 TPUEstimator variables; "
        "meshtf.TpuMeshImpl keeps one tf.Variable per slice: drop the "
        "wrapper and lower with mtf.TpuMeshImpl")
