"""Automatic layout: search the layout rules for a graph's dims over a
mesh's axes, rank them by predicted step time under a per-device memory
cap, as the plan report predicts them (accounting.py for memory and flops,
estimate.py for the collectives: no tracing, a few milliseconds per
candidate on the tests' models).

The candidates are every assignment of the graph's dims to a mesh axis,
several axes (`x+y`, in mesh order) or none, such that

  no tensor and no operation's dim group (an einsum's dims, ...) has two
    dims on one axis (the MeshLayout's own rule, checked while the
    assignment grows, so invalid branches are never enumerated);
  a dim is split only over axes whose processors it can fill (size >= the
    number of shards: more would only add padding);
  every mesh axis splits something (an idle axis replicates all the work:
    a smaller mesh does the same);
  every operation accepts its layout (MeshLayout.assign, e.g. a conv's
    spatial dim over one axis).

For the fastest candidates (and the smallest), a weight-update-sharding
variant (GSPMD 3.2, ZeRO) is tried too: the variables stored split over
the axes that split the batch, each on its largest dim that can take them.

Example:
  >>> result = search([graph], "x:2;y:4", hardware="tpuv3")
  >>> result.best.rules, result.best.step_seconds
  ('batch:x;d_ff:y;heads:y;vocab:y', 0.0123)
"""
import collections
import itertools

from meshtf import shapes
from meshtf.layouts import errors
from meshtf.layouts import mesh_layout as mesh_layout_lib
from meshtf.lowering import lowering as lowering_lib
from meshtf.plan import accounting
from meshtf.plan import estimate
from meshtf.plan import fusion
from meshtf.plan import hardware as hardware_lib
from meshtf.plan import report as report_lib

# Candidates enumerated at most (the search refuses larger spaces with a
# line saying which dims to leave out).
MAX_CANDIDATES = 20000
# How many of the fastest and of the smallest candidates get a
# weight-update-sharding variant.
VARIANTS_OF = 20


class Candidate(collections.namedtuple("Candidate", [
    "rules", "variable_rules", "step_seconds", "compute_seconds",
    "collective_seconds", "peak_bytes", "collective_bytes", "fits"])):
  """One layout and what the screen predicts for it (per device, per step;
  for several graphs, their weighted sum)."""

  def describe(self):
    """One line: the layout and its numbers."""
    variables = ("; variables %s" % self.variable_rules
                 if self.variable_rules else "")
    return ("%-40s step %.4g s (compute %.3g + collectives %.3g), peak "
            "%.4g MB, %.4g MB sent%s%s" % (
                self.rules, self.step_seconds, self.compute_seconds,
                self.collective_seconds, self.peak_bytes / 1e6,
                self.collective_bytes / 1e6, variables,
                "" if self.fits else " (does not fit)"))


class SearchResult(collections.namedtuple("SearchResult", [
    "ranked", "evaluated", "invalid", "memory_cap", "mesh_shape",
    "hardware"])):
  """ranked: [Candidate] that fit, fastest first, then those that do not,
  smallest first. evaluated / invalid: how many layouts were screened /
  refused by an operation."""

  @property
  def best(self):
    return self.ranked[0] if self.ranked and self.ranked[0].fits else None


def layout_dims(graphs):
  """{dim name: largest size} of every dim a graph's tensors have."""
  sizes = {}
  for graph in graphs:
    for op in lowering_lib.all_operations(graph.operations):
      for t in op.outputs:
        for d in t.shape.dims:
          sizes[d.name] = max(sizes.get(d.name, 0), d.size)
  return sizes


def conflict_groups(graphs):
  """The sets of dim names that may not share a mesh axis: each tensor's,
  and each operation's dim groups; sets inside another set dropped."""
  groups = set()
  for graph in graphs:
    for op in lowering_lib.all_operations(graph.operations):
      for t in list(op.inputs) + op.outputs:
        groups.add(frozenset(t.shape.dimension_names))
      for g in op.layout_dim_groups():
        groups.add(frozenset(g))
  groups = sorted((g for g in groups if len(g) > 1), key=len, reverse=True)
  kept = []
  for g in groups:
    if not any(g <= k for k in kept):
      kept.append(g)
  return kept


def _axis_options(mesh_shape, size):
  """The axis tuples a dim of `size` may split over: one axis, or several
  in mesh order, each filling no more processors than the dim has."""
  names = mesh_shape.dimension_names
  out = []
  for n in range(1, len(names) + 1):
    for axes in itertools.combinations(names, n):
      if 1 < mesh_shape.group_size(axes) <= size:
        out.append(axes)
  return out


def candidate_rules(graphs, mesh_shape, dims=None,
                    max_candidates=MAX_CANDIDATES):
  """Every valid assignment of dims (default: all of the graphs') to mesh
  axes (see the module docstring), as rule lists [(dim, axes)], fewest
  splits first. Raises ValueError (one line) when there are more than
  max_candidates.

  Example:
    >>> candidate_rules([graph], mtf.convert_to_shape("x:4"))[0]
    [('batch', ('x',))]
  """
  mesh_shape = shapes.convert_to_shape(mesh_shape)
  sizes = layout_dims(graphs)
  names = sorted(sizes if dims is None else [d for d in dims if d in sizes],
                 key=lambda n: (-sizes[n], n))
  options = {n: _axis_options(mesh_shape, sizes[n]) for n in names}
  names = [n for n in names if options[n]]
  groups = [g for g in conflict_groups(graphs)]
  groups_of = {n: [g for g in groups if n in g] for n in names}
  all_axes = set(mesh_shape.dimension_names)
  out = []
  chosen = {}

  def used_axes(name):
    return {a for g in groups_of[name] for other in g if other in chosen
            for a in chosen[other]}

  def grow(i):
    if len(out) > max_candidates:
      return
    if i == len(names):
      if chosen and {a for axes in chosen.values() for a in axes} == all_axes:
        out.append(sorted(chosen.items(), key=lambda p: names.index(p[0])))
      return
    name = names[i]
    grow(i + 1)                       # not split
    taken = used_axes(name)
    for axes in options[name]:
      if not taken & set(axes):
        chosen[name] = axes
        grow(i + 1)
        del chosen[name]

  grow(0)
  if len(out) > max_candidates:
    raise ValueError(
        "layout search: more than %d candidate layouts of dims %s over mesh "
        "%s: name fewer dims to search (dims=[...], the binary's "
        "--config.auto_layout_dims)" % (max_candidates, ",".join(names),
                                         mesh_shape))
  out.sort(key=len)
  return out


def rules_text(rules):
  """[(dim, axes)] as a layout string: 'batch:x+y;vocab:y'."""
  return ";".join("%s:%s" % (n, "+".join(a)) for n, a in rules)


def _screen(graphs, weights, layout, hw, cap):
  """The weighted per-device numbers of one MeshLayout, or None when an
  operation refuses it."""
  step = compute = comm = peak = sent = 0.0
  for graph, w in zip(graphs, weights):
    ops = list(graph.operations)
    try:
      graph_layout = layout.assign(lowering_lib.all_operations(ops))
    except errors.LayoutError:
      return None
    fused = (accounting.fused_kernels(fusion.fusions(ops, graph_layout))
             if hw.compiler is hardware_lib.Compiler.XLA
             else None)   # as plan() counts memory
    acc = accounting.account(ops, graph_layout, graph.backward_start, fused)
    events = []
    records = estimate.estimate_collectives(ops, graph_layout,
                                            timeline=events)
    # The report's own timing rules (what plan(trace=False) says).
    report = report_lib.PlanReport(layout, hw, acc, records, graph_layout,
                                   "estimated", operations=ops,
                                   timeline_events=events)
    c, m = report.compute_seconds(), report.collective_seconds()
    compute += w * c
    comm += w * m
    step += w * report.step_seconds()
    peak += w * acc.memory["peak"]
    sent += w * sum(r["bytes_per_device"] * r["count"] for r in records)
  return step, compute, comm, peak, sent


def weight_update_rules(rules, graphs, mesh_shape):
  """The variable rules that store every variable split over the axes
  that split the dim named batch, on its largest dim free of those axes
  (each dim at least as large as the processors it fills); "" when the
  batch is not split.

  Example:
    >>> weight_update_rules([("batch", ("x",))], [graph], "x:8")
    'd_ff:x;d_model:x;vocab:x'
  """
  mesh_shape = shapes.convert_to_shape(mesh_shape)
  batch = dict(rules).get("batch")
  if not batch:
    return ""
  shards = mesh_shape.group_size(batch)
  taken = {n for n, a in rules if set(a) & set(batch)}
  sizes = {}
  for graph in graphs:
    for v in graph.trainable_variables:
      for d in v.outputs[0].shape.dims:
        if d.name not in taken and d.size >= shards:
          sizes[d.name] = max(sizes.get(d.name, 0), d.size)
  return ";".join("%s:%s" % (n, "+".join(batch)) for n in
                  sorted(sizes, key=lambda n: (-sizes[n], n)))


def search(graphs, mesh_shape, hardware="cpu", weights=None,
           memory_cap=None, variable_rules="", dims=None,
           weight_update_sharding=True, max_candidates=MAX_CANDIDATES):
  """Ranks the candidate layouts of graphs (usually one graph; several
  with weights for a deep model screened at two small depths:
  cost(L) = sum_i weights[i] * cost(graph_i)) on mesh_shape. memory_cap:
  bytes per device (default: the hardware's memory; 0: none).
  variable_rules: the variables' own rules for every candidate (when
  given, no weight-update-sharding variants are tried). Returns a
  SearchResult.

  Example:
    >>> result = search([graph], "data:4;model:2", "cpu")
    >>> print(result.best.describe())
  """
  hw = hardware_lib.get(hardware)
  mesh_shape = shapes.convert_to_shape(mesh_shape)
  weights = list(weights) if weights is not None else [1.0] * len(graphs)
  cap = hw.memory_bytes if memory_cap is None else memory_cap
  screened, invalid = [], 0

  def evaluate(rules, vrules):
    nonlocal invalid
    text = rules_text(rules)
    layout = mesh_layout_lib.MeshLayout(mesh_shape, text,
                                        variable_rules=vrules or None)
    numbers = _screen(graphs, weights, layout, hw, cap)
    if numbers is None:
      invalid += 1
      return None
    step, compute, comm, peak, sent = numbers
    c = Candidate(text, vrules, step, compute, comm, peak, sent,
                  not cap or peak <= cap)
    screened.append(c)
    return c

  all_rules = candidate_rules(graphs, mesh_shape, dims, max_candidates)
  by_text = {}
  for rules in all_rules:
    c = evaluate(rules, variable_rules)
    if c is not None:
      by_text[c.rules] = rules
  if weight_update_sharding and not variable_rules:
    base = [c for c in screened]
    chosen = (sorted(base, key=lambda c: c.step_seconds)[:VARIANTS_OF] +
              sorted(base, key=lambda c: c.peak_bytes)[:VARIANTS_OF])
    for c in dict.fromkeys(chosen):
      vrules = weight_update_rules(by_text[c.rules], graphs,
                                    mesh_shape)
      if vrules:
        evaluate(by_text[c.rules], vrules)
  ranked = (sorted((c for c in screened if c.fits),
                   key=lambda c: (c.step_seconds, c.peak_bytes)) +
            sorted((c for c in screened if not c.fits),
                   key=lambda c: (c.peak_bytes, c.step_seconds)))
  return SearchResult(ranked, len(screened), invalid, cap, mesh_shape,
                      hw.name)
