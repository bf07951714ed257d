"""A step's time when collectives run beside the compute that does not
need them (XLA's asynchronous collectives; NCCL's own stream).

The compute runs the ops one after another in graph order, each taking
its time from plan/fusion.py. The interconnect runs one collective at a
time: a collective can start once the op whose output it moves has
finished (its "ready" op) and must be done before the op that reads its
result starts (its "needed" op; plan/estimate.py records both). When the
interconnect is free it starts, of the collectives whose inputs are
ready, the one needed first. Not modelled: collectives sharing the links
concurrently, compute and collectives competing for HBM bandwidth, and the
compiler reordering the compute to start collectives earlier.

Example:
  >>> events = []
  >>> estimate.estimate_collectives(ops, graph_layout, timeline=events)
  >>> simulate([seconds[op] for op in all_ops], events, price)
  Timeline(step=..., compute=..., collectives=..., exposed=...)
"""
import collections

Timeline = collections.namedtuple("Timeline", [
    "step", "compute", "collectives", "exposed"])


def simulate(op_seconds, events, price):
  """The Timeline of a step: op_seconds[i] is op i's compute; events are
  collective records with "ready" and "needed" op positions; price(event)
  its seconds. exposed: the time the compute waited for collectives."""
  n = len(op_seconds)
  ready = [min(e["ready"], n - 1) if n else 0 for e in events]
  # A result is needed after its input is ready, at the latest at the end.
  needed = [min(max(e["needed"], r + 1), n) for e, r in zip(events, ready)]
  by_ready = collections.defaultdict(list)
  for k, r in enumerate(ready):
    by_ready[r].append(k)
  durations = [price(e) for e in events]
  done = {}
  queue = []          # (needed, k, ready time) of issued collectives
  free_at = 0.0       # when the interconnect is next free

  def run_one():
    nonlocal free_at
    earliest = min(r for _, _, r in queue)
    now = max(free_at, earliest)
    pick = min((q for q in queue if q[2] <= now), key=lambda q: q[:2])
    queue.remove(pick)
    free_at = now + durations[pick[1]]
    done[pick[1]] = free_at

  waiting = collections.defaultdict(list)
  for k, w in enumerate(needed):
    waiting[w].append(k)
  clock = 0.0
  for i in range(n + 1):
    for k in waiting.get(i, ()):
      while k not in done:
        run_one()
      clock = max(clock, done[k])
    if i == n:
      break
    clock += op_seconds[i]
    for k in by_ready.get(i, ()):
      queue.append((needed[k], k, clock))
  while queue:
    run_one()
  step = max([clock] + list(done.values()))
  compute = sum(op_seconds)
  return Timeline(step, compute, sum(durations), step - compute)
