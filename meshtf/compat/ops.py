"""Mesh TensorFlow's ops.py names beyond meshtf's own: its Operation classes
(op_classes.py) and helpers (helpers.py). The package face star-imports
this module after the core's names, so `mtf.BinaryOpWithBroadcasting`,
`mtf.list_product`, ... exist and `mtf.convert_to_layout_rules` is Mesh
TF's (rules naming an axis the mesh lacks are inactive).

Example:
  >>> from meshtf.compat import ops
  >>> ops.list_product([2, 3, 4])
  24
"""
from meshtf.compat.op_classes import *  # noqa: F401,F403
from meshtf.compat.helpers import *  # noqa: F401,F403
from meshtf.compat import helpers as _helpers
from meshtf.compat import op_classes as _op_classes

__all__ = _op_classes.__all__ + [n for n in _helpers.__all__
                                 if n not in _op_classes.__all__]
