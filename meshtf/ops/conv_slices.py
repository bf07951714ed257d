"""Per-slice TensorFlow code of the convolution ops (meshtf/ops/conv.py):
batch flattening, TF's conv / input-gradient / filter-gradient calls, and
the halo exchange of laid-out tensors along a split spatial dim (collective
permutes through the MeshImpl, and its adjoint for the input gradient).

Example:
  >>> t, sizes = flatten_batch(tf.zeros([2, 3, 8, 4]), 2)   # [6, 8, 4]
"""
import tensorflow as tf

from meshtf import shapes


# --- per-slice TensorFlow code -----------------------------------------------
def flatten_batch(t, nb):
  """[batch..., rest...] -> [prod(batch), rest...] (a new size-1 batch axis
  when nb == 0); returns the tensor and the batch sizes."""
  shape = t.shape.as_list()
  if nb == 1:
    return t, shape[:1]
  return tf.reshape(t, [shapes.prod(shape[:nb])] + shape[nb:]), shape[:nb]


def restore_batch(t, batch_sizes):
  if len(batch_sizes) == 1:
    return t
  return tf.reshape(t, list(batch_sizes) + t.shape.as_list()[1:])


def tf_conv(x, f, strides):
  return tf.nn.convolution(x, f, strides=list(strides), padding="VALID")


def tf_input_grad(dy, f, x_sizes, strides):
  return tf.nn.conv_transpose(dy, f, output_shape=list(x_sizes),
                              strides=list(strides), padding="VALID")


def tf_filter_grad(x, dy, f_sizes, strides):
  nd = len(strides)
  f_sizes = list(f_sizes)
  if nd == 1:  # as a 2D conv with a height of 1
    x, dy = x[:, None], dy[:, None]
    f_sizes, strides = [1] + f_sizes, (1,) + tuple(strides)
  grad = (tf.raw_ops.Conv2DBackpropFilter if len(strides) == 2 else
          tf.raw_ops.Conv3DBackpropFilterV2)
  df = grad(input=x, filter_sizes=f_sizes, out_backprop=dy,
            strides=[1] + list(strides) + [1], padding="VALID")
  return df[0] if nd == 1 else df


def _pad_axis(t, axis, lo, hi):
  spec = [[0, 0]] * t.shape.rank
  spec[axis] = [lo, hi]
  return tf.pad(t, spec)


def _take(t, axis, begin, size):
  index = [slice(None)] * t.shape.rank
  index[axis] = slice(begin, begin + size)
  return t[tuple(index)]


# --- halo exchange on laid-out tensors ---------------------------------------
def _halo_pieces(stripe, lo, hi):
  """The pieces of a stripe extended by lo positions before and hi after,
  in order: (offset, begin, size) = positions [begin, begin + size) of the
  stripe of the processor `offset` places before (negative: after)."""
  pieces = []
  q, r = divmod(lo, stripe)
  if r:
    pieces.append((q + 1, stripe - r, r))
  pieces.extend((d, 0, stripe) for d in range(q, 0, -1))
  pieces.append((0, 0, stripe))
  q, r = divmod(hi, stripe)
  pieces.extend((-d, 0, stripe) for d in range(1, q + 1))
  if r:
    pieces.append((-(q + 1), 0, r))
  return pieces


def halo_extend(impl, t, axis, mesh_axis, stripe, lo, hi):
  """Laid-out t with each stripe of tensor axis `axis` extended by the lo
  positions before it and the hi after it: zeros past the ends, and from
  the neighbouring processors along mesh_axis where it is split (one
  collective permute per piece; each sender slices its piece first)."""
  if lo == 0 and hi == 0:
    return t
  if mesh_axis is None:
    return impl.slicewise(lambda s: _pad_axis(s, axis, lo, hi), t)
  parts = []
  for offset, begin, size in _halo_pieces(stripe, lo, hi):
    piece = t if size == stripe else impl.slicewise(
        lambda s, b=begin, n=size: _take(s, axis, b, n), t)
    if offset:
      piece = impl.shift_by_n_processors(piece, mesh_axis, offset, False)
    parts.append(piece)
  return impl.slicewise(lambda *p: tf.concat(list(p), axis), *parts)


def halo_reduce(impl, t, axis, mesh_axis, stripe, lo, hi):
  """The adjoint of halo_extend: every position of the extended stripes is
  added back into the stripe it came from (margins travel back to their
  neighbours by collective permutes; those past the ends are dropped)."""
  if lo == 0 and hi == 0:
    return t
  if mesh_axis is None:
    return impl.slicewise(lambda s: _take(s, axis, lo, stripe), t)
  parts, where, pos = [], [], 0
  for offset, begin, size in _halo_pieces(stripe, lo, hi):
    piece = impl.slicewise(lambda s, p=pos, n=size: _take(s, axis, p, n), t)
    if offset:
      piece = impl.shift_by_n_processors(piece, mesh_axis, -offset, False)
    parts.append(piece)
    where.append((begin, size))
    pos += size

  def add(*pieces):
    total = None
    for p, (begin, size) in zip(pieces, where):
      if size != stripe:
        p = _pad_axis(p, axis, begin, stripe - begin - size)
      total = p if total is None else total + p
    return total
  return impl.slicewise(add, *parts)
