"""--layout=auto: the binary picks the layout rules (and a weight-update-
sharding variable layout) for the config's model on its mesh, by predicted
step time under a per-device memory cap (meshtf/plan/search.py), before
any device exists. It prints the five best with their numbers and trains
(or plans) with the best.

A deep model is screened at two small depths and extrapolated linearly
(cost(L) = cost(d1) + (L - d1) / (d2 - d1) * (cost(d2) - cost(d1)), d1 and
d2 one and two periods of its layer pattern: MoE on every other layer has
period 2), then the best few are planned at full depth. The MoE group
count follows the layout (moe.num_groups = 0), so the screened graphs are
built with the groups split over the whole mesh, a count every candidate
divides evenly.

  python -m meshtf.train --config=t2t_configs/lm_tiny.py --layout=auto \\
      --model_dir=/tmp/lm_auto

Example:
  >>> choice = choose_layout(config, print)
  >>> choice["layout"], choice["variable_layout"]
  ('batch:data;d_ff:model', '')
"""
import copy
import time

from meshtf.train import config as config_lib

AUTO = "auto"
SHOWN = 5          # candidates printed
REPLANNED = 8      # candidates planned again at full depth


def wants_auto(config):
  return str(config.layout).strip() == AUTO


def _memory_cap(config, hw):
  gb = float(config.auto_memory_gb)
  if gb < 0:
    return 0                        # no cap
  return int(gb * 1e9) if gb > 0 else hw.memory_bytes


def _with(config, **values):
  """A copy of config with some keys set (the config itself unchanged)."""
  c = copy.deepcopy(config)
  for k, v in values.items():
    c[k] = v
  return c


def screening_graphs(config, mesh_layout):
  """(graphs, weights, note): the training graphs whose weighted costs
  stand for the config's (see the module docstring), each an Experiment's
  of its depth on mesh_layout."""
  from meshtf.train import experiment
  layers = config.num_layers
  decoder = config.num_decoder_layers or layers
  # Layers after which the stack's pattern repeats (MoE every other layer:
  # 2), or None when it does not (explicit MoE layer indices).
  period, _ = experiment.moe_layer_period(config)
  if period is None or decoder != layers or layers <= 2 * period:
    graph, _ = experiment.Experiment(config, mesh_layout).training_graph()
    return [graph], [1.0], "the full model"
  d1, d2 = period, 2 * period
  graphs = [experiment.Experiment(
      _with(config, num_layers=d, num_decoder_layers=0),
      mesh_layout).training_graph()[0] for d in (d1, d2)]
  k = (layers - d1) / float(d2 - d1)
  return graphs, [1.0 - k, k], ("%d- and %d-layer models extrapolated to "
                                "%d layers" % (d1, d2, layers))


def _finalist(config, candidate):
  """The Experiment of a search candidate at full depth: config with the
  candidate's layout and variable layout, on the MeshLayout the run would
  parse from it (config_lib.mesh_layout), so that the chosen one's graph
  and completed layouts serve the run (resolve). Planned without the
  activation layout, as the screening is; with one the run's graph differs
  (its annotations) and is built again."""
  from meshtf.train import experiment
  c = _with(config, layout=candidate.rules,
            variable_layout=candidate.variable_rules)
  if c.activation_layout:
    c.activation_layout = ""
  return experiment.Experiment(c, config_lib.mesh_layout(c))


def choose_layout(config, log):
  """Searches the layouts of config's model on config.mesh_shape (see the
  module docstring); logs the search and its five best; returns {"layout",
  "variable_layout", "candidates": [summary dicts], "screened", "seconds"}.
  Raises ConfigError (one line) when no layout fits the memory cap, the
  search space is too large, or auto_layout_dims names unknown dims."""
  return _choose(config, log)[0]


def _choose(config, log):
  """choose_layout's (choice, the chosen finalist's Experiment)."""
  from meshtf import layouts
  from meshtf.plan import hardware as hardware_lib
  from meshtf.plan import search as search_lib
  t0 = time.time()
  # Everything but the layout is checked first, one line per problem.
  config_lib.validate(_with(config, layout=""), check_layout=False,
                      check_data=False)
  hw = hardware_lib.get(config.plan_hardware)
  cap = _memory_cap(config, hw)
  mesh = layouts.MeshLayout(str(config.mesh_shape))
  all_axes = "+".join(mesh.mesh_shape.dimension_names)
  build_layout = layouts.MeshLayout(mesh.mesh_shape, "group:" + all_axes)
  graphs, weights, note = screening_graphs(config, build_layout)
  dims = [d.strip() for d in str(config.auto_layout_dims).split(",")
          if d.strip()] or None
  known = search_lib.layout_dims(graphs)
  unknown = [d for d in dims or [] if d not in known]
  if unknown:
    raise config_lib.ConfigError([
        "auto_layout_dims names %s, which the model does not have: use "
        "some of %s" % (",".join(unknown), ",".join(sorted(known)))])
  variable_rules = str(config.variable_layout).strip()
  try:
    result = search_lib.search(graphs, mesh.mesh_shape, hw.name, weights,
                               cap, variable_rules, dims)
  except ValueError as e:
    raise config_lib.ConfigError(["--layout=auto: %s" % str(e).splitlines()[
        0]])
  screened = time.time() - t0
  # The best few again at full depth (memory and collectives exact for the
  # real graph, not extrapolated), each with its own MoE group count.
  finalists = []
  # The fastest finalist that fits so far (the first of equals, as the
  # stable sort below) keeps its Experiment: one full-depth graph is kept
  # besides the one being planned.
  chosen, chosen_key = (None, None), None
  for c in result.ranked[:REPLANNED]:
    finalist = _finalist(config, c)
    summary = finalist.plan(hw.name, trace=False, compiler=None).summary()
    finalists.append((c, summary))
    peak = summary["memory_bytes_per_device"]["peak"]
    key = (summary["step_seconds"], peak)
    if (not cap or peak <= cap) and (chosen_key is None or key < chosen_key):
      chosen, chosen_key = (c, finalist), key
  fits = [f for f in finalists if not cap or
          f[1]["memory_bytes_per_device"]["peak"] <= cap]
  if not fits:
    smallest = min(result.ranked, key=lambda c: c.peak_bytes)
    raise config_lib.ConfigError([
        "--layout=auto: no layout of this model on mesh %s fits %.4g GB "
        "per device (%s): the smallest needs %.4g GB (%s); use more "
        "processors, a smaller --batch_size, or --config.auto_memory_gb=-1 "
        "to rank without a cap" % (
            config.mesh_shape, cap / 1e9, hw.name, smallest.peak_bytes / 1e9,
            smallest.rules + (" with variables " + smallest.variable_rules
                              if smallest.variable_rules else ""))])
  fits.sort(key=lambda f: (f[1]["step_seconds"],
                           f[1]["memory_bytes_per_device"]["peak"]))
  log("layout search: %d layouts of %d dims over mesh %s screened on %s "
      "(%s) in %.1f s, %d refused by an operation; memory cap %s" % (
          result.evaluated, len(dims or known), config.mesh_shape, hw.name,
          note, screened, result.invalid,
          "%.4g GB" % (cap / 1e9) if cap else "none"))
  log("the %d fastest that fit, planned at full depth:" % min(SHOWN,
                                                              len(fits)))
  shown = []
  for i, (c, s) in enumerate(fits[:SHOWN]):
    mem = s["memory_bytes_per_device"]
    log("  %d. layout %s%s" % (i + 1, c.rules, (
        "; variables " + c.variable_rules) if c.variable_rules else ""))
    log("     step %.4g s (compute %.4g + collectives %.4g); peak %.4g MB "
        "(parameters %.4g, optimizer %.4g, activations %.4g); %.4g MB sent"
        % (s["step_seconds"], s["compute_seconds"], s["collective_seconds"],
           mem["peak"] / 1e6, mem["parameters"] / 1e6,
           mem["optimizer_state"] / 1e6, mem["activations_peak"] / 1e6,
           s["collective_bytes_per_device"] / 1e6))
    shown.append(dict(s, layout=c.rules, variable_layout=c.variable_rules))
  best, _ = fits[0]
  log("using layout %s%s (%.1f s)" % (best.rules, (
      "; variables " + best.variable_rules) if best.variable_rules else "",
      time.time() - t0))
  return {"layout": best.rules, "variable_layout": best.variable_rules,
          "candidates": shown, "screened": result.evaluated,
          "seconds": time.time() - t0}, (
              chosen[1] if chosen[0] is best else None)


def resolve(config, log):
  """If config.layout is "auto", chooses it (choose_layout) and sets
  config.layout and config.variable_layout to the choice; returns (the
  choice dict, the chosen finalist's experiment.Experiment: its full-depth
  graph and completed layouts, which the run's preflight, header, plan and
  step reuse where its config is the run's -- Experiment.adopt), else
  (None, None)."""
  if not wants_auto(config):
    return None, None
  choice, chosen = _choose(config, log)
  config.layout = choice["layout"]
  config.variable_layout = choice["variable_layout"]
  return choice, chosen
