"""Mesh TensorFlow's `transformer.transformer_layers` module path: meshtf's
transformer layers (meshtf/models/transformer_layers.py) and its convolution
layers (meshtf/models/conv_transformer_layers.py), which Mesh TF kept in one
file.

Example:
  >>> from meshtf.compat import transformer_layers as tl
  >>> stack = transformer.LayerStack([tl.SelfAttention(), tl.Conv1DLayer(3, 8)])
"""
from meshtf.models.transformer_layers import *  # noqa: F401,F403
from meshtf.models.conv_transformer_layers import *  # noqa: F401,F403
from meshtf.models import conv_transformer_layers as _conv
from meshtf.models import transformer_layers as _transformer_layers
# Public names outside its __all__, on the module path as before.
from meshtf.models.transformer_layers import ACTIVATIONS  # noqa: F401
from meshtf.models.transformer_layers import annotate  # noqa: F401

__all__ = _transformer_layers.__all__ + _conv.__all__
