"""Mesh shapes, layout rules and tensor layouts. Pure Python: no TensorFlow."""
from meshtf.layouts.errors import InactiveLayoutRuleWarning
from meshtf.layouts.errors import LayoutError
from meshtf.layouts.errors import UnusedLayoutRuleWarning
from meshtf.layouts.layout_rules import LayoutRules
from meshtf.layouts.layout_rules import convert_to_layout_rules
from meshtf.layouts.layout_rules import rules_on_mesh
from meshtf.layouts.layout_rules import validate_layout_rules
from meshtf.layouts.mesh_layout import DimSplit
from meshtf.layouts.mesh_layout import MeshLayout
from meshtf.layouts.relayout import RelayoutPlan
from meshtf.layouts.relayout import RelayoutStep
from meshtf.layouts.tensor_layouts import TensorLayout
from meshtf.layouts.tensor_layouts import slice_shape
from meshtf.layouts.tensor_layouts import tensor_layout
from meshtf.layouts.tensor_layouts import validate_device_count
