"""How much Grappler (TensorFlow's graph optimizer) runs on a step.

A MeshFunction's step on the SPMD backend is one outer function calling
one per-device program per device. TensorFlow runs Grappler on the outer
function, specializing the program for each call site, then again on each
device's copy when it first runs: for a T5-small-sized encoder-decoder on 8
virtual CPUs (8,606 TF ops per program) that was 363 s of optimizer thread
time (remapper 90 s, TFG 77 s, constant folding 50 s, arithmetic 38 s,
layout 35 s; TF_CPP_VMODULE=meta_optimizer=1, load ~12 on 2 cores) for a
later step no faster on CPU (bench/first_step.py: 4.4 vs 4.2 CPU s). The
lowering already emits what those passes would make of it: one constant
per value (constants.py), static shapes, no dead branches.

Modes:
  "default": TensorFlow's Grappler, every default pass.
  "off": no Grappler on the step's functions (the meta optimizer off).
A mesh's default (default_grappler) is "off" when every device is a CPU
and the program is not compiled by XLA, else "default" (GPU steps may gain
from the remapper's fused kernels and the layout optimizer: unmeasured
here, so TensorFlow's choice stands).

Example:
  >>> default_grappler(["/cpu:0", "/cpu:1"], jit_compile="")
  'off'
  >>> with call_options("off"):
  ...   out = step(x)     # a tf.function instantiated without Grappler
"""
import contextlib

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context as tf_context

from meshtf.lowering import simd_collectives

GRAPPLER_MODES = ("default", "off")


def check_grappler(mode, where):
  """The mode, or None for None (not given); else ValueError.

  Example:
    >>> check_grappler("off", "MeshFunction")
    'off'
  """
  if mode is None or mode in GRAPPLER_MODES:
    return mode
  raise ValueError("%s: grappler=%r is not one of %s: pass grappler='off' "
                   "(no graph optimizer: a faster first step) or 'default' "
                   "(TensorFlow's Grappler)" % (
                       where, mode, ", ".join(repr(m)
                                              for m in GRAPPLER_MODES)))


def default_grappler(devices, jit_compile):
  """"off" for a mesh of CPUs without XLA, else "default".

  Example:
    >>> default_grappler(["/gpu:0"], jit_compile="")
    'default'
  """
  if jit_compile or any(simd_collectives.device_type(d) != "CPU"
                        for d in devices):
    return "default"
  return "off"


# (previous options' executor type and config, mode) -> the options to call
# with: a step calls its function under them every step, and building and
# serializing the ConfigProto each time cost ~60 us of Python per call.
_CALL_OPTIONS = {}


def _options_for(previous, mode):
  key = (previous.executor_type, previous.config_proto_serialized, mode)
  options = _CALL_OPTIONS.get(key)
  if options is None:
    config = config_pb2.ConfigProto()
    if previous.config_proto_serialized:
      config.ParseFromString(previous.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    options = _CALL_OPTIONS[key] = tf_context.FunctionCallOptions(
        executor_type=previous.executor_type, config_proto=config)
  return options


@contextlib.contextmanager
def call_options(mode):
  """While active, tf.function calls made on this thread -- calls run
  eagerly, and call ops added to a graph being traced -- have their
  functions optimized per `mode` when TensorFlow instantiates them.
  "default" changes nothing.

  Example:
    >>> with call_options("off"):
    ...   y = f(x)
  """
  if mode in (None, "default"):
    yield
    return
  context = tf_context.context()
  previous = context.function_call_options
  context.function_call_options = _options_for(previous, mode)
  try:
    yield
  finally:
    context.function_call_options = previous


__all__ = ["GRAPPLER_MODES", "check_grappler", "default_grappler",
           "call_options"]
