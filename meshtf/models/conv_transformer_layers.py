"""Convolution layers for the transformer (Mesh TensorFlow's Conv1D,
Conv1DLayer and SeparableConv1DLayer), with decoding support.

A causal convolution of filter size k needs, at decoding step t, its
inputs at steps t-k+1 .. t. The layers keep them as their decoding state
[batch..., length:k, d_model] (the dim named like the length dim, size k):
the "first_part" pass records the inputs just before
context.initial_position (zeros before the sequence starts), and each
"incremental" step shifts the state left by one, appends the new input,
records the result and convolves it with VALID padding (one output).

All of it is einsums, shifts and one-hots over named dims, so it holds on
any layout. Re-exported from meshtf.models.transformer_layers.

Example:
  >>> stack = transformer.LayerStack(
  ...     [SelfAttention(), Conv1DLayer(filter_size=3, output_size=64)])
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.models import conv_layers
from meshtf.models.transformer_layers import TransformerLayer


def _activation(name, x):
  """x through the mtf function `name` ("linear": unchanged)."""
  if name in (None, "linear"):
    return x
  fn = getattr(mtf, name, None)
  if not callable(fn):
    raise ValueError("conv layer: activation %r is not a meshtf function"
                     % (name,))
  return fn(x)


def _layer_name(context, default):
  """Variable prefix: the layer's scope in a LayerStack (so the decoding
  steps reuse the first pass's variables), else a unique default."""
  scope = getattr(context, "scope", "")
  return scope + "/" + default if scope else None


class Conv1D(TransformerLayer):
  """Base of the convolution layers: their decoding-state bookkeeping.

  Example:
    >>> class MyConv(Conv1D):
    ...   def call(self, context, x):
    ...     if context.mode == "incremental":
    ...       x = self.record_states_incremental_mode(context, x, 3)
    ...     ...
  """

  def record_states_first_part_mode(self, context, x, filter_size,
                                    length_dim_name="length"):
    """Records x[..., i-k:i, :] (zeros before position 0), i =
    context.initial_position (None: 0), as [batch..., length_dim_name:k,
    d_model], for the incremental steps.

    Example:
      >>> layer.record_states_first_part_mode(context, x, 3)
      >>> context.new_states[-1].shape    # [batch, length:3, d_model]
    """
    length_dim = x.shape.dims[-2]
    window = mtf.Dimension("_conv_window", filter_size)
    # Window position j holds x at i - k + j; a negative index one-hots to
    # zeros (the zeros before the sequence), on any split of length.
    index = mtf.range(x.mesh, window, tf.int32) - filter_size
    start = getattr(context, "initial_position", None)
    if start is not None:
      index = index + start
    pick = mtf.one_hot(index, length_dim, dtype=x.dtype)
    out = mtf.Shape(x.shape.dims[:-2] + [window] + x.shape.dims[-1:])
    state = mtf.einsum([pick, x], output_shape=out)
    context.record_new_states(
        [mtf.rename_dimension(state, window.name, length_dim_name)])

  def record_states_incremental_mode(self, context, x, filter_size,
                                     length_dim_name="length"):
    """The window [x(t-k+1), ..., x(t)] for input x [batch..., d_model] of
    step t, from the recorded state; records it as the new state.

    Example:
      >>> window = layer.record_states_incremental_mode(context, x, 3)
    """
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    old = context.get_states(1)[0]
    position = mtf.constant(x.mesh, filter_size - 1,
                            shape=mtf.Shape(x.shape.dims[:-1]),
                            dtype=tf.int32)
    window = self.update_state(old, x, position, filter_dim,
                               dtype=context.activation_dtype)
    context.record_new_states([window])
    return window

  def update_state(self, old_state, x, position, filter_dim, dtype):
    """old_state [batch..., filter_dim, d_model] shifted left by one, with
    x [batch..., d_model] put at `position` (int Tensor [batch...]).

    Example:
      >>> new = layer.update_state(old, x, last, filter_dim, tf.float32)
    """
    dtype = getattr(dtype, "activation_dtype", dtype)
    shifted = mtf.shift(old_state, -1, filter_dim, wrap=False)
    return shifted + mtf.one_hot(position, filter_dim, dtype=dtype) * x

  def _masked_input(self, context, x):
    """x with the padding positions (context.inputs == 0) zeroed."""
    inputs = getattr(context, "inputs", None)
    if inputs is None:
      return x
    return x * mtf.cast(mtf.not_equal(inputs, 0), x.dtype)


class Conv1DLayer(Conv1D):
  """Convolution over the length dim, d_model as channels: output_size
  channels named like d_model; the filter is Glorot uniform. Nothing stops
  it mixing packed examples (as in Mesh TensorFlow).

  Example:
    >>> layer = Conv1DLayer(filter_size=3, output_size=512)
  """

  def __init__(self, filter_size, output_size, activation="linear"):
    if filter_size < 1 or output_size < 1:
      raise ValueError("Conv1DLayer: filter_size %r and output_size %r must "
                       "be positive" % (filter_size, output_size))
    self._filter_size = filter_size
    self._output_size = output_size
    self._activation = activation

  @property
  def filter_size(self):
    return self._filter_size

  def call(self, context, x, losses=None):
    del losses
    if context.mode == "first_part":
      self.record_states_first_part_mode(context, x, self._filter_size)
    if context.mode == "incremental":
      x = self.record_states_incremental_mode(context, x, self._filter_size)
      padding = "VALID"   # the window is exactly one filter wide
    else:
      x = self._masked_input(context, x)
      padding = "SAME"
    model_dim = x.shape.dims[-1]
    x = mtf.rename_dimension(x, model_dim.name, "input_dim")
    # Looked up at call time as Mesh TF did (a TF initializer object is
    # converted to meshtf's layout-invariant Glorot uniform).
    init = tf.compat.v1.glorot_uniform_initializer()
    y = conv_layers.conv1d(
        x, mtf.Dimension(model_dim.name, self._output_size),
        filter_size=self._filter_size, padding=padding,
        filter_initializer=init, name=_layer_name(context, "conv1d"))
    if context.mode == "incremental":
      y = mtf.reduce_sum(y, reduced_dim=y.shape.dims[-2])   # length:1
    return _activation(self._activation, y)


class SeparableConv1DLayer(Conv1D):
  """Depthwise-separable convolution over the length dim (see
  mtf.layers.separable_conv1d), filter positions min_relative_pos ..
  max_relative_pos, output_size channels named like d_model.

  Example:
    >>> layer = SeparableConv1DLayer(-2, 0, output_size=512)   # causal
  """

  def __init__(self, min_relative_pos, max_relative_pos, output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0, activation="linear"):
    if max_relative_pos < min_relative_pos:
      raise ValueError("SeparableConv1DLayer: max_relative_pos %d < "
                       "min_relative_pos %d" % (max_relative_pos,
                                                min_relative_pos))
    self._min = min_relative_pos
    self._max = max_relative_pos
    self._output_size = output_size
    self._depth_scale = depthwise_filter_initializer_scale
    self._point_scale = pointwise_filter_initializer_scale
    self._activation = activation

  @property
  def filter_size(self):
    return self._max - self._min + 1

  def call(self, context, x, losses=None, all_kernel_wts=None):
    del losses
    if context.mode == "first_part":
      self.record_states_first_part_mode(context, x, self.filter_size)
    if context.mode == "incremental":
      x = self.record_states_incremental_mode(context, x, self.filter_size)
    else:
      x = self._masked_input(context, x)
    model_dim = x.shape.dims[-1]
    y = conv_layers.separable_conv1d(
        x, mtf.Dimension(model_dim.name, self._output_size),
        min_relative_pos=self._min, max_relative_pos=self._max,
        depthwise_filter_initializer_scale=self._depth_scale,
        pointwise_filter_initializer_scale=self._point_scale,
        kernel_depth_weights=all_kernel_wts,
        name=_layer_name(context, "separable_conv1d"))
    if context.mode == "incremental":
      # Only the window's last position is step t's output.
      length = y.shape.dims[-2]
      y = mtf.reduce_sum(
          mtf.slice(y, self.filter_size - 1, 1, length.name),
          reduced_dim=mtf.Dimension(length.name, 1))
    return _activation(self._activation, y)


__all__ = ["Conv1D", "Conv1DLayer", "SeparableConv1DLayer"]
