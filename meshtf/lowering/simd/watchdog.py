"""The collective watchdog of the SPMD backend: one daemon thread per process
that aborts its collective ops when a watched program run passes its deadline,
and the CollectiveTimeoutError that says what such an abort means.

Example:
  >>> from meshtf.lowering.simd import watchdog
  >>> with watchdog.WATCHDOG.watch(60.0, "mesh all:8") as state:
  ...   pass               # a program run with collectives
  >>> state["fired"]
  False
"""
import contextlib
import itertools
import threading
import time

import tensorflow as tf
from tensorflow.python.eager import context as tf_context

class CollectiveTimeoutError(RuntimeError):
  """A collective's peers did not all arrive within the timeout."""


def _abort_collectives(message):
  tf_context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED,
                                            message)


class CollectiveWatchdog(object):
  """One daemon thread that aborts this process's collective ops when a
  watched program run passes its deadline (they then fail with
  DeadlineExceeded instead of waiting forever).

  Why not the ops' own timeout_seconds: TensorFlow implements it with
  Env::SchedClosureAfter, which starts a thread that sleeps for the whole
  timeout, per collective, per device, per step (measured: 32 threads per
  step of an 8-device data-parallel step, 1,681 threads after 51 steps), so
  a training loop runs out of threads within minutes.
  """

  def __init__(self, abort=None):
    # abort(message): what firing does (default: abort this process's
    # collective ops with DeadlineExceeded).
    self._abort = abort or _abort_collectives
    self._cv = threading.Condition()
    self._deadlines = {}
    self._ids = itertools.count()
    self._thread = None
    # When the thread wakes next on its own (inf: only when notified). A
    # watch whose deadline comes later needs no notify, and an exit none:
    # the thread recomputes at that time. So a training loop (one watch
    # per step, same timeout) wakes it once per timeout, not twice a step.
    self._wake_at = float("inf")

  @contextlib.contextmanager
  def watch(self, seconds, what):
    """Runs the body with a deadline of `seconds` (None/0: unwatched).
    Yields a dict whose "fired" entry says whether the watchdog aborted."""
    state = {"fired": False}
    if not seconds:
      yield state
      return
    with self._cv:
      token = next(self._ids)
      deadline = time.monotonic() + seconds
      self._deadlines[token] = (deadline, what, state)
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="meshtf-collective-watchdog")
        self._thread.start()
      if deadline < self._wake_at:
        self._cv.notify()
    try:
      yield state
    finally:
      with self._cv:
        self._deadlines.pop(token, None)

  def _run(self):
    with self._cv:
      while True:
        now = time.monotonic()
        for token in [k for k, (deadline, _, _) in self._deadlines.items()
                      if deadline <= now]:
          _, what, state = self._deadlines.pop(token)
          state["fired"] = True
          self._abort("meshtf: collectives of %s did not complete in time"
                      % what)
        if self._deadlines:
          self._wake_at = min(d for d, _, _ in self._deadlines.values())
        elif self._wake_at <= now:
          self._wake_at = float("inf")
        # Else the last deadline ended early: sleep until it anyway, so
        # that the next step's (later) deadline needs no notify.
        if self._wake_at == float("inf"):
          self._cv.wait()
        else:
          self._cv.wait(self._wake_at - now)


WATCHDOG = CollectiveWatchdog()


def explain_timeout(error, mesh_impl):
  """A CollectiveTimeoutError saying what a DeadlineExceeded means here."""
  return CollectiveTimeoutError(
      "A collective on mesh %s did not complete within %.1f s: a device or "
      "worker of the mesh is missing, stuck or failed (mesh devices: %s%s). "
      "If steps are legitimately this slow, raise collective_timeout_seconds "
      "of the SimdMeshImpl. TensorFlow said: %s" % (
          ";".join("%s:%d" % (d.name, d.size) for d in mesh_impl.shape.dims),
          mesh_impl.collective_timeout_seconds,
          ", ".join(mesh_impl.devices[:4]),
          ", ..." if mesh_impl.size > 4 else "",
          str(error).strip().splitlines()[0] if str(error).strip() else ""))
