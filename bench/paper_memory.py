r"""The papers' largest configurations against their 16 GB TPU v3 cores:
each row's planned memory per device (meshtf/plan/, the estimate path:
nothing traced or run, seconds per row) beside the peak the paper reports.

Rows (GSPMD = Xu et al. 2021, GShard = Lepikhin et al. 2020):
  GSPMD Table 2: the dense 64B model, 2D finalized sharding, on 8x16,
    16x32 and 32x64 cores, and the 1T model on 32x64;
  GSPMD Table 4: the 16B narrow model pipelined in 4 stages on a
    (4, 16, 4) mesh, batch 16 x 64 and 32 x 32 (microbatches x size;
    t2t_configs/gspmd_pipeline.py);
  GSPMD Table 6: the sparse MoE language model, 32 to 2048 experts, one
    expert per core (t2t_configs/gspmd_moe.py);
  the Table 4 rows again without rematerialization (remat "none"), to
    show what it buys, and the Table 6 rows under the other policies
    (none, einsum_outputs, full), with the flops each adds to none's;
  GShard Figure 7 / Table 1: MoE(512E, 36L) and MoE(2048E, 36L), which
    "fit in 16 GB" there (36L with rematerialization).

Per row, one JSON object: the config (file:row and any overrides), the
paper's peak (GB = 1e9 bytes; null where the paper gives only "< 16 GB"),
the plan's parameters, optimizer state, activations kept for the backward
pass and peak per device (GB), whether the peak fits 16 GiB, the ratio to
the paper's peak, the flops per device (GSPMD Table 6: also the paper's,
its FLOPS utilization x step x 61.5 TFLOP/s -- the profiler's count,
recomputation included, GSPMD 5.2 -- and, where the run has the row's
remat "none" plan, the flops the policy adds to it), the graph's op count
and the seconds to build and plan.

Usage: python bench/paper_memory.py [--rows=table2_64B_16x32,...]
    [--out=FILE]   (also writes the JSON lines to FILE)
"""
import argparse
import importlib.util
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import meshtf as mtf  # noqa: E402
import meshtf.plan  # noqa: E402,F401
from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import experiment  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
GIB = float(1 << 30)
# name: (paper peak GB or None, config file, row, overrides)
ROWS = [
    ("table2_64B_8x16", 15.3, "gspmd_dense.py", "table2_64B_8x16", {}),
    ("table2_64B_16x32", 13.3, "gspmd_dense.py", "table2_64B_16x32", {}),
    ("table2_64B_32x64", 15.56, "gspmd_dense.py", "table2_64B_32x64", {}),
    ("table2_1T_32x64", 15.8, "gspmd_dense.py", "table2_1T_32x64", {}),
    # Table 4 (remat full inside the re-run stage) after what its
    # rematerialization buys: the paper's settings but remat "none" (the
    # model's flops, to which the recompute adds).
    ("table4_16x64_remat_none", 11.5, "gspmd_pipeline.py", "4x16x4_16x64",
     {"remat": "none"}),
    ("table4_16x64", 11.5, "gspmd_pipeline.py", "4x16x4_16x64", {}),
    ("table4_32x32_remat_none", 13.1, "gspmd_pipeline.py", "4x16x4_32x32",
     {"remat": "none"}),
    ("table4_32x32", 13.1, "gspmd_pipeline.py", "4x16x4_32x32", {}),
] + [
    # Table 6 (gspmd_moe.py; the config's remat is weight_einsum_outputs)
    # and the row under the other policies as context: none first, whose
    # flops (the model's) the others' recompute adds to.
    spec for row, experts, peak in (
        ("10B_32E", 32, 10.8), ("37B_128E", 128, 11.2),
        ("145B_512E", 512, 11.2), ("577B_2048E", 2048, 11.6))
    for spec in [
        ("table6_%dE_remat_none" % experts, peak, "gspmd_moe.py", row,
         {"remat": "none"}),
        ("table6_%dE" % experts, peak, "gspmd_moe.py", row, {}),
        ("table6_%dE_remat_einsum_outputs" % experts, peak, "gspmd_moe.py",
         row, {"remat": "einsum_outputs"}),
        ("table6_%dE_remat_full" % experts, peak, "gspmd_moe.py", row,
         {"remat": "full"})]
] + [
    ("gshard_512E_36L", None, "gshard_moe.py", "table1_512E_36L", {}),
    ("gshard_2048E_36L", None, "gshard_moe.py", "table1_2048E_36L", {}),
]


def load(config_file, row, overrides):
  c = config_lib.load_file(os.path.join(CONFIGS, config_file), row)
  for key, value in overrides.items():
    target = c
    parts = key.split(".")
    for p in parts[:-1]:
      target = target[p]
    target[parts[-1]] = value
  return c


def paper_flops(config_file, row, peak_flops):
  """The paper's flops per device where its table gives FLOPS utilization
  and step time (GSPMD Table 6: gspmd_moe.PAPER): utilization x step x
  the core's peak (the hardware model's, with its source), else None."""
  if config_file != "gspmd_moe.py":
    return None
  spec = importlib.util.spec_from_file_location(
      "gspmd_moe", os.path.join(CONFIGS, config_file))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  _, step, _, _, util = module.PAPER[row]
  return util * step * peak_flops


def plan_row(name, paper_gb, config_file, row, overrides):
  t0 = time.perf_counter()
  c = load(config_file, row, overrides)
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  t1 = time.perf_counter()
  report = mtf.plan.plan(graph, layout, "tpuv3", trace=False)
  mem = report.memory()
  t2 = time.perf_counter()
  gb = lambda b: round(b / 1e9, 3)  # noqa: E731
  out = {
      "bench": "paper_memory", "row": name, "config": "%s:%s" % (
          config_file, row), "overrides": overrides,
      "mesh": c.mesh_shape, "batch_size": c.batch_size,
      "activation_dtype": c.get("activation_dtype", "float32"),
      "remat": c.get("remat", "none"),
      "paper_peak_gb": paper_gb,
      "parameters_gb": gb(mem["parameters"]),
      "optimizer_state_gb": gb(mem["optimizer_state"]),
      "activations_kept_gb": gb(mem["activations_saved"]),
      "activation_peak_gb": gb(mem["activations_peak"]),
      "peak_gb": gb(mem["peak"]),
      "peak_gib": round(mem["peak"] / GIB, 3),
      "fits_16gib": mem["peak"] <= 16 * GIB,
      "ratio_to_paper": (round(mem["peak"] / 1e9 / paper_gb, 3)
                         if paper_gb else None),
      "flops_per_device": report.accounting.flops,
      "paper_flops_per_device": paper_flops(config_file, row,
                                            report.hardware.peak_flops),
      "graph_ops": len(graph.operations),
      "build_s": round(t1 - t0, 2), "plan_s": round(t2 - t1, 2),
      "machine": platform.machine(), "cpus": os.cpu_count()}
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="",
                      help="comma-separated row names (default all)")
  parser.add_argument("--out", default="", help="also write JSON lines here")
  parser.add_argument("--spec", default="",
                      help="a JSON file of rows [[name, paper_gb, config "
                      "file, row, overrides], ...] instead of ROWS")
  args = parser.parse_args()
  rows = ROWS
  if args.spec:
    with open(args.spec) as f:
      rows = [tuple(r) for r in json.load(f)]
  chosen = [r for r in args.rows.split(",") if r]
  out = open(args.out, "w") if args.out else None
  model_flops = {}   # (config, row) -> remat none's flops
  for spec in rows:
    if chosen and spec[0] not in chosen:
      continue
    result = plan_row(*spec)
    if result["remat"] == "none":
      model_flops[result["config"]] = result["flops_per_device"]
    none = model_flops.get(result["config"])
    result["flops_vs_remat_none"] = (
        round(result["flops_per_device"] / none, 4) if none else None)
    if result["paper_flops_per_device"]:
      result["flops_vs_paper"] = round(
          result["flops_per_device"] / result["paper_flops_per_device"], 4)
    line = json.dumps(result)
    print(line, flush=True)
    if out:
      out.write(line + "\n")
      out.flush()


if __name__ == "__main__":
  main()
