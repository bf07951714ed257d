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

The face is lazy (PEP 562): `import meshtf` imports nothing else, and
`mtf.einsum` imports the module that defines it on first use. So
`import meshtf.layouts` (pure Python) and `import meshtf.plan` load no
TensorFlow, and `python -m meshtf.train` can quiet TensorFlow's start-up
before TensorFlow loads. `_FACE` below is the face: every public name, the
module it comes from, in `from module import names` order (a later entry
wins, as a later import line would).
"""
import importlib as _importlib
import importlib.util as _importlib_util

__version__ = "0.1.0"

# (module, names): `from module import names`; "*" takes the module's
# __all__; "a as b" renames.
_FACE = (
    ("meshtf.shapes",
     "Dimension, Shape, convert_to_dimension, convert_to_shape"),
    ("meshtf.layouts",
     "LayoutError, LayoutRules, MeshLayout, TensorLayout, "
     "convert_to_layout_rules"),
    ("meshtf.graph", "Graph, Mesh, Operation, Tensor, reduce_together"),
    ("meshtf.autodiff", "gradients"),
    ("meshtf.lowering",
     "Lowering, MeshFunction, MeshImpl, PlacementMeshImpl, SimdMeshImpl, "
     "TpuMeshImpl, VariableStore, WorkerInfo, gpu_devices, "
     "start_multi_worker, virtual_cpu_devices"),
    # The op families.
    ("meshtf.ops", "initializers"),
    ("meshtf.ops.annotations", "replicate, shard"),
    ("meshtf.ops.control",
     "CustomGradientOperation, WhileLoopOperation, custom_gradient, "
     "recompute_grad, while_loop"),
    ("meshtf.ops.conv",
     "ConvOperation, conv1d, conv2d, conv2d_transpose, "
     "conv2d_transpose_with_blocks, conv2d_with_blocks, conv3d, "
     "conv3d_transpose, conv3d_transpose_with_blocks, conv3d_with_blocks"),
    ("meshtf.ops.einsum", "EinsumOperation, einsum, matmul"),
    ("meshtf.ops.elementwise", "*"),
    ("meshtf.ops.elementwise",
     "BroadcastOperation, ScalarMultiplyOperation"),
    ("meshtf.ops.index",
     "OneHotOperation, RangeOperation, cumsum, gather, mtf_range, one_hot, "
     "range, scatter_add"),
    ("meshtf.ops.initializers",
     "constant_initializer, ones_initializer, random_normal_initializer, "
     "random_uniform_initializer, truncated_normal_initializer, "
     "variance_scaling_initializer, zeros_initializer"),
    ("meshtf.ops.io",
     "ImportOperation, constant, host_rows, import_fully_replicated, "
     "import_rows, import_slices, import_tf_tensor, ones, ones_like, zeros, "
     "zeros_like"),
    ("meshtf.ops.microbatch", "serialize_training_step"),
    ("meshtf.ops.passthrough",
     "DependOperation as Depend, Print, PrintOperation, depend"),
    ("meshtf.ops.pool", "avg_pool2d, avg_pool3d, max_pool2d, max_pool3d"),
    ("meshtf.ops.random", "dropout, random_normal, random_uniform"),
    ("meshtf.ops.reductions",
     "ReduceOperation, log_softmax, reduce_all, reduce_any, "
     "reduce_logsumexp, reduce_max, reduce_mean, reduce_min, reduce_sum, "
     "softmax"),
    ("meshtf.ops.shape_ops",
     "ReshapeOperation, anonymize, anonymous_shape, combined_dimension, "
     "rename_dimension, replace_dimensions, reshape, transpose"),
    ("meshtf.ops.slicewise",
     "GenericGradOperation, SlicewiseOperation, cwise, slicewise"),
    ("meshtf.ops.slicing",
     "ConcatOperation, PadOperation, ShiftOperation, SliceOperation, "
     "SplitOperation, StackOperation, UnstackOperation, concat, "
     "dynamic_shift, halo_exchange, left_halo_exchange, mtf_slice, pad, "
     "pool_tensor_1d, shift, slice, split, stack, stride_tensor_1d, unstack"),
    ("meshtf.ops.topk",
     "TopKOperation, argmax, nth_largest_element, nth_smallest_element, "
     "reduce_first, sample_with_temperature, sort, top_1, top_k"),
    ("meshtf.ops.variables",
     "Assign, Variable, assign, assign_add, assign_add_slice, assign_slice, "
     "assign_sub, assign_sub_slice, custom_getter, get_variable, "
     "read_variable"),
    # The model libraries and the plan report.
    ("meshtf.models", "decoding, optimize, pipeline, training, transformer"),
    ("meshtf.models.dtypes", "VariableDType"),
    ("meshtf", "plan"),
    ("meshtf.plan.visualize", "visualize_layout"),
    # The Mesh TensorFlow wing (meshtf/compat/): its Operation classes and
    # ops.py helpers (convert_to_layout_rules is Mesh TF's, with its rule
    # semantics), and its module paths: mtf.layers is Mesh TF's layers
    # (meshtf's + its extras), mtf.moe and mtf.transformer_layers hold Mesh
    # TF's MoE1D / MoE2D and Conv1D layers too.
    ("meshtf.compat.ops", "*"),
    ("meshtf.compat",
     "layers, moe, placement_mesh_impl, simd_mesh_impl, transformer_layers"),
)


def _parse(names):
  """[(attribute in the module, name in the face)] of an entry's names."""
  pairs = []
  for item in names.split(","):
    source, _, alias = item.strip().partition(" as ")
    pairs.append((source, alias or source))
  return pairs


def _import_name(module_name, attribute):
  """`from module_name import attribute`: the module's attribute, else its
  submodule of that name."""
  if module_name != __name__:
    module = _importlib.import_module(module_name)
    if attribute in vars(module):
      return vars(module)[attribute]
  try:
    return _importlib.import_module(module_name + "." + attribute)
  except ModuleNotFoundError as e:
    if e.name != module_name + "." + attribute:
      raise
  return getattr(_importlib.import_module(module_name), attribute)


def _star_names(module_name):
  module = _importlib.import_module(module_name)
  return module.__all__


def _resolve(name):
  """The face's `name` (the last entry naming it wins), or raises
  AttributeError."""
  for module_name, names in reversed(_FACE):
    if names == "*":
      if name in _star_names(module_name):
        return _import_name(module_name, name)
      continue
    for source, alias in _parse(names):
      if alias == name:
        return _import_name(module_name, source)
  raise AttributeError("module 'meshtf' has no attribute %r" % name)


def _load_face():
  """Imports every name of the face into this module's namespace (what
  `dir(meshtf)`, `from meshtf import *` and meshtf.compat.install() see)."""
  namespace = globals()
  for module_name, names in _FACE:
    if names == "*":
      pairs = [(n, n) for n in _star_names(module_name)]
    else:
      pairs = _parse(names)
    for source, alias in pairs:
      namespace[alias] = _import_name(module_name, source)
  namespace.setdefault("__all__", sorted(
      n for n in namespace if not n.startswith("_")))


def __getattr__(name):  # noqa: N807  (PEP 562 hook)
  if name == "__all__":
    _load_face()
    return globals()["__all__"]
  if name.startswith("__"):
    raise AttributeError("module 'meshtf' has no attribute %r" % name)
  if _importlib_util.find_spec(__name__ + "." + name) is not None:
    # A subpackage (`from meshtf import shapes`, mtf.graph): itself only.
    return _importlib.import_module(__name__ + "." + name)
  value = _resolve(name)
  globals()[name] = value
  return value


def __dir__():  # noqa: N807
  _load_face()
  return sorted(globals())
