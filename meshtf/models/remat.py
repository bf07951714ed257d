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
                    policy): less recompute, more memory;
  "weight_einsum_outputs"
                    keep the block's input and the outputs of the einsums
                    that contract an activation with a model weight (the
                    projections to and from queries, keys, values and
                    heads, the feed-forward and the experts' matmuls, the
                    router's logits); the backward pass recomputes the
                    einsums between two activations -- attention's scores
                    and context, MoE dispatch and combine -- with the
                    elementwise ops, norms and softmaxes (the rule of
                    JAX's dots_with_no_batch_dims_saveable, which its
                    documentation calls "a useful heuristic for
                    transformers").

The weight-einsum rule. An einsum's output is kept when one operand is a
weight and another an activation:
  - an activation is computed from the input data: a host import (token
    ids, targets), a floating-point value a loop binds (a pipeline
    iteration's state) or the block's input (the residual stream);
  - a weight is computed from the model's variables without any
    activation: a variable, its 16-bit cast, a pipeline stage's chunk of a
    stacked variable (selected by the integer iteration counter, which is
    not data).
Why this rule: a weight einsum's flops are the layer's bulk (2 x tokens x
the weight's size), so recomputing it costs nearly a second forward pass,
while its output is tokens x one model dimension; an einsum between two
activations -- [batch, heads, length, memory_length] attention scores, the
[group, experts, capacity, d_model] dispatched tokens -- makes a tensor
as large as or larger than its operands for a few percent of the flops,
so recomputing it buys the most memory per flop. JAX tells the two apart
by dot_general's batch dimensions; meshtf's einsums have named dims and
no batch dimension marker, and an expert einsum has the experts dim in
both operands (JAX would call it batched), so the rule asks where the
operands come from instead. Einsums of weights alone (a stacked weight's
chunk) are recomputed: they cost weight-sized flops, not per-token ones.

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
  ...                                      remat="weight_einsum_outputs")
"""
from meshtf.ops import control
from meshtf.ops import einsum as einsum_lib
from meshtf.ops.control import subgraphs

POLICIES = ("none", "full", "einsum_outputs", "weight_einsum_outputs")


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


_DATA, _VARIABLES = 1, 2   # origin bits of a tensor


class _Origins(object):
  """What a tensor is computed from: _DATA (an activation: a host import,
  a floating-point loop-bound value, or one of `activations`) and/or
  _VARIABLES (a model variable), as bits. Walks the producers (through
  the aliases of depend and custom-gradient outputs: a view is its
  source), memoized; the walk stops at the block's input."""

  def __init__(self, activations=()):
    self._bits = {t: _DATA for t in activations}

  def __call__(self, tensor):
    bits = self._bits
    stack = [tensor]
    while stack:
      t = stack[-1]
      if t in bits:
        stack.pop()
        continue
      op = t.operation
      aliases = op.output_aliases or {}
      if op.creates_variable_slices:
        bits[t] = _VARIABLES
      elif op.imports_host_slices:
        bits[t] = _DATA
      elif subgraphs.is_bound_value(op):
        # A loop's float state carries activations; its integer
        # iteration counter is not data.
        bits[t] = _DATA if t.dtype.is_floating else 0
      else:
        index = op.outputs.index(t)
        sources = ([op.inputs[aliases[index]]] if index in aliases
                   else op.inputs)
        pending = [s for s in sources if s not in bits]
        if pending:
          stack.extend(pending)
          continue
        value = 0
        for s in sources:
          value |= bits[s]
        bits[t] = value
      stack.pop()
    return bits[tensor]


def keeps_weight_einsum(op, origins):
  """Whether op is an einsum that contracts an activation with a weight
  (the "weight_einsum_outputs" rule; module docstring). origins: an
  _Origins of the block.

  Example:
    >>> keeps_weight_einsum(q_einsum_op, _Origins([x]))   # x . w_q
    True
  """
  if not isinstance(op, einsum_lib.EinsumOperation) or len(op.inputs) < 2:
    return False
  if not any(origins(t) == _VARIABLES for t in op.inputs):
    return False
  return any(origins(t) & _DATA for t in op.inputs)


def keep_rule(policy, activations=()):
  """recompute_grad's keep= for a policy (None: recompute everything).
  activations: the block's inputs (the residual stream), which the
  weight-einsum rule counts as activations without walking their
  producers.

  Example:
    >>> keep_rule("full") is None
    True
  """
  policy = check_policy(policy)
  if policy == "einsum_outputs":
    return _keeps_einsum
  if policy == "weight_einsum_outputs":
    origins = _Origins(activations)
    return lambda op: keeps_weight_einsum(op, origins)
  return None


def recompute_block(block, x, context, layer, policy):
  """block(x), recomputed in the backward pass under `policy` ("full",
  "einsum_outputs" or "weight_einsum_outputs"; see the module docstring), with the layer's losses and
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
  outs = list(control.recompute_grad(fn, [x],
                                      keep=keep_rule(policy, [x])))
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


__all__ = ["POLICIES", "check_policy", "keep_rule", "keeps_weight_einsum",
           "recompute_block"]
