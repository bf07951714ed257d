"""meshtf: Mesh-TensorFlow for TensorFlow 2.

Write a model as if on one huge device with named dimensions; a layout maps
dimension names to mesh axes; a Lowering emits per-device TensorFlow with the
collectives the layout needs.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "mesh")
  >>> batch, io = mtf.Dimension("batch", 8), mtf.Dimension("io", 4)
  >>> x = mtf.ones(mesh, [batch, io])
  >>> mtf.reduce_sum(x, reduced_dim=io).shape
  Shape([batch:8])

Importing meshtf creates no devices and runs no TensorFlow op.
"""
# `python -m meshtf.train` imports this package, and so TensorFlow, before
# the binary's code runs: its quiet start (no C++ start-up lines) begins here.
from meshtf.train import startup as _startup
_startup.quiet_if_command_line()

from meshtf import placement_mesh_impl
from meshtf import simd_mesh_impl
from meshtf.autodiff import gradients
from meshtf.graph import Graph
from meshtf.graph import Mesh
from meshtf.graph import Operation
from meshtf.graph import Tensor
from meshtf.graph import reduce_together
from meshtf.layouts import LayoutError
from meshtf.layouts import LayoutRules
from meshtf.layouts import MeshLayout
from meshtf.layouts import TensorLayout
from meshtf.layouts import convert_to_layout_rules
from meshtf.lowering import Lowering
from meshtf.lowering import MeshFunction
from meshtf.lowering import MeshImpl
from meshtf.lowering import PlacementMeshImpl
from meshtf.lowering import WorkerInfo
from meshtf.lowering import start_multi_worker
from meshtf.lowering import SimdMeshImpl
from meshtf.lowering import TpuMeshImpl
from meshtf.lowering import VariableStore
from meshtf.lowering import gpu_devices
from meshtf.lowering import virtual_cpu_devices
from meshtf.ops import initializers
from meshtf.ops.conv import conv1d
from meshtf.ops.conv import conv2d
from meshtf.ops.conv import conv2d_transpose
from meshtf.ops.conv import conv2d_transpose_with_blocks
from meshtf.ops.conv import conv2d_with_blocks
from meshtf.ops.conv import conv3d
from meshtf.ops.conv import conv3d_transpose
from meshtf.ops.conv import conv3d_transpose_with_blocks
from meshtf.ops.conv import conv3d_with_blocks
from meshtf.ops.passthrough import Print
from meshtf.ops.control import custom_gradient
from meshtf.ops.passthrough import depend
from meshtf.ops.control import recompute_grad
from meshtf.ops.microbatch import serialize_training_step
from meshtf.ops.control import while_loop
from meshtf.ops.passthrough import DependOperation as Depend
from meshtf.ops.annotations import replicate
from meshtf.ops.annotations import shard
from meshtf.ops.einsum import einsum
from meshtf.ops.einsum import matmul
from meshtf.ops.elementwise import *  # noqa: F401,F403  (op names)
from meshtf.ops.initializers import constant_initializer
from meshtf.ops.initializers import ones_initializer
from meshtf.ops.initializers import random_normal_initializer
from meshtf.ops.initializers import random_uniform_initializer
from meshtf.ops.initializers import truncated_normal_initializer
from meshtf.ops.initializers import variance_scaling_initializer
from meshtf.ops.initializers import zeros_initializer
from meshtf.ops.index import cumsum
from meshtf.ops.index import gather
from meshtf.ops.index import mtf_range
from meshtf.ops.index import one_hot
from meshtf.ops.index import range  # noqa: A004  (Mesh TensorFlow's mtf.range)
from meshtf.ops.index import scatter_add
from meshtf.ops.io import constant
from meshtf.ops.io import import_fully_replicated
from meshtf.ops.io import host_rows
from meshtf.ops.io import import_rows
from meshtf.ops.io import import_slices
from meshtf.ops.io import import_tf_tensor
from meshtf.ops.io import ones
from meshtf.ops.io import ones_like
from meshtf.ops.io import zeros
from meshtf.ops.io import zeros_like
from meshtf.ops.random import dropout
from meshtf.ops.pool import avg_pool2d
from meshtf.ops.pool import avg_pool3d
from meshtf.ops.pool import max_pool2d
from meshtf.ops.pool import max_pool3d
from meshtf.ops.random import random_normal
from meshtf.ops.random import random_uniform
from meshtf.ops.reductions import log_softmax
from meshtf.ops.reductions import reduce_all
from meshtf.ops.reductions import reduce_any
from meshtf.ops.reductions import reduce_logsumexp
from meshtf.ops.reductions import reduce_max
from meshtf.ops.reductions import reduce_mean
from meshtf.ops.reductions import reduce_min
from meshtf.ops.reductions import reduce_sum
from meshtf.ops.reductions import softmax
from meshtf.ops.reductions import nth_largest_element
from meshtf.ops.reductions import nth_smallest_element
from meshtf.ops.reductions import reduce_first
from meshtf.ops.shape_ops import rename_dimension
from meshtf.ops.shape_ops import replace_dimensions
from meshtf.ops.shape_ops import reshape
from meshtf.ops.shape_ops import transpose
from meshtf.ops.shape_ops import anonymize
from meshtf.ops.shape_ops import anonymous_shape
from meshtf.ops.shape_ops import combined_dimension
from meshtf.ops.slicing import concat
from meshtf.ops.slicing import dynamic_shift
from meshtf.ops.slicing import left_halo_exchange
from meshtf.ops.slicing import halo_exchange
from meshtf.ops.slicing import mtf_slice
from meshtf.ops.slicing import pad
from meshtf.ops.slicing import pool_tensor_1d
from meshtf.ops.slicing import shift
from meshtf.ops.slicing import slice  # noqa: A004  (Mesh TensorFlow's mtf.slice)
from meshtf.ops.slicing import split
from meshtf.ops.slicing import stack
from meshtf.ops.slicing import stride_tensor_1d
from meshtf.ops.slicing import unstack
from meshtf.ops.topk import argmax
from meshtf.ops.topk import sample_with_temperature
from meshtf.ops.topk import sort
from meshtf.ops.topk import top_1
from meshtf.ops.topk import top_k
from meshtf.ops.variables import Variable
from meshtf.ops.variables import assign
from meshtf.ops.variables import assign_add
from meshtf.ops.variables import assign_sub
from meshtf.ops.variables import get_variable
from meshtf.ops.variables import custom_getter
from meshtf.ops.variables import Assign
from meshtf.ops.variables import assign_add_slice
from meshtf.ops.variables import assign_slice
from meshtf.ops.variables import assign_sub_slice
from meshtf.ops.variables import read_variable
from meshtf.ops.slicewise import GenericGradOperation
from meshtf.ops.slicewise import SlicewiseOperation
from meshtf.ops.slicewise import cwise
from meshtf.ops.slicewise import slicewise
# Mesh TensorFlow's Operation classes and ops.py helpers by their names.
from meshtf.ops.mesh_tf_names import *  # noqa: F401,F403,E402
from meshtf.ops.mesh_tf_helpers import *  # noqa: F401,F403,E402
from meshtf.ops.control import CustomGradientOperation  # noqa: E402
from meshtf.ops.index import RangeOperation  # noqa: E402
from meshtf.ops.topk import TopKOperation  # noqa: E402
from meshtf.ops.conv import ConvOperation  # noqa: E402
from meshtf.ops.einsum import EinsumOperation  # noqa: E402
from meshtf.ops.elementwise import BroadcastOperation  # noqa: E402
from meshtf.ops.elementwise import ScalarMultiplyOperation  # noqa: E402
from meshtf.ops.index import OneHotOperation  # noqa: E402
from meshtf.ops.io import ImportOperation  # noqa: E402
from meshtf.ops.passthrough import PrintOperation  # noqa: E402
from meshtf.ops.reductions import ReduceOperation  # noqa: E402
from meshtf.ops.shape_ops import ReshapeOperation  # noqa: E402
from meshtf.ops.slicing import ConcatOperation  # noqa: E402
from meshtf.ops.slicing import PadOperation  # noqa: E402
from meshtf.ops.slicing import ShiftOperation  # noqa: E402
from meshtf.ops.slicing import SliceOperation  # noqa: E402
from meshtf.ops.slicing import SplitOperation  # noqa: E402
from meshtf.ops.slicing import StackOperation  # noqa: E402
from meshtf.ops.slicing import UnstackOperation  # noqa: E402
from meshtf.ops.control import WhileLoopOperation  # noqa: E402
from meshtf.shapes import Dimension
from meshtf.shapes import Shape
from meshtf.shapes import convert_to_dimension
from meshtf.shapes import convert_to_shape

# Model libraries last: they build on the ops above (mtf.relu, ...).
from meshtf.models import layers  # noqa: E402
from meshtf.models import optimize  # noqa: E402
from meshtf.models.dtypes import VariableDType  # noqa: E402
from meshtf.models import decoding  # noqa: E402
from meshtf.models import moe  # noqa: E402
from meshtf.models import training  # noqa: E402
from meshtf.models import pipeline  # noqa: E402
from meshtf.models import transformer  # noqa: E402
from meshtf.models import transformer_layers  # noqa: E402
# The plan report: what a layout needs before running it.
from meshtf import plan  # noqa: E402
from meshtf.plan.visualize import visualize_layout  # noqa: E402

__version__ = "0.1.0"
