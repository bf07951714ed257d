"""einsum and matmul: local einsum on slices, then an allreduce over the mesh
axes of the reduced dimensions (deferred as a pending sum).

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;io:3"); w = mtf.ones(mesh, "io:3;hidden:5")
  >>> mtf.einsum([x, w], output_shape="batch:4;hidden:5").shape
  Shape([batch:4, hidden:5])
"""
from meshtf import graph as graph_lib
from meshtf import shapes
from meshtf.layouts import errors
from meshtf.lowering import pending as pending_lib
from meshtf.op_kinds import CostKind
from meshtf.ops import _local


class EinsumOperation(graph_lib.Operation):
  """Multiply inputs elementwise (broadcast by name), sum out the dims that
  are not in output_shape."""

  # Its contracted dims' splits leave partial sums; with two operands or
  # more it is a matrix product (one operand: a reduction, fused with its
  # producers).
  sums_partials = True
  matrix_unit = True
  cost_kind = property(lambda self: CostKind.REDUCING if len(
      self._inputs) == 1 else CostKind.KERNEL)

  def __init__(self, inputs, output_shape, name=None):
    inputs = list(inputs)
    if not inputs:
      raise ValueError("einsum needs at least one input")
    dtypes = {x.dtype for x in inputs}
    if len(dtypes) > 1:
      raise TypeError("einsum inputs differ in dtype: %s" %
                      [(x.name, x.dtype.name) for x in inputs])
    super().__init__(inputs, name=name or "einsum")
    self._all_dims = _local.union_shape([x.shape for x in inputs])
    output_shape = shapes.convert_to_shape(output_shape)
    sizes = {d.name: d.size for d in self._all_dims.dims}
    for d in output_shape.dims:
      if d.name in sizes and sizes[d.name] != d.size:
        raise ValueError(
            "einsum output dimension %s:%d has size %d in the inputs (%s): "
            "dims that share a name have one size; write %s:%d in "
            "output_shape, or give the new dim another name" % (
                d.name, d.size, sizes[d.name], ", ".join(
                    "%s %s" % (x.name, x.shape) for x in inputs
                    if x.shape.has_dim_name(d.name)), d.name,
                sizes[d.name]))
      if d not in self._all_dims.dims:
        raise ValueError(
            "einsum output dimension %s:%d is not a dimension of any input "
            "(inputs have %s); broadcast afterwards with mtf.broadcast"
            % (d.name, d.size, self._all_dims))
    self._outputs = [graph_lib.Tensor(self, output_shape, inputs[0].dtype)]

  def layout_dim_groups(self):
    return [self._all_dims.dimension_names]

  def flops(self, layout, tile=0):
    """k operands: k x the product of every dim's local size (a matmul:
    2 M N K). With a matrix unit's tile T (TPU MXU: 128), a two-operand
    einsum's contracted size and the free size of the operand that stays
    in the unit are padded to multiples of T, in the cheaper orientation.

    Example:
      >>> op = mtf.einsum([x, w], output_shape=[batch, hidden]).operation
      >>> op.flops(mesh_layout), op.flops(mesh_layout, tile=128)
    """
    if not tile:
      return max(len(self._inputs), 1) * layout.slice_size(self._all_dims)
    x, y = self._inputs[0].shape, self._inputs[1].shape
    out = set(self._outputs[0].shape.dimension_names)
    xs, ys = set(x.dimension_names), set(y.dimension_names)
    size = {d.name: layout.slice_size(shapes.Shape([d]))
            for d in self._all_dims.dims}
    def prod(names):
      return shapes.prod(size[n] for n in names)
    def padded(n):
      return -(-n // tile) * tile
    batch = prod(n for n in size if n in xs and n in ys and n in out)
    k = prod(n for n in size if n not in out)
    m = prod(n for n in size if n in xs and n not in ys and n in out)
    n_ = prod(n for n in size if n in ys and n not in xs and n in out)
    return 2 * batch * padded(k) * min(m * padded(n_), padded(m) * n_)

  def validate_layout(self, mesh_layout):
    """All dims of one einsum must split over distinct mesh axes, or the
    partial results of different output stripes would be summed together."""
    try:
      mesh_layout.tensor_layout(self._all_dims)
    except errors.LayoutError as e:
      raise errors.LayoutError(
          "einsum %r over all of its dims %s: %s" % (self.name,
                                                     self._all_dims, e))

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    grads = []
    for i, x in enumerate(self._inputs):
      others = self._inputs[:i] + self._inputs[i + 1:]
      present = set(dy.shape.dimension_names)
      for o in others:
        present.update(o.shape.dimension_names)
      kept = shapes.Shape([d for d in x.shape.dims if d.name in present])
      g = einsum([dy] + others, output_shape=kept)
      if kept != x.shape:
        from meshtf.ops import elementwise
        g = elementwise.broadcast(g, x.shape)
      grads.append(g)
    return grads

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self._outputs[0]
    fn = _local.einsum_fn([x.shape for x in self._inputs], out.shape)
    # Contracted dims split unevenly: zero the padding of every operand that
    # has them (padding may hold anything, NaN included).
    contracted = [d.name for d in self._all_dims.dims
                  if d.name not in out.shape.dimension_names]
    operands = [impl.mask_padding(lowering.tensors[x], x.shape, 0, contracted)
                for x in self._inputs]
    local = impl.slicewise(fn, *operands)
    reduced = impl.reduced_mesh_axes(self._all_dims, out.shape)
    if reduced:
      local = pending_lib.PendingSum(impl, local, reduced)
    lowering.set_tensor_lowering(out, local)


def einsum(xs, output_shape=None, reduced_dims=None, name=None):
  """Einstein summation over named dimensions.

  Give output_shape, or reduced_dims (then the output keeps every other
  dim, in first-seen order), or neither (dims that appear in exactly one
  input are kept).

  Example:
    >>> h = mtf.einsum([x, w], output_shape=[batch, hidden])
  """
  xs = list(xs)
  if output_shape is None:
    all_dims = _local.union_shape([x.shape for x in xs])
    if reduced_dims is not None:
      names = {d if isinstance(d, str) else
               shapes.convert_to_dimension(d).name for d in reduced_dims}
      output_shape = shapes.Shape([d for d in all_dims.dims
                                   if d.name not in names])
    else:
      counts = {}
      for x in xs:
        for d in x.shape.dims:
          counts[d.name] = counts.get(d.name, 0) + 1
      output_shape = shapes.Shape([d for d in all_dims.dims
                                   if counts[d.name] == 1])
  return EinsumOperation(xs, output_shape, name=name).outputs[0]


def matmul(a, b, output_shape=None, reduced_dims=None, name=None):
  """einsum([a, b], ...): contracts the dims a and b share by default.

  Example:
    >>> y = mtf.matmul(h, v)
  """
  return einsum([a, b], output_shape=output_shape, reduced_dims=reduced_dims,
                name=name)
