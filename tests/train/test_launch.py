"""The launcher's own bad input (meshtf/train/launch.py): one line, exit 2,
no worker started. Its runs of real workers (a lost worker restarted) are
in test_cluster.py."""
import io
import os

import pytest

from meshtf.train import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LM_TINY = "--config=" + os.path.join(ROOT, "t2t_configs", "lm_tiny.py")


@pytest.mark.parametrize("argv,expected", [
    (["--workers=3", "--", LM_TINY],
     "--workers=3: mesh_shape 'data:4;model:2' has 8 processors, which 3 "
     "workers cannot share equally (each gets the same number, one or "
     "more): use --workers=1, 2, 4 or 8"),
    (["--workers=16", "--", LM_TINY], "use --workers=1, 2, 4 or 8"),
    (["--workers=0", "--", LM_TINY], "--workers=0: start 1 or more workers"),
    (["--", LM_TINY], "the following arguments are required: --workers"),
    (["--workers=2", "--", LM_TINY, "--task_index=1"],
     "--task_index=1: the launcher gives each worker its --worker_hosts and "
     "--task_index: leave them out"),
    (["--workers=2", "--", LM_TINY, "--mode=decode"],
     "--mode=decode runs in one process"),
    (["--workers=2", "--", LM_TINY, "--backend=placement"],
     "backend='placement' cannot span 2 worker processes"),
    (["--workers=2", "--", "--config=nope.py"],
     "--config=nope.py: nope.py does not exist"),
    (["--workers=2", "--", LM_TINY, "--config.d_modle=8"],
     "unknown config key 'd_modle'"),
])
def test_bad_input_is_one_line(argv, expected):
  err = io.StringIO()
  assert launch.main(["launch"] + argv, out=io.StringIO(), err=err) == 2
  lines = err.getvalue().splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith("meshtf.train.launch: error: "), lines
  assert expected in lines[0], lines[0]


def test_the_documented_command_is_valid(monkeypatch):
  """docs/backends.md's launcher command passes the launcher's checks (its
  runs are test_cluster.py's, with fewer steps)."""
  import shlex
  with open(os.path.join(ROOT, "docs", "backends.md")) as f:
    text = f.read()
  start = text.index("python -m meshtf.train.launch --workers=")
  command = text[start:text.index("\n```", start)].replace("\\\n", " ")
  argv = shlex.split(command)[2:]
  options, flags = launch.parse(["launch"] + argv[1:])
  assert options.workers == 4 and options.restarts == 1
  monkeypatch.chdir(ROOT)   # the command's paths are the clone's
  assert launch.check(options.workers, flags) == 8


class _ScriptedProc(object):
  """A worker whose exit code appears after `after` seconds, or when it
  is sent SIGTERM (then 143)."""

  def __init__(self, code, after=None):
    import time
    self.code, self.returncode = code, None
    self.at = None if after is None else time.monotonic() + after

  def poll(self):
    import time
    if self.returncode is None and self.at is not None and (
        time.monotonic() >= self.at):
      self.returncode = self.code
    return self.returncode


class _ScriptedGroup(object):
  def __init__(self, procs):
    self.procs, self.signals = procs, []

  def signal_all(self, signum):
    self.signals.append(signum)
    for p in self.procs:
      if p.poll() is None:
        p.returncode = 128 + signum if signum != 9 else -9

  def finish(self):
    pass


def _run_scripted(procs, grace):
  import argparse
  group = _ScriptedGroup(procs)
  lines = []
  cause, code = launch.run_group(
      group, argparse.Namespace(grace_seconds=grace), [], lines.append,
      poll=0.01)
  return group, lines, cause, code


def test_survivors_of_a_lost_worker_are_left_to_say_so():
  """Worker 2 killed by SIGKILL: the others, which exit 3 on their own
  (peers.py's line), get no SIGTERM that would race that line."""
  import signal
  procs = [_ScriptedProc(3, 0.2), _ScriptedProc(3, 0.25),
           _ScriptedProc(-9, 0.0), _ScriptedProc(3, 0.2)]
  group, lines, cause, code = _run_scripted(procs, grace=5.0)
  assert group.signals == [] and (cause, code) == (2, -9)
  assert [p.returncode for p in procs] == [3, 3, -9, 3]
  assert lines == ["worker 2 was killed by SIGKILL: the others stop on "
                   "their own when they notice (SIGTERM after 5 s)"]
  # Survivors that do not stop get SIGTERM after the grace period.
  procs = [_ScriptedProc(3), _ScriptedProc(-9, 0.0)]
  group, lines, cause, code = _run_scripted(procs, grace=0.2)
  assert group.signals == [signal.SIGTERM] and procs[0].returncode == 143
  assert lines[-1] == ("workers still running 0 s after worker 1 failed: "
                       "SIGTERM")


def test_a_worker_failing_otherwise_stops_the_others_at_once():
  import signal
  procs = [_ScriptedProc(0), _ScriptedProc(2, 0.0)]
  group, lines, cause, code = _run_scripted(procs, grace=5.0)
  assert group.signals == [signal.SIGTERM] and (cause, code) == (1, 2)
  assert lines == ["worker 1 exited 2: stopping the others"]
  assert procs[0].returncode == 143
