"""The streaming input pipeline: batches of packed rows read from files as
training goes, deterministic, sharded by batch row and resumable.

Every row of a batch is a LANE. Lane j reads the units (meshtf/train/
sources.py: 64 KiB byte ranges of text files, whole gzip / TFRecord files,
TFDS shards) of the global slots j, j + B, j + 2B, ... (B: the batch size),
where slot s is unit order_e[s mod U] of epoch e = s div U (U units; order_e
a permutation fixed by (seed, e)). A unit's documents are tokenized, shuffled
in windows by (seed, e, unit), run through the objective
(meshtf/train/objectives.py) and packed; the lane serves its rows one per
step. So:

- the batch of step k is a function of (seed, k, the files, the batch
  size, the length, the objective and the vocabulary) -- not of the worker
  count or how many batches this process read before;
- a process reads only the lanes of the rows its processors hold
  (`rows=`, mtf.host_rows), so a worker of a multi-worker mesh reads only
  its units;
- a lane's position is two numbers: its slot ordinal n and the rows r it
  served of that unit. `state()` gives every lane's position after the
  last batch served; it is saved in the checkpoint's meta.json (atomic with
  it) and `restore(state)` continues from it by reading one unit per lane
  from its start: resuming at step 1,000 does not read 1,000 batches;
- memory and time to the first batch depend on the batch size and the row
  length, not on the corpus: a lane holds one unit's window of documents.

Reading runs ahead of the step: the next batch is made in a background
thread while the step runs, its lanes over `reader_threads` threads.

Where it cannot hold: a gzip or TFRecord file is one unit (neither can
seek), so a lane restarts such a file from its beginning on resume (only
the current file); files that changed since the checkpoint, or another
batch size, length, objective or vocabulary, change what every lane reads:
the positions are then dropped, with a warning, and the data starts again
from its beginning.

Example:
  >>> stream = Stream(units, sources.ReadSpec("text"), objective, 8,
  ...                 vocab=vocab)
  >>> stream.batch(0)["targets"].shape
  (8, 128)
  >>> again = Stream(units, sources.ReadSpec("text"), objective, 8,
  ...                vocab=vocab)
  >>> again.restore(stream.state())       # continues at step 1
"""
import concurrent.futures
import hashlib
import json
import os
import threading
import time

import numpy as np

from meshtf.train import errors
from meshtf.train import objectives as objectives_lib
from meshtf.train import sources

STATE_VERSION = 1
# Documents per tokenization call, and the shuffling window of a unit.
WINDOW_DOCUMENTS = 512
WINDOW_BYTES = 1 << 16


class Stream(object):
  """Packed batches from units of files; see the module docstring.

  Args:
    units: sources.Unit list (fixed order: part of what the data is).
    spec: sources.ReadSpec of the units.
    objective: objectives.Objective.
    batch_size: rows per batch = lanes.
    seed: the order of units per epoch and the shuffling and noise.
    vocab: a vocabulary.Vocabulary for text documents (None: the documents
      are token ids already).
    reader_threads: lanes read in parallel (1: in the calling thread).
    prefetch: make the next batch in the background after each batch.
    cache: keep every batch made (held-out batches, read again each eval).
    name: what the data is, for messages.
  """

  def __init__(self, units, spec, objective, batch_size, seed=0, vocab=None,
               reader_threads=2, prefetch=True, cache=False,
               name="the data"):
    self.units = list(units)
    if not self.units:
      raise errors.DataError("%s has no data" % name)
    self.spec = spec
    self.objective = objective
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.vocab = vocab
    self.name = name
    self.reader_threads = max(1, int(reader_threads))
    self._pool = (concurrent.futures.ThreadPoolExecutor(
        self.reader_threads, thread_name_prefix="meshtf-reader")
        if self.reader_threads > 1 else None)
    self._prefetcher = (concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="meshtf-prefetch") if prefetch else None)
    self._cache = {} if cache else None
    self._lock = threading.Lock()
    self._orders = {}
    self._lanes = {}        # lane -> _Lane (positioned after _served)
    self._served = {}       # lane -> (n, r) after the last batch served
    self._next_step = 0     # the step the lanes are positioned for
    self._fresh_lanes = False   # lanes missing from _served start at 0
    self._pending = None    # (step, rows, Future) of the prefetch
    self.fingerprint = fingerprint(self)

  # --- where each lane reads ---------------------------------------------------
  def slot_unit(self, slot):
    """(epoch, unit index) of a global slot.

    Example:
      >>> stream.slot_unit(0)
      (0, 17)
    """
    epoch, i = divmod(int(slot), len(self.units))
    order = self._orders.get(epoch)
    if order is None:
      order = np.random.default_rng([self.seed, epoch, 7]).permutation(
          len(self.units))
      if len(self._orders) > 64:
        self._orders.clear()
      self._orders[epoch] = order
    return epoch, int(order[i])

  def unit_rows(self, slot):
    """The packed rows of a slot's unit, as a generator."""
    epoch, u = self.slot_unit(slot)
    shuffle_rng = np.random.default_rng([self.seed, epoch, u, 1])
    noise_rng = np.random.default_rng([self.seed, epoch, u, 2])
    documents = sources.read_unit(self.units[u], self.spec)
    tokenized = self._tokenized(documents, shuffle_rng)
    packer = objectives_lib.Packer(self.objective.features,
                                   self.objective.length)
    for example in self.objective.examples(tokenized, noise_rng):
      for row in packer.add(example):
        yield row
    for row in packer.flush():
      yield row

  def _tokenized(self, documents, rng):
    """Documents as token ids (one array, or a pair for pair objectives),
    shuffled in windows of WINDOW_DOCUMENTS or WINDOW_BYTES."""
    window, size = [], 0
    for doc in documents:
      window.append(doc)
      size += sum(len(d) for d in doc)
      if len(window) >= WINDOW_DOCUMENTS or size >= WINDOW_BYTES:
        yield from self._window(window, rng)
        window, size = [], 0
    if window:
      yield from self._window(window, rng)

  def _window(self, window, rng):
    columns = list(zip(*window))
    ids = []
    for column in columns:
      if isinstance(column[0], str):
        if self.vocab is None:
          raise errors.DataError(
              "%s holds text but no vocabulary was given" % self.name)
        ids.append(self.vocab.encode_batch(column))
      else:
        ids.append(list(column))
    docs = list(zip(*ids))
    for i in rng.permutation(len(docs)):
      doc = docs[i]
      yield doc if self.objective.pairs else doc[0]

  # --- batches -------------------------------------------------------------
  def batch(self, step, batch_size=None, seed=None, rows=None):
    """The rows `rows` (default all) of the batch of `step`: a dict of
    [len(rows), length] arrays. Steps in order read on; another step
    repositions (from the positions of the last batch served: a step before
    it reads its lanes again from the start). batch_size and seed are the
    stream's (the arguments are Data.batch's).

    Example:
      >>> stream.batch(5, rows=[4, 5, 6, 7])["targets"].shape
      (4, 128)
    """
    if batch_size is not None and int(batch_size) != self.batch_size:
      raise ValueError("this stream makes batches of %d rows, not %d" % (
          self.batch_size, batch_size))
    del seed   # fixed when the stream was made
    rows = tuple(range(self.batch_size)) if rows is None else tuple(
        int(r) for r in rows)
    key = (int(step), rows)
    if self._cache is not None and key in self._cache:
      return dict(self._cache[key])
    with self._lock:
      pending, self._pending = self._pending, None
      if pending is not None and pending[:2] == key:
        batch, positions = pending[2].result()
      else:
        if pending is not None:   # made for another step: lanes rewound
          _wait(pending[2])
          self._lanes = {}
        self._seek(int(step), rows)
        batch, positions = self._make(rows)
      self._served.update(positions)
      self._next_step = int(step) + 1
      if self._prefetcher is not None:
        self._pending = (self._next_step, rows,
                         self._prefetcher.submit(self._make, rows))
    if self._cache is not None:
      self._cache[key] = dict(batch)
    return batch

  def _lane(self, j):
    lane = self._lanes.get(j)
    if lane is None:
      if j in self._served:
        n, r = self._served[j]
        lane = _Lane(self, j, n, r)
      else:
        lane = _Lane(self, j, 0, 0)
        if self._next_step and not self._fresh_lanes:
          for _ in range(self._next_step):   # a lane new at this step
            lane.next_row()
      self._lanes[j] = lane
    return lane

  def _seek(self, step, rows):
    """Positions the lanes of `rows` for `step`."""
    if step < self._next_step:
      self._lanes, self._served, self._next_step = {}, {}, 0
      self._fresh_lanes = False
    lanes = [self._lane(j) for j in rows]
    for _ in range(step - self._next_step):
      self._map(lambda lane: lane.next_row(), lanes)
    for lane in lanes:
      self._served[lane.j] = (lane.n, lane.r)
    self._next_step = step

  def _map(self, fn, items):
    """[fn(x) for x in items], in reader_threads groups of lanes at once
    (one task per group: a row is usually cheap, a new window is not)."""
    if self._pool is None or len(items) == 1:
      return [fn(x) for x in items]
    n = min(self.reader_threads, len(items))
    groups = [items[i::n] for i in range(n)]
    done = list(self._pool.map(lambda g: [fn(x) for x in g], groups))
    out = [None] * len(items)
    for i, results in enumerate(done):
      out[i::n] = results
    return out

  def _make(self, rows):
    lanes = [self._lane(j) for j in rows]
    got = self._map(lambda lane: lane.next_row(), lanes)
    batch = {k: np.stack([row[k] for row, _ in got]) for k in got[0][0]}
    return batch, {j: pos for j, (_, pos) in zip(rows, got)}

  # --- positions ---------------------------------------------------------------
  def state(self):
    """Every lane's position after the last batch served (JSON-able).

    Example:
      >>> stream.state()["step"], stream.state()["lanes"]["0"]
      (100, [3, 12])
    """
    with self._lock:
      return {"version": STATE_VERSION, "step": self._next_step,
              "lanes": {str(j): [int(n), int(r)]
                        for j, (n, r) in sorted(self._served.items())},
              "data": dict(self.fingerprint)}

  def restore(self, state, step):
    """Continues from `state` (a state() of a run of this data) at `step`;
    returns None, or one line saying why the positions cannot be used (the
    stream then starts the data from its beginning at `step`)."""
    with self._lock:
      if self._pending is not None:
        _wait(self._pending[2])
        self._pending = None
      self._lanes, self._served = {}, {}
      self._next_step = int(step)
      self._fresh_lanes = True
      if not state:
        return ("the checkpoint of step %d holds no input position (it was "
                "saved by another version of meshtf or without one): the "
                "data starts again from its beginning" % step)
      why = _mismatch(state, self.fingerprint, step)
      if why:
        return why
      self._served = {int(j): (int(n), int(r))
                      for j, (n, r) in state["lanes"].items()}
      self._fresh_lanes = False
      return None

  def close(self):
    for pool in (self._pool, self._prefetcher):
      if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


class _Lane(object):
  """One batch row's reader: slot ordinal n, rows r served of its unit."""

  def __init__(self, stream, j, n, r):
    self.stream, self.j, self.n, self.r = stream, j, n, r
    self._rows = None

  def _open(self):
    self._rows = self.stream.unit_rows(
        self.j + self.n * self.stream.batch_size)
    for _ in range(self.r):   # resuming inside a unit
      if next(self._rows, None) is None:
        break

  def next_row(self):
    """(row, (n, r) after it)."""
    opened = 0
    while True:
      if self._rows is None:
        self._open()
        opened += 1
      row = next(self._rows, None)
      if row is not None:
        self.r += 1
        return row, (self.n, self.r)
      self._rows, self.n, self.r = None, self.n + 1, 0
      if opened > len(self.stream.units):
        raise errors.DataError(
            "%s has no example: every document is blank or shorter than "
            "the objective needs" % self.stream.name)


def _wait(future):
  try:
    future.result()
  except Exception:  # pylint: disable=broad-except
    pass   # a prefetch for a step no longer wanted: its error is moot


# --- what the positions are positions in ---------------------------------------
def fingerprint(stream):
  """What a stream's positions depend on: its units (files by name and
  size), batch size, length, objective, seed and vocabulary."""
  files = hashlib.sha1()
  sizes = {}
  for unit in stream.units:
    if unit.path not in sizes:
      try:
        sizes[unit.path] = os.path.getsize(unit.path)
      except OSError:
        sizes[unit.path] = -1
      files.update(("%s:%d;" % (os.path.basename(unit.path),
                                sizes[unit.path])).encode())
  files.update(("units=%d" % len(stream.units)).encode())
  obj = stream.objective
  vocab = stream.vocab
  return {"files": files.hexdigest()[:16], "units": len(stream.units),
          "batch_size": stream.batch_size, "length": obj.length,
          "objective": "%s:%g:%g:%s" % (obj.name, obj.noise_density,
                                        obj.mean_noise_span_length,
                                        obj.decoder_only),
          "seed": stream.seed,
          "vocab": (hashlib.sha1(vocab.model_proto).hexdigest()[:16]
                    if vocab is not None else "")}


def _mismatch(state, current, step):
  if state.get("version") != STATE_VERSION:
    return ("the checkpoint of step %d holds an input position of another "
            "format (version %s): the data starts again from its beginning"
            % (step, state.get("version")))
  saved = state.get("data", {})
  differ = [k for k in sorted(current) if saved.get(k) != current[k]]
  if differ:
    words = {"files": "the data files (names or sizes)", "units": "the "
             "data files", "batch_size": "batch_size", "length": "length",
             "objective": "the objective", "seed": "seed",
             "vocab": "the vocabulary"}
    return ("the input position saved at step %d is for other data: %s "
            "changed since: the data starts again from its beginning, so "
            "the batches from step %d on are not an uninterrupted run's" % (
                step, " and ".join(sorted({words[k] for k in differ})),
                step))
  return None


# --- multi-worker: the chief saves every worker's lanes ------------------------
POSITIONS_PREFIX = ".input-positions-"


def positions_path(model_dir, step, worker):
  return os.path.join(model_dir, "%s%d-w%d.json" % (POSITIONS_PREFIX, step,
                                                    worker))


def write_positions(model_dir, step, worker, state):
  """A non-chief worker's lane positions for the chief's checkpoint of
  `step` (written before the checkpoint's collectives, through a
  temporary file).

  Example:
    >>> write_positions("/shared/m", 100, 1, stream.state())
  """
  path = positions_path(model_dir, step, worker)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(state, f)
  os.replace(tmp, path)


def gather_positions(model_dir, step, num_workers, own, timeout_s=120.0):
  """(the lanes of every worker merged into the chief's `own` state, the
  workers whose positions did not come within timeout_s). The files read
  are removed.

  Example:
    >>> state, missing = gather_positions("/shared/m", 100, 2, own)
  """
  merged = dict(own)
  merged["lanes"] = dict(own.get("lanes", {}))
  missing = []
  deadline = time.time() + timeout_s
  for worker in range(1, num_workers):
    path = positions_path(model_dir, step, worker)
    while not os.path.exists(path) and time.time() < deadline:
      time.sleep(0.05)
    try:
      with open(path) as f:
        merged["lanes"].update(json.load(f)["lanes"])
      os.remove(path)
    except (OSError, ValueError, KeyError):
      missing.append(worker)
  return merged, missing


__all__ = ["Stream", "fingerprint", "write_positions", "gather_positions",
           "positions_path", "POSITIONS_PREFIX", "STATE_VERSION"]
