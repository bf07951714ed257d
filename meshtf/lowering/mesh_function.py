"""MeshFunction: build and lower a meshtf graph once, run it many times.

The build function runs inside a tf.function trace: it builds a fresh meshtf
graph from the (symbolic) inputs, the graph is lowered, and the exported
outputs become the function's results. Variables live in a VariableStore
that outlives the traces, so assignments persist from call to call. Retracing
happens only when input shapes/dtypes change.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> impl = mtf.PlacementMeshImpl("all:1", "", ["/cpu:0"])
  >>> def build(mesh, x):
  ...   w = mtf.get_variable(mesh, "w", "io:2", initializer=mtf.ones_initializer())
  ...   x = mtf.import_tf_tensor(mesh, x, "io:2")
  ...   loss = mtf.reduce_sum(x * w)
  ...   g, = mtf.gradients([loss], [w])
  ...   mtf.assign_sub(w, 0.5 * g)
  ...   return loss
  >>> step = mtf.MeshFunction(build, impl)
  >>> [float(step(tf.ones([2]))) for _ in range(2)]
  [2.0, 1.0]
"""
import contextlib

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf.lowering import grappler as grappler_lib
from meshtf.lowering import lowering as lowering_lib
from meshtf.lowering import program_options as program_options_lib
from meshtf.lowering import simd
from meshtf.lowering import variables as variables_lib


class MeshFunction(object):
  """Callable running build_fn's graph lowered on mesh_impl.

  Args:
    build_fn: build_fn(mesh, *tf_inputs) -> a nest (Tensor, list, tuple or
      dict) of meshtf Tensors to export. Assign ops it creates are run.
    mesh_impl: the MeshImpl (mesh shape, layout, devices) to lower onto.
    variable_store: where variables live; a new VariableStore by default.
    seed: the graph seed for layout-invariant initializers and random ops.
    use_tf_function: False runs eagerly on every call (for debugging).
    bucket_bytes: cap of a fused gradient-allreduce bucket (Lowering's;
      None: 1 MiB, 0: off).
    communication_hint, jit_compile, grappler: the SPMD backend's program
      options for this function's traces and calls (see SimdMeshImpl);
      None: the impl's.
    options: the three as one checked ProgramOptions, instead of the
      keywords.
  """

  def __init__(self, build_fn, mesh_impl, variable_store=None, seed=0,
               use_tf_function=True, mesh_name="mesh", bucket_bytes=None,
               communication_hint=None, jit_compile=None, grappler=None,
               options=None):
    self._bucket_bytes = lowering_lib.bucketing.check_bucket_bytes(
        bucket_bytes)
    if options is None:
      options = program_options_lib.ProgramOptions.checked(
          "MeshFunction", communication_hint, jit_compile, grappler)
    self._program_options = options
    if options.given and not mesh_impl.is_spmd:
      raise ValueError(
          "MeshFunction: communication_hint / jit_compile / grappler are "
          "options of the SPMD backend, but the mesh impl is a %s: use "
          "mtf.SimdMeshImpl or leave them None" % type(mesh_impl).__name__)
    self._build_fn = build_fn
    self._mesh_impl = mesh_impl
    self._seed = seed
    self._mesh_name = mesh_name
    self.variable_store = (variable_store if variable_store is not None
                           else variables_lib.VariableStore())
    self.lowering = None
    self.graph = None
    # autograph off: build_fn is plain Python, and errors (LayoutError)
    # surface with their own type instead of a StagingError.
    self._fn = (tf.function(self._run, autograph=False) if use_tf_function
                else self._run)

  def _run(self, *tf_inputs):
    graph = graph_lib.Graph(seed=self._seed)
    mesh = graph_lib.Mesh(graph, self._mesh_name)
    outputs = self._build_fn(mesh, *tf_inputs)
    options = (self._mesh_impl.program_options(
        options=self._program_options)
               if self._mesh_impl.is_spmd
               else contextlib.nullcontext())
    with options:
      lowering = lowering_lib.Lowering(graph, {mesh: self._mesh_impl},
                                       variable_store=self.variable_store,
                                       outputs=tf.nest.flatten(outputs),
                                       bucket_bytes=self._bucket_bytes)
    result = tf.nest.map_structure(lowering.export_to_tf_tensor, outputs)
    self.graph, self.lowering = graph, lowering
    return result

  # The first run of a traced step also instantiates it (TensorFlow places
  # and optimizes every device's program): minutes for a large model on a
  # loaded host, which the collectives' deadline must not mistake for a
  # lost peer.
  FIRST_RUN_ALLOWANCE = 4.0

  def _call_options(self):
    """The impl's call options (its Grappler mode) under this function's
    program options."""
    if not self._mesh_impl.is_spmd:
      return contextlib.nullcontext()
    with self._mesh_impl.program_options(
        options=self._program_options) as impl:
      return grappler_lib.call_options(impl.grappler)

  def __call__(self, *tf_inputs):
    with self._call_options():
      return self._call(*tf_inputs)

  def _call(self, *tf_inputs):
    watchdog = getattr(self._mesh_impl, "collective_watchdog", None)
    if watchdog is None:
      return self._fn(*tf_inputs)
    allowance = 1.0
    if self.lowering is None and hasattr(self._fn,
                                         "get_concrete_function"):
      # Traced outside the deadline: tracing runs no collective.
      self._fn.get_concrete_function(*tf_inputs)
      allowance = self.FIRST_RUN_ALLOWANCE
    with watchdog(allowance) as watch:
      try:
        return self._fn(*tf_inputs)
      except (tf.errors.DeadlineExceededError, tf.errors.CancelledError) as e:
        if watch["fired"]:
          raise simd.explain_timeout(e, self._mesh_impl) from e
        raise

  def collective_stats(self):
    """Collectives of the most recent trace (see Lowering.collective_stats)."""
    if self.lowering is None:
      raise ValueError("call the MeshFunction once before asking for stats")
    return self.lowering.collective_stats()

  def variable_value(self, name):
    """Full value of a variable as a numpy array."""
    return self.variable_store.full_value(name)
