"""Mesh TensorFlow's MoE layers, MoE1D and MoE2D, with Mesh TF's numbers.

meshtf's own MoE layer (moe.py: moe_layer, MoeFeedForward) follows GShard's
Algorithm 1. Mesh TensorFlow 0.1.21's transformer/moe.py (MoE1D, MoE2D,
transformer_moe_layer_v1/v2) routes differently in ways that change the
numbers, so code ported by changing the import gets these, written for
meshtf's core:

- Groups: num_groups = max(1, n // group_size) (rounded down), raised to a
  multiple of the size of the mesh axis that splits the batch dim. The
  group-count dim takes the batch dim's name, so the batch's layout rule
  splits the groups; the group-size dim is "group"; a leading "outer_batch"
  dim (size 1 if absent) is kept apart.
- Capacity: C = max(min_expert_capacity, min(S, int(S * factor / E))):
  no factor k for top-2 (meshtf's moe.expert_capacity has one).
- Slots: a second choice the policy ("threshold", "random") skips takes
  no slot (in GShard's Algorithm 1 it keeps its slot number, empty).
- Loss: mean over groups and experts of density * mean gate, times E**2 (1
  when balanced), divided by num_microbatches, plus z_loss * router z-loss;
  the layer returns it times loss_coef. The second-expert threshold
  defaults to 0.2 (GShard's 2 * g2 > uniform is 0.5).
- Names: the router is "<gating>/kernel" ("outer_gating" / "inner_gating"
  in MoE2D), the experts "wi/kernel" and "wo/kernel", under the enclosing
  tf.compat.v1.variable_scope (a Mesh TF checkpoint's names).

Gatings "top_2" and "switch" (policies argmax, input_dropout, input_jitter,
sample) are here; Mesh TF's research gatings (ntlb, switch_max,
expert_selection, top_n), experts attention and word-embedding routing are
refused in one line: run Mesh TF's own transformer/moe.py on meshtf's core
for them (README: Porting from Mesh TensorFlow, way 2).

Example:
  >>> from meshtf.compat import moe_layers
  >>> stack = transformer.LayerStack(
  ...     [transformer_layers.SelfAttention(num_heads=4),
  ...      moe_layers.MoE1D(num_experts=8, hidden_size=256)])
"""
import tensorflow as tf

import meshtf as mtf
from meshtf.compat import layers_extra
from meshtf.models import layers
from meshtf.models import moe as moe_lib
from meshtf.models import transformer_layers as tl

GATINGS = ("top_2", "switch")
SWITCH_POLICIES = ("argmax", "input_dropout", "input_jitter", "sample")


class HParams(object):
  """A bag of `moe_*` hyperparameters (Mesh TF's stand-in for TF1 HParams).

  Example:
    >>> hp = HParams(moe_num_experts=8)
    >>> hp.add_hparam("moe_group_size", 256); hp.moe_group_size
    256
  """

  def __init__(self, **kwargs):
    for k, v in kwargs.items():
      setattr(self, k, v)

  def add_hparam(self, k, v):
    setattr(self, k, v)


def set_default_moe_hparams(hparams):
  """Mesh TF's MoE defaults on an HParams-like object.

  Example:
    >>> hp = HParams(); set_default_moe_hparams(hp); hp.moe_capacity_factor_train
    1.25
  """
  for k, v in dict(_DEFAULTS, moe_num_experts=16).items():
    setattr(hparams, k, v)


_DEFAULTS = dict(
    moe_gating="top_2", moe_loss_coef=1e-2, moe_hidden_size=4096,
    moe_group_size=1024, moe_min_expert_capacity=4,
    moe_capacity_factor_train=1.25, moe_capacity_factor_eval=2.0,
    moe_capacity_factor_second_level=1.0, moe_use_second_place_loss=False,
    moe_second_policy_train="random", moe_second_policy_eval="random",
    moe_second_threshold_train=0.2, moe_second_threshold_eval=0.2,
    moe_dropout_rate=0.0, moe_switch_policy_train="input_jitter",
    moe_switch_policy_eval="input_jitter", moe_switch_dropout=0.1,
    moe_switch_temperature=1.0, moe_switch_jitter=1e-2, moe_output_dim=None,
    moe_z_loss=None, moe_use_experts_attention=False,
    moe_word_embed_mode=None, moe_use_second_place_expert_prob=None)


def _hp(hparams, name):
  return getattr(hparams, name, _DEFAULTS.get(name))


def _check_hparams(hparams, where):
  """One line naming the hyperparameter Mesh TF has and meshtf does not."""
  gating = _hp(hparams, "moe_gating")
  if gating not in GATINGS:
    raise ValueError(
        "%s: moe_gating=%r is one of Mesh TF's research gatings; meshtf's "
        "MoE1D has %s. Run Mesh TF's own transformer/moe.py on meshtf's core "
        "(meshtf.compat.install(library=True)) for it" % (
            where, gating, " and ".join(GATINGS)))
  for name in ("moe_use_experts_attention", "moe_word_embed_mode",
               "moe_use_second_place_expert_prob"):
    if _hp(hparams, name):
      raise ValueError(
          "%s: %s=%r is not supported by meshtf's MoE1D; run Mesh TF's own "
          "transformer/moe.py on meshtf's core (meshtf.compat.install("
          "library=True)) for it" % (where, name, _hp(hparams, name)))
  for mode in ("train", "eval"):
    policy = _hp(hparams, "moe_second_policy_" + mode)
    if gating == "top_2" and policy not in moe_lib.SECOND_POLICIES:
      raise ValueError("%s: moe_second_policy_%s=%r must be one of %s" % (
          where, mode, policy, ", ".join(moe_lib.SECOND_POLICIES)))
    policy = _hp(hparams, "moe_switch_policy_" + mode)
    if gating == "switch" and policy not in SWITCH_POLICIES:
      raise ValueError("%s: moe_switch_policy_%s=%r must be one of %s" % (
          where, mode, policy, ", ".join(SWITCH_POLICIES)))


def split_into_groups(n, max_group_size, mesh_dim_size):
  """Mesh TF's grouping of n tokens: (num_groups, group_size) with
  num_groups >= n // max_group_size, a multiple of mesh_dim_size, dividing
  n. (meshtf's moe.split_into_groups rounds n / max_group_size up instead.)

  Example:
    >>> split_into_groups(96, 64, 1), split_into_groups(96, 64, 4)
    ((1, 96), (4, 24))
  """
  if n % mesh_dim_size:
    raise ValueError(
        "MoE: %d tokens per outer batch cannot be cut into a multiple of %d "
        "groups (the size of the mesh axis that splits the batch); make "
        "batch * length a multiple of %d" % (n, mesh_dim_size, mesh_dim_size))
  num_groups = max(1, n // max_group_size)
  while num_groups % mesh_dim_size or n % num_groups:
    num_groups += 1
  return num_groups, n // num_groups


def expert_capacity(group_size, num_experts, capacity_factor, min_capacity):
  """Mesh TF's capacity: max(min_capacity, min(S, int(S * factor / E))).

  Example:
    >>> expert_capacity(64, 4, 1.25, 4), expert_capacity(8, 16, 1.25, 4)
    (20, 4)
  """
  c = min(group_size, int((group_size * capacity_factor) / num_experts))
  return max(c, min_capacity)


def _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                   variable_dtype, name):
  return layers.dense(gate_inputs, experts_dim, use_bias=False,
                      expert_dims=outer_expert_dims,
                      variable_dtype=variable_dtype, name=name)


def _importance_mask(importance, value_is_one):
  """1.0 where a token counts: importance == 1 (first choices) or > 0."""
  if value_is_one:
    return mtf.to_float(mtf.equal(importance, 1.0))
  return mtf.to_float(mtf.greater(importance, 0.0))


def _balance_loss(mask, gates, group_size_dim, experts_dim):
  """Mesh TF's load-balancing loss: E**2 * mean(density * mean gate)."""
  density = mtf.reduce_mean(mask, reduced_dim=group_size_dim)
  proxy = mtf.reduce_mean(gates, reduced_dim=group_size_dim)
  return mtf.reduce_mean(density * proxy) * float(experts_dim.size ** 2)


def _z_loss(logits, experts_dim, num_microbatches, importance):
  """Mean squared logsumexp of the logits over the tokens that count."""
  z = mtf.square(mtf.reduce_logsumexp(logits, experts_dim))
  if importance is None:
    count = float(z.shape.size)
  else:
    counts = _importance_mask(importance, True)
    z *= counts
    count = mtf.reduce_sum(counts)
  return mtf.reduce_sum(z) / count / float(num_microbatches or 1)


def _combine(gate, keep, index, position, experts_dim, capacity_dim):
  """[..., S, E, C]: gate where a choice took its slot."""
  return (gate * keep * mtf.one_hot(index, experts_dim) *
          mtf.one_hot(mtf.to_int32(position), capacity_dim))


def _outputs(combine, dtype):
  """(dispatch, combine) in the layer's dtype: dispatch is 1 where combine
  is non-zero."""
  combine = mtf.cast(combine, dtype)
  return mtf.cast(mtf.cast(combine, tf.bool), dtype), combine


def top_2_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim,
                 hparams, train, variable_dtype, importance=None,
                 name="top_2_gating", num_microbatches=None):
  """Mesh TF's top-2 gating (transformer/moe.py's _top_2_gating).

  Each token's best expert gets g1 / (g1 + g2), its second g2 / (g1 + g2).
  Slots go first to the first choices in token order (those past C are
  dropped), then to the second choices the policy keeps, counting from the
  first choices each expert kept. importance [..., S] (optional): 1 sends a
  token to up to 2 experts, between 0 and 1 to its second only, 0 to none.

  Args:
    inputs: [<batch dims>, group_size_dim, d_model].
    outer_expert_dims: None, or MoE2D's outer expert dims (one router per
      outer expert).
    experts_dim, expert_capacity_dim: Dimensions E and C.
    hparams: moe_* hyperparameters (HParams or an object with them).
    train: bool: the train or eval policy and threshold.
    variable_dtype: the router's VariableDType.
    importance, name, num_microbatches: as in Mesh TF.

  Returns:
    (dispatch, combine, loss): [<batch dims>, S, E, C] twice and a scalar
    (balance loss, plus moe_z_loss * z-loss when training).

  Example:
    >>> dispatch, combine, loss = top_2_gating(
    ...     x, None, mtf.Dimension("expert_unsplit", 4),
    ...     mtf.Dimension("expert_capacity", 8), HParams(), True, None)
  """
  group_size_dim = inputs.shape.dims[-2]
  logits = _router_logits(mtf.to_float(inputs), experts_dim,
                          outer_expert_dims, variable_dtype, name)
  gates = mtf.softmax(logits, experts_dim)
  capacity = float(expert_capacity_dim.size)

  gate_1, index_1 = mtf.top_1(gates, experts_dim)
  mask_1 = mtf.one_hot(index_1, experts_dim, dtype=gates.dtype)
  proxy_gates = gates
  if importance is not None:
    first = _importance_mask(importance, True)
    mask_1 *= first
    gate_1 *= first
    proxy_gates *= first
  without_1 = gates * (1.0 - mask_1)
  gate_2, index_2 = mtf.top_1(without_1, experts_dim)
  mask_2 = mtf.one_hot(index_2, experts_dim, dtype=gates.dtype)
  if importance is not None:
    mask_2 *= _importance_mask(importance, False)
  denom = gate_1 + gate_2 + 1e-9
  gate_1 /= denom
  gate_2 /= denom

  loss = _balance_loss(mask_1, proxy_gates, group_size_dim, experts_dim)
  if _hp(hparams, "moe_use_second_place_loss"):
    normalized = without_1 / (
        mtf.reduce_sum(without_1, reduced_dim=experts_dim) + 1e-9)
    loss += 0.5 * _balance_loss(mask_2, normalized, group_size_dim,
                                experts_dim)
  if num_microbatches and num_microbatches > 1:
    loss /= float(num_microbatches)
  if train and _hp(hparams, "moe_z_loss") is not None:
    loss += float(_hp(hparams, "moe_z_loss")) * _z_loss(
        logits, experts_dim, num_microbatches, importance)

  mode = "train" if train else "eval"
  policy = _hp(hparams, "moe_second_policy_" + mode)
  threshold = float(_hp(hparams, "moe_second_threshold_" + mode))
  if policy == "none":
    mask_2 *= 0.0
  elif policy == "threshold":
    mask_2 *= mtf.to_float(mtf.greater(gate_2, threshold))
  elif policy == "random":
    uniform = mtf.random_uniform(gates.mesh, gate_2.shape,
                                 name=name + "/second_expert_uniform")
    mask_2 *= mtf.to_float(mtf.less(uniform, gate_2 / max(threshold, 1e-9)))

  # Slot numbers: exclusive cumsums over the group, the second choices'
  # offset by the first choices each expert kept.
  position_1 = mtf.cumsum(mask_1, group_size_dim, exclusive=True) * mask_1
  mask_1 *= mtf.to_float(mtf.less(position_1, capacity))
  kept_1 = mtf.reduce_sum(mask_1, reduced_dim=group_size_dim)
  keep_1 = mtf.reduce_sum(mask_1, reduced_dim=experts_dim)
  position_1 = mtf.reduce_sum(position_1, reduced_dim=experts_dim)
  position_2 = (mtf.cumsum(mask_2, group_size_dim, exclusive=True) +
                kept_1) * mask_2
  mask_2 *= mtf.to_float(mtf.less(position_2, capacity))
  keep_2 = mtf.reduce_sum(mask_2, reduced_dim=experts_dim)
  position_2 = mtf.reduce_sum(position_2, reduced_dim=experts_dim)
  combine = (
      _combine(gate_1, keep_1, index_1, position_1, experts_dim,
               expert_capacity_dim) +
      _combine(gate_2, keep_2, index_2, position_2, experts_dim,
               expert_capacity_dim))
  dispatch, combine = _outputs(combine, inputs.dtype)
  return dispatch, combine, mtf.cast(loss, inputs.dtype)


def switch_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim,
                  hparams, train, variable_dtype, importance=None,
                  name="switch_gating", num_microbatches=None):
  """Mesh TF's Switch (top-1) gating: each token goes to one expert with
  weight gates[e] (not renormalised), in token order while C slots last.
  Policies (moe_switch_policy_train/eval): "argmax"; "input_dropout" and
  "input_jitter" perturb the router's inputs (dropout, multiplicative
  jitter; jitter only while training); "sample" draws the expert from
  softmax(logits / moe_switch_temperature). Same arguments and results as
  top_2_gating.

  Example:
    >>> dispatch, combine, loss = switch_gating(
    ...     x, None, mtf.Dimension("expert_unsplit", 4),
    ...     mtf.Dimension("expert_capacity", 8),
    ...     HParams(moe_gating="switch"), True, None)
  """
  group_size_dim = inputs.shape.dims[-2]
  policy = _hp(hparams, "moe_switch_policy_" + ("train" if train else "eval"))
  gate_inputs = mtf.to_float(inputs)
  if policy == "input_dropout":
    gate_inputs = mtf.dropout(gate_inputs, train,
                              keep_prob=1.0 - _hp(hparams,
                                                  "moe_switch_dropout"),
                              name=name + "/input_dropout")
  elif train and policy == "input_jitter":
    gate_inputs = layers_extra.multiplicative_jitter(
        gate_inputs, _hp(hparams, "moe_switch_jitter"),
        name=name + "/input_jitter")
  logits = _router_logits(gate_inputs, experts_dim, outer_expert_dims,
                          variable_dtype, name)
  gates = mtf.softmax(logits, experts_dim)
  if policy == "sample":
    index = mtf.sample_with_temperature(
        logits, experts_dim, _hp(hparams, "moe_switch_temperature"))
    gate = mtf.reduce_sum(gates * mtf.one_hot(index, experts_dim,
                                              dtype=gates.dtype),
                          reduced_dim=experts_dim)
  else:
    gate, index = mtf.top_1(gates, experts_dim)
  mask = mtf.one_hot(index, experts_dim, dtype=gates.dtype)
  # Mesh TF measures the density before masking by importance.
  density = mtf.reduce_mean(mask, reduced_dim=group_size_dim)
  proxy = mtf.reduce_mean(gates, reduced_dim=group_size_dim)
  if importance is not None:
    first = _importance_mask(importance, True)
    mask *= first
    gate *= first
    proxy *= first
  loss = mtf.reduce_mean(density * proxy) * float(experts_dim.size ** 2)
  if num_microbatches and num_microbatches > 1:
    loss /= float(num_microbatches)
  if train and _hp(hparams, "moe_z_loss") is not None:
    loss += float(_hp(hparams, "moe_z_loss")) * _z_loss(
        logits, experts_dim, num_microbatches, importance)
  position = mtf.cumsum(mask, group_size_dim, exclusive=True) * mask
  mask *= mtf.to_float(mtf.less(position, float(expert_capacity_dim.size)))
  keep = mtf.reduce_sum(mask, reduced_dim=experts_dim)
  position = mtf.reduce_sum(position, reduced_dim=experts_dim)
  dispatch, combine = _outputs(
      _combine(gate, keep, index, position, experts_dim,
               expert_capacity_dim), inputs.dtype)
  return dispatch, combine, mtf.cast(loss, inputs.dtype)


def _gating_fn(hparams):
  return top_2_gating if _hp(hparams, "moe_gating") == "top_2" else (
      switch_gating)


def _outer_batch(dims):
  """(outer_batch dim, the batch dim): Mesh TF keeps a leading
  "outer_batch" dim (the experts' replication) apart from the groups."""
  if dims[0].name == "outer_batch":
    return dims[0], dims[1]
  return mtf.Dimension("outer_batch", 1), dims[0]


def transformer_moe_layer_v1(inputs, output_dim, hparams, train,
                             variable_dtype=None, layout=None,
                             mesh_shape=None, nonpadding=None,
                             activation=mtf.relu, num_microbatches=None,
                             token_embeddings=None):
  """Mesh TF's one-level MoE layer: (output, loss * moe_loss_coef).

  inputs [<batch dims>, length, d_model] are cut into groups (see the
  module docstring), routed by top_2_gating or switch_gating, dispatched by
  einsum to [outer_batch, expert_unsplit, <batch>, C, d_model], renamed to
  [outer_batch, experts, batch_unsplit, C, d_model] (an alltoall when the
  layout splits batch and experts on one axis), run through each expert's
  FFN (wi: [experts, d_model, expert_hidden], wo: [experts, expert_hidden,
  output_dim]) and combined back.

  Args:
    inputs: float Tensor [<batch dims>, length, d_model].
    output_dim: the output's last Dimension.
    hparams: moe_* hyperparameters (HParams, or MoE1D's).
    train: bool.
    variable_dtype: a VariableDType or None (float32).
    layout, mesh_shape: Mesh TF's layout rules and mesh shape, or a
      MeshLayout as layout: the group count is a multiple of the size of
      the mesh axis that splits the batch dim.
    nonpadding: optional [<batch dims>, length] of 1 (token) / 0 (padding).
    activation: the experts' activation: a function, a meshtf op name
      ("relu", "gelu") or a list of them (a gated FFN, as dense_product).
    num_microbatches: divides the loss (gradient accumulation).
    token_embeddings: Mesh TF's word-embedding routing; refused.

  Returns:
    (output [<batch dims>, length, output_dim], scalar loss).

  Example:
    >>> y, loss = transformer_moe_layer_v1(
    ...     x, x.shape.dims[-1], HParams(moe_num_experts=4,
    ...                                  moe_hidden_size=64), train=True)
  """
  del token_embeddings  # refused by _check_hparams (moe_word_embed_mode)
  _check_hparams(hparams, "transformer_moe_layer_v1")
  variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
  outer_dims, input_dim = inputs.shape.dims[:-1], inputs.shape.dims[-1]
  outer_batch_dim, batch_dim = _outer_batch(inputs.shape.dims)
  num_experts = _hp(hparams, "moe_num_experts")
  n = inputs.shape.size // input_dim.size // outer_batch_dim.size
  num_groups, group_size = split_into_groups(
      n, _hp(hparams, "moe_group_size"),
      mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, batch_dim))
  group_size_dim = mtf.Dimension("group", group_size)
  groups_dim = mtf.Dimension(batch_dim.name, num_groups)
  moe_dims = [outer_batch_dim, groups_dim, group_size_dim]
  x = mtf.reshape(inputs, moe_dims + [input_dim])
  factor = _hp(hparams, "moe_capacity_factor_" + ("train" if train
                                                  else "eval"))
  capacity_dim = mtf.Dimension("expert_capacity", expert_capacity(
      group_size, num_experts, factor, _hp(hparams, "moe_min_expert_capacity")))
  experts_dim = mtf.Dimension("experts", num_experts)
  experts_unsplit = mtf.Dimension("expert_unsplit", num_experts)
  groups_unsplit = mtf.Dimension("batch_unsplit", num_groups)
  importance = None
  if nonpadding is not None:
    importance = mtf.reshape(
        mtf.zeros(inputs.mesh, outer_dims, dtype=inputs.dtype) + nonpadding,
        moe_dims)
  dispatch, combine, loss = _gating_fn(hparams)(
      x, None, experts_unsplit, capacity_dim, hparams, train, variable_dtype,
      importance=importance, name=_hp(hparams, "moe_gating") + "_gating",
      num_microbatches=num_microbatches)

  expert_inputs = mtf.einsum(
      [x, dispatch], mtf.Shape([outer_batch_dim, experts_unsplit, groups_dim,
                                capacity_dim, input_dim]))
  # Groups -> experts (the alltoall), through a renamed d_model as in Mesh
  # TF, so that a layout splitting d_model reshards it the same way.
  expert_inputs = _rename_last(expert_inputs, [
      outer_batch_dim, experts_dim, groups_unsplit, capacity_dim], input_dim)
  h = layers.dense_product(
      expert_inputs, reduced_dims=[input_dim],
      new_dims=[mtf.Dimension("expert_hidden", _hp(hparams,
                                                   "moe_hidden_size"))],
      expert_dims=[experts_dim], activation_functions=activation,
      use_bias=False, variable_dtype=variable_dtype, name="wi")
  rate = _hp(hparams, "moe_dropout_rate")
  if rate:
    h = mtf.dropout(h, train, keep_prob=1.0 - rate)
  expert_outputs = layers.dense(
      h, output_dim, reduced_dims=h.shape.dims[-1:], expert_dims=[experts_dim],
      use_bias=False, variable_dtype=variable_dtype, name="wo")
  expert_outputs = _rename_last(expert_outputs, [
      outer_batch_dim, experts_unsplit, groups_dim, capacity_dim], output_dim)
  output = mtf.einsum([expert_outputs, combine],
                      mtf.Shape(moe_dims + [output_dim]))
  output = mtf.reshape(output, outer_dims + [output_dim])
  return output, loss * float(_hp(hparams, "moe_loss_coef"))


def _rename_last(x, leading_dims, last_dim):
  """x reshaped to leading_dims + [last_dim], through "d_model_split"."""
  split = mtf.Dimension("d_model_split", last_dim.size)
  x = mtf.reshape(x, mtf.Shape(leading_dims + [split]))
  return mtf.reshape(x, mtf.Shape(leading_dims + [last_dim]))


def transformer_moe_layer_v2(inputs, output_dim, hparams, train,
                             variable_dtype=None, layout=None,
                             mesh_shape=None, nonpadding=None,
                             num_microbatches=None):
  """Mesh TF's two-level (hierarchical) MoE layer: X outer experts, each
  with Y inner ones, as in MoE2D.

  Tokens [a, b, l, m] (a: "outer_batch", size 1 if absent) are grouped per
  b (groups of S) and routed top-2 among X outer experts ("outer_gating":
  [m, x]) into [x, a, g, c, m]; each outer expert's buffer is regrouped
  (groups named like a, of T tokens) and routed top-2 among its Y inner
  experts ("inner_gating": [x, m, y]), with importance 1 for a first-level
  first choice and 0.5 for a second one (which then goes to one inner
  expert only). The X * Y experts ("wi": [y, x, m, expert_hidden], "wo":
  [y, x, expert_hidden, n]) run on [y, x, h, d, m], and everything is
  combined back. Layout names: expert_x / expert_y split the experts
  (expert_x_unsplit / expert_y_unsplit are the routers'); the first-level
  capacity is moe_capacity_factor_train/eval, the second-level
  moe_capacity_factor_second_level.

  Args:
    inputs: float [outer_batch, batch, length, d_model] or [batch, length,
      d_model].
    output_dim, hparams (moe_num_experts = [X, Y]), train, variable_dtype,
    layout, mesh_shape, nonpadding, num_microbatches: as in
    transformer_moe_layer_v1.

  Returns:
    (output of inputs' shape with output_dim last, loss * moe_loss_coef).

  Example:
    >>> y, loss = transformer_moe_layer_v2(
    ...     x, d_model, HParams(moe_num_experts=[2, 2],
    ...                         moe_hidden_size=64), train=True)
  """
  _check_hparams(hparams, "transformer_moe_layer_v2")
  if _hp(hparams, "moe_gating") != "top_2":
    raise ValueError("transformer_moe_layer_v2: moe_gating=%r; Mesh TF's "
                     "two-level MoE has top_2 gating only" % (
                         _hp(hparams, "moe_gating"),))
  num_experts = _hp(hparams, "moe_num_experts")
  if not isinstance(num_experts, (list, tuple)) or len(num_experts) != 2:
    raise ValueError("transformer_moe_layer_v2: moe_num_experts=%r must be "
                     "[X, Y] (outer and inner experts)" % (num_experts,))
  variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
  squeeze = inputs.shape.ndims == 3
  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, inputs.shape.dims[:-1],
                           dtype=inputs.dtype) + nonpadding
  if squeeze:
    outer = [mtf.Dimension("outer_batch", 1)]
    inputs = mtf.reshape(inputs, outer + inputs.shape.dims)
    if nonpadding is not None:
      nonpadding = mtf.reshape(nonpadding, outer + nonpadding.shape.dims)
  if inputs.shape.ndims != 4:
    raise ValueError("transformer_moe_layer_v2: inputs %s %s must be [batch, "
                     "length, d_model] or [outer_batch, batch, length, "
                     "d_model]" % (inputs.name, inputs.shape))
  a0, b1, l, m = inputs.shape.dims
  x1 = mtf.Dimension("expert_x", num_experts[0])
  y0 = mtf.Dimension("expert_y", num_experts[1])
  x = mtf.Dimension("expert_x_unsplit", num_experts[0])
  y = mtf.Dimension("expert_y_unsplit", num_experts[1])
  hidden = mtf.Dimension("expert_hidden", _hp(hparams, "moe_hidden_size"))
  min_capacity = _hp(hparams, "moe_min_expert_capacity")
  group_size = _hp(hparams, "moe_group_size")

  num_groups, s_size = split_into_groups(
      b1.size * l.size, group_size,
      mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, b1))
  g1 = mtf.Dimension(b1.name, num_groups)
  g = mtf.Dimension(b1.name + "_unsplit", num_groups)
  s = mtf.Dimension("group_size_x", s_size)
  factor = _hp(hparams, "moe_capacity_factor_" + ("train" if train
                                                  else "eval"))
  c = mtf.Dimension("expert_capacity_x", expert_capacity(
      s_size, x.size, factor, min_capacity))
  num_groups, t_size = split_into_groups(
      a0.size * g.size * c.size, group_size,
      mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, a0))
  t = mtf.Dimension("group_size_y", t_size)
  h0 = mtf.Dimension(a0.name, num_groups)
  h = mtf.Dimension(a0.name + "_unsplit", num_groups)
  d = mtf.Dimension("expert_capacity_y", expert_capacity(
      t_size, y.size, _hp(hparams, "moe_capacity_factor_second_level"),
      min_capacity))

  inputs = mtf.reshape(inputs, [a0, g1, s, m])
  if nonpadding is not None:
    nonpadding = mtf.reshape(nonpadding, [a0, g1, s])
  dispatch_x, combine_x, loss_outer = top_2_gating(
      inputs, None, x, c, hparams, train, variable_dtype,
      importance=nonpadding, name="outer_gating",
      num_microbatches=num_microbatches)
  expert_inputs_x = mtf.einsum([inputs, dispatch_x], [x, a0, g1, c, m])
  # Importance of each first-level slot: 1 for a first choice, 0.5 for a
  # second one (its combine weight is <= 0.5), 0 for an empty slot.
  importance = mtf.reduce_sum(combine_x, output_shape=[x, a0, g1, c])
  importance = 0.5 * (mtf.to_float(mtf.greater(importance, 0.5)) +
                      mtf.to_float(mtf.greater(importance, 0.0)))
  expert_inputs_x = mtf.reshape(expert_inputs_x, [x1, a0, g, c, m])
  importance = mtf.reshape(importance, [x1, a0, g, c])
  inputs_y = mtf.reshape(expert_inputs_x, [x1, h0, t, m])
  importance = mtf.reshape(importance, [x1, h0, t])
  dispatch_y, combine_y, loss_inner = top_2_gating(
      inputs_y, [x1], y, d, hparams, train, variable_dtype,
      importance=importance, name="inner_gating",
      num_microbatches=num_microbatches)
  expert_inputs_y = mtf.einsum([inputs_y, dispatch_y], [y, x1, h0, d, m])
  expert_inputs_y = mtf.reshape(expert_inputs_y, [y0, x1, h, d, m])
  hidden_output = layers.dense(
      expert_inputs_y, hidden, reduced_dims=[m], expert_dims=[y0, x1],
      activation=mtf.relu, use_bias=False, variable_dtype=variable_dtype,
      name="wi")
  expert_output = layers.dense(
      hidden_output, output_dim, reduced_dims=[hidden], expert_dims=[y0, x1],
      use_bias=False, variable_dtype=variable_dtype, name="wo")
  expert_output = mtf.reshape(expert_output, [y, x1, h0, d, output_dim])
  output_y = mtf.einsum([expert_output, combine_y], [x1, h0, t, output_dim])
  output = mtf.reshape(output_y, [x1, a0, g, c, output_dim])
  output = mtf.reshape(output, [x, a0, g1, c, output_dim])
  output = mtf.einsum([output, combine_x], [a0, g1, s, output_dim])
  output = mtf.reshape(output, [a0, b1, l, output_dim])
  if squeeze:
    output = mtf.reshape(output, [b1, l, output_dim])
  return output, (loss_outer + loss_inner) * float(_hp(hparams,
                                                       "moe_loss_coef"))


class _MeshTfMoeLayer(tl.TransformerLayer):
  """The call shared by MoE1D and MoE2D: variables under the layer's scope,
  a length dim added for one-position (incremental) inputs, the loss into
  context.losses."""

  def _layer(self, context, x):
    raise NotImplementedError

  def call(self, context, x, losses=None):
    del losses  # Mesh TF's signature; the loss goes to context.losses
    model = getattr(context, "model", None)
    if getattr(model, "ensemble_dim", None):
      raise NotImplementedError("%s: MoE is not implemented with ensembles "
                                "(as in Mesh TF)" % type(self).__name__)
    x_shape = x.shape
    has_length = context.length_dim in x_shape.dims
    if not has_length:
      x = mtf.reshape(x, mtf.Shape(x_shape.dims[:-1] + [
          mtf.Dimension("length", 1)] + x_shape.dims[-1:]))
    scope = getattr(context, "scope", "")
    with tf.compat.v1.variable_scope(scope or tf.compat.v1.get_variable_scope(),
                                     auxiliary_name_scope=False):
      y, loss = self._layer(context, x)
    if context.losses is not None:
      context.losses.append(loss)
    if not has_length:
      y = mtf.reshape(y, x_shape)
    return y


def _layout_of(context):
  model = getattr(context, "model", None)
  return getattr(model, "layout", None), getattr(model, "mesh_shape", None)


class MoE1D(_MeshTfMoeLayer):
  """Mesh TF's MoE1D: a Transformer feed-forward layer that is a one-level
  mixture of experts (transformer_moe_layer_v1), with Mesh TF's arguments
  and defaults. Its loss goes into context.losses.

  Example:
    >>> ffn = MoE1D(num_experts=8, hidden_size=256, group_size=512)
    >>> stack = transformer.LayerStack([SelfAttention(), ffn] * 4)
  """

  def __init__(self, num_experts=16, loss_coef=1e-2, hidden_size=4096,
               group_size=1024, capacity_factor_train=1.25,
               capacity_factor_eval=2.0, use_second_place_loss=False,
               second_policy_train="random", second_policy_eval="random",
               second_threshold_train=0.2, second_threshold_eval=0.2,
               dropout_rate=0.0, activation="relu", moe_gating="top_2",
               min_expert_capacity=4, switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter", switch_dropout=0.1,
               switch_temperature=1.0, switch_jitter=1e-2, ntlb_top_k=4,
               output_dim=None, use_experts_attention=False, z_loss=None,
               word_embed_mode=None, use_second_place_expert_prob=None,
               use_second_place_expert_prob_temp=None,
               top_n_num_experts_per_token=3):
    del ntlb_top_k, top_n_num_experts_per_token  # research gatings only
    del use_second_place_expert_prob_temp
    self._hparams = HParams(
        moe_gating=moe_gating, moe_num_experts=num_experts,
        moe_loss_coef=loss_coef, moe_hidden_size=hidden_size,
        moe_group_size=group_size, moe_min_expert_capacity=min_expert_capacity,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval,
        moe_dropout_rate=dropout_rate,
        moe_switch_policy_train=switch_policy_train,
        moe_switch_policy_eval=switch_policy_eval,
        moe_switch_dropout=switch_dropout,
        moe_switch_temperature=switch_temperature,
        moe_switch_jitter=switch_jitter, moe_output_dim=output_dim,
        moe_use_experts_attention=use_experts_attention, moe_z_loss=z_loss,
        moe_word_embed_mode=word_embed_mode,
        moe_use_second_place_expert_prob=use_second_place_expert_prob)
    _check_hparams(self._hparams, "MoE1D")
    self._activation = activation

  def _layer(self, context, x):
    layout, mesh_shape = _layout_of(context)
    output_dim = self._hparams.moe_output_dim or context.model_dim
    return transformer_moe_layer_v1(
        x, output_dim, self._hparams, context.train, context.variable_dtype,
        layout=layout, mesh_shape=mesh_shape,
        nonpadding=getattr(context, "nonpadding", None),
        activation=self._activation,
        num_microbatches=getattr(context, "num_microbatches", None))


class MoE2D(_MeshTfMoeLayer):
  """Mesh TF's MoE2D: a two-level mixture of expert_x * expert_y experts
  (transformer_moe_layer_v2) as a Transformer feed-forward layer.

  Example:
    >>> ffn = MoE2D(expert_x=4, expert_y=4, hidden_size=256)
  """

  def __init__(self, expert_x=8, expert_y=8, loss_coef=1e-2, hidden_size=4096,
               group_size=1024, capacity_factor_train=1.25,
               capacity_factor_eval=2.0, capacity_factor_second_level=1.0,
               use_second_place_loss=False, second_policy_train="random",
               second_policy_eval="random", second_threshold_train=0.2,
               second_threshold_eval=0.2):
    self._hparams = HParams(
        moe_gating="top_2", moe_num_experts=[expert_x, expert_y],
        moe_loss_coef=loss_coef, moe_hidden_size=hidden_size,
        moe_group_size=group_size,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_capacity_factor_second_level=capacity_factor_second_level,
        moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval)
    _check_hparams(self._hparams, "MoE2D")

  def _layer(self, context, x):
    layout, mesh_shape = _layout_of(context)
    return transformer_moe_layer_v2(
        x, context.model_dim, self._hparams, context.train,
        context.variable_dtype, layout=layout, mesh_shape=mesh_shape,
        nonpadding=getattr(context, "nonpadding", None),
        num_microbatches=getattr(context, "num_microbatches", None))


__all__ = ["MoE1D", "MoE2D", "HParams", "set_default_moe_hparams",
           "transformer_moe_layer_v1", "transformer_moe_layer_v2",
           "top_2_gating", "switch_gating", "split_into_groups",
           "expert_capacity"]
