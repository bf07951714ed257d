"""A multi-worker run when a worker is lost, and when one is told to stop.

A lost or hung worker. TensorFlow's collectives fail on every worker when
one member is gone, and the binary turns that failure, caught where the
step (or the save, or an eval) was called, into ClusterError's one line on
every other worker: which worker was lost (task and host:port), during
what (the step), what model_dir keeps (the newest checkpoint and its step)
and the command that resumes. Exit code 3. How long it takes:

- a worker whose process ends (killed, crashed, its machine rebooted):
  its connections close and its peers' collectives fail at once;
- a worker that stops answering but keeps its connections (SIGSTOP, a
  hung host, a network partition): its heartbeats to TensorFlow's
  coordination service (on task 0) stop, and after
  config.peer_timeout_seconds the service fails every other worker's
  collectives; when task 0 itself stops, the others' heartbeats to it fail
  after the same time. That is the bound of the loss being known:
  peer_timeout_seconds, plus the check below (PEER_CHECK_SECONDS); a
  survivor then exits within peer_timeout_seconds + PEER_CHECK_SECONDS
  more (the linger below), so at most 2 x (peer_timeout_seconds +
  PEER_CHECK_SECONDS) after the loss. Choose it above the
  longest pause a healthy worker makes (a heartbeat is a C++ thread, so a
  long step does not delay it; 30 s by default, a few seconds in tests);
- a worker alive but stuck outside collectives: the collective watchdog
  (SimdMeshImpl.collective_timeout_seconds, 600 s; 4x for a first run).

Which worker is lost is asked, not guessed from TensorFlow's text: each
survivor asks every other worker's TensorFlow server for its health (in
parallel, PEER_CHECK_SECONDS each), then keeps answering the others'
questions before it exits (linger): until every worker it found healthy
has exited, or peer_timeout_seconds + PEER_CHECK_SECONDS have passed, and
LINGER_SECONDS at least. A survivor that exited right after its own check
would be named as lost too by one that asks later (a loaded host; seen on
4 workers on 2 cores, tests/train/test_cluster.py). TensorFlow's
own messages (RingReduce aborts, 'Restart your program to reset') go to
model_dir/tensorflow-task<i>.log, not the terminal.

A stop (preemption). SIGTERM or SIGINT to any one worker must stop every
worker at the same step boundary, because a checkpoint gathers the
variables' slices from all of them: StopAgreement takes each worker's stop
request (its signal number and task; 0: none) and maxes it over every
processor of the mesh, one allreduce of one int32 per step boundary. All
then stop after the same step, the chief saves that step, and every worker
exits 130 / 143 with one line naming the worker that was told to stop.
tf.distribute's PreemptionCheckpointHandler does the same with its
coordination service's key-value store; one collective is simpler here.

Example:
  >>> agree = StopAgreement(session.impl, workers)
  >>> agree(None)            # at a step boundary, on every worker
  (None, None)
  >>> agree(signal.SIGTERM)  # on task 2 (the others pass None)
  (15, 2)
"""
import os
import re
import shlex
import sys
import threading
import time

from meshtf.train import errors

PEER_CHECK_SECONDS = 3.0
LINGER_SECONDS = 4.0
_TASK_BITS = 10     # a stop request is (signal << _TASK_BITS) | task
_HEARTBEAT_LOSS = re.compile(
    r"unhealthy \(stopped sending heartbeats\):\s*/job:[^/\s]+"
    r"(?:/replica:\d+)?/task:(\d+)")


# --- a lost worker ------------------------------------------------------------
def is_peer_failure(error):
  """True for the errors a lost, stopped or stuck worker causes in the
  others' collectives (TensorFlow's UNAVAILABLE, DEADLINE_EXCEEDED,
  ABORTED, CANCELLED; meshtf's CollectiveTimeoutError).

  Example:
    >>> is_peer_failure(tf.errors.UnavailableError(None, None, "closed"))
    True
  """
  import tensorflow as tf
  from meshtf.lowering import simd
  return isinstance(error, (tf.errors.UnavailableError,
                            tf.errors.DeadlineExceededError,
                            tf.errors.AbortedError, tf.errors.CancelledError,
                            simd.CollectiveTimeoutError)) or (
                                isinstance(error, tf.errors.InternalError)
                                and "Collective ops is aborted" in str(error))


def unhealthy_workers(workers, error=None, timeout_seconds=PEER_CHECK_SECONDS):
  """{task: why} of the other workers that do not answer TensorFlow's peer
  health check (asked in parallel, timeout_seconds each); a task that the
  coordination service named in `error` as out of heartbeats is lost too.
  Before this worker's TensorFlow server runs (its join failed) the
  question is whether anything listens on a worker's port.

  Example:
    >>> unhealthy_workers(workers)
    {2: 'its process is gone: connection refused'}
  """
  from meshtf.lowering import cluster
  found = {}
  joined = cluster.local_job_and_task() is not None
  job = cluster.local_job_and_task()[0] if joined else "worker"

  def ask(task):
    try:
      if joined:
        from tensorflow.python.eager import context
        context.context().check_collective_ops_peer_health(
            "/job:%s/replica:0/task:%d" % (job, task),
            int(1000 * timeout_seconds))
      else:
        _listens(workers.hosts[task], timeout_seconds)
    except Exception as e:  # pylint: disable=broad-except
      found.setdefault(task, _health_reason(e, timeout_seconds))
  threads = [threading.Thread(target=ask, args=(t,), daemon=True)
             for t in range(workers.num_workers) if t != workers.index]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout_seconds + 2.0)
  # The coordination service names a worker out of heartbeats; the check
  # above says more (gone, or not answering) where it got an answer.
  for m in _HEARTBEAT_LOSS.finditer(str(error or "")):
    found.setdefault(int(m.group(1)), "its heartbeats stopped")
  return dict(found)


def _listens(address, timeout_seconds):
  """Raises OSError unless something accepts connections at address."""
  import socket
  name, _, port = address.rpartition(":")
  socket.create_connection((name.strip("[]"), int(port)),
                           timeout=timeout_seconds).close()


def _health_reason(error, timeout_seconds):
  if isinstance(error, ConnectionRefusedError):
    return "its process is gone: connection refused"
  if isinstance(error, OSError) and "timed out" in str(error):
    return "it does not answer: no reply in %.0f s, stopped or hung" % \
        timeout_seconds
  text = str(error)
  if "Connection refused" in text or "failed to connect" in text:
    return "its process is gone: connection refused"
  if "Deadline Exceeded" in text or "DEADLINE_EXCEEDED" in text:
    return "it does not answer: no reply in %.0f s, stopped or hung" % \
        timeout_seconds
  if "Socket closed" in text:
    return "its process ended: its connection closed"
  lines = [l for l in text.splitlines() if l.strip()]
  return lines[0][:120] if lines else type(error).__name__


def lost_worker_error(workers, error, doing, model_dir, mesh_size,
                      peer_timeout_seconds, argv=None):
  """The ClusterError (one line) of a collective that failed because a
  worker was lost: which one (asked: unhealthy_workers), during what, what
  model_dir keeps and the command that resumes. Waits LINGER_SECONDS
  first, so that the other survivors' health checks reach this worker.

  Example:
    >>> lost_worker_error(w, e, "step 16", "/tmp/m", 4, 30.0)
    ClusterError('worker task 2 (127.0.0.1:2224) was lost during step 16
    (its process is gone: connection refused): /tmp/m keeps ckpt-15 ...')
  """
  started = time.monotonic()
  lost = unhealthy_workers(workers, error)
  linger(workers, lost, started + max(
      LINGER_SECONDS, peer_timeout_seconds + PEER_CHECK_SECONDS))
  if lost:
    who = "; ".join("worker %s was lost during %s (%s)" % (
        workers.describe(t), doing, why) for t, why in sorted(lost.items()))
  else:
    from meshtf.lowering import simd
    kind = ("a collective did not complete in time"
            if isinstance(error, simd.CollectiveTimeoutError) else
            "a collective failed (%s)" % type(error).__name__)
    who = ("%s during %s, and every other worker answers: one is stuck or "
           "its connection broke (TensorFlow's messages: %s)" % (
               kind, doing, log_path(model_dir, workers.index)))
  return errors.ClusterError("%s: %s. %s" % (
      who, kept_line(model_dir), resume_line(workers, mesh_size, argv)))


def linger(workers, lost, until, poll_seconds=0.5):
  """Keeps this worker (its TensorFlow server, which answers the health
  checks) running after it named the lost workers, so that the other
  survivors' checks find it: until every worker it found healthy has
  exited (refuses connections) or `until` (time.monotonic()) has passed,
  and at least LINGER_SECONDS from now. A survivor that asks later than
  this one (a loaded host; one told of the loss by the coordination
  service, up to peer_timeout_seconds later) would otherwise find it gone
  and name it as lost too.

  Example:
    >>> linger(workers, {2: "its process is gone"}, time.monotonic() + 8)
  """
  least = time.monotonic() + LINGER_SECONDS
  waiting = [t for t in range(workers.num_workers)
             if t != workers.index and t not in lost]
  while time.monotonic() < until:
    if waiting and time.monotonic() >= least:
      gone = unhealthy_workers(workers, None, 1.0)
      waiting = [t for t in waiting if not gone.get(t, "").startswith(
          ("its process is gone", "its process ended"))]
    if not waiting and time.monotonic() >= least:
      return
    time.sleep(poll_seconds)


def kept_line(model_dir):
  """What model_dir keeps, for the lost-worker line."""
  from meshtf.train import checkpoint
  try:
    found = checkpoint.CheckpointManager(model_dir).checkpoints()
  except OSError:
    found = []
  if not found:
    return "%s holds no checkpoint yet (training starts again from step 0)" \
        % model_dir
  step, path = found[-1]
  return "%s keeps %s (step %d); the steps after it are lost" % (
      model_dir, os.path.basename(path), step)


def resume_line(workers, mesh_size, argv=None):
  """How to go on: the same command on every worker; any worker count that
  divides the mesh.

  Example:
    >>> resume_line(w, 4, ["python", "-m", "meshtf.train", "--task_index=1"])
    'To resume, start every worker again with the same command ...'
  """
  counts = [n for n in range(1, mesh_size + 1) if mesh_size % n == 0]
  command = _command(argv)
  return ("To resume, start every worker again with the same "
          "command (%s, with each worker's task index), or with a "
          "--worker_hosts list of %s workers (the mesh has %d processors), "
          "or on one machine: python -m meshtf.train.launch --workers=N -- "
          "<the flags>" % (command, ", ".join(str(n) for n in counts),
                           mesh_size))


def _command(argv=None):
  if argv is None:
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
  words = [a for a in argv if not a.startswith("--task_index")]
  if words and os.path.basename(words[0]).startswith("python"):
    words[0] = "python"
  return " ".join(shlex.quote(w) for w in words)


def log_path(model_dir, task):
  """Where a worker's TensorFlow messages go.

  Example:
    >>> log_path("/tmp/m", 1)
    '/tmp/m/tensorflow-task1.log'
  """
  return os.path.join(model_dir, "tensorflow-task%d.log" % task)


def wait_for_all(name, timeout_seconds):
  """A barrier of every worker through TensorFlow's coordination service;
  True when all arrived within timeout_seconds. Before a worker exits: the
  receivers of a collective pull their data from the senders, so a worker
  that exits right after its last collective can fail the others' (a
  checkpoint's last gather). Each arrives only once its own transfers are
  done.

  Example:
    >>> wait_for_all("meshtf/stop", 30.0)
    True
  """
  from tensorflow.python.eager import context
  try:
    context.context().wait_at_barrier(name, int(1000 * timeout_seconds))
    return True
  except Exception:  # pylint: disable=broad-except
    return False     # a worker gone meanwhile: nothing left to wait for


# --- agreeing to stop ---------------------------------------------------------
class StopAgreement(object):
  """Every worker's stop request, maxed over the whole mesh: call it at
  each step boundary on every worker (the same number of times: it is a
  collective) with this worker's signal number or None; returns the
  (signal number, task) of the stop agreed on, or (None, None). Traced
  when made, on every worker in the same order (a collective's keys are
  assigned in program order).

  Example:
    >>> agree = StopAgreement(impl, workers)
    >>> agree(None)
    (None, None)
  """

  def __init__(self, impl, workers):
    import tensorflow as tf
    self._impl = impl
    self._workers = workers
    axes = list(range(impl.ndims))

    def body(request):
      return [impl.allreduce(impl.LaidOutTensor([request]), axes,
                             "MAX").one_slice]
    self._run = impl.launcher(impl.trace_program(
        body, [tf.TensorSpec([], tf.int32)]))
    self._calls = 0

  def __call__(self, signum):
    import numpy as np
    import tensorflow as tf
    mine = 0 if signum is None else (int(signum) << _TASK_BITS) | \
        self._workers.index
    local = self._impl.local_pnums()
    args = [[tf.constant(mine, tf.int32)] if p in local else None
            for p in range(self._impl.size)]
    # The first run also instantiates the program (as a first step does).
    allowance = 4.0 if self._calls == 0 else 1.0
    self._calls += 1
    results = self._run(args, allowance)
    agreed = int(np.asarray(results[local[0]][0]))
    if not agreed:
      return None, None
    return agreed >> _TASK_BITS, agreed & ((1 << _TASK_BITS) - 1)


__all__ = ["is_peer_failure", "unhealthy_workers", "lost_worker_error",
           "linger", "kept_line", "resume_line", "log_path", "StopAgreement",
           "wait_for_all",
           "PEER_CHECK_SECONDS", "LINGER_SECONDS"]
