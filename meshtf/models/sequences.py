"""Sequence helpers of the Transformer: the sinusoidal position signal, the
decoder's shifted inputs, the inputs-part mask of delimited LM examples.

Kept apart from the layers (meshtf/models/transformer_layers.py re-exports
them under Mesh TensorFlow's names) because they are plain functions of ids
and positions, with no variables.

Example:
  >>> from meshtf.models import sequences
  >>> inputs = sequences.autoregressive_inputs(targets, targets_segmentation)
"""
import math

import tensorflow as tf

import meshtf as mtf
from meshtf.models import layers


def sinusoidal_position_signal(position, model_dim, dtype=tf.float32,
                               max_timescale=1.0e4):
  """The Transformer's sine/cosine position signal [position dims...,
  d_model]: channel c < d/2 is sin(p * w_c), channel d/2 + c is cos(p * w_c),
  w_c = max_timescale^(-c / (d/2 - 1)).

  Example:
    >>> s = sinusoidal_position_signal(mtf.range(mesh, length, tf.int32),
    ...                                d_model)   # [length, d_model]
  """
  half = max(model_dim.size // 2, 1)
  channel = mtf.range(position.mesh, model_dim, tf.int32)
  freq_index = mtf.cast(mtf.mod(channel, half), tf.float32)
  inv_timescale = mtf.exp(freq_index * (-math.log(max_timescale)
                                        / max(half - 1, 1)))
  angle = mtf.cast(position, tf.float32) * inv_timescale
  signal = mtf.where(mtf.less(channel, half), mtf.sin(angle), mtf.cos(angle))
  return mtf.cast(signal, dtype)


def autoregressive_inputs(targets, sequence_id=None, length_dim=None):
  """Decoder inputs: targets shifted right by one (0 first), and 0 at the
  start of every packed segment.

  Example:
    >>> inputs = autoregressive_inputs(targets, targets_segmentation)
  """
  length_dim = length_dim or targets.shape.dims[-1]
  inputs = mtf.shift(targets, 1, length_dim, wrap=False)
  if sequence_id is not None:
    same = mtf.equal(sequence_id, mtf.shift(sequence_id, 1, length_dim,
                                            wrap=False))
    inputs = inputs * mtf.cast(same, inputs.dtype)
  return inputs


def delimited_lm_inputs_mask(ids, sequence_id=None, eos_id=1, length_dim=None):
  """True on the "inputs" part of an [inputs, EOS, targets, EOS] language
  model example: every non-padding position up to and including the first
  EOS of its segment.

  Example:
    >>> loss_weights = mtf.logical_not(delimited_lm_inputs_mask(targets))
  """
  length_dim = length_dim or ids.shape.dims[-1]
  eos_before = mtf.cumsum(mtf.cast(mtf.equal(ids, eos_id), tf.int32),
                          length_dim, exclusive=True)
  if sequence_id is not None:
    # EOS count up to the segment's start: the smallest count over the
    # segment, since the count never decreases along the length.
    mem = "memory_" + length_dim.name
    other = mtf.not_equal(sequence_id, layers.rename_length_to_memory_length(
        sequence_id, length_dim.name))
    counts = layers.rename_length_to_memory_length(eos_before,
                                                   length_dim.name)
    big = length_dim.size + 1
    at_start = mtf.reduce_min(counts + mtf.cast(other, tf.int32) * big,
                              reduced_dim=mtf.Dimension(mem, length_dim.size))
    eos_before = eos_before - at_start
  return mtf.logical_and(mtf.equal(eos_before, 0), mtf.not_equal(ids, 0))


__all__ = ["sinusoidal_position_signal", "autoregressive_inputs",
           "delimited_lm_inputs_mask"]
