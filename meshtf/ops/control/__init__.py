"""Control ops: while_loop (differentiable), custom_gradient and
recompute_grad (depend and Print are in passthrough.py,
serialize_training_step in microbatch.py).

A while loop's cond and body are meshtf sub-graphs: they are built once, kept
out of graph.operations, and lowered by the loop itself inside a
tf.while_loop. On the SPMD backend that loop sits inside the per-device
program, so a body may hold collectives (an einsum over a split dim is an
allreduce in every iteration).

Gradients of a while loop: the forward loop records each iteration's loop
state (one TensorArray per slice); a backward tf.while_loop walks the
iterations in reverse, re-runs the body's forward ops from the recorded state
and then the body's meshtf gradient, carrying the loop variables'
cotangents and summing the gradients of the tensors the body reads from
outside (weights). Only the loop state is kept per iteration, not the body's
activations.

Example:
  >>> import meshtf as mtf, tensorflow as tf
  >>> from meshtf.ops import control
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4")
  >>> i, y = control.while_loop(lambda i, x: mtf.less(i, 3),
  ...                           lambda i, x: [i + 1, x * 2.0],
  ...                           [mtf.constant(mesh, 0, dtype=tf.int32), x])
  >>> y.shape
  Shape([batch:4])
"""
from meshtf.ops.control.gradients import CustomGradientOperation
from meshtf.ops.control.gradients import clone_operations
from meshtf.ops.control.gradients import custom_gradient
from meshtf.ops.control.gradients import recompute_grad
from meshtf.ops.control.loops import WhileLoopGradOperation
from meshtf.ops.control.loops import WhileLoopOperation
from meshtf.ops.control.loops import while_loop
# depend and Print live in passthrough.py; control.depend etc. still work.
from meshtf.ops.passthrough import DependOperation
from meshtf.ops.passthrough import Print
from meshtf.ops.passthrough import PrintOperation
from meshtf.ops.passthrough import depend

__all__ = [
    "while_loop", "custom_gradient", "recompute_grad", "depend", "Print",
    "clone_operations", "WhileLoopOperation",
    "WhileLoopGradOperation", "CustomGradientOperation", "DependOperation",
    "PrintOperation",
]
