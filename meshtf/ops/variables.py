"""Variables: get_variable (one tf.Variable per slice, created through the
Lowering's VariableStore), the assign family (assign, assign_add,
assign_sub, with Mesh TensorFlow's per-slice assign functions assign_slice,
assign_add_slice, assign_sub_slice) and read_variable.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> w = mtf.get_variable(mesh, "w", "io:4;hidden:8")
  >>> [v.name for v in graph.trainable_variables]
  ['w']
"""
import contextlib

import tensorflow as tf

from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.lowering import rng
from meshtf.lowering import variables as variables_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import initializers


class VariableDType(object):
  """Datatypes of a variable: master, per-processor slice, activation.

  Example:
    >>> vdt = VariableDType(master_dtype=tf.float32,
    ...                     activation_dtype=tf.bfloat16)
    >>> w = mtf.get_variable(mesh, "w", [io, hidden], dtype=vdt)  # bfloat16
  """

  def __init__(self, master_dtype=tf.float32, slice_dtype=None,
               activation_dtype=None):
    master_dtype = master_dtype or tf.float32
    self._master_dtype = tf.as_dtype(master_dtype)
    self._slice_dtype = tf.as_dtype(slice_dtype or master_dtype)
    self._activation_dtype = tf.as_dtype(activation_dtype or master_dtype)

  master_dtype = property(lambda self: self._master_dtype)
  slice_dtype = property(lambda self: self._slice_dtype)
  activation_dtype = property(lambda self: self._activation_dtype)

  def _key(self):
    return (self._master_dtype, self._slice_dtype, self._activation_dtype)

  def __eq__(self, other):
    return isinstance(other, VariableDType) and self._key() == other._key()

  def __hash__(self):
    return hash(self._key())

  def __repr__(self):
    return "VariableDType(master=%s, slice=%s, activation=%s)" % tuple(
        d.name for d in self._key())


def _split_dtype(dtype, master_dtype=None, slice_dtype=None,
                 activation_dtype=None):
  """(stored dtype, activation dtype or None) of a get_variable dtype: a
  tf.DType or a VariableDType, with Mesh TF's deprecated per-part
  overrides. meshtf stores the slice dtype (there is no master copy)."""
  if dtype is None:
    dtype = VariableDType(master_dtype, slice_dtype, activation_dtype)
  if isinstance(dtype, VariableDType):
    return dtype.slice_dtype, dtype.activation_dtype
  stored = tf.as_dtype(slice_dtype or master_dtype or dtype)
  return stored, (tf.as_dtype(activation_dtype) if activation_dtype
                  else None)


class Variable(graph_lib.Operation):
  """A variable; its output is the value at this point of the graph."""

  cost_kind = CostKind.FREE

  def __init__(self, mesh, name, shape, dtype, initializer, trainable=True,
               layout=None, **unused_kwargs):
    dtype, _ = _split_dtype(dtype)   # a VariableDType stores its slice dtype
    if layout is not None:
      from meshtf.ops import annotations
      self.layout_spec = annotations.annotation_rules(
          shapes.convert_to_shape(shape), layout,
          "get_variable %r layout" % name)
    super().__init__([], mesh=mesh, name=name)
    self._initializer = initializers.convert_initializer(initializer)
    self._trainable = trainable
    self._outputs = [graph_lib.Tensor(self, shapes.convert_to_shape(shape),
                                      dtype)]
    mesh.graph.all_variables.append(self)
    mesh.graph.variables_by_name.setdefault(self.name, self)
    if trainable:
      mesh.graph.trainable_variables.append(self)

  creates_variable_slices = True

  @property
  def layout_label(self):
    return "get_variable %r layout" % self.name

  shape = property(lambda self: self._outputs[0].shape)
  dtype = property(lambda self: self._outputs[0].dtype)
  trainable = property(lambda self: self._trainable)
  value = property(lambda self: self._outputs[0])
  # Mesh TensorFlow's VariableDType parts: meshtf stores no master copy, and
  # get_variable's activation dtype is a cast after the variable.
  slice_dtype = property(lambda self: self._outputs[0].dtype)
  master_dtype = slice_dtype
  activation_dtype = slice_dtype

  def create_slices(self, lowering):
    """The VariableEntry of this variable, creating its per-slice
    tf.Variables on first use (backends may call this before lowering)."""
    impl = lowering.mesh_impl(self)
    key = rng.op_key(self.graph.seed, self.name)
    full = self.shape.to_integer_list
    init, dtype = self._initializer, self.dtype
    entry = lowering.variable_store.get_or_create(
        self.name, self.shape, dtype, impl,
        initializers.traced_slice_fn(init, key, full, dtype),
        self._trainable)
    lowering.variables[self] = entry
    return entry

  def entry_without_slices(self, mesh_impl):
    """A VariableEntry naming this variable, with no tf.Variables (for
    tracing a per-device program without running it)."""
    return variables_lib.VariableEntry(self.name, self.shape, self.dtype,
                                       mesh_impl, None)

  def lower(self, lowering):
    # A backend may have prepared the entry already (SPMD: before tracing).
    entry = lowering.variables.get(self) or self.create_slices(lowering)
    lowering.set_tensor_lowering(self._outputs[0],
                                 lowering.mesh_impl(self).read_variable(entry))


# Custom getters (innermost last): TF1's variable_scope custom_getter for
# meshtf. Pipelining (meshtf/models/pipeline.py) uses one to stack a layer's
# variables along the stage dim without the layers knowing.
_CUSTOM_GETTERS = []


@contextlib.contextmanager
def custom_getter(getter):
  """While active, get_variable(mesh, name, shape, **kwargs) returns
  getter(base, mesh, name, shape, **kwargs), where base is get_variable as
  it would be without this getter (an outer getter, or the plain one).

  Example:
    >>> def doubled(base, mesh, name, shape, **kwargs):
    ...   return base(mesh, name, shape, **kwargs) * 2.0
    >>> with mtf.custom_getter(doubled):
    ...   w2 = mtf.get_variable(mesh, "w", "io:4")   # 2 * the variable w
  """
  _CUSTOM_GETTERS.append(getter)
  try:
    yield
  finally:
    _CUSTOM_GETTERS.remove(getter)


def _getter_chain(depth):
  """get_variable through the custom getters below `depth` (0: none)."""
  if depth == 0:
    return _plain_get_variable
  getter, base = _CUSTOM_GETTERS[depth - 1], _getter_chain(depth - 1)
  return lambda mesh, name, shape, **kwargs: getter(base, mesh, name, shape,
                                                    **kwargs)


def get_variable(mesh, name, shape, dtype=tf.float32, master_dtype=None,
                 slice_dtype=None, activation_dtype=None, initializer=None,
                 trainable=True, layout=None, **unused_kwargs):
  """Creates a variable and returns its value as a Tensor.

  The initial value depends only on (graph.seed, name, element index), so
  every layout starts from the same numbers. As in Mesh TensorFlow, a name
  the graph already has a variable for returns that variable (shape and
  dtype must match): calling a model twice in one graph -- a decoder's
  parallel first pass and its incremental steps -- shares its weights.

  layout: the variable's own stored layout ("d_model:x;d_ff:y"; dims not
  named are replicated) instead of the rules' (or the MeshLayout's
  variable_rules); computations that want it otherwise relay it when they
  read it (see meshtf/layouts/assignment.py).

  dtype: a tf.DType, or a VariableDType (stored in its slice dtype, returned
  in its activation dtype); master_dtype / slice_dtype / activation_dtype
  are Mesh TF's deprecated per-part overrides, in its argument order. Inside a tf.compat.v1.variable_scope the name is
  prefixed with the scope's, as in Mesh TensorFlow.

  Example:
    >>> w = mtf.get_variable(mesh, "w", [io, hidden],
    ...                      initializer=mtf.random_normal_initializer(stddev=0.1))
  """
  dtype, vdt_activation = _split_dtype(dtype, master_dtype, slice_dtype,
                                       activation_dtype)
  activation_dtype = activation_dtype or vdt_activation
  if _CUSTOM_GETTERS:
    return _getter_chain(len(_CUSTOM_GETTERS))(
        mesh, name, shape, dtype=dtype, initializer=initializer,
        trainable=trainable, activation_dtype=activation_dtype,
        layout=layout)
  return _plain_get_variable(mesh, name, shape, dtype, initializer,
                             trainable, activation_dtype, layout)


def _plain_get_variable(mesh, name, shape, dtype=tf.float32,
                        initializer=None, trainable=True,
                        activation_dtype=None, layout=None):
  """get_variable without custom getters (dtype already a tf.DType)."""
  scope = graph_lib.variable_scope_name()
  var = _existing_variable(mesh, scope + "/" + name if scope else name,
                           shape, dtype)
  if var is None:
    var = Variable(mesh, name, shape, dtype, initializer, trainable, layout)
  out = var.outputs[0]
  if activation_dtype is not None and tf.as_dtype(activation_dtype) != out.dtype:
    from meshtf.ops import elementwise
    out = elementwise.cast(out, activation_dtype)
  return out


def _existing_variable(mesh, name, shape, dtype):
  """The graph's Variable named `name`, or None; raises if it differs."""
  var = mesh.graph.variables_by_name.get(name)
  if var is not None:
    shape = shapes.convert_to_shape(shape)
    if var.mesh is not mesh or var.shape != shape or (
        var.dtype != tf.as_dtype(dtype)):
      raise ValueError(
          "get_variable: variable %r exists in this graph as %s %s on mesh "
          "%r; it is asked for again as %s %s on mesh %r. Reuse it with the "
          "same shape, dtype and mesh, or pick another name" % (
              name, var.shape, var.dtype.name, var.mesh.name, shape,
              tf.as_dtype(dtype).name, mesh.name))
    return var
  return None


def _variable_op(var, op_name="assign"):
  """The Variable operation behind var: a Variable, its Tensor, or (as in
  Mesh TensorFlow) the end of a chain of one-input ops starting at one, such
  as the cast that get_variable(..., activation_dtype=...) returns."""
  op = var.operation if isinstance(var, graph_lib.Tensor) else var
  while (isinstance(op, graph_lib.Operation) and not isinstance(op, Variable)
         and len(op.inputs) == 1):
    op = op.inputs[0].operation
  if not isinstance(op, Variable):
    raise TypeError("%s: %r is not a variable (pass the Tensor that "
                    "get_variable returned, or its Variable operation)"
                    % (op_name, var))
  return op


# --- assign ------------------------------------------------------------------
# Mesh TensorFlow's per-slice assign functions: assign_fn(variable, slice_var,
# value) -> TensorFlow op, called once per processor with that processor's
# slice. The three below map onto native variable updates on every backend;
# any other assign_fn is run on a stand-in slice variable (see _SliceUpdate).
def assign_slice(variable, slice_var, val):
  """Sets slice_var to val (cast to the variable's slice dtype).

  Example:
    >>> op = mtf.assign(w, new_w, assign_fn=mtf.assign_slice)
  """
  return slice_var.assign(tf.cast(val, variable.slice_dtype))


def assign_add_slice(variable, slice_var, val):
  """Adds val (cast to the variable's slice dtype) to slice_var.

  Example:
    >>> op = mtf.assign(w, delta, assign_fn=mtf.assign_add_slice)
  """
  return slice_var.assign_add(tf.cast(val, variable.slice_dtype))


def assign_sub_slice(variable, slice_var, val):
  """Subtracts val (cast to the variable's slice dtype) from slice_var.

  Example:
    >>> op = mtf.assign(w, grad * lr, assign_fn=mtf.assign_sub_slice)
  """
  return slice_var.assign_sub(tf.cast(val, variable.slice_dtype))


_NATIVE_MODES = {assign_slice: "assign", assign_add_slice: "add",
                 assign_sub_slice: "sub"}
_MODE_FNS = {mode: fn for fn, mode in _NATIVE_MODES.items()}


class _SliceUpdate(object):
  """Stands in for one processor's slice variable while a custom assign_fn
  runs: it holds the slice's current value and records what the function
  assigns (assign / assign_add / assign_sub, or tf.compat.v1.assign), so the
  update becomes an ordinary assignment through the MeshImpl interface and
  works on every backend (the SPMD program has resource handles, not
  tf.Variables)."""

  def __init__(self, current):
    self._current = current
    self.new_value = None

  dtype = property(lambda self: self._current.dtype)
  shape = property(lambda self: self._current.shape)

  def value(self):
    return self._current if self.new_value is None else self.new_value

  read_value = value

  def _set(self, value):
    self.new_value = tf.cast(value, self._current.dtype)
    return self.new_value

  def assign(self, value, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._set(value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._set(self.value() + delta)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._set(self.value() - delta)

  # Mesh TensorFlow's assign functions write tf.assign(v, v + val).
  def __add__(self, other):
    return self.value() + other

  def __radd__(self, other):
    return other + self.value()

  def __sub__(self, other):
    return self.value() - other

  def __rsub__(self, other):
    return other - self.value()

  def __mul__(self, other):
    return self.value() * other

  __rmul__ = __mul__


class AssignOperation(graph_lib.Operation):
  """Assigns new values to variables, slice by slice (Mesh TensorFlow's
  mtf.Assign). assign_fn(variable, slice_var, value) says how: assign_slice
  (set), assign_add_slice, assign_sub_slice or any function of that form.
  The strings "assign", "add" and "sub" name the first three."""

  cost_kind = CostKind.FUSIBLE

  def __init__(self, variables, new_values, assign_fn=assign_slice,
               name=None):
    self._variables = [_variable_op(v) for v in variables]
    new_values = list(new_values)
    if len(new_values) != len(self._variables):
      raise ValueError("assign: %d variables but %d values" % (
          len(self._variables), len(new_values)))
    for v, x in zip(self._variables, new_values):
      if not isinstance(x, graph_lib.Tensor):
        raise TypeError("assign to %r: the value %r is not a meshtf Tensor"
                        % (v.name, x))
      if x.shape != v.shape:
        raise ValueError("assign to %r: value %s has shape %s, variable has "
                         "shape %s" % (v.name, x.name, x.shape, v.shape))
    if isinstance(assign_fn, str):
      if assign_fn not in _MODE_FNS:
        raise ValueError("assign: mode %r is not one of %s" % (
            assign_fn, sorted(_MODE_FNS)))
      assign_fn = _MODE_FNS[assign_fn]
    if not callable(assign_fn):
      raise TypeError("assign: assign_fn %r must be a function (variable, "
                      "slice_var, value) -> op, such as mtf.assign_slice"
                      % (assign_fn,))
    super().__init__(new_values, mesh=self._variables[0].mesh,
                     name=name or "assign")
    self._assign_fn = assign_fn
    # Values are assigned in their variable's stored layout.
    self.layout_source = self._variables[0].outputs[0]

  variables = property(lambda self: list(self._variables))
  assign_fn = property(lambda self: self._assign_fn)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    mode = _NATIVE_MODES.get(self._assign_fn)
    ops = []
    for v, x in zip(self._variables, self._inputs):
      entry = lowering.variables[v]
      with impl.using_layout(entry.mesh_layout):
        ops.extend(self._assign(impl, v, entry,
                                lowering.value_in(x, entry.mesh_layout), mode))
    lowering.operations[self] = ops

  def _assign(self, impl, v, entry, value, mode):
    """The TF ops assigning laid-out `value` to variable v (entry)."""
    if mode is None:
      # A custom assign_fn: run it per slice on a _SliceUpdate holding the
      # slice's current value; what it assigns is then set natively.
      fn = self._assign_fn

      def update(current, val):
        stand_in = _SliceUpdate(current)
        fn(v, stand_in, val)
        return stand_in.value()
      value = impl.slicewise(update, impl.read_variable(entry), value)
      return impl.assign_variable(entry, value, "assign")
    if value.tensor_list[0].dtype != v.dtype:
      value = impl.slicewise(lambda t: tf.cast(t, v.dtype), value)
    return impl.assign_variable(entry, value, mode)


Assign = AssignOperation  # Mesh TensorFlow's name


def assign(var, new_val, assign_fn=assign_slice, name=None):
  """Sets var to new_val (or applies assign_fn, Mesh TensorFlow's per-slice
  function (variable, slice_var, value) -> op). Returns the Operation.

  var may be the Tensor that get_variable returned (also through a cast),
  or the Variable operation. Ops that read var before this assignment in
  the graph see the old value; read_variable(var) after it sees the new one.

  Example:
    >>> update = mtf.assign(w, w - 0.1 * grad_w)
  """
  return AssignOperation([var], [new_val], assign_fn=assign_fn, name=name)


def assign_add(var, new_val, name=None):
  """Adds new_val to var.

  Example:
    >>> step_op = mtf.assign_add(step, mtf.ones(mesh, [], tf.int64))
  """
  return AssignOperation([var], [new_val], assign_add_slice,
                         name=name or "assign_add")


def assign_sub(var, new_val, name=None):
  """Subtracts new_val from var.

  Example:
    >>> update = mtf.assign_sub(w, grad_w * 0.1)
  """
  return AssignOperation([var], [new_val], assign_sub_slice,
                         name=name or "assign_sub")


# --- read_variable -----------------------------------------------------------
class ReadVariableOperation(graph_lib.Operation):
  """The variable's value at this point of the program: after the
  assignments that come before it in the graph (a Variable's own output is
  its value when the Variable operation runs)."""

  cost_kind = CostKind.FREE

  def __init__(self, var, dtype=None, name=None):
    self._var = _variable_op(var, "read_variable")
    super().__init__([self._var.outputs[0]], name=name or "read_variable")
    self._outputs = [graph_lib.Tensor(self, self._var.shape,
                                      dtype or self._var.dtype)]

  variable = property(lambda self: self._var)
  # The value comes in the variable's stored layout.
  layout_source = property(lambda self: self._var.outputs[0])

  @property
  def has_gradient(self):
    return self._outputs[0].dtype.is_floating and self._var.dtype.is_floating

  def gradient(self, grad_ys):
    from meshtf.ops import elementwise
    dy = grad_ys[0]
    if dy.dtype != self._var.dtype:
      dy = elementwise.cast(dy, self._var.dtype)
    return [dy]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    value = impl.read_variable(lowering.variables[self._var])
    out = self._outputs[0]
    if out.dtype != self._var.dtype:
      value = impl.slicewise(lambda t: tf.cast(t, out.dtype), value)
    lowering.set_tensor_lowering(out, value)


def read_variable(var, name=None):
  """The current value of a variable, read where this op sits in the graph:
  after assignments made before it (Mesh TensorFlow's mtf.read_variable).
  var is the Variable operation or the Tensor get_variable returned; the
  result has that Tensor's dtype (the activation dtype). The gradient flows
  to the variable as through its own output.

  Example:
    >>> update = mtf.assign_add(step, one)
    >>> new_step = mtf.read_variable(step)
  """
  dtype = var.dtype if isinstance(var, graph_lib.Tensor) else None
  return ReadVariableOperation(var, dtype=dtype, name=name).outputs[0]
