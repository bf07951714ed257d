"""--mode=plan: what the config's training step needs per device on its
mesh and layout -- memory, flops, collectives, an estimated step time on a
hardware model -- without devices and without running anything
(meshtf/plan/). Prints one screen -- with the collectives that send the
most bytes and why each exists (the operation, the layouts that met and
their origins) -- and writes the report as JSON and a picture of every
variable's layout (meshtf/plan/pictures.py) as PNG. Its first line says
how the depth was planned: a stack of identical layers counted from a few
small plans (plan_report, meshtf/plan/repeated.py), or every layer and
why not.

  python -m meshtf.train --config=t2t_configs/gspmd_dense.py --mode=plan \\
      --config.plan_hardware=tpuv3 --model_dir=/tmp/plan_64b

Example:
  >>> result = run_plan(config, mesh_layout, "/tmp/plan", print)
  >>> result["report"]["step_seconds"] > 0
  True
"""
import copy
import json
import os
import time

PLAN_FILE = "plan.json"
# The collectives --mode=plan prints with their reasons (all of them are in
# the JSON; the most expensive first).
PLAN_TOP_COLLECTIVES = 5
PICTURE_FILE = "layouts.png"


def run_plan(config, mesh_layout, model_dir, log, layout_choice=None,
             experiment=None):
  """Plans config's training step under mesh_layout on
  config.plan_hardware; logs the report and a picture of the largest
  variable's layout, writes model_dir/plan.json and model_dir/layouts.png
  (every variable's layout; each atomically). Returns {"report": summary
  dict, "path": the JSON file, "picture": the PNG}. layout_choice: what
  --layout=auto chose and why (auto_layout.choose_layout), kept in the
  JSON as "layout_search". experiment: the run's experiment.Experiment,
  whose symbolic training graph and completed layouts (the preflight's)
  are planned as they are, not built again (default: a new one)."""
  import meshtf as mtf
  from meshtf.train import experiment as experiment_lib
  t0 = time.time()
  if experiment is None:
    experiment = experiment_lib.Experiment(config, mesh_layout)
  graph, _ = experiment.training_graph()
  report, depth = plan_report(config, mesh_layout, experiment)
  summary = report.summary()
  summary["depth"] = depth
  summary["config"] = {"mesh_shape": str(config.mesh_shape),
                       "layout": str(config.layout),
                       "variable_layout": str(config.variable_layout),
                       "activation_layout": str(config.activation_layout),
                       "batch_size": config.batch_size,
                       "length": config.length}
  if layout_choice is not None:
    summary["layout_search"] = layout_choice
  largest = max(graph.trainable_variables, key=lambda v: v.shape.size)
  log(depth["how"])
  for line in report.text().splitlines():
    log(line)
  for line in report.explain(top=PLAN_TOP_COLLECTIVES).splitlines():
    log(line)
  log("largest variable %s, per processor:" % largest.name)
  # The full graph's layouts (the preflight's), also where the plan
  # counted the layers (a counted plan has none).
  graph_layout = experiment.graph_layout()
  picture = mtf.visualize_layout(largest.outputs[0], graph_layout.
                                 tensor_mesh_layout(largest.outputs[0]))
  for line in picture.splitlines():
    log("  " + line)
  os.makedirs(model_dir, exist_ok=True)
  path = os.path.join(model_dir, PLAN_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(summary, f, indent=1, sort_keys=True, default=str)
  os.replace(tmp, path)
  picture_path = os.path.join(model_dir, PICTURE_FILE)
  mtf.plan.draw_variable_layouts(graph, graph_layout,
                                 picture_path + ".tmp", mesh_layout=mesh_layout)
  os.replace(picture_path + ".tmp", picture_path)
  log("every variable's layout drawn in %s" % picture_path)
  log("plan written to %s (%.1f s, nothing run)" % (path, time.time() - t0))
  return {"report": summary, "path": path, "picture": picture_path}


def _plan_of_depth(config, mesh_layout, depth, compiler):
  """The estimate-path PlanReport of config's model `depth` layers deep
  (both stacks of a Bitransformer)."""
  from meshtf.train import experiment as experiment_lib
  c = copy.deepcopy(config)
  c.num_layers, c.num_decoder_layers = depth, 0
  return experiment_lib.Experiment(c, mesh_layout).plan(
      config.plan_hardware, trace=False, compiler=compiler)


def plan_report(config, mesh_layout, experiment):
  """(report, depth): the plan of config's training step, and how its
  depth was planned ({"layers", "counted", "planned": the small depths
  planned, "how": one line}). Where XLA compiles the program
  (TPU hardware, a GPU with jit_compile) the collectives are estimated,
  not traced (plan(trace="auto")), and a stack of identical layers
  (experiment.layer_period) is planned at a few small depths and counted
  (meshtf/plan/repeated.py: "planned 2, 3, 4 and 5 layers and counted
  256") where those hold under half the model's layers; otherwise, or
  where a number is not affine in the depth, all layers are planned
  ("planned all 256 layers: <why>"), on experiment's graph and layouts.

  Example:
    >>> report, depth = plan_report(config, layout, experiment)
    >>> depth["how"]
    'planned 2, 3, 4 and 5 layers and counted 256'
  """
  from meshtf.plan import hardware as hardware_lib
  from meshtf.plan import repeated
  from meshtf.train import experiment as experiment_lib
  compiler = experiment_lib.plan_compiler(config)
  hw = hardware_lib.get(config.plan_hardware, compiler)
  layers = config.num_layers
  planned = []   # the small depths planned before counting was refused
  if hardware_lib.executor_threads(hw, mesh_layout.size) is not None:
    why = "TF's executor runs the program, whose traced memory is not counted"
  else:
    period, why = experiment_lib.layer_period(config)
    if period is not None:
      try:
        depths = repeated.sample_depths(layers, period)
        # The small plans build and complete their graphs, which the full
        # plan has from the preflight: counting pays from about twice
        # their layers (gspmd_moe.py's 32 layers from 4+6+8+10: 2.0 s
        # planned in full, 2.4 s counted).
        if 2 * sum(depths) >= layers:
          raise repeated.NotCounted(
              "the counting plans (%s layers) would cost more than "
              "planning the model's own" % "+".join(map(str, depths)))
        counted = repeated.count_layers(
            lambda d: _plan_of_depth(config, mesh_layout, d, compiler),
            layers, period)
        return counted, counted.depth
      except repeated.NotCounted as e:
        why, planned = str(e), e.planned
  # XLA compiles the program (fused kernels) where jit_compile is on;
  # there its collectives are estimated, not traced (plan(trace="auto")).
  report = experiment.plan(config.plan_hardware, trace="auto",
                           compiler=compiler)
  return report, {"layers": layers, "counted": False, "planned": planned,
                  "how": "planned all %d layers: %s" % (layers, why)}
