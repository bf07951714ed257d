"""Clean stops of the training binary: SIGINT (Ctrl-C) and SIGTERM (a
scheduler's preemption, `kill`).

While training steps run, the first signal is a request: the step in flight
finishes, a checkpoint is saved at that step (atomically, as every
checkpoint), and the binary says where and exits with 130 (SIGINT) or 143
(SIGTERM), the shells' 128 + signal number, without a traceback. Training
again with the same --model_dir continues from that step with the numbers
an uninterrupted run has (the data and the random numbers depend on the
step only).

In a multi-worker run the first signal to any worker stops every worker
at the same step boundary (they agree on it: meshtf/train/peers.py), the
chief saves that step and all exit 130 / 143; there it also waits while
the first step is traced, since one worker stopping at once would fail
the others' collectives.

Before the first step has run (restoring, building, tracing and lowering
the step), in eval, decode, export, plan and sweep, and on a second signal,
the binary stops at once: there is nothing new to save, and what it writes
is written atomically (checkpoints, config.json, the export's SavedModel go
to a temporary name that is renamed when complete), so nothing is left
half-written. The one line then says what model_dir keeps.

Example:
  >>> with StopRequests() as stops:          # handlers installed
  ...   with stops.deferred("training"):     # a first signal is a request
  ...     step_fn(batch)
  ...     if stops.signum is not None:
  ...       save(); raise Stopped(stops.signum, "saved ckpt-37")
"""
import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum):
  """The shell's exit status for a stop by signum: 128 + its number
  (SIGINT 130, SIGTERM 143)."""
  return 128 + int(signum)


def signal_name(signum):
  return signal.Signals(signum).name


class Stopped(Exception):
  """Training stopped on request after saving; str(e) is the one line.

  Attributes:
    signum: the signal; exit_code: 130 or 143.
  """

  def __init__(self, signum, message):
    self.signum = signum
    self.exit_code = exit_code(signum)
    super().__init__(message)


class Interrupted(BaseException):
  """A signal that stops at once (raised in the main thread by the
  handler). A BaseException, like KeyboardInterrupt: `except Exception`
  in TensorFlow or meshtf code does not swallow it.

  Attributes:
    signum: the signal; phase: what was running ("tracing and lowering
      the training step", ...); second: True when it was a second signal.
  """

  def __init__(self, signum, phase, second=False):
    self.signum = signum
    self.phase = phase
    self.second = second
    self.exit_code = exit_code(signum)
    super().__init__("%s while %s" % (signal_name(signum), phase))


class StopRequests(object):
  """Installs SIGINT and SIGTERM handlers while it is entered (in the main
  thread only; elsewhere it is inert) and restores the previous ones on
  exit. A signal raises Interrupted at once, except inside `deferred()`,
  where the first one is recorded in .signum for the caller to act on.

  Example:
    >>> with StopRequests() as stops:
    ...   stops.phase = "exporting"     # named in the one line
    ...   export()                      # a signal stops at once
  """

  def __init__(self):
    self.signum = None
    self.phase = "starting"
    self._deferring = False
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *unused):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous.clear()
    return False

  def reinstall(self):
    """Installs the handlers again (if entered): joining a TensorFlow
    cluster replaces the SIGTERM handler with TensorFlow's preemption
    notifier, which would leave a SIGTERM unanswered."""
    for s in self._previous:
      signal.signal(s, self._handle)

  def _handle(self, signum, unused_frame):
    if self._deferring and self.signum is None:
      self.signum = signum
      return
    raise Interrupted(signum, self.phase, second=self.signum is not None)

  @contextlib.contextmanager
  def deferred(self, phase):
    """Inside, a first signal is recorded (not raised); a second one still
    stops at once."""
    previous = self._deferring, self.phase
    self._deferring, self.phase = True, phase
    try:
      yield self
    finally:
      self._deferring, self.phase = previous

  @property
  def requested(self):
    return self.signum is not None


class NoStops(object):
  """The stand-in when no StopRequests is active (the library API); a
  multi-worker run may still be told to stop by another worker (.signum
  set)."""
  signum = None
  phase = ""

  @property
  def requested(self):
    return self.signum is not None

  @contextlib.contextmanager
  def deferred(self, phase):
    del phase
    yield self

  def reinstall(self):
    pass


__all__ = ["StopRequests", "NoStops", "Stopped", "Interrupted", "exit_code",
           "signal_name", "SIGNALS"]
