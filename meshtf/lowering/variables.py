"""VariableStore: the per-slice tf.Variables of a model, kept across steps.

Lowering a graph looks each meshtf variable up by name and creates its slices
on first use (eagerly, via tf.init_scope, so it also works while a
tf.function traces). Pass the same store to every Lowering of a training
loop and the variables persist.

Example:
  >>> import meshtf as mtf
  >>> store = mtf.VariableStore()
  >>> len(store)
  0
"""
import numpy as np
import tensorflow as tf


class VariableEntry(object):
  """The slices of one meshtf variable on one mesh implementation, laid out
  by mesh_layout (the impl's, or the variable's own layout)."""

  def __init__(self, name, shape, dtype, mesh_impl, slices, mesh_layout=None):
    self.name = name
    self.shape = shape
    self.dtype = dtype
    self.mesh_impl = mesh_impl
    self.slices = slices
    self.mesh_layout = mesh_layout or mesh_impl.mesh_layout

  def full_value(self):
    """The full variable as a tf.Tensor (gathers the slices)."""
    return self.mesh_impl.variable_full_value(self)


class VariableStore(object):
  """Maps variable names to their per-slice tf.Variables."""

  def __init__(self):
    self._entries = {}
    self._pending_values = {}  # restored values of not-yet-created variables
    self._pending_sources = {}  # the same, read slice by slice when created

  def __len__(self):
    return len(self._entries)

  def __contains__(self, name):
    return name in self._entries

  def names(self):
    return sorted(self._entries)

  def entry(self, name):
    if name not in self._entries:
      raise KeyError("No variable %r in this store; it has %s" %
                     (name, self.names()))
    return self._entries[name]

  def get_or_create(self, name, shape, dtype, mesh_impl, slice_init_fn,
                    trainable=True):
    """Returns the entry for `name`, creating its slices if needed."""
    entry = self._entries.get(name)
    if entry is not None:
      if entry.shape != shape or entry.dtype != dtype:
        raise ValueError(
            "Variable %r exists in the store with shape %s and dtype %s, but "
            "the graph asks for shape %s and dtype %s; use a new name or a "
            "new VariableStore" % (name, entry.shape, entry.dtype.name, shape,
                                   dtype.name))
      if entry.mesh_impl is not mesh_impl:
        raise ValueError(
            "Variable %r was created for %r and is now lowered with %r; a "
            "store serves one mesh implementation (save and restore to move "
            "between layouts)" % (name, entry.mesh_impl, mesh_impl))
      had = entry.mesh_layout.tensor_layout(shape)
      wants = mesh_impl.mesh_layout.tensor_layout(shape)
      if had != wants:
        raise ValueError(
            "Variable %r is stored with layout %s and is now asked for with "
            "layout %s; a store keeps one layout per variable (save and "
            "restore to change it)" % (name, had, wants))
      return entry
    if name in self._pending_values:
      value = self._pending_values.pop(name)
      _check_restored(name, value, shape, dtype)
      slice_init_fn = _slicer(value, dtype)
    elif name in self._pending_sources:
      slice_init_fn = _from_source(self._pending_sources.pop(name), dtype)
    with tf.init_scope():
      slices = mesh_impl.make_variable_slices(name, shape, dtype,
                                              slice_init_fn, trainable)
    entry = VariableEntry(name, shape, dtype, mesh_impl, slices,
                          mesh_impl.mesh_layout)
    self._entries[name] = entry
    return entry

  def full_value(self, name):
    """The full value of variable `name` as a numpy array."""
    with tf.init_scope():
      return np.asarray(self.entry(name).full_value())

  def entries(self):
    """All VariableEntries, sorted by name."""
    return [self._entries[n] for n in self.names()]

  def full_values(self):
    """{name: full value as a tf.Tensor} of every variable, gathered by one
    program per mesh implementation (in a multi-worker mesh every worker
    must call it, at the same point).

    Example:
      >>> sorted(store.full_values())
      ['w']
    """
    groups = {}
    for entry in self.entries():
      groups.setdefault(id(entry.mesh_impl), []).append(entry)
    values = {}
    for group in groups.values():
      with tf.init_scope():
        full = group[0].mesh_impl.variable_full_values(group)
      values.update((e.name, v) for e, v in zip(group, full))
    return values

  def restore_values(self, values):
    """Sets variables from full values {name: numpy array}, whatever mesh
    or layout saved them: existing variables are assigned slice by slice
    now; the others take their value when first created (instead of their
    initializer). Shapes and dtypes must match the graph's.

    Example:
      >>> store.restore_values({"w": np.zeros([4, 8], np.float32)})
    """
    for name, value in sorted(values.items()):
      entry = self._entries.get(name)
      if entry is None:
        self._pending_values[name] = value
        continue
      _check_restored(name, value, entry.shape.to_integer_list, entry.dtype)
      layout = entry.mesh_layout
      with tf.init_scope():
        sizes = layout.slice_shape(entry.shape)
        for p in entry.mesh_impl.local_pnums():
          part = padded_part(value, layout.slice_begin(entry.shape, p), sizes)
          entry.slices[p].assign(tf.constant(part, entry.dtype))

  def restore_sources(self, sources):
    """Sets variables from slice sources {name: fn(begin, sizes) -> numpy
    array of sizes in the variable's dtype} (a checkpoint read slice by
    slice: each processor's slice is read when it is created, so a host
    reads only what its processors hold; see
    meshtf/train/mesh_tf_checkpoint.SliceSource). Existing variables read
    their local slices now.

    Example:
      >>> store.restore_sources({"w": lambda begin, sizes: np.zeros(sizes)})
    """
    for name, source in sorted(sources.items()):
      entry = self._entries.get(name)
      if entry is None:
        self._pending_sources[name] = source
        continue
      layout = entry.mesh_layout
      with tf.init_scope():
        sizes = layout.slice_shape(entry.shape)
        for p in entry.mesh_impl.local_pnums():
          part = source(layout.slice_begin(entry.shape, p), sizes)
          entry.slices[p].assign(tf.constant(part, entry.dtype))

  def unrestored_names(self):
    """Restored values that no created variable has used yet."""
    return sorted(set(self._pending_values) | set(self._pending_sources))


def _check_restored(name, value, shape, dtype):
  shape = list(shape.to_integer_list if hasattr(shape, "to_integer_list")
               else shape)
  if list(np.shape(value)) != shape:
    raise ValueError(
        "Restored value of variable %r has shape %s but the model's variable "
        "has shape %s; the checkpoint comes from a different model config "
        "(restore it into the model that saved it, or start a new model_dir)"
        % (name, list(np.shape(value)), shape))
  if np.asarray(value).dtype != tf.as_dtype(dtype).as_numpy_dtype:
    raise ValueError(
        "Restored value of variable %r has dtype %s but the model's variable "
        "is %s" % (name, np.asarray(value).dtype, tf.as_dtype(dtype).name))


def padded_part(value, begin, sizes):
  """value[begin:begin + sizes] of a full numpy value, zero-padded at the
  end where the slice of an uneven split reaches past it.

  Example:
    >>> padded_part(np.arange(5), [3], [3])
    array([3, 4, 0])
  """
  part = np.asarray(value)[tuple(slice(b, b + n)
                                 for b, n in zip(begin, sizes))]
  if list(part.shape) != list(sizes):
    part = np.pad(part, [(0, n - k) for n, k in zip(sizes, part.shape)])
  return part


def _from_source(source, dtype):
  """slice_init_fn of a slice source (restore_sources)."""
  def fn(begin, sizes):
    return tf.constant(source(begin, sizes), dtype)
  fn.traced = True
  return fn


def _slicer(value, dtype):
  """slice_init_fn that cuts a restored full value (numpy) per slice."""
  def fn(begin, sizes):
    begin = [int(b) for b in np.asarray(begin)]
    return tf.constant(padded_part(value, begin, sizes), dtype)
  fn.traced = True  # plain eager slicing: no tf.function needed
  return fn
