"""Rematerialization of Transformer layers: what a layer keeps for the
backward pass, as a model choice.

A LayerStack (and so the Transformer, its MoE layers and the layers of a
pipeline's stages) takes `remat`, one of:

  "none"            keep every activation the backward pass reads (the
                    default);
  "full"            keep each residual block's input only: the backward
                    pass recomputes the block -- norm, layer, dropout --
                    from it, inside the block's gradient (GShard's
                    rematerialization, GPipe's per-layer variant);
  "einsum_outputs"  keep the block's input and its einsums' outputs; the
                    backward pass recomputes the elementwise ops, norms
                    and softmaxes between them (JAX's dots-saveable
                    policy): less recompute, more memory.

The recomputation is meshtf operations in the graph
(ops/control.recompute_grad): copies of the block's operations made by
its gradient, waiting for the block's output gradient, so every backend
runs them in the backward pass -- the traced SPMD program included -- and
the plan (meshtf/plan/) counts what is kept, the recompute flops and the
peak inside the recomputed block from the same graph. Random draws
(dropout, MoE routing) depend on the op's name, which a copy keeps: the
recomputed block is bit-for-bit the forward one.

A layer's extra results leave the recomputed function as extra outputs:
the losses it appends to context.losses and the metrics dicts it appends
to its `sink.layers` (MoeFeedForward). Attention masks (context.cache) are
made before the block, once, and shared.

Example:
  >>> stack = transformer.make_layer_stack(4, remat="full")
  >>> lm = transformer.make_unitransformer(256, num_layers=4,
  ...                                      remat="einsum_outputs")
"""
from meshtf.ops import control
from meshtf.ops import einsum as einsum_lib

POLICIES = ("none", "full", "einsum_outputs")


def check_policy(policy, what="remat"):
  """The policy name (True: "full"; False / None: "none"); ValueError with
  the choices otherwise.

  Example:
    >>> check_policy(True)
    'full'
  """
  if policy is True:
    return "full"
  if policy in (False, None, ""):
    return "none"
  if policy not in POLICIES:
    raise ValueError("%s=%r is not one of %s: use 'full' to recompute each "
                     "layer from its input in the backward pass" % (
                         what, policy, ", ".join(POLICIES)))
  return policy


def _keeps_einsum(op):
  return isinstance(op, einsum_lib.EinsumOperation)


def keep_rule(policy):
  """recompute_grad's keep= for a policy (None: recompute everything)."""
  return _keeps_einsum if check_policy(policy) == "einsum_outputs" else None


def recompute_block(block, x, context, layer, policy):
  """block(x), recomputed in the backward pass under `policy` ("full" or
  "einsum_outputs"; see the module docstring), with the layer's losses and
  sink metrics passed out as the function's outputs.

  Example:
    >>> y = recompute_block(lambda x: layer.call(context, x), x, context,
    ...                     layer, "full")
  """
  policy = check_policy(policy)
  if policy == "none":
    return block(x)
  mask = getattr(layer, "mask", None)
  if callable(mask):
    mask(context)   # made once, outside: every block reads the same one
  losses = context.losses
  sink = getattr(layer, "sink", None)
  sink_layers = getattr(sink, "layers", None)
  n_losses = len(losses) if losses is not None else 0
  n_sink = len(sink_layers) if sink_layers is not None else 0
  added = {}

  def fn(x):
    y = block(x)
    new_losses = list(losses[n_losses:]) if losses is not None else []
    new_metrics = list(sink_layers[n_sink:]) if sink_layers is not None \
        else []
    keys = [sorted(m) for m in new_metrics]
    added["losses"], added["keys"] = len(new_losses), keys
    return [y] + new_losses + [m[k] for m, ks in zip(new_metrics, keys)
                               for k in ks]
  outs = list(control.recompute_grad(fn, [x], keep=keep_rule(policy)))
  k = 1 + added["losses"]
  if losses is not None:
    losses[n_losses:] = outs[1:k]
  if sink_layers is not None:
    rebuilt = []
    for ks in added["keys"]:
      rebuilt.append(dict(zip(ks, outs[k:k + len(ks)])))
      k += len(ks)
    sink_layers[n_sink:] = rebuilt
  return outs[0]


__all__ = ["POLICIES", "check_policy", "keep_rule", "recompute_block"]
