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

  def __init__(self):
    self._cv = threading.Condition()
    self._deadlines = {}
    self._ids = itertools.count()
    self._thread = None

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
      self._deadlines[token] = (time.monotonic() + seconds, what, state)
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="meshtf-collective-watchdog")
        self._thread.start()
      self._cv.notify()
    try:
      yield state
    finally:
      with self._cv:
        self._deadlines.pop(token, None)
        self._cv.notify()

  def _run(self):
    with self._cv:
      while True:
        if not self._deadlines:
          self._cv.wait()
          continue
        token = min(self._deadlines, key=lambda k: self._deadlines[k][0])
        deadline, what, state = self._deadlines[token]
        now = time.monotonic()
        if now < deadline:
          self._cv.wait(deadline - now)
          continue
        del self._deadlines[token]
        state["fired"] = True
        tf_context.context().abort_collective_ops(
            tf.errors.DEADLINE_EXCEEDED,
            "meshtf: collectives of %s did not complete in time" % what)


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
