r"""--layout=auto on the papers' configs: the layout the search finds vs the
paper's own, by the plan's model (hardware tpuv3, the configs' default),
without devices.

Per config, one JSON object: the paper's layout (and variable / activation
layouts) with its planned step time and peak bytes per device, the found
layout with its own, their ratio, whether the found rules are the paper's
(as a set), how many layouts were screened, and the search's seconds.
Both sides are planned at full depth with estimated collectives
(plan(trace=False), what the search ranks by).

Usage: python bench/auto_layout.py [--only=mtf_lm_table2,...]
"""
import argparse
import copy
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import meshtf.plan  # noqa: E402,F401
from meshtf.plan import report as report_lib  # noqa: E402
from meshtf.train import auto_layout  # noqa: E402
from meshtf.train import config as config_lib  # noqa: E402
from meshtf.train import experiment  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "t2t_configs")
# (name, config file, row or None, auto_memory_gb, auto_layout_dims).
# GShard's and GSPMD's float32 activations exceed a TPUv3 core's 16 GiB
# under the papers' own layouts too (they rely on bfloat16 and
# rematerialisation), so those rank without a cap (-1).
CASES = [
    ("mtf_lm_table2", "mtf_lm_table2", None, 0.0, ""),
    ("mtf_translate_table3", "mtf_translate_table3", None, 0.0, ""),
    ("gshard_128E_12L", "gshard_moe", "128E_12L", -1.0, ""),
    ("gspmd_64B_16x32", "gspmd_dense", "64B_16x32,attempt1", -1.0, ""),
]


def _planned(config):
  layout = config_lib.mesh_layout(config)
  graph, _ = experiment.build_training_graph(config, layout)
  s = report_lib.plan(graph, layout, config.plan_hardware,
                      trace=False).summary()
  return {"step_seconds": s["step_seconds"],
          "peak_bytes": s["memory_bytes_per_device"]["peak"],
          "collective_bytes": s["collective_bytes_per_device"]}


def _rules(text):
  return {r.strip() for r in str(text).split(";") if r.strip()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="")
  args = parser.parse_args()
  only = {n for n in args.only.split(",") if n}
  for name, file, row, memory_gb, dims in CASES:
    if only and name not in only:
      continue
    config = config_lib.load_file(os.path.join(CONFIGS, file + ".py"), row)
    config.auto_memory_gb = memory_gb
    config.auto_layout_dims = dims
    paper = _planned(config)
    search_config = copy.deepcopy(config)
    search_config.layout = "auto"
    t0 = time.time()
    lines = []
    choice = auto_layout.choose_layout(search_config, lines.append)
    seconds = time.time() - t0
    found = choice["candidates"][0]
    print(json.dumps({
        "config": name, "row": row, "mesh": str(config.mesh_shape),
        "hardware": config.plan_hardware,
        "memory_cap_gb": memory_gb,
        "paper_layout": str(config.layout),
        "paper_variable_layout": str(config.variable_layout),
        "paper_activation_layout": str(config.activation_layout),
        "paper": paper,
        "found_layout": choice["layout"],
        "found_variable_layout": choice["variable_layout"],
        "found": {"step_seconds": found["step_seconds"],
                  "peak_bytes": found["memory_bytes_per_device"]["peak"],
                  "collective_bytes": found["collective_bytes_per_device"]},
        "found_is_paper": (_rules(choice["layout"]) ==
                           _rules(config.layout) and
                           _rules(choice["variable_layout"]) ==
                           _rules(config.variable_layout)),
        "step_ratio_found_to_paper": found["step_seconds"] /
                                     paper["step_seconds"],
        "screened": choice["screened"], "search_seconds": seconds,
        "search_log": lines[0]}), flush=True)


if __name__ == "__main__":
  main()
