"""GShard Mixture-of-Experts feed-forward layer (GShard 2020, sections 2-3).

The tokens of x [<batch dims>, d_model] are cut into G groups of S tokens;
a router picks experts per token inside each group (Algorithm 1, written as
tensor ops); dispatch and combine are einsums over [G, S, E, C] (Algorithm
2). Dimension names, so that one layout rule set places everything:

  group / group_size      G groups of S tokens           (split group: data)
  expert_unsplit          E, on the router's tensors     (keep unsplit)
  experts                 E, on the experts' weights     (split: experts)
  group_unsplit           G, on the experts' inputs      (unsplit, or as
                                                          group if experts
                                                          are replicated)
  expert_capacity         C buffer slots per expert and group
  expert_hidden           the experts' d_ff              (split: model)

Data parallelism is "batch:x;group:x;group_unsplit:x": every processor
routes its groups through all the experts, with no communication but the
gradients' sums. Expert parallelism is "group:x;experts:x": the dispatched
tensor is computed split on group ([expert_unsplit, group, C, M]), renamed to
[experts, group_unsplit, C, M], which moves the split from the group dim to
the experts dim. MeshImpl.reshape lowers that to one alltoall (GShard 3.3's
resharding), and the way back after the experts' FFN to another. Routing is
computed per group, so it needs no communication when group is split.

The random choice of second experts uses mtf.random_uniform, so every
layout routes the same tokens to the same experts.

Example:
  >>> import meshtf as mtf
  >>> from meshtf.models import moe
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:4;length:8;d_model:16")
  >>> hp = moe.MoeParams(moe_num_experts=4, moe_group_size=8,
  ...                    moe_hidden_size=32)
  >>> y, metrics = moe.moe_layer(x, x.shape.dims[-1], hp, train=True)
  >>> y.shape, metrics["expert_load"].shape
  (Shape([batch:4, length:8, d_model:16]), Shape([experts:4]))
"""
import math

import tensorflow as tf

import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import layers
from meshtf.models import remat as remat_lib
from meshtf.models import transformer_layers as tl

GATINGS = ("top_2", "switch")
SECOND_POLICIES = ("all", "none", "random", "threshold")


class MoeParams(object):
  """MoE hyperparameters, named as Mesh TensorFlow's `moe_*` hparams.

  Defaults follow GShard: top-2 gating, second expert chosen at random with
  probability 2 * g2 (threshold 0.5), capacity 2S/E per group and expert
  while training (factor 1.0).

  Attributes:
    moe_num_experts: E.
    moe_group_size: S, the most tokens per routing group (groups get fewer
      when the token count asks for it, see split_into_groups).
    moe_num_groups: 0 (the fewest groups of <= moe_group_size tokens whose
      count the group dim's mesh axis divides: the grouping, so the routing,
      depends on the layout) or G > 0: exactly G groups on every mesh and
      layout (routing then is layout-invariant; G must divide the tokens
      and be a multiple of the group axis size).
    moe_capacity_factor_train / moe_capacity_factor_eval: C = max(
      moe_min_expert_capacity, ceil(factor * k * S / E)), k = 2 for top_2 and
      1 for switch (then at most S: an expert never gets more). Mesh
      TensorFlow has no k: its factor 1.25 for top-2 is 0.625 here.
    moe_min_expert_capacity: the least C.
    moe_hidden_size: d_ff of each expert.
    moe_gating: "top_2" (GShard) or "switch" (top-1, Switch Transformer).
    moe_use_second_place_loss: also balance the second choices (Mesh
      TensorFlow's option; adds half of the same loss computed on them).
    moe_second_policy_train / moe_second_policy_eval: "random" (dispatch to
      the second expert with probability min(1, g2 / threshold)), "all",
      "none" or "threshold" (when g2 > threshold).
    moe_second_threshold_train / moe_second_threshold_eval: 0.5 gives
      GShard's 2 * g2 > uniform. moe_second_threshold= sets both.
    moe_loss_coef: multiplies GShard's load-balancing loss l_aux (1 / E**2
      when balanced; Mesh TensorFlow and Lingvo scale it by E**2, so their
      coefficient c is c * E**2 here).
    moe_router_z_loss_coef: multiplies the router z-loss (ST-MoE uses 1e-3;
      GShard has none, so 0).

  Example:
    >>> hp = MoeParams(moe_num_experts=64, moe_gating="switch")
    >>> hp.moe_capacity_factor_train
    1.0
  """

  def __init__(self, moe_num_experts=16, moe_group_size=1024,
               moe_capacity_factor_train=1.0, moe_capacity_factor_eval=2.0,
               moe_min_expert_capacity=4, moe_hidden_size=4096,
               moe_gating="top_2", moe_use_second_place_loss=False,
               moe_second_policy_train="random",
               moe_second_policy_eval="random",
               moe_second_threshold_train=0.5, moe_second_threshold_eval=0.5,
               moe_loss_coef=1e-2, moe_router_z_loss_coef=0.0,
               moe_second_threshold=None, moe_num_groups=0):
    self.moe_num_experts = moe_num_experts
    self.moe_group_size = moe_group_size
    self.moe_num_groups = moe_num_groups
    self.moe_capacity_factor_train = moe_capacity_factor_train
    self.moe_capacity_factor_eval = moe_capacity_factor_eval
    self.moe_min_expert_capacity = moe_min_expert_capacity
    self.moe_hidden_size = moe_hidden_size
    self.moe_gating = moe_gating
    self.moe_use_second_place_loss = moe_use_second_place_loss
    self.moe_second_policy_train = moe_second_policy_train
    self.moe_second_policy_eval = moe_second_policy_eval
    if moe_second_threshold is not None:
      moe_second_threshold_train = moe_second_threshold
      moe_second_threshold_eval = moe_second_threshold
    self.moe_second_threshold_train = moe_second_threshold_train
    self.moe_second_threshold_eval = moe_second_threshold_eval
    self.moe_loss_coef = moe_loss_coef
    self.moe_router_z_loss_coef = moe_router_z_loss_coef
    validate_hparams(self)

  def __repr__(self):
    return "MoeParams(%s)" % ", ".join(
        "%s=%r" % kv for kv in sorted(vars(self).items()))


_DEFAULTS = None


def _hparam(hparams, name):
  """hparams.name, or MoeParams' default for hparams objects (e.g. ported
  Mesh TensorFlow HParams) that lack the newer fields."""
  global _DEFAULTS
  if hasattr(hparams, name):
    return getattr(hparams, name)
  if _DEFAULTS is None:
    _DEFAULTS = MoeParams()
  return getattr(_DEFAULTS, name)


def validate_hparams(hparams):
  """Raises ValueError naming the bad MoE hyperparameter and a fix.

  Example:
    >>> validate_hparams(MoeParams(moe_gating="top_3"))
    Traceback (most recent call last):
    ValueError: moe: moe_gating='top_3' is unknown; use one of ...
  """
  def get(name):
    return _hparam(hparams, name)

  def bad(name, why):
    raise ValueError("moe: %s=%r %s" % (name, get(name), why))
  if get("moe_gating") not in GATINGS:
    bad("moe_gating", "is unknown; use one of %s" % (GATINGS,))
  for name in ("moe_num_experts", "moe_group_size", "moe_hidden_size"):
    if not isinstance(get(name), int) or get(name) < 1:
      bad(name, "must be a positive int")
  if get("moe_gating") == "top_2" and get("moe_num_experts") < 2:
    bad("moe_num_experts", "is too few for top_2 gating (it picks two "
        "experts); use >= 2 experts or moe_gating='switch'")
  if not isinstance(get("moe_min_expert_capacity"), int) or \
      get("moe_min_expert_capacity") < 1:
    bad("moe_min_expert_capacity", "must be an int >= 1")
  for name in ("moe_capacity_factor_train", "moe_capacity_factor_eval"):
    if not get(name) > 0:
      bad(name, "must be > 0")
  for mode in ("train", "eval"):
    policy = get("moe_second_policy_" + mode)
    if policy not in SECOND_POLICIES:
      bad("moe_second_policy_" + mode,
          "is unknown; use one of %s" % (SECOND_POLICIES,))
    if policy == "random" and not get("moe_second_threshold_" + mode) > 0:
      bad("moe_second_threshold_" + mode, "must be > 0 for the random policy "
          "(0.5 is GShard's)")
  for name in ("moe_loss_coef", "moe_router_z_loss_coef"):
    if get(name) < 0:
      bad(name, "must be >= 0")
  if not isinstance(get("moe_num_groups"), int) or get("moe_num_groups") < 0:
    bad("moe_num_groups", "must be an int >= 0 (0: from moe_group_size)")


# --- sizes --------------------------------------------------------------------
def split_into_groups(n, max_group_size, mesh_dim_size=1):
  """(num_groups, group_size) for n tokens: the fewest groups of at most
  max_group_size tokens whose count divides n and is a multiple of
  mesh_dim_size (so the group dim splits evenly over its mesh axis).

  Example:
    >>> split_into_groups(4096, 1024, mesh_dim_size=8)
    (8, 512)
  """
  if n % mesh_dim_size:
    raise ValueError(
        "moe: %d tokens cannot be cut into a multiple of %d groups (the size "
        "of the group dim's mesh axis); make batch * length a multiple of %d"
        % (n, mesh_dim_size, mesh_dim_size))
  num_groups = max(1, -(-n // max_group_size))
  while num_groups % mesh_dim_size or n % num_groups:
    num_groups += 1
  return num_groups, n // num_groups


def _groups(x, n, num_groups, max_group_size, mesh_dim_size):
  """(num_groups, group_size): a fixed count (the same routing on every
  mesh and layout) or split_into_groups' choice, which depends on the size
  of the group dim's mesh axis."""
  if not num_groups:
    return split_into_groups(n, max_group_size, mesh_dim_size)
  if n % num_groups or num_groups % mesh_dim_size:
    raise ValueError(
        "moe_layer: x %s %s has %d tokens, cut into moe_num_groups=%d groups"
        "; the groups must divide the tokens and be a multiple of %d (the "
        "size of the group dim's mesh axis): set moe_num_groups to such a "
        "count" % (x.name, x.shape, n, num_groups, mesh_dim_size))
  return num_groups, n // num_groups


def expert_capacity(group_size, num_experts, capacity_factor, gating="top_2",
                    min_capacity=4):
  """Buffer slots per expert and group: max(min_capacity, ceil(factor * k *
  S / E)), k = 2 for top_2 and 1 for switch; never more than S, which no
  expert can exceed (each token goes to an expert at most once).

  Example:
    >>> expert_capacity(1024, 2048, 1.0), expert_capacity(64, 4, 1.25)
    (4, 40)
  """
  k = 2 if gating == "top_2" else 1
  # The epsilon keeps float rounding (e.g. 1.1 * 2 * 50 / 11) from adding one.
  c = int(math.ceil(capacity_factor * k * group_size / num_experts - 1e-9))
  return min(group_size, max(min_capacity, c))


# --- gating -------------------------------------------------------------------
def _check_gating_args(op_name, logits, group_size_dim, experts_dim,
                       expert_capacity_dim):
  names = logits.shape.dimension_names
  for what, d in (("group_size_dim", group_size_dim),
                  ("experts_dim", experts_dim)):
    if d.name not in names or logits.shape.get_dim_by_name(d.name) != d:
      raise ValueError("%s: %s %s is not a dimension of logits %s %s" % (
          op_name, what, d, logits.name, logits.shape))
  if expert_capacity_dim.name in names:
    raise ValueError("%s: expert_capacity_dim %r is already a dimension of "
                     "logits %s; pick another name" % (
                         op_name, expert_capacity_dim.name, logits.shape))
  if not logits.dtype.is_floating:
    raise TypeError("%s: logits %s must be floating, not %s" % (
        op_name, logits.name, logits.dtype.name))


def _top_1(x, dim):
  """(max value, argmax) along dim."""
  return mtf.top_1(x, dim)


def _router_probabilities(logits, experts_dim):
  """(logsumexp, log gates, gates) over experts; one logsumexp serves the
  softmax, the z-loss and the entropy."""
  lse = mtf.reduce_logsumexp(logits, experts_dim)
  log_gates = logits - lse
  return lse, log_gates, mtf.exp(log_gates)


def _slots(mask, group_size_dim, expert_capacity_dim, offset=None, keep=None):
  """[..., S, E, C]: 1.0 where a token's choice (mask, one-hot over experts)
  takes a buffer slot of that expert. The slot is Algorithm 1's running
  counter c_e: how many tokens before it in the group made the same choice
  (plus offset[e]), an exclusive cumsum (which works on a split
  group_size). Slots >= C are dropped by one_hot itself (out-of-range
  indices give zeros); keep ([..., S], 0 or 1) drops more, after counting."""
  position = mtf.cumsum(mask, group_size_dim, exclusive=True)
  if offset is not None:
    position += offset
  slot = mtf.one_hot(mtf.to_int32(position), expert_capacity_dim,
                     dtype=mask.dtype)
  return slot * (mask if keep is None else mask * keep)


def _balance_loss(mask, gates, group_size_dim):
  """GShard's l_aux: mean over groups of (1/E) sum_e (c_e / S) * m_e, c_e
  the tokens whose choice (mask) is e, m_e the mean gate of e."""
  density = mtf.reduce_sum(mask, reduced_dim=group_size_dim)
  proxy = mtf.reduce_sum(gates, reduced_dim=group_size_dim)
  # Means over S (twice), the groups and the experts in one scale.
  return mtf.reduce_sum(density * proxy) * (
      1.0 / (group_size_dim.size * mask.shape.size))


def _router_stats(lse, log_gates, gates, dispatch, experts_dim):
  """Router z-loss, entropy, per-expert load and dropped-token fraction."""
  num_tokens = float(lse.shape.size)
  experts_per_token = mtf.reduce_sum(dispatch, output_shape=lse.shape)
  return {
      "router_z_loss": mtf.reduce_mean(mtf.square(lse)),
      "router_entropy": mtf.reduce_sum(gates * log_gates) * (
          -1.0 / num_tokens),
      "expert_load": mtf.reduce_sum(
          dispatch, output_shape=mtf.Shape([experts_dim])) * (
              1.0 / num_tokens),
      "dropped_fraction": mtf.reduce_mean(
          mtf.to_float(mtf.equal(experts_per_token, 0.0))),
  }


def top_2_gating(logits, group_size_dim, experts_dim, expert_capacity_dim,
                 hparams, train, uniform=None, name="top_2_gating"):
  """GShard's group-level top-2 gating (Algorithm 1), as tensor ops.

  Per group: gates = softmax(logits) over experts; each token's best expert
  e1 gets weight g1 / (g1 + g2) and its second e2 weight g2 / (g1 + g2).
  Slots in each expert's buffer go first to all first choices, in token
  order, then to the second choices (counting from the number of first
  choices of that expert); a choice whose slot is >= C is dropped, and a
  second choice is also dropped unless the policy keeps it. As in Algorithm
  1, a second choice skipped by the policy still takes its slot number.
  The policy (hparams.moe_second_policy_train/eval) "random" keeps it when
  uniform < g2 / threshold (GShard: threshold 0.5, i.e. 2 * g2 > uniform).

  Args:
    logits: float [<batch dims>, group_size_dim, experts_dim] router logits.
    group_size_dim, experts_dim: Dimensions of logits.
    expert_capacity_dim: Dimension C (see expert_capacity).
    hparams: a MoeParams (or an object with its moe_* fields).
    train: bool, picks the train or eval policy.
    uniform: optional float Tensor [<batch dims>, group_size_dim] of draws
      in [0, 1) for the random policy (default: mtf.random_uniform, the same
      on every layout).
    name: name prefix of the random op.

  Returns:
    dispatch_tensor: [<batch dims>, S, E, C], 1.0 where a token takes a slot.
    combine_tensor: [<batch dims>, S, E, C], the slot's combine weight.
    stats: dict of float32 Tensors: aux_loss (l_aux, unscaled; Mesh
      TensorFlow's is E**2 times larger, 1 when balanced), router_z_loss
      (unscaled), router_entropy, dropped_fraction (scalars) and expert_load
      ([experts_dim], the fraction of tokens sent to each expert; sums to at
      most 2).

  Example:
    >>> dispatch, combine, stats = top_2_gating(
    ...     logits, group_size_dim, experts_dim,
    ...     mtf.Dimension("expert_capacity", 4), MoeParams(), train=True)
  """
  validate_hparams(hparams)
  _check_gating_args("top_2_gating", logits, group_size_dim, experts_dim,
                     expert_capacity_dim)
  if experts_dim.size < 2:
    raise ValueError("top_2_gating: experts_dim %s has fewer than 2 experts; "
                     "use switch_gating" % (experts_dim,))
  logits = mtf.to_float(logits)
  lse, log_gates, gates = _router_probabilities(logits, experts_dim)
  gate_1, index_1 = _top_1(gates, experts_dim)
  mask_1 = mtf.one_hot(index_1, experts_dim, dtype=tf.float32)
  gates_without_1 = gates * mtf.one_hot(index_1, experts_dim, on_value=0.0,
                                        off_value=1.0, dtype=tf.float32)
  gate_2, index_2 = _top_1(gates_without_1, experts_dim)
  mask_2 = mtf.one_hot(index_2, experts_dim, dtype=tf.float32)
  denom = gate_1 + gate_2
  gate_1 /= denom
  gate_2 /= denom

  aux_loss = _balance_loss(mask_1, gates, group_size_dim)
  if _hparam(hparams, "moe_use_second_place_loss"):
    # Second choices balanced against the gates renormalised without e1.
    normalized = gates_without_1 / mtf.reduce_sum(gates_without_1,
                                                  reduced_dim=experts_dim)
    aux_loss += 0.5 * _balance_loss(mask_2, normalized, group_size_dim)

  mode = "train" if train else "eval"
  policy = _hparam(hparams, "moe_second_policy_" + mode)
  threshold = float(_hparam(hparams, "moe_second_threshold_" + mode))
  dispatch_1 = _slots(mask_1, group_size_dim, expert_capacity_dim)
  if policy == "none":
    dispatch = dispatch_1
    combine = dispatch_1 * gate_1
  else:
    keep = None
    if policy == "threshold":
      keep = mtf.to_float(mtf.greater(gate_2, threshold))
    elif policy == "random":
      if uniform is None:
        uniform = mtf.random_uniform(logits.mesh, gate_2.shape,
                                     name=name + "/second_expert_uniform")
      elif uniform.shape != gate_2.shape:
        raise ValueError("top_2_gating: uniform %s has shape %s; it needs the "
                         "logits' shape without experts, %s" % (
                             uniform.name, uniform.shape, gate_2.shape))
      keep = mtf.to_float(mtf.less(mtf.to_float(uniform),
                                   gate_2 * (1.0 / threshold)))
    # Algorithm 1 counts every first choice (dropped ones too) before the
    # second choices: their counter for e starts at #first choices of e.
    first_count = mtf.reduce_sum(mask_1, reduced_dim=group_size_dim)
    dispatch_2 = _slots(mask_2, group_size_dim, expert_capacity_dim,
                        offset=first_count, keep=keep)
    dispatch = dispatch_1 + dispatch_2
    combine = dispatch_1 * gate_1 + dispatch_2 * gate_2
  stats = _router_stats(lse, log_gates, gates, dispatch, experts_dim)
  stats["aux_loss"] = aux_loss
  return dispatch, combine, stats


def switch_gating(logits, group_size_dim, experts_dim, expert_capacity_dim,
                  hparams, train, name="switch_gating"):
  """Switch Transformer top-1 gating: each token goes to its best expert e1
  with weight gates[e1] (not renormalised), in token order while the
  expert's C slots last. Same arguments and results as top_2_gating (the
  balance loss is the same l_aux, on the only choice).

  Example:
    >>> dispatch, combine, stats = switch_gating(
    ...     logits, group_size_dim, experts_dim,
    ...     mtf.Dimension("expert_capacity", 4), MoeParams(), train=True)
  """
  del train, name  # No random choices in top-1 gating.
  validate_hparams(hparams)
  _check_gating_args("switch_gating", logits, group_size_dim, experts_dim,
                     expert_capacity_dim)
  logits = mtf.to_float(logits)
  lse, log_gates, gates = _router_probabilities(logits, experts_dim)
  gate_1, index_1 = _top_1(gates, experts_dim)
  mask_1 = mtf.one_hot(index_1, experts_dim, dtype=tf.float32)
  dispatch = _slots(mask_1, group_size_dim, expert_capacity_dim)
  combine = dispatch * gate_1
  stats = _router_stats(lse, log_gates, gates, dispatch, experts_dim)
  stats["aux_loss"] = _balance_loss(mask_1, gates, group_size_dim)
  return dispatch, combine, stats


# --- the layer ----------------------------------------------------------------
def moe_layer(x, output_dim, hparams, train, variable_dtype=None,
              layout=None, mesh_shape=None, activation=None, name="moe",
              second_expert_uniform=None):
  """A GShard Mixture-of-Experts feed-forward layer.

  x [<batch dims>, d_model] is reshaped to [group, group_size, d_model];
  a router (variable "<name>/<gating>/kernel": [d_model, expert_unsplit])
  picks experts per group (top_2_gating or switch_gating); tokens are
  dispatched by einsum to [expert_unsplit, group, C, d_model], renamed to
  [experts, group_unsplit, C, d_model] (an alltoall when group and experts
  split the same mesh axis), run through each expert's FFN ("<name>/wi/
  kernel": [experts, d_model, expert_hidden], "<name>/wo/kernel": [experts,
  expert_hidden, output_dim]), renamed back and combined by einsum with the
  gates. Tokens dropped by every expert come out as zeros (a residual
  connection outside passes them on).

  Args:
    x: float Tensor [<batch dims>, d_model] (e.g. [batch, length, d_model]).
    output_dim: Dimension of the output's last dim (d_model in a
      Transformer).
    hparams: MoeParams (or an object with its moe_* fields).
    train: bool: capacity factor and second-expert policy of train or eval.
    variable_dtype: a VariableDType, or None for x's dtype. The router runs
      in float32 whatever the dtype.
    layout, mesh_shape: optional: a MeshLayout (mesh_shape None), or as in
      Mesh TensorFlow layout rules and a mesh shape; if given, the number
      of groups is made a multiple of the group dim's mesh axis size.
    activation: the experts' hidden activation (default mtf.relu).
    name: variable-name prefix (made unique in the graph).
    second_expert_uniform: optional [group, group_size] draws for the random
      policy (see top_2_gating); default mtf.random_uniform.

  Returns:
    (y, metrics): y [<batch dims>, output_dim] in x's dtype; metrics a dict
    of float32 Tensors: aux_loss (moe_loss_coef * GShard's l_aux),
    router_z_loss (moe_router_z_loss_coef * mean of logsumexp(logits)**2),
    loss (their sum: add it to the training loss), router_entropy,
    dropped_fraction (tokens sent to no expert) and expert_load ([experts]:
    fraction of the tokens sent to each expert).

  Example:
    >>> y, metrics = moe_layer(x, d_model, MoeParams(moe_num_experts=8),
    ...                        train=True)
    >>> loss = task_loss + metrics["loss"]
  """
  validate_hparams(hparams)
  if not isinstance(x, mtf.Tensor) or x.shape.ndims < 2:
    raise ValueError("moe_layer: x must be a Tensor [<batch dims>, d_model], "
                     "got %r" % (x,))
  if not x.dtype.is_floating:
    raise TypeError("moe_layer: x %s must be floating, not %s" % (
        x.name, x.dtype.name))
  output_dim = mtf.convert_to_dimension(output_dim)
  def hp(name):
    return _hparam(hparams, name)
  gating = hp("moe_gating")
  outer_dims, input_dim = x.shape.dims[:-1], x.shape.dims[-1]
  num_experts = hp("moe_num_experts")
  group_dim_name = mtf.Dimension("group", 1)
  num_groups, group_size = _groups(
      x, x.shape.size // input_dim.size, hp("moe_num_groups"),
      hp("moe_group_size"), mtf.tensor_dim_to_mesh_dim_size(
          layout, mesh_shape, group_dim_name))
  factor = hp("moe_capacity_factor_" + ("train" if train else "eval"))
  capacity = expert_capacity(group_size, num_experts, factor, gating,
                             hp("moe_min_expert_capacity"))

  group_dim = mtf.Dimension("group", num_groups)
  group_size_dim = mtf.Dimension("group_size", group_size)
  experts_dim = mtf.Dimension("experts", num_experts)
  experts_unsplit = mtf.Dimension("expert_unsplit", num_experts)
  group_unsplit = mtf.Dimension("group_unsplit", num_groups)
  capacity_dim = mtf.Dimension("expert_capacity", capacity)
  hidden_dim = mtf.Dimension("expert_hidden", hp("moe_hidden_size"))
  taken = [d.name for d in outer_dims] + [input_dim.name]
  for d in (group_dim, group_size_dim, experts_dim, experts_unsplit,
            group_unsplit, capacity_dim, hidden_dim):
    if d.name in taken or (d.name == output_dim.name):
      raise ValueError(
          "moe_layer: x %s %s or output_dim %s uses the name %r, which the "
          "layer needs for its own dim; rename that dim" % (
              x.name, x.shape, output_dim, d.name))

  mesh = x.mesh
  # As given (Mesh TF variable scopes): a decoder's incremental step that
  # calls the layer again reuses its variables.
  scope = name
  inputs = mtf.reshape(x, mtf.Shape([group_dim, group_size_dim, input_dim]),
                       name=scope + "/to_groups")

  # The router in float32 (low-precision routing hurts quality).
  router_dtype = dtypes.VariableDType(
      variable_dtype.master_dtype if variable_dtype else tf.float32,
      variable_dtype.slice_dtype if variable_dtype else None, tf.float32)
  logits = layers.dense(mtf.to_float(inputs), experts_unsplit, use_bias=False,
                        variable_dtype=router_dtype,
                        name="%s/%s_gating" % (scope, gating))
  if gating == "top_2":
    dispatch, combine, stats = top_2_gating(
        logits, group_size_dim, experts_unsplit, capacity_dim, hparams, train,
        uniform=second_expert_uniform, name=scope + "/top_2_gating")
  else:
    if second_expert_uniform is not None:
      raise ValueError("moe_layer: second_expert_uniform is for top_2 gating; "
                       "switch gating picks one expert and draws nothing")
    dispatch, combine, stats = switch_gating(
        logits, group_size_dim, experts_unsplit, capacity_dim, hparams, train)

  # Algorithm 2: GSEC,GSM->EGCM, computed where the group lives, ...
  expert_inputs = mtf.einsum(
      [mtf.cast(dispatch, x.dtype), inputs],
      output_shape=mtf.Shape([experts_unsplit, group_dim, capacity_dim,
                              input_dim]), name=scope + "/dispatch")
  # ... then resharded from the group dim to the experts dim (alltoall).
  expert_inputs = mtf.reshape(
      expert_inputs, mtf.Shape([experts_dim, group_unsplit, capacity_dim,
                                input_dim]), name=scope + "/to_experts")
  h = layers.dense(expert_inputs, hidden_dim, expert_dims=[experts_dim],
                   use_bias=False, activation=activation or mtf.relu,
                   variable_dtype=variable_dtype, name=scope + "/wi")
  expert_outputs = layers.dense(h, output_dim, expert_dims=[experts_dim],
                                use_bias=False, variable_dtype=variable_dtype,
                                name=scope + "/wo")
  expert_outputs = mtf.reshape(
      expert_outputs, mtf.Shape([experts_unsplit, group_dim, capacity_dim,
                                 output_dim]), name=scope + "/to_groups_back")
  # GSEC,EGCM->GSM.
  y = mtf.einsum([mtf.cast(combine, x.dtype), expert_outputs],
                 output_shape=mtf.Shape([group_dim, group_size_dim,
                                         output_dim]), name=scope + "/combine")
  y = mtf.reshape(y, mtf.Shape(outer_dims + [output_dim]),
                  name=scope + "/from_groups")

  aux_loss = stats["aux_loss"] * float(hp("moe_loss_coef"))
  z_loss = stats["router_z_loss"] * float(hp("moe_router_z_loss_coef"))
  metrics = {
      "aux_loss": aux_loss,
      "router_z_loss": z_loss,
      "loss": aux_loss + z_loss,
      "router_entropy": stats["router_entropy"],
      "dropped_fraction": stats["dropped_fraction"],
      "expert_load": mtf.rename_dimension(stats["expert_load"],
                                          experts_unsplit.name,
                                          experts_dim.name),
  }
  return y, metrics


# --- as a Transformer layer ---------------------------------------------------
class MoeFeedForward(tl.TransformerLayer):
  """A Transformer LayerStack feed-forward layer that is a GShard MoE layer
  (moe_layer); its load-balancing loss goes into context.losses, and its
  metrics dict is appended to `sink.layers` when a sink is given.

  mesh_layout: the MeshLayout the model will run under (sets the automatic
  group count, see moe_layer); mesh_shape and layout are Mesh TensorFlow's
  form of it. remat: this layer's rematerialization policy
  (meshtf/models/remat.py), or None for its LayerStack's.

  Example:
    >>> layer = MoeFeedForward(moe.MoeParams(moe_num_experts=8), sink,
    ...                        mesh_layout=mtf.MeshLayout("x:8", "group:x"),
    ...                        remat="full")
  """

  def __init__(self, hparams, sink=None, mesh_shape=None, layout=None,
               mesh_layout=None, remat=None):
    self.hparams = hparams
    self.sink = sink
    self.remat = (None if remat is None else
                  remat_lib.check_policy(remat, "MoeFeedForward: remat"))
    self.mesh_shape = None if mesh_layout is not None else mesh_shape
    self.layout = mesh_layout if mesh_layout is not None else layout

  @property
  def name(self):
    return "MoE"

  def call(self, context, x):
    y, metrics = moe_layer(
        x, context.model_dim, self.hparams, train=context.train,
        variable_dtype=context.variable_dtype, layout=self.layout,
        mesh_shape=self.mesh_shape, name=context.scope)
    if context.losses is not None:
      context.losses.append(metrics["loss"])
    if self.sink is not None:
      self.sink.layers.append(metrics)
    return y


__all__ = ["MoeParams", "moe_layer", "MoeFeedForward", "top_2_gating",
           "switch_gating", "expert_capacity", "split_into_groups",
           "validate_hparams"]
