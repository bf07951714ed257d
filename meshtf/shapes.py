"""Named dimensions and shapes (pure Python, no TensorFlow).

A `Dimension` is a (name, size) pair; a `Shape` is an ordered tuple of
dimensions with unique names. Mesh shapes are Shapes too: "rows:2;cols:4".

Example:
  >>> s = convert_to_shape("batch:8;hidden:16")
  >>> s.dims[1]
  Dimension(name='hidden', size=16)
  >>> s.size
  128
"""
import collections
import operator
import re


# What shape strings ("rows:2;cols:4") and layout strings ("batch:rows")
# split at: not allowed in a dimension name.
_NAME_SEPARATOR = re.compile(r"[:;,.\s]")


class Dimension(collections.namedtuple("Dimension", ["name", "size"])):
  """A named tensor dimension: (name, size), checked when it is made.

  The name is a non-empty string without the separators of shape and
  layout strings (':', ';', ',', '.', spaces); the size an integer >= 0.
  Size 0 is legal, as in TensorFlow (an empty tensor: reductions over it
  give their identity, a split of it gives every processor an empty slice);
  a negative size, a bool, a float or None is refused here with the
  dimension named, not deep inside a lowering.

  Example:
    >>> Dimension("batch", 8)
    Dimension(name='batch', size=8)
    >>> Dimension("batch", -4)
    Traceback (most recent call last):
    ValueError: Dimension 'batch' has size -4: a size is an integer >= 0 ...
  """
  __slots__ = ()

  def __new__(cls, name, size):
    if not isinstance(name, str) or not name:
      raise ValueError(
          "Dimension name %r (size %r) must be a non-empty string, e.g. "
          "mtf.Dimension('batch', 8)" % (name, size))
    bad = _NAME_SEPARATOR.search(name)
    if bad:
      # Accepted, such a name could not be written in a shape or layout
      # string ("bat:ch:rows" does not parse).
      raise ValueError(
          "Dimension name %r contains %r, which shape and layout strings "
          "use as a separator ('batch:8;hidden:16', 'batch:rows'): a rule or"
          " shape naming it could not be parsed; use letters, digits, '_' "
          "or '-', e.g. mtf.Dimension(%r, %r)" % (
              name, bad.group(0), _NAME_SEPARATOR.sub("_", name), size))
    if isinstance(size, bool):
      raise ValueError("Dimension %r has size %r: a size is an integer >= 0,"
                       " not a bool" % (name, size))
    try:
      size = operator.index(size)   # int and numpy integers, not floats
    except TypeError:
      raise ValueError(
          "Dimension %r has size %r (%s): a size is an integer >= 0, e.g. "
          "mtf.Dimension(%r, 8)" % (name, size, type(size).__name__, name)
      ) from None
    if size < 0:
      raise ValueError(
          "Dimension %r has negative size %d: a size is an integer >= 0 "
          "(0 is an empty dimension), e.g. mtf.Dimension(%r, %d)" % (
              name, size, name, -size))
    return super().__new__(cls, name, size)


def convert_to_dimension(d):
  """Converts a Dimension, (name, size) pair or None to a Dimension.

  Example:
    >>> convert_to_dimension(("io", 32))
    Dimension(name='io', size=32)
  """
  if d is None:
    return None
  if isinstance(d, Dimension):
    return d   # checked when it was made
  try:
    name, size = d
  except TypeError:   # Mesh TF raises TypeError for a non-pair (e.g. 5)
    raise TypeError("Bad dimension %r: expected a Dimension or a (str name, "
                    "int size) pair" % (d,)) from None
  except ValueError:
    raise ValueError("Bad dimension %r: expected a Dimension or a (str name, "
                     "int size) pair" % (d,)) from None
  if isinstance(size, str) and re.fullmatch(r"\s*\d+\s*", size):
    size = int(size)
  return Dimension(name, size)


def prod(values):
  """The product of integers (1 for none): element counts, processors.

  Example:
    >>> prod([2, 3, 4]), prod([])
    (24, 1)
  """
  out = 1
  for v in values:
    out *= v
  return out


class Shape(object):
  """An ordered tuple of Dimensions with unique names.

  Example:
    >>> Shape([Dimension("a", 2), Dimension("b", 3)]).to_integer_list
    [2, 3]
  """

  def __init__(self, dims):
    self._dims = [convert_to_dimension(d) for d in tuple(dims)]
    names = [d.name for d in self._dims]
    if len(set(names)) != len(names):
      dup = sorted({n for n in names if names.count(n) > 1})
      raise ValueError(
          "Shape %s repeats dimension name(s) %s: every dimension of a "
          "tensor needs its own name" % (self._repr_dims(), dup))

  def _repr_dims(self):
    return "[" + ", ".join("%s:%d" % (d.name, d.size) for d in self._dims) + "]"

  def __repr__(self):
    return "Shape(%s)" % self._repr_dims()

  def __str__(self):
    return self._repr_dims()

  def __eq__(self, other):
    if isinstance(other, Shape):   # the common case, kept fast: layouts
      return self._dims == other._dims   # cache by shape
    try:
      other = convert_to_shape(other)
    except (ValueError, TypeError):
      return False
    return self._dims == other.dims

  def __ne__(self, other):
    return not self.__eq__(other)

  def __hash__(self):
    # A Shape never changes: hash it once.
    h = getattr(self, "_hash", None)
    if h is None:
      h = self._hash = hash(tuple(self._dims))
    return h

  def __add__(self, other):
    """Concatenation; dims of `other` already in self are skipped."""
    other = convert_to_shape(other)
    return Shape(self._dims + [d for d in other.dims if d not in self._dims])

  def __sub__(self, other):
    """Removes dims (or dim names) of `other` from self."""
    if isinstance(other, (Dimension, str)):
      other = [other]
    names = {d if isinstance(d, str) else convert_to_dimension(d).name
             for d in (other.dims if isinstance(other, Shape) else other)}
    return Shape([d for d in self._dims if d.name not in names])

  def __len__(self):
    return len(self._dims)

  def __getitem__(self, key):
    return self._dims[key]

  def __iter__(self):
    return iter(self._dims)

  @property
  def dims(self):
    return list(self._dims)

  @property
  def ndims(self):
    return len(self._dims)

  @property
  def dimension_names(self):
    return [d.name for d in self._dims]

  @property
  def to_integer_list(self):
    return [d.size for d in self._dims]

  @property
  def size(self):
    return prod(d.size for d in self._dims)

  def group_size(self, axes):
    """Of a mesh shape: the processors in one group along mesh `axes`
    (indices or names), the product of their sizes.

    Example:
      >>> mesh = convert_to_shape("rows:2;cols:4")
      >>> mesh.group_size([0, 1]), mesh.group_size(["cols"])
      (8, 4)
    """
    return prod(self.get_dim_by_name(a).size if isinstance(a, str)
                else self._dims[a].size for a in axes)

  def cumprod_to_tensor_axis(self, axis):
    return prod(d.size for d in self._dims[:axis])

  def get_dim_by_name(self, name):
    for d in self._dims:
      if d.name == name:
        return d
    raise ValueError("Shape %s has no dimension named %r" % (self, name))

  def has_dim_name(self, name):
    return name in self.dimension_names

  def cumprod(self):
    """Exclusive cumulative products of sizes (strides of the leading axes)."""
    out, acc = [], 1
    for d in self._dims:
      out.append(acc)
      acc *= d.size
    return out

  def is_subshape_of(self, other):
    other_dims = set(convert_to_shape(other).dims)
    return all(d in other_dims for d in self._dims)

  def is_compatible_with(self, other):
    """True if no dimension name appears in both with different sizes."""
    other_sizes = {d.name: d.size for d in convert_to_shape(other).dims}
    return all(other_sizes.get(d.name, d.size) == d.size for d in self._dims)

  def rename_dimension(self, old_name, new_name):
    return Shape([Dimension(new_name, d.size) if d.name == old_name else d
                  for d in self._dims])

  def resize_dimension(self, name, new_size):
    return Shape([Dimension(name, new_size) if d.name == name else d
                  for d in self._dims])

  def dims_to_index(self):
    return {d.name: i for i, d in enumerate(self._dims)}


_SHAPE_SPLIT = re.compile(r"[;,.\s]+")


def convert_to_shape(x):
  """Converts a Shape, list of Dimensions/pairs, or string to a Shape.

  Strings list name:size pairs separated by ';', ',', '.' or spaces.

  Example:
    >>> convert_to_shape("x:4 y:8") == convert_to_shape([("x", 4), ("y", 8)])
    True
  """
  if x is None:
    return None
  if isinstance(x, Shape):
    return x
  if isinstance(x, str):
    text = x.strip()
    if not text:
      return Shape([])
    dims = []
    for item in _SHAPE_SPLIT.split(text):
      if not item:
        continue
      parts = item.split(":")
      if len(parts) != 2 or not parts[0] or not re.fullmatch(r"\d+", parts[1]):
        # '.' separates pairs too, so "rows:2.5" reads as "rows:2" and
        # "5": name the whole pair instead of the "5".
        decimal = re.search(r"([^\s;,.:]+):\s*(\d*\.\d+)", text)
        if decimal:
          name, size = decimal.groups()
          raise ValueError(
              "Cannot parse %r in shape string %r: dimension %r has size %s,"
              " but a size is a whole number, e.g. '%s:%d'" % (
                  decimal.group(0), x, name, size, name,
                  max(1, int(float(size)))))
        raise ValueError(
            "Cannot parse %r in shape string %r: write name:size pairs such "
            "as 'rows:2;cols:4'" % (item, x))
      dims.append(Dimension(parts[0], int(parts[1])))
    return Shape(dims)
  if isinstance(x, Dimension):
    return Shape([x])
  return Shape(x)
