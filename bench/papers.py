r"""Every number of the papers' tables and figures that meshtf's plan can
predict, planned from t2t_configs on the plan's estimate path (collectives
estimated from the layouts, plan(trace=False)), without devices.

One JSON object per (row, quantity): the table it comes from ("GSPMD
Table 2"), the row (the config row, named after the table's; "paper_row"
as the paper prints it), the quantity (step_seconds, parameters, ...),
the paper's value, the plan's, plan / paper, the config it was planned
from with the overrides the paper states and the config lacks, and the
seconds the planning took. Rows that need a model meshtf does not have
say so (plan null, a note).

Hardware is the paper's (tpuv2 for Mesh-TensorFlow, tpuv3 for GShard and
GSPMD; meshtf/plan/hardware, every constant from a specification, printed
with its source by --describe). Nothing here is fitted to these rows.
Parameter counts are in the papers' units: 1e9 for Mesh-TensorFlow,
2^30 for GShard and GSPMD (GSPMD's 64B model is 32 x 2.15e9 = 64.0 x
2^30 parameters). The paper values of tables whose cells our copy of the
paper scrambles are matched to their rows as each config file says.

Usage: python bench/papers.py [--only=gspmd_t2,gshard_fig9] [--describe]
         [--label=NAME]
       python bench/papers.py --table=bench/results/papers.jsonl   # the
         README's reproduction table, from a saved run
       python bench/papers.py --table=OLD.jsonl,NEW.jsonl \
         --compare=before,after   # the step rows of labelled runs
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
MB = 1 << 20
GIB = 2.0 ** 30


def _row(table, row, quantity, paper, plan, config="", unit="", note="",
         **extra):
  out = {"bench": "papers", "table": table, "row": row,
         "quantity": quantity, "unit": unit, "paper": paper,
         "plan": plan,
         "ratio": (round(plan / paper, 4) if plan is not None and paper
                   else None),
         "config": config}
  if note:
    out["note"] = note
  out.update(extra)
  return out


_PLANS = {}


def _module(name):
  """The config file t2t_configs/<name>.py as a module (its ROWS, PAPER)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "t2t_config_" + name, os.path.join(CONFIGS, name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def plan_row(name, row, overrides=None):
  """The plan (estimate path) of config file `name`'s row, with the
  paper's settings the config lacks (overrides: {field: value}); cached.
  Returns a dict of the numbers the rows print."""
  key = (name, row, tuple(sorted((overrides or {}).items())))
  if key in _PLANS:
    return _PLANS[key]
  from meshtf.plan import report as report_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import experiment  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  config = config_lib.load_file(os.path.join(CONFIGS, name + ".py"), row)
  applied = {}
  for field, value in (overrides or {}).items():
    # A dotted field ("moe.min_expert_capacity") names a nested key.
    *parents, key = field.split(".")
    holder = config
    for parent in parents:
      holder = holder[parent]
    if holder.get(key) != value:
      applied[field] = value
      setattr(holder, key, value)
  layout = config_lib.mesh_layout(config)
  graph, _ = experiment.build_training_graph(config, layout)
  report = report_lib.plan(graph, layout, config.plan_hardware, trace=False)
  s = report.summary()
  mesh = layout.mesh_shape
  by_kind = {}
  from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
  for r in report.collectives:
    by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["count"] * (
        hardware.collective_seconds(report.hardware, mesh, r))
  # The compute split: einsums (the matrix unit's kernels) and the rest
  # (fused elementwise / reduction kernels, gathers, ...).
  compute_by_family = {}
  for cost, seconds in zip(report.accounting.costs, report.op_seconds()):
    family = "einsum" if cost.family == "einsum" else "other"
    compute_by_family[family] = compute_by_family.get(family, 0.0) + seconds
  out = {
      "config": "%s.py:%s" % (name, row) + (
          " " + " ".join("--config.%s=%s" % kv for kv in
                         sorted(applied.items())) if applied else ""),
      "hardware": report.hardware.name,
      "devices": layout.size,
      "parameters": sum(v.outputs[0].shape.size
                        for v in graph.trainable_variables),
      "parameter_bytes_per_device": s["memory_bytes_per_device"][
          "parameters"],
      "peak_bytes_per_device": s["memory_bytes_per_device"]["peak"],
      "flops_per_device": s["flops_per_device"],
      "step_seconds": s["step_seconds"],
      "compute_seconds": s["compute_seconds"],
      "collective_seconds": s["collective_seconds"],
      # (an older plan, --label=before, has no overlap: all exposed)
      "exposed_collective_seconds": s.get("exposed_collective_seconds",
                                          s["collective_seconds"]),
      "collective_seconds_by_kind": by_kind,
      "compute_seconds_by_family": compute_by_family,
      "collective_bytes_per_device": s["collective_bytes_per_device"],
      "flops_utilization": s["flops_per_device"] / (
          s["step_seconds"] * report.hardware.peak_flops),
      "peak_flops": report.hardware.peak_flops,
      "plan_seconds": round(time.time() - t0, 1),
  }
  _PLANS[key] = out
  return out


def _detail(p, *keys):
  """The plan's breakdown of a step row: compute (einsums / the rest),
  collectives one after another (by kind) and those not hidden."""
  keys = keys or ("step_seconds", "compute_seconds", "collective_seconds",
                  "exposed_collective_seconds", "flops_utilization",
                  "compute_seconds_by_family", "collective_seconds_by_kind")
  def rounded(v):
    if isinstance(v, dict):
      return {k: round(x, 4) for k, x in sorted(v.items())}
    return round(v, 4) if isinstance(v, float) else v
  return {("plan_" + k): rounded(p[k]) for k in keys if k in p}


# --- Mesh-TensorFlow -----------------------------------------------------------
def mtf_table_1():
  """Mesh-TF Table 1 on its two-layer network (Algorithm 1: x [b, io],
  w [io, h], v [h, io], a bias, SGD), b 8192, io 4096, h 16384, 512
  processors: values allreduced and parameters per processor for each
  layout, the paper's formulas (constant factors kept) vs the plan."""
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  import meshtf.plan  # pylint: disable=g-import-not-at-top,unused-import
  b, io, h = 8192, 4096, 16384
  rows = []
  layouts = [
      ("data-parallel", "all:512", "batch:all", 2 * io * h, 2 * io * h),
      ("model-parallel", "all:512", "hidden:all", 2 * b * io,
       2 * io * h / 512),
      ("data+model (16x32)", "rows:16;cols:32", "batch:rows;hidden:cols",
       2 * b * io / 16 + 2 * io * h / 32, 2 * io * h / 32)]
  for name, mesh_shape, rules, comm, params in layouts:
    t0 = time.time()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.random_normal(mesh, "batch:%d;io:%d" % (b, io))
    w = mtf.get_variable(mesh, "w", "io:%d;hidden:%d" % (io, h))
    bias = mtf.get_variable(mesh, "bias", "hidden:%d" % h)
    v = mtf.get_variable(mesh, "v", "hidden:%d;io:%d" % (h, io))
    y = mtf.einsum([mtf.relu(mtf.einsum([x, w], output_shape=(
        "batch:%d;hidden:%d" % (b, h))) + bias), v],
                   output_shape="batch:%d;io:%d" % (b, io))
    loss = mtf.reduce_mean(mtf.square(y))
    dx, *grads = mtf.gradients([loss], [x, w, bias, v])
    sink = mtf.get_variable(mesh, "dx_sink", "batch:%d;io:%d" % (b, io),
                            trainable=False)
    mtf.assign(sink, dx)
    for var, g in zip([w, bias, v], grads):
      mtf.assign_sub(var, g * 0.1)
    report = mtf.plan.plan(graph, mtf.MeshLayout(mesh_shape, rules),
                           "tpuv2", trace=False)
    s = report.summary()
    reduced = sum(r["count"] * r["elements_per_device"]
                  for r in s["collectives"] if r["kind"].startswith(
                      "allreduce") or r["kind"] == "reduce_scatter")
    config = "two-layer network, %s @ %s" % (mesh_shape, rules)
    seconds = round(time.time() - t0, 2)
    rows.append(_row(
        "Mesh-TF Table 1", name, "values_allreduced_per_processor", comm,
        reduced, config, "values", seconds=seconds,
        note="the loss's and bias gradient's small sums on top"))
    gl = report.graph_layout
    weights = sum(gl.tensor_mesh_layout(t).slice_size(t.shape)
                  for t in (w, v))
    rows.append(_row(
        "Mesh-TF Table 1", name, "weights_per_processor", params, weights,
        config, "values", seconds=0.0,
        note="w and v (the bias left out)"))
  return rows


def mtf_table_2():
  """Mesh-TF Table 2 (language models on a 16x32 TPUv2 mesh): the two
  parameter counts the paper gives, and the largest model's 6 of 11.5
  PFLOP/s ('over 50%') as flops utilization."""
  mtf_lm_table2 = _module("mtf_lm_table2")
  rows = []
  for row in mtf_lm_table2.ROWS:
    p = plan_row("mtf_lm_table2", row)
    if row in mtf_lm_table2.PAPER_PARAMETERS:
      rows.append(_row("Mesh-TF Table 2", row, "parameters_1e9",
                       mtf_lm_table2.PAPER_PARAMETERS[row] / 1e9,
                       round(p["parameters"] / 1e9, 4), p["config"], "1e9",
                       seconds=p["plan_seconds"]))
    if row == "4.9B":
      rows.append(_row(
          "Mesh-TF Table 2", row, "flops_utilization", 6.0 / 11.5,
          round(p["flops_utilization"], 4), p["config"], "fraction",
          note="'6 PFLOP/s out of a maximum 11.5' on the largest models",
          seconds=0.0, **_detail(p)))
  return rows


def mtf_table_3():
  """Mesh-TF Table 3 (translation): parameters per row."""
  mtf_translate_table3 = _module("mtf_translate_table3")
  rows = []
  for row, paper in mtf_translate_table3.PAPER_PARAMETERS.items():
    p = plan_row("mtf_translate_table3", row)
    rows.append(_row("Mesh-TF Table 3", row, "parameters_1e9", paper / 1e9,
                     round(p["parameters"] / 1e9, 4), p["config"], "1e9",
                     seconds=p["plan_seconds"]))
  return rows


# --- GShard --------------------------------------------------------------------
GSHARD_TABLE_3 = {  # row: (paper id, steps per second), GShard Table 3
    "2048E_36L": ("(1) MoE(2048E, 36L)", 0.72),
    "2048E_12L": ("(2) MoE(2048E, 12L)", 2.15),
    "512E_36L": ("(3) MoE(512E, 36L)", 1.05),
    "512E_12L": ("(4) MoE(512E, 12L)", 3.28),
    "128E_36L": ("(5) MoE(128E, 36L)", 0.67),
    "128E_12L": ("(6) MoE(128E, 12L)", 2.16),
}
_GSHARD_WEIGHTS_UNIT = ("GShard's weights in units of 2^30, like GSPMD's "
                        "(128E_36L: 37.0 x 2^30); 600B and 1T are rounded")


def gshard_table_1():
  gshard_moe = _module("gshard_moe")
  rows = []
  for row in gshard_moe.ROWS:
    p = plan_row("gshard_moe", row)
    rows.append(_row("GShard Table 1", row, "weights_2^30",
                     gshard_moe.PAPER_WEIGHTS[row] / 1e9,
                     round(p["parameters"] / GIB, 2), p["config"], "2^30",
                     note=_GSHARD_WEIGHTS_UNIT, seconds=p["plan_seconds"]))
  return rows


# GShard 3.1: each group holds 2N / (G E) slots of each expert (top-2),
# "C needs to be at least 1" (5.2); the config's model keeps a larger
# minimum (moe.min_expert_capacity) where that is less.
PAPER_CAPACITY = {"moe.min_expert_capacity": 1}


def _paper_capacity(config):
  """The expert capacity per group GShard's rule gives a config: 2S/E
  (top-2, capacity factor 1, S tokens per group), at least 1."""
  from meshtf.models import moe  # pylint: disable=g-import-not-at-top
  m = config.moe
  return moe.expert_capacity(m.group_size, m.num_experts,
                             m.capacity_factor_train, m.gating,
                             min_capacity=1)


def gshard_table_3():
  """GShard Table 3: step time = 1 / steps per second (float32 weights
  and activations, as the paper trained). Where the config's minimum
  expert capacity exceeds GShard's 2S/E (2,048 experts: 4 slots where
  the paper has 1), the row planned with the paper's capacity too
  (quantity step_seconds_paper_capacity)."""
  from meshtf.train import config as config_lib  # pylint: disable=g-import-not-at-top
  rows = []
  for row, (paper_row, steps_per_second) in GSHARD_TABLE_3.items():
    p = plan_row("gshard_moe", row)
    rows.append(_row("GShard Table 3", row, "step_seconds",
                     round(1.0 / steps_per_second, 4),
                     round(p["step_seconds"], 4), p["config"], "s",
                     paper_row=paper_row, seconds=p["plan_seconds"],
                     **_detail(p)))
    config = config_lib.load_file(os.path.join(CONFIGS, "gshard_moe.py"),
                                  row)
    paper_capacity = _paper_capacity(config)
    if paper_capacity < config.moe.min_expert_capacity:
      q = plan_row("gshard_moe", row, PAPER_CAPACITY)
      rows.append(_row(
          "GShard Table 3", row, "step_seconds_paper_capacity",
          round(1.0 / steps_per_second, 4), round(q["step_seconds"], 4),
          q["config"], "s", paper_row=paper_row, seconds=q["plan_seconds"],
          note="expert capacity %d per group (GShard's 2S/E) where the "
          "config keeps its minimum of %d" % (
              paper_capacity, config.moe.min_expert_capacity),
          **_detail(q)))
  return rows


def gshard_figure_7():
  """GShard Figure 7: per-device weights stay flat from 128 to 2,048
  experts (12 layers), and grow with depth."""
  small = plan_row("gshard_moe", "128E_12L")
  big = plan_row("gshard_moe", "2048E_12L")
  return [_row(
      "GShard Figure 7", "2048E_12L / 128E_12L",
      "weight_bytes_per_device_ratio", 1.0,
      round(big["parameter_bytes_per_device"] /
            small["parameter_bytes_per_device"], 4),
      "gshard_moe.py 128E_12L, 2048E_12L", "x",
      note="'both weight memory and activation memory stay constant when "
      "the number of experts increases'; the routers' [d_model, experts] "
      "weights are replicated", seconds=0.0)]


def gshard_figure_8():
  """GShard Figure 8: the share of MoE dispatch and combine (alltoall) in
  the device time, 16% at 128 experts and 36% at 2,048 (36 layers)."""
  rows = []
  for row, share in (("128E_36L", 0.16), ("2048E_36L", 0.36)):
    p = plan_row("gshard_moe", row)
    alltoall = p["collective_seconds_by_kind"].get("alltoall", 0.0)
    rows.append(_row(
        "GShard Figure 8", row, "alltoall_share_of_step", share,
        round(alltoall / p["step_seconds"], 4), p["config"], "fraction",
        note="the paper's share of the MoE and Transformer layers' forward "
        "time; the plan's alltoall seconds over its step", seconds=0.0))
  return rows


def gshard_figure_9():
  """GShard Figure 9: allreduce and alltoall of 8 MB and 32 MB per
  partition from 16 to 2,048 partitions on TPU v3 (the time at 2,048 over
  the time at 16; the paper: allreduce about flat, alltoall ~9x)."""
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
  net = hardware.get("tpuv3").interconnect
  rows = []
  for mb in (8, 32):
    times = {}
    for kind in ("allreduce_sum", "alltoall"):
      for n in (16, 2048):
        shape = mtf.convert_to_shape("all:%d" % n)
        times[kind, n] = net.collective_seconds(
            kind, net.place(shape, [0]), mb * MB)
    for kind, paper, note in (
        ("allreduce_sum", 1.0, "'execution time independent from the number"
         " of devices'; done when <= 2x"),
        ("alltoall", 9.0, "'only increases by 9 times'")):
      rows.append(_row(
          "GShard Figure 9", "%s_%dMB" % (kind.split("_")[0], mb),
          "seconds_2048_over_16", paper,
          round(times[kind, 2048] / times[kind, 16], 4),
          "tpuv3 all:16 / all:2048", "x", note=note, seconds=0.0,
          plan_us_16=round(times[kind, 16] * 1e6, 1),
          plan_us_2048=round(times[kind, 2048] * 1e6, 1)))
  return rows


# --- GSPMD ---------------------------------------------------------------------
# GSPMD 5.1: "32-bit floating-point parameters, 16-bit floating-point
# activations, and Adafactor": the dense rows plan with bfloat16
# activations where the config does not already say so.
GSPMD_DENSE = {"activation_dtype": "bfloat16"}
GSPMD_TABLE_2 = {  # row: (paper column, step s, peak GB, FLOPS util)
    "64B_8x16": ("64B (8,16) batch 64", 5.74, 15.3, 0.627),
    "64B_16x32": ("64B (16,32) batch 256", 6.25, 13.3, 0.571),
    "64B_32x64": ("64B (32,64) batch 1024", 6.30, 15.56, 0.569),
    "128B_32x64": ("128B (32,64) batch 512", 6.31, 14.0, 0.565),
    "256B_32x64": ("256B (32,64) batch 256", 6.71, 12.9, 0.541),
    "512B_32x64": ("512B (32,64) batch 128", 7.64, 13.6, 0.475),
    "1T_32x64": ("1T (32,64) batch 128", 12.66, 15.8, 0.556),
}
# Our copy of Table 2 prints the step times apart from their columns; the
# six 2,048-or-fewer-device rows do equal flops per device (the batch
# grows with X, the depth shrinks with the batch), so their step times
# rank inversely to their FLOPS utilization, which is in column order:
# 5.74 < 6.25 < 6.30 < 6.31 < 6.71 < 7.64; 12.66 s is the 4x wider 1T.
# The text agrees: 256B is 7% over 64B on 2,048 cores, 512B 13% over
# 256B.
GSPMD_TABLE_3 = {  # row: (paper column, step s, peak GB, FLOPS util)
    "16B_4x16": ("(4,16) batch 48", 3.56, 12.4, 0.394),
    "16B_8x16": ("(8,16) batch 96", 3.43, 14.6, 0.405),
    "16B_8x32": ("(8,32) batch 192", 5.71, 14.8, 0.271),
    "16B_16x4": ("(16,4) batch 48", 3.10, 13.8, 0.457),
    "16B_16x8": ("(16,8) batch 96", 3.36, 12.7, 0.413),
    "16B_32x8": ("(32,8) batch 192", 3.37, 14.1, 0.417),
}
# Table 3's step/util pairs are printed apart from their columns too. The
# text fixes most: a smaller Y is faster at equal devices (Y=32 slowest,
# Y=4 fastest), equal Y keeps the step (Y=16: 3.43/3.56, Y=8: 3.36/3.37,
# order within each pair unknown), and the best pipeline (22.2 s for 1024
# sequences on 256 devices) is '24% slower than 2D sharding with
# (X=32, Y=8)': 3.37 s for 192.
_TABLE_3_NOTE = ("cells matched to columns from the paper's text; within "
                 "the Y=16 and Y=8 pairs the order is a guess")


def _gspmd_rows(table, module, rows_map, note=""):
  out = []
  for row, (paper_row, step, peak, util) in rows_map.items():
    p = plan_row(module, row, GSPMD_DENSE)
    extra = dict(paper_row=paper_row)
    if note:
      extra["note"] = note
    out.append(_row(table, row, "step_seconds", step,
                    round(p["step_seconds"], 4), p["config"], "s",
                    seconds=p["plan_seconds"], **dict(extra, **_detail(p))))
    implied = util * step * p["peak_flops"]
    out.append(_row(table, row, "flops_per_device", implied,
                    p["flops_per_device"], p["config"], "flop",
                    seconds=0.0, **dict(extra, note=(
                        "the paper's: FLOPS util x step x 61.5 TFLOP/s"))))
    out.append(_row(table, row, "peak_memory_gb", peak,
                    round(p["peak_bytes_per_device"] / 1e9, 2),
                    p["config"], "GB", seconds=0.0, **extra))
  return out


def gspmd_table_1():
  """GSPMD Table 1: every sharding stores O(1/(XY)) of the weights per
  device: params x 4 bytes / (X Y) on 64B (16,32)."""
  rows = []
  for variant in ("attempt1", "attempt2", "finalized"):
    p = plan_row("gspmd_dense", "64B_16x32," + variant, GSPMD_DENSE)
    paper = p["parameters"] * 4.0 / 512
    rows.append(_row("GSPMD Table 1", "2D " + variant,
                     "weight_bytes_per_device", paper,
                     p["parameter_bytes_per_device"], p["config"], "bytes",
                     note="O(1/(XY)): 4 bytes x parameters / 512",
                     seconds=p["plan_seconds"], **_detail(p)))
  return rows


def gspmd_table_2():
  rows = _gspmd_rows("GSPMD Table 2", "gspmd_dense", GSPMD_TABLE_2)
  for row, columns in GSPMD_TABLE_2.items():
    p = plan_row("gspmd_dense", row, GSPMD_DENSE)
    rows.append(_row("GSPMD Table 2", row, "parameters_2^30",
                     float(row.split("_")[0].rstrip("BT")) * (
                         1024 if row.startswith("1T") else 1),
                     round(p["parameters"] / GIB, 2), p["config"], "2^30",
                     seconds=0.0, paper_row=columns[0]))
  return rows


def gspmd_table_3():
  return _gspmd_rows("GSPMD Table 3", "gspmd_dense", GSPMD_TABLE_3,
                     _TABLE_3_NOTE)


def gspmd_table_4():
  """GSPMD Table 4: the pipelined narrow model; step time and peak per
  row, then whether the plan ranks the rows' step times as the paper."""
  gspmd_pipeline = _module("gspmd_pipeline")
  rows, planned = [], {}
  for row, (step, peak) in gspmd_pipeline.PAPER.items():
    p = plan_row("gspmd_pipeline", row, GSPMD_DENSE)
    planned[row] = p["step_seconds"]
    rows.append(_row("GSPMD Table 4", row, "step_seconds", step,
                     round(p["step_seconds"], 4), p["config"], "s",
                     seconds=p["plan_seconds"], **_detail(p)))
    rows.append(_row("GSPMD Table 4", row, "peak_memory_gb", peak,
                     round(p["peak_bytes_per_device"] / 1e9, 2),
                     p["config"], "GB", seconds=0.0))
  paper_rank = sorted(gspmd_pipeline.PAPER,
                      key=lambda r: gspmd_pipeline.PAPER[r][0])
  plan_rank = sorted(planned, key=planned.get)
  rows.append(_row("GSPMD Table 4", "all rows", "step_rank_agrees", 1.0,
                   1.0 if plan_rank == paper_rank else 0.0,
                   "gspmd_pipeline.py", "bool", seconds=0.0,
                   paper_rank=paper_rank, plan_rank=plan_rank))
  return rows


def gspmd_table_5():
  return [_row("GSPMD Table 5", "Conformer", "step_seconds", None, None,
               "", "s", note="no Conformer model in meshtf")]


def gspmd_table_6():
  gspmd_moe = _module("gspmd_moe")
  rows = []
  for row, (params, step, peak, share, util) in gspmd_moe.PAPER.items():
    p = plan_row("gspmd_moe", row)
    rows.append(_row("GSPMD Table 6", row, "step_seconds", step,
                     round(p["step_seconds"], 4), p["config"], "s",
                     seconds=p["plan_seconds"], **_detail(p)))
    rows.append(_row("GSPMD Table 6", row, "parameters_2^30", params,
                     round(p["parameters"] / GIB, 2), p["config"], "2^30",
                     seconds=0.0))
    rows.append(_row("GSPMD Table 6", row, "flops_per_device",
                     util * step * p["peak_flops"], p["flops_per_device"],
                     p["config"], "flop", seconds=0.0,
                     note="the paper's: FLOPS util x step x 61.5 TFLOP/s"))
    alltoall = p["collective_seconds_by_kind"].get("alltoall", 0.0)
    rows.append(_row("GSPMD Table 6", row, "alltoall_share_of_step", share,
                     round(alltoall / p["step_seconds"], 4), p["config"],
                     "fraction", seconds=0.0))
    rows.append(_row("GSPMD Table 6", row, "peak_memory_gb", peak,
                     round(p["peak_bytes_per_device"] / 1e9, 2),
                     p["config"], "GB", seconds=0.0))
  return rows


H100_RESULTS = os.path.join(os.path.dirname(__file__), "results",
                            "h100_2026-11-26.jsonl")


def h100_gpu_step():
  """meshtf's own measurement: bench/gpu_step.py on one H100 (every run
  of bench/results/h100_2026-11-26.jsonl) against the h100_8x_node model
  of the same graph (jit_compile off: TF's executor, one kernel per op;
  program: XLA's fused kernels)."""
  from meshtf.plan import report as report_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import config as config_lib  # pylint: disable=g-import-not-at-top
  from meshtf.train import experiment  # pylint: disable=g-import-not-at-top
  with open(H100_RESULTS) as f:
    runs = [json.loads(l) for l in f if '"bench": "gpu_step", "kind": "run"'
            in l]
  rows = []
  for run in runs:
    t0 = time.time()
    s = run["sizes"]
    c = config_lib.default_config()
    c.model_type, c.vocab_size, c.vocab_divisor = "lm", s["vocab"], 1
    c.d_model, c.num_layers, c.num_heads = (s["d_model"], s["num_layers"],
                                            s["num_heads"])
    c.d_kv, c.d_ff, c.length, c.batch_size = (s["d_kv"], s["d_ff"],
                                              s["length"], s["batch"])
    c.dropout_rate, c.moe.num_experts = 0.0, 0
    c.activation_dtype, c.optimizer = run["activation_dtype"], run[
        "optimizer"]
    c.mesh_shape, c.layout = run["mesh_shape"], run["layout"]
    layout = config_lib.mesh_layout(c)
    graph, _ = experiment.build_training_graph(c, layout)
    try:
      report = report_lib.plan(
          graph, layout, "h100_8x_node", trace=False,
          compiler="xla" if run["jit_compile"] != "off" else None)
    except TypeError:   # an older plan (--label=before): no compilers
      report = report_lib.plan(graph, layout, "h100_8x_node", trace=False)
    summary = report.summary()
    rows.append(_row(
        "H100 (bench/gpu_step.py)", "%s d_model %d batch %d" % (
            run["run"], s["d_model"], s["batch"]), "step_seconds",
        run["step_s"], round(summary["step_seconds"], 4),
        "h100_2026-11-26.jsonl: %s, jit_compile=%s" % (
            run["mesh_shape"], run["jit_compile"]), "s",
        seconds=round(time.time() - t0, 2),
        note="measured (median of 3 rounds); the paper column holds it",
        plan_flops_per_step=summary["flops_per_device"],
        measured_flops_per_step=run["flops_per_step"],
        plan_compiler=getattr(report.hardware, "compiler", "tf")))
  return rows


SECTIONS = [
    ("mtf_t1", mtf_table_1), ("mtf_t2", mtf_table_2),
    ("mtf_t3", mtf_table_3),
    ("gshard_t1", gshard_table_1), ("gshard_t3", gshard_table_3),
    ("gshard_fig7", gshard_figure_7), ("gshard_fig8", gshard_figure_8),
    ("gshard_fig9", gshard_figure_9),
    ("gspmd_t1", gspmd_table_1), ("gspmd_t2", gspmd_table_2),
    ("gspmd_t3", gspmd_table_3), ("gspmd_t4", gspmd_table_4),
    ("gspmd_t5", gspmd_table_5), ("gspmd_t6", gspmd_table_6),
    ("h100", h100_gpu_step),
]


def _fmt(v, unit):
  if v is None:
    return "--"
  if unit == "flop":
    return "%.3g" % v
  if unit == "bytes":
    return "%.3g GB" % (v / 1e9)
  if unit == "fraction":
    return "%.1f%%" % (100 * v)
  if unit == "bool":
    return "yes" if v else "no"
  if unit == "s":
    return "%.3g s" % v
  if unit == "GB":
    return "%.3g GB" % v
  if isinstance(v, float):
    return "%.0f" % v if v >= 1000 else "%.3g" % v
  return str(v)


_QUANTITY_NAMES = {
    "step_seconds": "step", "flops_per_device": "flops / device",
    "peak_memory_gb": "peak / device", "parameters_2^30": "parameters "
    "(x 2^30)", "parameters_1e9": "parameters (x 1e9)", "weights_2^30":
    "weights (x 2^30)", "alltoall_share_of_step": "alltoall share",
    "weight_bytes_per_device": "weights / device",
    "values_allreduced_per_processor": "values allreduced / processor",
    "weights_per_processor": "weights / processor",
    "flops_utilization": "flops utilization",
    "step_seconds_paper_capacity": "step, the paper's expert capacity",
    "seconds_2048_over_16":
    "time at 2,048 / at 16", "weight_bytes_per_device_ratio":
    "weights / device, ratio", "step_rank_agrees": "steps ranked as the "
    "paper's"}


def markdown_table(lines):
  """The README's reproduction tables from bench JSON lines: one per
  paper table, a row per table row, a column per quantity, each cell
  "paper / plan (plan / paper)"."""
  tables = []
  by_table = {}
  for r in lines:
    if r.get("bench") != "papers":
      continue
    if r["table"] not in by_table:
      by_table[r["table"]] = ([], {})
      tables.append(r["table"])
    quantities, rows = by_table[r["table"]]
    if r["quantity"] not in quantities:
      quantities.append(r["quantity"])
    name = r.get("paper_row", r["row"])
    rows.setdefault(name, {})[r["quantity"]] = r
  out = []
  for table in tables:
    quantities, rows = by_table[table]
    out.append("| %s | %s |" % (table, " | ".join(
        _QUANTITY_NAMES.get(q, q) for q in quantities)))
    out.append("|---" * (len(quantities) + 1) + "|")
    for name, cells in rows.items():
      texts = []
      for q in quantities:
        r = cells.get(q)
        if r is None:
          texts.append("")
        elif r["plan"] is None:
          texts.append("%s / -- (%s)" % (_fmt(r["paper"], r["unit"]),
                                          r.get("note", "")))
        elif r["paper"] is None or r["ratio"] is None:
          texts.append("-- / %s" % _fmt(r["plan"], r["unit"]))
        elif r["unit"] == "bool":
          texts.append(_fmt(r["plan"], r["unit"]))
        else:
          texts.append("%s / %s (%.2f)" % (
              _fmt(r["paper"], r["unit"]), _fmt(r["plan"], r["unit"]),
              r["ratio"]))
      out.append("| %s | %s |" % (name, " | ".join(texts)))
    out.append("")
  return "\n".join(out).rstrip() + "\n"


def compare_table(lines, *labels):
  """Markdown: every step_seconds row, the paper's value and the plans of
  labelled runs side by side (plan / paper in parentheses), in the order
  the labels are given (e.g. "before", "after"); "label=header" heads a
  run's column "plan header" (default: its label)."""
  headers = [l.split("=", 1)[-1] for l in labels]
  labels = [l.split("=", 1)[0] for l in labels]
  runs = {}
  order = []
  for r in lines:
    if r.get("quantity") != "step_seconds" or r.get("paper") is None:
      continue
    key = (r["table"], r.get("paper_row", r["row"]))
    if key not in runs:
      order.append(key)
      runs[key] = {"paper": r["paper"]}
    runs[key][r.get("label")] = r
  out = ["| table | row | paper | %s |" % " | ".join(
      "plan " + header for header in headers),
         "|---" * (len(labels) + 3) + "|"]
  for key in order:
    cells = runs[key]
    texts = []
    for label in labels:
      r = cells.get(label)
      texts.append("%.3g s (%.2f)" % (r["plan"], r["ratio"]) if r else "--")
    out.append("| %s | %s | %.3g s | %s |" % (
        key[0], key[1], cells["paper"], " | ".join(texts)))
  return "\n".join(out) + "\n"


def read_runs(paths):
  """The JSON lines of saved runs (comma-separated paths), in order."""
  lines = []
  for path in paths.split(","):
    with open(path) as f:
      lines.extend(json.loads(l) for l in f if l.strip())
  return lines


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="",
                      help="comma-separated section prefixes")
  parser.add_argument("--describe", action="store_true",
                      help="print the hardware models with their sources")
  parser.add_argument("--table", default="",
                      help="print the markdown table of a saved run "
                      "(comma-separated files: their lines together)")
  parser.add_argument("--compare", default="",
                      help="with --table: labels, comma-separated (BEFORE,"
                      "AFTER,...), each LABEL or LABEL=HEADER; the step "
                      "rows of those runs side by side")
  parser.add_argument("--label", default="",
                      help="a label every row carries (e.g. the model's "
                      "commit, to compare two runs)")
  args = parser.parse_args()
  if args.table:
    lines = read_runs(args.table)
    if args.compare:
      print(compare_table(lines, *args.compare.split(",")), end="")
    else:
      print(markdown_table(r for r in lines if not args.label or
                           r.get("label") == args.label), end="")
    return
  only = [p for p in args.only.split(",") if p]
  if args.describe:
    from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
    for name in ("tpuv2", "tpuv3"):
      print("\n".join(hardware.get(name).describe()))
    return
  for name, section in SECTIONS:
    if only and not any(name.startswith(p) for p in only):
      continue
    t0 = time.time()
    for row in section():
      row.setdefault("seconds", round(time.time() - t0, 2))
      if args.label:
        row["label"] = args.label
      print(json.dumps(row), flush=True)
      t0 = time.time()


if __name__ == "__main__":
  main()
