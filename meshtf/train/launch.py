"""`python -m meshtf.train.launch`: several workers of the training binary
on this machine, for a try-out, a test or a laptop (on a cluster the
scheduler plays this part: docs/backends.md has Slurm and Kubernetes
recipes).

  python -m meshtf.train.launch --workers=4 [--restarts=1] -- \\
      --config=t2t_configs/lm_tiny.py --model_dir=/tmp/lm

It checks the binary's flags and that the mesh splits over the workers
(one line, exit 2, before anything starts), picks free 127.0.0.1 ports,
starts `python -m meshtf.train <flags> --worker_hosts=... --task_index=i`
for each worker, each in its own process group, and prints their lines
prefixed with "[worker i]". When one worker fails, the others are stopped
(SIGTERM, then SIGKILL after --grace_seconds); when one is lost (killed by
a signal, or exit 3) the others are left to notice it and say so, and get
SIGTERM only if still running after --grace_seconds. With --restarts=K, a group
that failed because a worker was lost (a worker killed by a signal, or
exit 3: meshtf/train/peers.py) or stopped from outside (130 / 143) is
started again, on new ports, up to K times; the binary resumes from the
newest checkpoint. Bad input (2) and divergence (1) are not retried: they
would fail again.

Ctrl-C (or SIGTERM) to the launcher is passed on once to every worker:
they agree on a step boundary, the chief saves it, and all exit 130 / 143;
a second one is passed on too and stops them at once. The launcher exits
with the code of the worker that failed first (0 when all finished).

Example:
  >>> main(["launch", "--workers=2", "--", "--config=t2t_configs/lm_tiny.py",
  ...       "--mesh_shape=data:2;model:2", "--model_dir=/tmp/lm2"])
  0
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from meshtf.train import errors

PROGRAM = "meshtf.train.launch"
_RETRYABLE = (errors.EXIT_CLUSTER, 130, 143)


class LaunchError(errors.UsageError):
  """The launcher's own bad input: one line, exit code 2."""


def parse(argv):
  """(options, binary flags) from `launch [options] -- <binary flags>`.

  Example:
    >>> parse(["launch", "--workers=2", "--", "--train_steps=4"])[1]
    ['--train_steps=4']
  """
  argv = list(argv[1:])
  if "--" in argv:
    at = argv.index("--")
    own, flags = argv[:at], argv[at + 1:]
  else:
    own, flags = argv, []
  parser = _Parser(prog="python -m " + PROGRAM, add_help=True)
  parser.add_argument("--workers", type=int, required=True,
                      help="worker processes to start (the mesh's size must "
                      "be a multiple)")
  parser.add_argument("--restarts", type=int, default=0,
                      help="restart the group this many times when a worker "
                      "is lost")
  parser.add_argument("--grace_seconds", type=float, default=60.0,
                      help="after one worker failed, how long the others "
                      "get to stop before SIGKILL")
  options = parser.parse_args(own)
  if options.workers < 1:
    raise LaunchError("--workers=%d: start 1 or more workers" %
                      options.workers)
  if options.restarts < 0:
    raise LaunchError("--restarts=%d: pass 0 (no restart) or more" %
                      options.restarts)
  taken = [f for f in flags if f.split("=", 1)[0] in (
      "--worker_hosts", "--task_index", "-worker_hosts", "-task_index")]
  if taken:
    raise LaunchError("%s: the launcher gives each worker its "
                      "--worker_hosts and --task_index: leave them out" %
                      taken[0])
  return options, flags


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise LaunchError("%s: python -m %s --workers=N [--restarts=K] -- "
                      "<flags of python -m meshtf.train>" % (message,
                                                            PROGRAM))


def check(num_workers, flags):
  """The binary's flags and config, resolved as the binary does, and the
  mesh against the number of workers; raises UsageError / ConfigError
  (one line). Returns the mesh's number of processors.

  Example:
    >>> check(3, ["--config=t2t_configs/lm_tiny.py"])
    Traceback (most recent call last):
    ConfigError: mesh_shape 'data:4;model:2' has 8 processors, which 3 ...
  """
  from absl import flags as absl_flags
  from meshtf.train import config as config_lib
  from meshtf.train import main
  from meshtf.train import workers as workers_lib
  argv = ["meshtf.train"] + list(flags)
  flag_values = absl_flags.FlagValues()
  main.define_flags(flag_values, argv)
  rest = main.parse_flags(argv, flag_values)
  if len(rest) > 1:
    raise LaunchError("unexpected arguments %s: the binary takes flags only"
                      % " ".join(rest[1:]))
  config, _, _, flag_names = main.resolve_config(flag_values)
  layout = config_lib.validate(config, flag_names=flag_names,
                               check_layout=False)
  mode = flag_values.mode
  if mode not in workers_lib.MODES:
    raise LaunchError(
        "--mode=%s runs in one process (it reads the layout-free "
        "checkpoint): run python -m meshtf.train --mode=%s with the same "
        "flags, without the launcher" % (mode, mode))
  size = layout.size
  if num_workers > size or size % num_workers:
    raise LaunchError(
        "--workers=%d: mesh_shape %r has %d processors, which %d workers "
        "cannot share equally (each gets the same number, one or more): use "
        "--workers=%s, or a mesh whose size is a multiple of %d" % (
            num_workers, config.mesh_shape, size, num_workers,
            _divisors(size), num_workers))
  hosts = ["127.0.0.1:%d" % (1 + i) for i in range(num_workers)]
  problems = workers_lib.problems(config, layout, workers_lib.Workers(
      hosts, 0), mode)
  if problems:
    raise config_lib.ConfigError(["; ".join(problems)])
  return size


def _divisors(n):
  """'1, 2, 4 or 8'."""
  found = [str(d) for d in range(1, n + 1) if n % d == 0]
  return found[0] if len(found) == 1 else "%s or %s" % (
      ", ".join(found[:-1]), found[-1])


def free_ports(n):
  """n TCP ports free on 127.0.0.1 now."""
  socks = [socket.socket() for _ in range(n)]
  try:
    for s in socks:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


class Group(object):
  """One start of every worker: the processes and their prefixed output."""

  def __init__(self, num_workers, flags, out, err, environ=None):
    hosts = ",".join("127.0.0.1:%d" % p for p in free_ports(num_workers))
    env = dict(os.environ if environ is None else environ)
    env.pop("TF_CONFIG", None)   # the flags name the cluster
    self.procs = []
    self._pumps = []
    for i in range(num_workers):
      p = subprocess.Popen(
          [sys.executable, "-m", "meshtf.train"] + list(flags) +
          ["--worker_hosts=" + hosts, "--task_index=%d" % i],
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
          start_new_session=True)   # a terminal's Ctrl-C reaches us only
      self.procs.append(p)
      for stream, sink in ((p.stdout, out), (p.stderr, err)):
        t = threading.Thread(target=_pump, args=(stream, sink, i),
                             daemon=True)
        t.start()
        self._pumps.append(t)

  def signal_all(self, signum):
    for p in self.procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signum)
        except ProcessLookupError:
          pass

  def finish(self):
    for t in self._pumps:
      t.join(5.0)


def _pump(stream, sink, index):
  prefix = "[worker %d] " % index
  for raw in iter(stream.readline, b""):
    line = raw.decode("utf-8", "backslashreplace")
    if line.startswith(prefix):
      line = line[len(prefix):]
    elif line.startswith("meshtf.train: ") and line[14:].startswith(prefix):
      line = "meshtf.train: " + line[14 + len(prefix):]
    sink.write(prefix + line)
    sink.flush()
  stream.close()


def describe_exit(code):
  """'exited 3', 'was killed by SIGKILL'."""
  if code is not None and code < 0:
    try:
      return "was killed by %s" % signal.Signals(-code).name
    except ValueError:
      return "was killed by signal %d" % -code
  return "exited %s" % code


def exits_line(codes):
  """Every worker's exit, in task order.

  Example:
    >>> exits_line([3, -9, 3])
    'worker 0 exited 3, worker 1 was killed by SIGKILL, worker 2 exited 3'
  """
  return ", ".join("worker %d %s" % (i, describe_exit(c))
                   for i, c in enumerate(codes))


def lost_peer(code):
  """Whether a worker's exit code means the others lost a peer: it was
  killed by a signal or it lost one itself (errors.EXIT_CLUSTER).

    >>> lost_peer(-9), lost_peer(3), lost_peer(2)
    (True, True, False)
  """
  return code < 0 or code == errors.EXIT_CLUSTER


def run_group(group, options, received, log, poll=0.1):
  """Waits for the group; returns (cause index or None, its exit code).
  When a worker is lost the others are left to notice it (one line each);
  when one fails otherwise they are sent SIGTERM at once. Either way those
  still running after --grace_seconds are stopped (SIGTERM, then SIGKILL)."""
  cause = None
  failed_at = None    # when the cause was seen, with others still running
  term_after = None   # seconds after failed_at: SIGTERM those left
  kill_after = None   # seconds after failed_at: SIGKILL those left
  forwarded = 0
  while True:
    codes = [p.poll() for p in group.procs]
    while forwarded < len(received):
      group.signal_all(received[forwarded])
      forwarded += 1
    if cause is None:
      for i, c in enumerate(codes):
        if c not in (None, 0):
          cause = i
          if any(x is None for x in codes):
            failed_at = time.monotonic()
            kill_after = options.grace_seconds
            if received:
              pass   # they are stopping already
            elif lost_peer(c):
              # The others notice the lost peer themselves and each says
              # so in one line (peers.py); a SIGTERM now would race that
              # line with a preemption stop that cannot be agreed.
              log("worker %d %s: the others stop on their own when they "
                  "notice (SIGTERM after %.0f s)" % (
                      i, describe_exit(c), options.grace_seconds))
              term_after = options.grace_seconds
              kill_after = 2 * options.grace_seconds
            else:
              log("worker %d %s: stopping the others" % (
                  i, describe_exit(c)))
              group.signal_all(signal.SIGTERM)
          break
    waited = time.monotonic() - failed_at if failed_at is not None else 0.0
    if term_after is not None and waited > term_after:
      log("workers still running %.0f s after worker %d failed: SIGTERM" % (
          term_after, cause))
      group.signal_all(signal.SIGTERM)
      term_after = None
    if all(c is not None for c in codes):
      group.finish()
      if cause is None:
        return None, 0
      return cause, codes[cause]
    if kill_after is not None and waited > kill_after:
      log("workers still running %.0f s after worker %d failed: SIGKILL" % (
          kill_after, cause))
      group.signal_all(signal.SIGKILL)
      kill_after = None
    time.sleep(poll)


def launch(options, flags, out=None, err=None):
  """Starts the group (again, with --restarts) and returns the exit code."""
  out = out or sys.stdout
  err = err or sys.stderr

  def log(message):
    err.write("launch: %s\n" % message)
    err.flush()
  received = []
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for s in (signal.SIGINT, signal.SIGTERM):
      previous[s] = signal.signal(s, lambda signum, _: received.append(
          signum))
  try:
    attempt = 0
    while True:
      group = Group(options.workers, flags, out, err)
      log("started %d workers (pids %s)%s" % (
          options.workers, ", ".join(str(p.pid) for p in group.procs),
          "; restart %d of %d" % (attempt, options.restarts)
          if attempt else ""))
      cause, code = run_group(group, options, received, log)
      if cause is None:
        return 0
      # What each worker did (a lost one's peers exit 3 with their line).
      log("the workers' exits: %s" % exits_line(
          [p.returncode for p in group.procs]))
      retry = (not received and attempt < options.restarts and
               (code < 0 or code in _RETRYABLE))
      if not retry:
        if code < 0:
          return 128 - code
        return code
      attempt += 1
      log("worker %d %s: restarting all %d workers from the newest "
          "checkpoint (restart %d of %d)" % (
              cause, describe_exit(code), options.workers, attempt,
              options.restarts))
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def main(argv=None, out=None, err=None):
  """The launcher's entry point; returns the exit code."""
  err = err or sys.stderr
  argv = sys.argv if argv is None else argv
  from meshtf.train import config as config_lib
  try:
    options, flags = parse(argv)
    check(options.workers, flags)
  except (errors.UsageError, config_lib.ConfigError) as e:
    for line in str(e).splitlines() or [type(e).__name__]:
      err.write("%s: error: %s\n" % (PROGRAM, line))
    err.flush()
    return errors.EXIT_USAGE
  return launch(options, flags, out, err)


__all__ = ["main", "launch", "parse", "check", "free_ports", "Group",
           "describe_exit", "exits_line", "LaunchError"]


if __name__ == "__main__":
  sys.exit(main())
