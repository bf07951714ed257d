"""Mesh TensorFlow's `transformer.moe` module path: meshtf's GShard MoE
(meshtf/models/moe.py) and Mesh TF's own MoE layers under its names, with
its routing and numbers (moe_layers.py: MoE1D, MoE2D, HParams,
transformer_moe_layer_v1 / v2).

Example:
  >>> from meshtf.compat import moe
  >>> stack = transformer.LayerStack([tl.SelfAttention(), moe.MoE1D(8, 256)])
"""
from meshtf.models.moe import *  # noqa: F401,F403
from meshtf.compat.moe_layers import HParams
from meshtf.compat.moe_layers import MoE1D
from meshtf.compat.moe_layers import MoE2D
from meshtf.compat.moe_layers import set_default_moe_hparams
from meshtf.compat.moe_layers import transformer_moe_layer_v1
from meshtf.compat.moe_layers import transformer_moe_layer_v2
from meshtf.models import moe as _moe
# Public names outside its __all__, on the module path as before.
from meshtf.models.moe import GATINGS  # noqa: F401
from meshtf.models.moe import SECOND_POLICIES  # noqa: F401

__all__ = _moe.__all__ + [
    "HParams", "MoE1D", "MoE2D", "set_default_moe_hparams",
    "transformer_moe_layer_v1", "transformer_moe_layer_v2"]
