"""Planning a stack of identical layers by counting them: a model whose
layers repeat (same structure and layout every `period` layers) is
planned at four small depths k, k + p, k + 2p, k + 3p (plan/report.py's
estimate path), and where every number of the summary is affine in the
depth there -- integers exactly, seconds to float rounding -- the N-layer
numbers are the first depth's plus (N - k) / p periods' increment.
Where one is not, or where counting could not be exact, the caller plans
all N layers (NotCounted says why, in one line).

What is counted and what is derived:
  counted: flops (by family), the bytes the ops touch, every memory
    number, the step's and the compute's seconds, and each collective
    record's count and elements (its reasons' counts too);
  derived, as plan/report.py derives them: each record's bytes (from its
    elements), the collective bytes and seconds (priced record by
    record), the exposed seconds, fits_in_memory, the utilization.
Not counted (NotCounted): a number not affine at the four depths; a
record whose elements grow with the depth (a gradient bucket filling with
every layer) reaching the bucket cap by N layers (the Lowering's Bucketer
would split it); an activation peak growing slower than the activations
kept for the backward pass (the peak sits in a part of the step the
layers do not scale, and a later layer's would overtake it); a traced
program's memory (executor hardware: plan/program_memory.py walks the
program itself). A CountedPlan has no per-op detail (accounting, fused
kernels, timeline, graph layout): plan the full graph for those. Its
reasons (top_collectives, explain()) are counted per pattern; the example
of each is the deepest small plan's first (op names of that graph).

Example:
  >>> counted = count_layers(lambda d: plan_graph_of_depth(d), 256, 1)
  >>> counted.how
  'planned 2, 3, 4 and 5 layers and counted 256'
  >>> counted.summary()["step_seconds"]
"""
import collections

from meshtf.layouts import relayout as relayout_lib
from meshtf.layouts.relayout import CollectiveKind
from meshtf.lowering import bucketing
from meshtf.plan import hardware as hardware_lib
from meshtf.plan import report as report_lib

SAMPLES = 4          # depths planned: k, k + p, k + 2p, k + 3p
RELATIVE = 1e-9      # float rounding allowed in an affine number


class NotCounted(ValueError):
  """The layers cannot be counted exactly; str(e) says why, in one line.
  planned: the depths planned before it was known (count_layers)."""

  def __init__(self, message, planned=()):
    super().__init__(message)
    self.planned = list(planned)


def sample_depths(layers, period, first=None):
  """The depths count_layers plans for `layers` layers repeating every
  `period`: first (default 2 * period) and SAMPLES - 1 more periods.
  Raises NotCounted where layers is not past them or not a whole number
  of periods after the first.

  Example:
    >>> sample_depths(256, 1)
    [2, 3, 4, 5]
    >>> sample_depths(64, 2)
    [4, 6, 8, 10]
  """
  first = 2 * period if first is None else first
  depths = [first + i * period for i in range(SAMPLES)]
  if layers <= depths[-1]:
    raise NotCounted("%d layers are not more than the %d counting plans" % (
        layers, depths[-1]))
  if (layers - first) % period:
    raise NotCounted("%d layers are not %d plus whole periods of %d" % (
        layers, first, period))
  return depths


def _integer(values):
  return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _scale(name, values, depths, layers):
  """values (at depths) at `layers` layers, if affine in the depth; else
  raises NotCounted naming the number."""
  periods = (layers - depths[0]) // (depths[1] - depths[0])
  if _integer(values):
    step = values[1] - values[0]
    if any(b - a != step for a, b in zip(values, values[1:])):
      raise NotCounted("%s is not affine in depth (%s at %s layers)" % (
          name, ", ".join(map(str, values)),
          ", ".join(map(str, depths))))
    return values[0] + periods * step
  step = (values[-1] - values[0]) / (len(values) - 1)
  scale = max(abs(v) for v in values)
  if any(abs(v - (values[0] + i * step)) > RELATIVE * scale
         for i, v in enumerate(values)):
    raise NotCounted("%s is not affine in depth (%s at %s layers)" % (
        name, ", ".join("%.6g" % v for v in values),
        ", ".join(map(str, depths))))
  return values[0] + periods * step


def _scale_dict(name, dicts, depths, layers):
  keys = list(dicts[-1])
  if any(list(d) != keys for d in dicts):
    raise NotCounted("%s has other entries at other depths (%s)" % (
        name, " / ".join(",".join(sorted(d)) for d in dicts)))
  return {k: _scale("%s[%s]" % (name, k), [d[k] for d in dicts], depths,
                    layers) for k in keys}


def _check_bucket(what, records, depths, layers):
  """Raises NotCounted where records (at the first two depths) grow into
  an allreduce reaching the Bucketer's cap by `layers` layers: it would
  be split there, into buckets the small plans do not have."""
  first, second = records
  grows = second["elements_per_device"] - first["elements_per_device"]
  if not grows or not CollectiveKind(second["kind"]).is_allreduce:
    return
  itemsize = hardware_lib.slice_bytes(second) // second["elements_per_device"]
  elements = first["elements_per_device"] + grows * (
      (layers - depths[0]) // (depths[1] - depths[0]))
  cap = bucketing.check_bucket_bytes(None)
  if elements * itemsize >= cap:
    raise NotCounted(
        "%s grows by %d elements every %d layer(s): a gradient bucket "
        "that reaches the %d-byte bucket cap by %d layers (the Bucketer "
        "splits it)" % (what, grows, depths[1] - depths[0], cap, layers))


def _scale_reasons(patterns, count, depths, layers):
  """[(pattern, count at `layers` layers, example Reason)] of one record:
  patterns {pattern: ([count at each depth], Reason)}. A pattern's count
  affine in the depth is counted; the rest of the record's count goes to
  the others as the deepest plan has them (a reason the depth changes,
  as the op that a sum over the MoE layers' losses ends in: the numbers
  do not depend on it)."""
  out, others = [], []
  for p, (counts, why) in patterns.items():
    try:
      out.append((p, _scale("", counts, depths, layers), why))
    except NotCounted:
      others.append((p, counts[-1], why))
  rest = count - sum(n for _, n, _ in out)
  if others and rest != sum(n for _, n, _ in others):
    others = [(others[0][0], rest, others[0][2])]
  return out + others


def _scale_records(reports, depths, layers):
  """[(record without reasons, [(pattern, count, example Reason)])] at
  `layers` layers: each record's count and elements counted, its bytes
  derived from its elements; records that become equal merged."""
  lists = [r.collectives for r in reports]
  if len({len(c) for c in lists}) != 1:
    raise NotCounted("the collectives are %s records at %s layers" % (
        ", ".join(str(len(c)) for c in lists),
        ", ".join(map(str, depths))))
  scaled = collections.OrderedDict()
  for i, records in enumerate(zip(*lists)):
    last = records[-1]
    what = "collective %d (%s over %s)" % (i, last["kind"],
                                            "+".join(last["mesh_axes"]))
    if any((r["kind"], list(r["mesh_axes"]), r["group_size"]) !=
           (last["kind"], list(last["mesh_axes"]), last["group_size"])
           for r in records):
      raise NotCounted("%s is another collective at other depths" % what)
    count = _scale(what + "'s count", [r["count"] for r in records],
                   depths, layers)
    elements = _scale(what + "'s elements",
                      [r["elements_per_device"] for r in records], depths,
                      layers)
    if all(r["elements_per_device"] == last["elements_per_device"]
           for r in records):
      if any(r["bytes_per_device"] != last["bytes_per_device"]
             for r in records):
        raise NotCounted("%s's bytes change with the depth" % what)
      nbytes = last["bytes_per_device"]
    else:
      # Grows with the depth: a bucket of every layer's small gradients.
      itemsize = hardware_lib.slice_bytes(last) // last["elements_per_device"]
      if any(relayout_lib.collective_bytes(r["kind"], r["group_size"],
                                           r["elements_per_device"],
                                           itemsize) != r["bytes_per_device"]
             for r in records):
        raise NotCounted("%s's bytes are not its elements' (%d bytes each)"
                         % (what, itemsize))
      _check_bucket(what, records[:2], depths, layers)
      nbytes = relayout_lib.collective_bytes(last["kind"], last["group_size"],
                                             elements, itemsize)
    patterns = collections.OrderedDict()
    for k, r in enumerate(records):
      reasons = list(r.get("reasons") or ())
      reasons += [None] * (r["count"] - len(reasons))
      for reason in reasons:
        key = reason.pattern if reason is not None else None
        entry = patterns.setdefault(key, [[0] * len(records), None])
        entry[0][k] += 1
        if k == len(records) - 1 and entry[1] is None:
          entry[1] = reason   # the first in the deepest plan, as plan()
    groups = _scale_reasons(patterns, count, depths, layers)
    key = (last["kind"], tuple(last["mesh_axes"]), last["group_size"],
           elements, nbytes)
    entry = scaled.setdefault(key, [0, []])
    entry[0] += count
    entry[1].extend(g for g in groups if g[1] > 0)
  return [(dict(kind=k[0], mesh_axes=list(k[1]), group_size=k[2],
                elements_per_device=k[3], bytes_per_device=k[4],
                count=count), groups)
          for k, (count, groups) in scaled.items() if count]


class CountedPlan(report_lib.PlanReport):
  """A PlanReport of `layers` identical layers counted from plans of a
  few (count_layers): the summary, text, top collectives and their
  reasons; no per-op detail (accounting, operations, timeline_events and
  graph_layout are None: plan the full graph for those).

  Attributes (beyond PlanReport's): layers, depths (those planned),
  samples (their PlanReports), how (one line: "planned 2, 3, 4 and 5
  layers and counted 256").
  """

  def __init__(self, samples, depths, layers, period, totals, groups):
    last = samples[-1]
    super().__init__(last.mesh_layout, last.hardware, None,
                     [dict(r, reasons=[why for _, n, why in g
                                       for _ in range(n)])
                      for r, g in groups],
                     collectives_source=last.collectives_source)
    self.samples = samples
    self.depths = depths
    self.layers = layers
    self.period = period
    # The counted totals summary() derives the rest from: memory, flops,
    # touched (bytes), flops_by_family, compute (seconds, with the step
    # overhead) and step (seconds).
    self._totals = totals
    self.how = "planned %s and %d layers and counted %d" % (
        ", ".join(map(str, depths[:-1])), depths[-1], layers)
    self.depth = {"layers": layers, "planned": depths, "counted": True,
                  "how": self.how}

  def memory(self):
    return dict(self._totals["memory"])

  def memory_model(self):
    return self.samples[-1].memory_model()

  def op_seconds(self):
    raise ValueError("a counted plan (%s) has no per-op times: plan the "
                     "full graph for them" % self.how)

  def timeline(self):
    return None

  def compute_seconds(self):
    return self._totals["compute"] - self.hardware.step_overhead

  def step_seconds(self):
    return self._totals["step"]

  def summary(self):
    """PlanReport.summary's dict, derived from the counted totals as
    report.py derives a plan's, with the depth line in "assumptions" and
    "depth" (self.depth)."""
    t = self._totals
    s = self._summary_of(self.memory(), t["flops"], t["touched"],
                         dict(t["flops_by_family"]), t["compute"], t["step"])
    s["assumptions"] = s["assumptions"] + [
        "depth: %s: every number of the %d plans is affine in the depth, "
        "the %d-layer numbers are the first plan's plus %d periods of %d "
        "layers' increment (meshtf/plan/repeated.py)" % (
            self.how, len(self.depths), self.layers,
            (self.layers - self.depths[0]) // self.period, self.period)]
    s["depth"] = dict(self.depth)
    return s

  def _step_rule(self):
    return self.samples[-1]._step_rule()  # pylint: disable=protected-access

  def text(self):
    lines = super().text().splitlines()
    return "\n".join(lines[:1] + ["depth: %s (meshtf/plan/repeated.py)"
                                  % self.how] + lines[1:])


def count_layers(plan_at, layers, period, first=None):
  """The CountedPlan of a stack of `layers` layers repeating every
  `period` (see the module docstring): plan_at(depth) -> the PlanReport of
  the same model `depth` layers deep, asked at sample_depths(layers,
  period, first). Raises NotCounted (one line) where the layers cannot be
  counted exactly: the caller plans all of them.

  Example:
    >>> counted = count_layers(plan_of_depth, 64, 1)
    >>> counted.depths, counted.how
    ([2, 3, 4, 5], 'planned 2, 3, 4 and 5 layers and counted 64')
  """
  depths = sample_depths(layers, period, first)
  samples = []
  try:
    return _count(plan_at, layers, period, depths, samples)
  except NotCounted as e:
    raise NotCounted(str(e), depths[:len(samples)]) from None


def _count(plan_at, layers, period, depths, samples):
  for d in depths:
    samples.append(plan_at(d))
    if len(samples) == 2 and len({len(r.collectives) for r in samples}) == 1:
      # A bucket that will split is seen at two depths: no more plans.
      for i, pair in enumerate(zip(*(r.collectives for r in samples))):
        _check_bucket("collective %d (%s over %s)" % (
            i, pair[1]["kind"], "+".join(pair[1]["mesh_axes"])), pair,
                      depths, layers)
  if any(r.program_memory is not None for r in samples):
    raise NotCounted("the traced program's memory (TF's executor) is not "
                     "counted")
  summaries = [r.summary() for r in samples]
  last = summaries[-1]
  for key in ("mesh", "layout", "hardware", "collectives_source",
              "memory_model", "assumptions"):
    if any(s[key] != last[key] for s in summaries):
      raise NotCounted("the plans' %s differ with the depth" % key)
  one = lambda name: _scale(  # noqa: E731
      name, [s[name] for s in summaries], depths, layers)
  memory = _scale_dict("memory_bytes_per_device",
                       [s["memory_bytes_per_device"] for s in summaries],
                       depths, layers)
  peak, saved = ([s["memory_bytes_per_device"][k] for s in summaries]
                 for k in ("activations_peak", "activations_saved"))
  if peak[1] - peak[0] < saved[1] - saved[0]:
    raise NotCounted(
        "the activation peak grows by %d bytes a period, less than the "
        "%d kept for the backward pass: it is not where the layers are"
        % (peak[1] - peak[0], saved[1] - saved[0]))
  # In the order a not-affine number is met (and named) as before.
  flops = one("flops_per_device")
  touched = _scale("bytes touched", [r.accounting.bytes for r in samples],
                   depths, layers)
  step, compute = one("step_seconds"), one("compute_seconds")
  groups = _scale_records(samples, depths, layers)
  totals = {"memory": memory, "flops": flops, "touched": touched,
            "flops_by_family": _scale_dict(
                "flops_by_family", [s["flops_by_family"] for s in summaries],
                depths, layers),
            "compute": compute, "step": step}
  return CountedPlan(samples, depths, layers, period, totals, groups)


__all__ = ["CountedPlan", "NotCounted", "count_layers", "sample_depths",
           "SAMPLES"]
