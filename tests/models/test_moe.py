"""GShard Mixture-of-Experts (meshtf/models/moe.py).

- The gating equals a plain numpy transcription of GShard's Algorithm 1
  (sequential loops over the tokens of each group), with the second-expert
  policy "all", "none", "threshold", and "random" fed the same uniform
  draws; switch gating likewise; capacities small enough that tokens are
  dropped.
- The whole layer (top-2 with random routing, and switch with a router
  z-loss) gives the single-device outputs, metrics and gradients (w.r.t. x
  and every variable) under data-, expert- and data+expert+model-parallel
  layouts, on both backends; expert parallelism reshards by alltoall.
- A paper-scale layer (2048 experts) builds symbolically in seconds.
"""
import time

import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.layouts import tensor_layouts
from meshtf.models import moe
from meshtf.ops import random as random_ops

TWO = "rows:2;cols:4"


# --- numpy transcription of Algorithm 1 ---------------------------------------
def np_softmax(logits):
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def algorithm_1(logits, capacity, uniform=None, policy="random",
                second_place_loss=False, threshold=None):
  """GShard Algorithm 1 per group, line by line (numbers in comments).
  Returns combine [G, S, E, C] and l_aux (mean over groups). policy says
  which second choices line (19) keeps: "random" (2 * g2 > rnd, GShard's),
  "all", "none" or "threshold" (g2 > threshold, Mesh TensorFlow's)."""
  num_groups, group_size, num_experts = logits.shape
  gates = np_softmax(logits.astype(np.float64))
  combine = np.zeros([num_groups, group_size, num_experts, capacity])
  losses = []
  for g in range(num_groups):
    counts = np.zeros(num_experts, np.int64)            # (1) c_E <- 0
    mean_gates = gates[g].mean(axis=0)                   # (3) m_E
    for s in range(group_size):                          # (4)
      e1, e2 = np.argsort(-gates[g, s], kind="stable")[:2]   # (5) top_2
      g1, g2 = gates[g, s, e1], gates[g, s, e2]
      g1 = g1 / (g1 + g2)                                # (6)
      c = counts[e1]                                     # (7)
      if counts[e1] < capacity:                          # (8)
        combine[g, s, e1, c] = g1                        # (9)
      counts[e1] = c + 1                                 # (11)
    loss = np.sum(counts / group_size * mean_gates) / num_experts   # (13)
    if second_place_loss:  # Mesh TensorFlow's extra term on second choices.
      second = np.zeros(num_experts)
      without_1 = gates[g].copy()
      for s in range(group_size):
        e1, e2 = np.argsort(-gates[g, s], kind="stable")[:2]
        second[e2] += 1
        without_1[s, e1] = 0.0
      without_1 /= without_1.sum(-1, keepdims=True)
      loss += 0.5 * np.sum(second / group_size * without_1.mean(0)) / \
          num_experts
    losses.append(loss)
    for s in range(group_size):                          # (14)
      e1, e2 = np.argsort(-gates[g, s], kind="stable")[:2]   # (15)
      g1, g2 = gates[g, s, e1], gates[g, s, e2]
      g2 = g2 / (g1 + g2)                                # (16)
      rnd = uniform[g, s] if policy == "random" else 1.0    # (17)
      c = counts[e2]                                     # (18)
      chosen = {"all": True, "none": False, "random": 2 * g2 > rnd,
                "threshold": g2 > (threshold or 0.0)}[policy]
      if c < capacity and chosen:                        # (19)
        combine[g, s, e2, c] = g2                        # (20)
      counts[e2] = c + 1                                 # (22)
  return combine, np.mean(losses)


def switch_reference(logits, capacity):
  num_groups, group_size, num_experts = logits.shape
  gates = np_softmax(logits.astype(np.float64))
  combine = np.zeros([num_groups, group_size, num_experts, capacity])
  losses = []
  for g in range(num_groups):
    counts = np.zeros(num_experts, np.int64)
    for s in range(group_size):
      e1 = np.argmax(gates[g, s])
      if counts[e1] < capacity:
        combine[g, s, e1, counts[e1]] = gates[g, s, e1]
      counts[e1] += 1
    losses.append(np.sum(counts / group_size * gates[g].mean(0)) /
                  num_experts)
  return combine, np.mean(losses)


def np_stats(logits, combine):
  """z-loss, entropy, load and dropped fraction from logits and combine."""
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  gates = np_softmax(logits.astype(np.float64))
  routed = (combine > 0).sum(-1)                 # [G, S, E]
  tokens = routed.shape[0] * routed.shape[1]
  return {"router_z_loss": np.mean(lse ** 2),
          "router_entropy": np.mean(-(gates * np.log(gates)).sum(-1)),
          "expert_load": routed.sum((0, 1)) / tokens,
          "dropped_fraction": np.mean(routed.sum(-1) == 0)}


# --- gating against the transcription -----------------------------------------
G, S, E, C = 2, 8, 4, 2


def test_gating_matches_algorithm_1():
  rs = np.random.RandomState(7)
  # Expert 0 favoured, so its buffer overflows and tokens are dropped.
  logits = (rs.normal(size=[G, S, E]) + [1.5, 0.5, 0, 0]).astype(np.float32)
  uniform = rs.uniform(size=[G, S]).astype(np.float32)
  capacity = mtf.Dimension("expert_capacity", C)
  group_size, experts = mtf.Dimension("group_size", S), mtf.Dimension(
      "expert_unsplit", E)
  cases = {  # name -> (gating fn, hparams, kwargs)
      "all": (moe.top_2_gating, moe.MoeParams(
          moe_second_policy_train="all"), {}),
      "none": (moe.top_2_gating, moe.MoeParams(
          moe_second_policy_train="none", moe_use_second_place_loss=True), {}),
      "random": (moe.top_2_gating, moe.MoeParams(), {"fed": True}),
      "threshold": (moe.top_2_gating, moe.MoeParams(
          moe_second_policy_train="threshold", moe_second_threshold=0.3), {}),
      "switch": (moe.switch_gating, moe.MoeParams(moe_gating="switch"), {}),
  }

  def model(mesh, t):
    out = {}
    for name, (fn, hp, kw) in cases.items():
      extra = {"uniform": t["u"]} if kw.get("fed") else {}
      dispatch, combine, stats = fn(t["logits"], group_size, experts,
                                    capacity, hp, train=True, **extra)
      out[name + "/dispatch"] = dispatch
      out[name + "/combine"] = combine
      for k, v in stats.items():
        out[name + "/" + k] = v
    return out
  run = harness.run_model(
      model, {"logits": (logits, "group:2;group_size:8;expert_unsplit:4"),
              "u": (uniform, "group:2;group_size:8")}, "all:1", "")
  got = run.outputs
  expected = {
      "all": algorithm_1(logits, C, policy="all"),
      "none": algorithm_1(logits, C, policy="none", second_place_loss=True),
      "random": algorithm_1(logits, C, uniform, policy="random"),
      "threshold": algorithm_1(logits, C, policy="threshold", threshold=0.3),
      "switch": switch_reference(logits, C),
  }
  for name, (combine, aux) in expected.items():
    np.testing.assert_allclose(got[name + "/combine"], combine, rtol=1e-5,
                               atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(got[name + "/dispatch"],
                                  (combine > 0).astype(np.float32),
                                  err_msg=name)
    np.testing.assert_allclose(got[name + "/aux_loss"], aux, rtol=1e-5,
                               err_msg=name)
    for k, v in np_stats(logits, combine).items():
      np.testing.assert_allclose(got[name + "/" + k], v, rtol=1e-5,
                                 atol=1e-6, err_msg=name + " " + k)
  # The test proves something: tokens overflow, and random routing skips
  # some second choices that "all" takes.
  assert got["switch/dropped_fraction"] > 0
  for policy in ("random", "threshold"):
    assert 0 < expected[policy][0].astype(bool).sum() < \
        expected["all"][0].astype(bool).sum()
  first_only = expected["none"][0].astype(bool).sum()
  assert first_only < G * S  # some first choices overflowed


# --- the layer under every layout ---------------------------------------------
BATCH, LENGTH, D_MODEL = 8, 4, 4
TOP2 = moe.MoeParams(moe_num_experts=4, moe_group_size=4, moe_hidden_size=8,
                     moe_min_expert_capacity=1, moe_router_z_loss_coef=0.1)
SWITCH = moe.MoeParams(moe_num_experts=4, moe_group_size=4, moe_hidden_size=8,
                       moe_min_expert_capacity=1, moe_gating="switch",
                       moe_router_z_loss_coef=0.1)
LAYOUTS = [
    # Data parallel: groups (and the batch they come from) split 8 ways;
    # the routed tensors stay with their groups (group_unsplit).
    ("all:8", "batch:all;group:all;group_unsplit:all"),
    # Expert parallel (GShard): groups and experts on one axis, the routed
    # tensors resharded by alltoall; group_size split too (cumsum across).
    (TWO, "batch:cols;group:cols;experts:cols;group_size:rows"),
    # Data + expert + model: the experts' d_ff and the router's experts
    # (softmax and top-1 across processors) split on rows.
    (TWO, "batch:cols;group:cols;experts:cols;expert_hidden:rows;"
     "expert_unsplit:rows"),
]


SCALARS = ["aux_loss", "router_z_loss", "router_entropy", "dropped_fraction"]


def test_moe_layer_layout_invariant_with_alltoall():
  x_np = harness.random_array([BATCH, LENGTH, D_MODEL], 3)

  def model(mesh, t):
    x = t["x"]
    d_model = x.shape.dims[-1]
    out = {}
    for name, hp in (("top2", TOP2), ("switch", SWITCH)):
      y, metrics = moe.moe_layer(x, d_model, hp, train=True, name=name)
      out[name] = y
      out[name + "/expert_load"] = metrics["expert_load"]
      # One output for the scalars: fewer harness ops (suite time).
      out[name + "/scalars"] = mtf.stack([metrics[k] for k in SCALARS],
                                         "metric")
    return out
  runs = harness.assert_layout_invariant(
      model, {"x": (x_np, "batch:8;length:4;d_model:4")}, LAYOUTS, wrt=["x"])

  # (Every run has the single-device values.) Routing is exercised: tokens
  # dropped, second choices skipped at random, losses with gradients.
  outputs = runs[("placement",) + LAYOUTS[0]].outputs
  top2 = dict(zip(SCALARS, outputs["top2/scalars"]))
  switch = dict(zip(SCALARS, outputs["switch/scalars"]))
  assert switch["dropped_fraction"] > 0
  assert 1 < outputs["top2/expert_load"].sum() < 2
  assert top2["aux_loss"] > 0 and switch["router_z_loss"] > 0
  grads = runs[("placement",) + LAYOUTS[0]].grads
  assert np.abs(grads["top2/top_2_gating/kernel"]).max() > 0
  assert np.abs(grads["switch/switch_gating/kernel"]).max() > 0
  # Data parallelism communicates only the losses' and gradients' sums.
  for backend in harness.BACKENDS:
    stats = runs[(backend,) + LAYOUTS[0]].lowering.collective_stats()
    assert {s["kind"] for s in stats} == {"allreduce_sum"}, stats
  # Expert parallelism moves the routed tensors by alltoall (forward and
  # backward, both layers), never by gathering them.
  capacity = 2  # ceil(1.0 * 2 * S / E) for top-2, S = 4, E = 4
  dispatched_slice = 4 * (BATCH * LENGTH // 4 // 4) * capacity * D_MODEL
  for backend in harness.BACKENDS:
    stats = runs[(backend,) + LAYOUTS[1]].lowering.collective_stats()
    alltoalls = [s for s in stats if s["kind"] == "alltoall"]
    assert sum(s["count"] for s in alltoalls) >= 8, stats
    assert all(s["mesh_axes"] == ("cols",) for s in alltoalls), stats
    assert dispatched_slice in [s["elements_per_device"] for s in alltoalls]
    big_gathers = [s for s in stats if s["kind"] == "allconcat" and
                   s["elements_per_device"] >= dispatched_slice // 2]
    assert not big_gathers, stats


def test_fixed_group_count_routes_alike_on_any_group_axis():
  """moe_num_groups fixes G: a layout-aware layer (mesh_shape and layout
  given, as in a Transformer) routes the same on 1 device and with the
  group dim split 2 or 4 ways; the automatic count (from moe_group_size)
  would give 1, 2 and 4 groups there, so different routing."""
  x_np = harness.random_array([BATCH, LENGTH, D_MODEL], 5)
  runs = [("all:1", "", "placement"),
          (TWO, "batch:rows;group:rows;experts:cols", "simd"),
          ("all:4", "batch:all;group:all;group_unsplit:all", "simd")]
  outs = {}
  for groups in (4, 0):
    hp = moe.MoeParams(moe_num_experts=4, moe_group_size=32,
                       moe_num_groups=groups, moe_hidden_size=8,
                       moe_capacity_factor_train=0.5,
                       moe_min_expert_capacity=1)
    for mesh_shape, layout, backend in runs:
      def model(mesh, t, mesh_shape=mesh_shape, layout=layout, hp=hp):
        y, metrics = moe.moe_layer(t["x"], t["x"].shape.dims[-1], hp,
                                   train=True, layout=layout,
                                   mesh_shape=mesh_shape)
        return {"y": y, "load": metrics["expert_load"]}
      outs[groups, mesh_shape] = harness.run_model(
          model, {"x": (x_np, "batch:8;length:4;d_model:4")}, mesh_shape,
          layout, backend, wrt=["x"])
  base = outs[4, "all:1"]
  for mesh_shape, _, _ in runs[1:]:
    got = outs[4, mesh_shape]
    np.testing.assert_allclose(got.outputs["y"], base.outputs["y"],
                               rtol=1e-5, atol=1e-6, err_msg=mesh_shape)
    np.testing.assert_allclose(got.grads["x"], base.grads["x"], rtol=1e-4,
                               atol=1e-6, err_msg=mesh_shape)
  auto = [outs[0, m].outputs["y"] for m, _, _ in runs]
  assert not np.allclose(auto[0], auto[2], atol=1e-4)
  with pytest.raises(ValueError, match=r"moe_num_groups=3 groups; the groups "
                     r"must divide the tokens"):
    harness.run_model(lambda mesh, t: {"y": moe.moe_layer(
        t["x"], t["x"].shape.dims[-1], moe.MoeParams(
            moe_num_experts=4, moe_num_groups=3), train=True)[0]},
                      {"x": (x_np, "batch:8;length:4;d_model:4")}, "all:1",
                      "")


# --- scale, sizes and errors --------------------------------------------------
def test_paper_scale_builds_symbolically_in_seconds():
  """GShard's 600B layer shape: d_model 1024, d_ff 8192, 2048 experts, one
  group of 1024 tokens per each of 2048 devices."""
  start = time.time()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "batch:2048;length:1024;d_model:1024")
  hp = moe.MoeParams(moe_num_experts=2048, moe_group_size=1024,
                     moe_hidden_size=8192)
  y, metrics = moe.moe_layer(x, x.shape.dims[-1], hp, train=True,
                             layout="batch:x;group:x;experts:x",
                             mesh_shape="x:2048")
  grads = mtf.gradients([mtf.reduce_sum(y) + metrics["loss"]],
                        [v.outputs[0] for v in graph.trainable_variables])
  elapsed = time.time() - start
  assert elapsed < 10, elapsed
  assert y.shape == x.shape
  shapes = {v.name: v.outputs[0].shape for v in graph.trainable_variables}
  assert shapes["moe/wi/kernel"] == "experts:2048;d_model:1024;" \
      "expert_hidden:8192"
  assert shapes["moe/wo/kernel"] == "experts:2048;expert_hidden:8192;" \
      "d_model:1024"
  assert shapes["moe/top_2_gating/kernel"] == "d_model:1024;" \
      "expert_unsplit:2048"
  assert all(g is not None for g in grads)
  # 2S/E = 1 slot per group and expert, raised to the minimum of 4.
  dispatched = [op.outputs[0] for op in graph.operations
                if op.name == "moe/to_experts"][0]
  assert dispatched.shape == \
      "experts:2048;group_unsplit:2048;expert_capacity:4;d_model:1024"
  # Every tensor of the graph has a valid expert-parallel layout.
  mesh_shape = mtf.convert_to_shape("x:2048")
  rules = mtf.convert_to_layout_rules("batch:x;group:x;experts:x")
  for op in graph.operations:
    for t in op.outputs:
      tensor_layouts.tensor_layout(t.shape, mesh_shape, rules, t.name)


def test_sizes():
  assert moe.split_into_groups(32, 4) == (8, 4)
  assert moe.split_into_groups(4096, 1024, mesh_dim_size=8) == (8, 512)
  assert moe.split_into_groups(10, 4) == (5, 2)   # never more than 4
  assert moe.expert_capacity(8, 4, 0.5, min_capacity=1) == 2
  assert moe.expert_capacity(8, 4, 1.0, "switch", min_capacity=1) == 2
  assert moe.expert_capacity(8, 4, 1.25, "switch", min_capacity=1) == 3
  assert moe.expert_capacity(100, 11, 1.1, "switch", min_capacity=1) == 10
  assert moe.expert_capacity(8, 2, 4.0) == 8      # at most S
  with pytest.raises(ValueError, match="multiple of 8"):
    moe.split_into_groups(12, 4, mesh_dim_size=8)


def test_train_flag_picks_capacity_and_policy():
  def build(train, **kwargs):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, "batch:4;length:8;d_model:4")
    if kwargs.get("second_expert_uniform"):
      kwargs["second_expert_uniform"] = mtf.zeros(mesh, "group:4;group_size:8")
    hp = moe.MoeParams(moe_num_experts=4, moe_group_size=8, moe_hidden_size=8,
                       moe_second_policy_eval="all", moe_min_expert_capacity=1)
    moe.moe_layer(x, x.shape.dims[-1], hp, train=train, **kwargs)
    capacity = [op.outputs[0] for op in graph.operations
                if op.name == "moe/to_experts"][0].shape.get_dim_by_name(
                    "expert_capacity").size
    draws = any(isinstance(op, random_ops.RandomOperation)
                for op in graph.operations)
    return capacity, draws
  assert build(train=True) == (4, True)     # ceil(1.0 * 2 * 8 / 4), random
  assert build(train=False) == (8, False)   # ceil(2.0 * 2 * 8 / 4), "all"
  # Fed draws replace the random op.
  assert build(train=True, second_expert_uniform=True) == (4, False)


def test_bad_inputs_raise_clear_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:4;length:8;d_model:4")
  d_model = x.shape.dims[-1]
  with pytest.raises(ValueError, match="moe_gating='top_3'"):
    moe.MoeParams(moe_gating="top_3")
  with pytest.raises(ValueError, match="moe_second_policy_train"):
    moe.MoeParams(moe_second_policy_train="sometimes")
  with pytest.raises(ValueError, match="fewer|too few"):
    moe.moe_layer(x, d_model, moe.MoeParams(moe_num_experts=1), train=True)
  clash = mtf.zeros(mesh, "group:4;length:8;d_model:4")
  with pytest.raises(ValueError, match="'group'"):
    moe.moe_layer(clash, d_model, moe.MoeParams(moe_num_experts=4), True)
  logits = mtf.zeros(mesh, "group:2;group_size:8;expert_unsplit:4")
  dims = logits.shape.dims
  capacity = mtf.Dimension("expert_capacity", 2)
  with pytest.raises(ValueError, match="uniform"):
    moe.top_2_gating(logits, dims[1], dims[2], capacity, moe.MoeParams(),
                     True, uniform=mtf.zeros(mesh, "group:2"))
  with pytest.raises(ValueError, match="experts_dim"):
    moe.top_2_gating(logits, dims[1], mtf.Dimension("experts", 4), capacity,
                     moe.MoeParams(), True)
