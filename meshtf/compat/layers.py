"""Mesh TensorFlow's `mtf.layers` module path: meshtf's layers
(meshtf/models/layers.py), its convolution layers and pools
(meshtf/models/conv_layers.py), and the Mesh TF names meshtf's own models do
not use (layers_extra.py: jitter, losses, incremental attention, ...;
local_attention.py: blocked local and memory-compressed attention).

`mtf.layers` and `mesh_tensorflow.layers` (after meshtf.compat.install())
are this module. VarianceScalingInitializer is Mesh TF's dense initializer,
meshtf's layers.DenseVarianceScalingInitializer.

Example:
  >>> import meshtf as mtf
  >>> y = mtf.layers.multiplicative_jitter(mtf.layers.dense(x, d_ff), 1e-2)
"""
from meshtf.models.layers import *  # noqa: F401,F403
from meshtf.models.conv_layers import *  # noqa: F401,F403
from meshtf.compat.layers_extra import *  # noqa: F401,F403
from meshtf.compat.local_attention import *  # noqa: F401,F403
from meshtf.compat import layers_extra as _layers_extra
from meshtf.compat import local_attention as _local_attention
from meshtf.models import conv_layers as _conv_layers
from meshtf.models import layers as _layers
from meshtf.models.conventions import unit_scaling_convention
# Mesh TF's name for meshtf's dense initializer.
VarianceScalingInitializer = _layers.DenseVarianceScalingInitializer

__all__ = (_layers.__all__ + _conv_layers.__all__ + _layers_extra.__all__ +
           _local_attention.__all__ +
           ["unit_scaling_convention", "VarianceScalingInitializer"])
