"""Multi-worker runs of the binary that meet what clusters do, with real
worker processes on 127.0.0.1 (2 workers of 2 virtual CPUs, lm_tiny made
smaller, 12 steps):

- a cluster that cannot form is one line on each worker, before model_dir
  is written: a port in use (exit 2), a worker that never starts (exit 3
  after worker_start_timeout_seconds; a waiting worker says what it waits
  for and stops on SIGTERM, exit 143, no train.lock), workers started with
  different configs (exit 2 on both, the fields named);
- a worker killed with SIGKILL mid-run: the survivor is one line naming it
  (task, host:port, the step, the newest checkpoint), exit 3; the launcher
  (--restarts=1) starts the group again and the run's losses equal the
  uninterrupted one-process run's;
- SIGTERM to one worker: both stop after the same step, the chief saves it,
  both exit 143 with one line; resumed as ONE process, the losses equal
  the uninterrupted run's;
- streamed text: the chief's checkpoint holds both workers' input
  positions, from which one process resumes with the uninterrupted run's
  losses.

And on 4 workers of 2 virtual CPUs (mesh data:4;model:2, 10 steps), a
random worker at a random step (the seed is printed; MESHTF_FAULT_SEED
repeats it), every step's loss compared with the one-process run's:

- SIGKILL: the 3 others exit 3 within the bound, one line each naming it;
  launch --restarts=1 resumes;
- SIGTERM: all 4 stop at the first step boundary after it, the chief
  saves that step, all exit 143 with one line; 2 workers resume;
- SIGSTOP (hung): the 3 others exit 3 within the bound, one line each
  naming it; one process resumes.

bench/cluster_faults.py measures the same (and task 0 as the victim).
"""
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import free_ports

from meshtf.train import main
from meshtf.train import peers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LM_TINY = os.path.join(ROOT, "t2t_configs", "lm_tiny.py")
FLAGS = ["--config=" + LM_TINY, "--mesh_shape=data:2;model:2",
         "--train_steps=12", "--batch_size=16", "--config.length=8",
         "--config.num_layers=1", "--config.checkpoint_every=4",
         "--config.eval_every=0", "--config.eval_steps=1",
         "--config.log_every=1", "--config.peer_timeout_seconds=5"]
TIMEOUT = 240


def _env():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TF_CONFIG", None)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


class _Proc(object):
  """A process whose output lines are collected as they come."""

  def __init__(self, argv):
    self.proc = subprocess.Popen(argv, cwd=ROOT, env=_env(),
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    self.out, self.err = [], []
    self.arrived = {}   # a line: when it came (time.monotonic())
    self.exited_at = None
    self._threads = [threading.Thread(target=self._pump, args=(s, l),
                                      daemon=True)
                     for s, l in ((self.proc.stdout, self.out),
                                  (self.proc.stderr, self.err))]
    for t in self._threads:
      t.start()

  def _pump(self, stream, lines):
    for line in iter(stream.readline, ""):
      self.arrived.setdefault(line.rstrip("\n"), time.monotonic())
      lines.append(line.rstrip("\n"))

  def wait_for(self, pattern, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      for line in list(self.out) + list(self.err):
        if re.search(pattern, line):
          return line
      if self.proc.poll() is not None:
        time.sleep(0.2)   # the pumps' last lines
        if not any(re.search(pattern, l) for l in self.out + self.err):
          raise AssertionError("exited %s before %r:\n%s" % (
              self.proc.returncode, pattern, "\n".join(self.err[-20:])))
      time.sleep(0.1)
    raise AssertionError("no %r in %d s" % (pattern, timeout))

  def finish(self, timeout=TIMEOUT):
    try:
      code = self.proc.wait(timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
    for t in self._threads:
      t.join(5)
    return code

  def errors(self):
    """stderr lines but TensorFlow's C++ log lines (start-up notes)."""
    return [l for l in self.err if l.strip() and not re.match(
        r"^([IWEF]\d{4} |WARNING: All log messages|To enable the)", l)]


def _binary(model_dir, hosts, task, *extra):
  return [sys.executable, "-m", "meshtf.train", "--model_dir=" +
          str(model_dir)] + FLAGS + list(extra) + [
              "--worker_hosts=" + ",".join(hosts), "--task_index=%d" % task]


def _metrics(model_dir):
  with open(os.path.join(str(model_dir), main.METRICS_FILE)) as f:
    return [json.loads(l) for l in f]


def _assert_same_losses(model_dir, reference, steps=12):
  got = _metrics(model_dir)
  assert [r["step"] for r in got] == list(range(steps))
  for g, w in zip(got, reference):
    assert g["loss"] == pytest.approx(w["loss"], rel=1e-5), g["step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted one-process run's per-step metrics."""
  model_dir = tmp_path_factory.mktemp("reference")
  assert main.run_command(["meshtf.train", "--model_dir=%s" % model_dir] +
                          FLAGS, out=open(os.devnull, "w")) == 0
  return _metrics(model_dir)


def _in_process(model_dir, hosts, task, *extra):
  """Runs the binary's main function in a thread of this process (the
  cases that end before TensorFlow's cluster starts); returns a dict that
  gets its exit code and stderr lines."""
  result = {}

  def run():
    err = io.StringIO()
    result["code"] = main.run_command(
        _binary(model_dir, hosts, task, *extra)[2:], out=io.StringIO(),
        err=err)
    result["lines"] = err.getvalue().splitlines()
  result["thread"] = threading.Thread(target=run, daemon=True)
  result["thread"].start()
  return result


def test_a_cluster_that_cannot_form_is_one_line_before_model_dir_is_written(
    tmp_path):
  busy_hosts, alone_hosts, waiting_hosts, mixed_hosts = [
      ["127.0.0.1:%d" % p for p in free_ports(2)] for _ in range(4)]
  # A real process: it waits, says for whom, and a SIGTERM stops it.
  waiting = _Proc(_binary(tmp_path / "waiting", waiting_hosts, 1))
  busy = socket.socket()
  busy.bind(("127.0.0.1", int(busy_hosts[1].rsplit(":", 1)[1])))
  busy.listen(1)
  try:
    runs = {
        "busy": _in_process(tmp_path / "busy", busy_hosts, 1),
        "alone": _in_process(tmp_path / "alone", alone_hosts, 0,
                             "--config.worker_start_timeout_seconds=3"),
        "mixed0": _in_process(tmp_path / "mixed", mixed_hosts, 0),
        "mixed1": _in_process(tmp_path / "mixed", mixed_hosts, 1,
                              "--config.d_model=64", "--train_steps=20")}
    for r in runs.values():
      r["thread"].join(TIMEOUT)
    waiting.wait_for(r"waiting for the others to start .*task 0 "
                     r"\(%s\): nothing listens there" %
                     re.escape(waiting_hosts[0]))
    waiting.proc.send_signal(signal.SIGTERM)
    assert waiting.finish() == 143
  finally:
    busy.close()
    if waiting.proc.poll() is None:
      waiting.proc.kill()
  codes = {k: r["code"] for k, r in runs.items()}
  lines = {k: r["lines"] for k, r in runs.items()}
  lines["waiting"] = waiting.errors()
  for k, p in lines.items():
    assert len(p) == 1, (k, p)
  assert codes["busy"] == 2
  assert ("this worker's address %s (task 1) is in use by another process"
          % busy_hosts[1]) in lines["busy"][0]
  assert codes["alone"] == 3
  assert ("worker task 1 (%s) did not join within 3 s" % alone_hosts[1]) in \
      lines["alone"][0] and "nothing listens there" in lines["alone"][0]
  assert "stopped by SIGTERM while waiting for the other workers to start" \
      in lines["waiting"][0]
  for k in ("mixed0", "mixed1"):
    assert codes[k] == 2
    assert ("the workers were started with different configs: d_model 32 "
            "on task 0, 64 on task 1; train_steps 12 on task 0, 20 on task "
            "1") in lines[k][0], lines[k]
  for name in ("busy", "alone", "waiting", "mixed"):
    assert not (tmp_path / name).exists(), name


def test_a_lost_worker_is_one_line_and_the_launcher_restarts_the_group(
    reference, tmp_path):
  model_dir = tmp_path / "lost"
  launcher = _Proc([sys.executable, "-m", "meshtf.train.launch",
                    "--workers=2", "--restarts=1", "--"] + FLAGS +
                   ["--model_dir=%s" % model_dir])
  pids = launcher.wait_for(r"^launch: started 2 workers")
  victim = int(re.search(r"pids (\d+), (\d+)", pids).group(2))
  launcher.wait_for(r"^\[worker 0\] step 6 ")
  os.kill(victim, signal.SIGKILL)
  assert launcher.finish() == 0, "\n".join(launcher.err[-20:])
  lost = [l for l in launcher.err if "was lost" in l]
  assert len(lost) == 1, launcher.err
  found = re.match(r"\[worker 0\] meshtf.train: error: worker task 1 "
                   r"\(127.0.0.1:\d+\) was lost during .*step \d+ \((its "
                   r"process is gone: connection refused|its heartbeats "
                   r"stopped)\): %s keeps ckpt-(\d+) \(step (\d+)\); the "
                   r"steps after it are lost. To resume, start every worker "
                   r"again with the same command" % re.escape(str(model_dir)),
                   lost[0])
  assert found, lost[0]
  # The kill lands after step 6; on a loaded host a step or two later.
  kept = int(found.group(2))
  assert kept == int(found.group(3)) and kept in (4, 8)
  assert any("worker 1 was killed by SIGKILL: restarting all 2 workers" in l
             for l in launcher.err), launcher.err
  assert any("resumed from step %d" % kept in l for l in launcher.out)
  _assert_same_losses(model_dir, reference)


def test_sigterm_to_one_worker_stops_both_at_one_step_then_one_process_resumes(
    reference, tmp_path):
  model_dir = tmp_path / "preempted"
  hosts = ["127.0.0.1:%d" % p for p in free_ports(2)]
  procs = [_Proc(_binary(model_dir, hosts, t)) for t in range(2)]
  try:
    procs[0].wait_for(r"^step 5 ")
    procs[1].proc.send_signal(signal.SIGTERM)
    codes = [p.finish() for p in procs]
  finally:
    for p in procs:
      if p.proc.poll() is None:
        p.proc.kill()
  lines = [p.errors() for p in procs]
  assert codes == [143, 143], lines
  assert [len(l) for l in lines] == [1, 1], lines
  steps = [int(re.search(r"after step (\d+): saved", l[0]).group(1))
           for l in lines]
  assert steps[0] == steps[1] and 5 <= steps[0] < 12, lines
  k = steps[0]
  assert ("stopped by SIGTERM to worker task 1 (%s) (all workers stop "
          "together) after step %d: saved %s" % (
              hosts[1], k, model_dir / ("ckpt-%d" % k))) in lines[0][0]
  assert lines[1][0].startswith("meshtf.train: stopped by SIGTERM after "
                                "step %d" % k)
  assert (model_dir / ("ckpt-%d" % k)).is_dir()
  assert not (model_dir / "train.lock").exists()
  # The same model_dir, trained on by one process.
  assert main.run_command(["meshtf.train", "--model_dir=%s" % model_dir] +
                          FLAGS, out=open(os.devnull, "w")) == 0
  _assert_same_losses(model_dir, reference)


def test_text_data_positions_gathered_from_two_workers_resume_in_one(
    tmp_path):
  """Streamed text on 2 real workers (each reads only its rows' lanes):
  the chief's ckpt-4 holds every lane's position, the workers' gathered
  (meshtf/train/streams.py); one process resumes there without reading the
  data again from its start, and its losses are the uninterrupted one-process
  run's."""
  text = ["--config.task.data_files=" + os.path.join(ROOT, "README.md"),
          "--config.vocab_size=256", "--train_steps=4"]
  model_dir = tmp_path / "two"
  hosts = ["127.0.0.1:%d" % p for p in free_ports(2)]
  procs = [_Proc(_binary(model_dir, hosts, t, *text)) for t in range(2)]
  try:
    codes = [p.finish() for p in procs]
  finally:
    for p in procs:
      if p.proc.poll() is None:
        p.proc.kill()
  assert codes == [0, 0], [p.errors() for p in procs]
  with open(str(model_dir / "ckpt-4" / "meta.json")) as f:
    lanes = json.load(f)["extra"]["input"]["lanes"]
  assert sorted(map(int, lanes)) == list(range(16))   # both workers' rows
  on = FLAGS + text[:2] + ["--train_steps=8"]
  out = io.StringIO()
  assert main.run_command(["meshtf.train", "--model_dir=%s" % model_dir] + on,
                          out=out) == 0
  assert "input:" not in out.getvalue()   # the positions were used
  straight = tmp_path / "one"
  assert main.run_command(["meshtf.train", "--model_dir=%s" % straight] + on,
                          out=open(os.devnull, "w")) == 0
  got, want = _metrics(model_dir), _metrics(straight)
  assert [r["step"] for r in got] == list(range(8))
  for g, w in zip(got, want):
    assert g["loss"] == pytest.approx(w["loss"], rel=1e-5), g["step"]


# --- 4 workers: what a cluster does, at a random step --------------------------
FOUR = ["--config=" + LM_TINY, "--mesh_shape=data:4;model:2",
        "--train_steps=10", "--batch_size=16", "--config.length=8",
        "--config.num_layers=1", "--config.checkpoint_every=4",
        "--config.eval_every=0", "--config.eval_steps=1",
        "--config.log_every=1", "--config.peer_timeout_seconds=5"]
# The bound in which a lost or hung worker's peers exit (peers.py), and what
# a loaded 2-core machine may add: these tests check that the survivors do
# not hang (a collective's watchdog would take 600 s), not how fast they are.
BOUND = 2 * (5 + peers.PEER_CHECK_SECONDS)
LOADED = 45.0
_STEP = re.compile(r"^(?:\[worker \d\] )?step (\d+) ")


def _fault(name):
  """(victim task, step) drawn from a printed seed (MESHTF_FAULT_SEED
  repeats a run)."""
  seed = int(os.environ.get("MESHTF_FAULT_SEED") or
             random.SystemRandom().randrange(1 << 20))
  rng = random.Random(seed)
  victim, step = rng.randrange(4), rng.randrange(2, 7)
  print("%s: worker %d after its step %d (MESHTF_FAULT_SEED=%d)" % (
      name, victim, step, seed))
  return victim, step, seed


@pytest.fixture(scope="module")
def reference4(tmp_path_factory):
  """FOUR's uninterrupted run as one process on this process's 8 virtual
  CPUs. Its losses are 4 workers' of 2 (layout-invariance): each test
  below compares every step, those its 4 workers ran before the fault
  and those resumed after it."""
  model_dir = tmp_path_factory.mktemp("reference4")
  assert main.run_command(["meshtf.train", "--model_dir=%s" % model_dir] +
                          FOUR, out=open(os.devnull, "w")) == 0
  return _metrics(model_dir)


def _four_workers(model_dir):
  hosts = ["127.0.0.1:%d" % p for p in free_ports(4)]
  return hosts, [_Proc([sys.executable, "-m", "meshtf.train",
                        "--model_dir=%s" % model_dir] + FOUR +
                       ["--worker_hosts=" + ",".join(hosts),
                        "--task_index=%d" % t]) for t in range(4)]


def _exit_seconds(procs, since, timeout):
  """Waits for every process (a hang fails after timeout); each one's
  seconds from `since` to its exit."""
  deadline = time.monotonic() + timeout
  while any(p.proc.poll() is None for p in procs):
    for p in procs:
      if p.exited_at is None and p.proc.poll() is not None:
        p.exited_at = time.monotonic()
    if time.monotonic() > deadline:
      raise AssertionError("still running %.0f s after the fault: tasks %s" % (
          timeout, [i for i, p in enumerate(procs) if p.proc.poll() is None]))
    time.sleep(0.05)
  for p in procs:
    if p.exited_at is None:
      p.exited_at = time.monotonic()
    p.finish()
  return [round(p.exited_at - since, 2) for p in procs]


def _kill_all(procs):
  for p in procs:
    if p.proc.poll() is None:
      p.proc.kill()
      p.proc.wait()


def _lost_line(line, victim, host, model_dir):
  """The survivor's line naming the lost victim; returns the step of the
  checkpoint it names (None: none yet)."""
  found = re.match(
      r"(\[worker \d\] )?meshtf.train: error: worker task %d \(%s\) was lost "
      r"during [^:]*(step |ckpt-)\d+ \((its process is gone: connection "
      r"refused|its process ended: its connection closed|its heartbeats "
      r"stopped|it does not answer: no reply in \d+ s, stopped or hung)\): "
      r"%s (keeps ckpt-(\d+) \(step (\d+)\); the steps after it are lost|"
      r"holds no checkpoint yet \(training starts again from step 0\))\. To "
      r"resume, start every worker again with the same command" % (
          victim, re.escape(host), re.escape(str(model_dir))), line)
  assert found, line
  if found.group(5) is None:
    return None
  assert found.group(5) == found.group(6), line
  return int(found.group(5))


def test_kill_9_of_one_of_4_workers_is_one_line_on_each_other_then_restart(
    reference4, tmp_path):
  """SIGKILL of a random worker at a random step: each of the 3 others
  exits 3 within the bound with one line naming it (task, host:port) and
  the newest checkpoint; launch --restarts=1 starts the 4 again, which
  resume there with the uninterrupted run's losses."""
  victim, at, seed = _fault("SIGKILL")
  model_dir = tmp_path / "killed"
  launcher = _Proc([sys.executable, "-m", "meshtf.train.launch",
                    "--workers=4", "--restarts=1", "--"] + FOUR +
                   ["--model_dir=%s" % model_dir])
  try:
    started = launcher.wait_for(r"^launch: started 4 workers")
    pids = [int(p) for p in re.search(r"pids ([\d, ]+)\)", started).group(
        1).split(", ")]
    launcher.wait_for(r"^\[worker %d\] step %d " % (victim, at))
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    restart = launcher.wait_for(
        r"^launch: worker %d was killed by SIGKILL: restarting all 4 "
        r"workers" % victim, BOUND + LOADED)
    seconds = launcher.arrived[restart] - killed
    code = launcher.finish()
  finally:
    _kill_all([launcher])
  print("the 3 others exited %.1f s after the SIGKILL (bound %.0f s)" % (
      seconds, BOUND))
  first = launcher.err[:launcher.err.index(restart)]
  exits = [l for l in first if l.startswith("launch: the workers' exits: ")]
  assert exits == ["launch: the workers' exits: " + ", ".join(
      "worker %d %s" % (t, "was killed by SIGKILL" if t == victim else
                        "exited 3") for t in range(4))], (seed, [
                            l for l in first if "[worker" not in l or
                            "meshtf.train:" in l])
  host = re.search(r"task %d \((127\.0\.0\.1:\d+)\)" % victim, "\n".join(
      first)).group(1)
  kept = set()
  for t in set(range(4)) - {victim}:
    mine = [l[len("[worker %d] " % t):] for l in first
            if l.startswith("[worker %d] " % t)]
    mine = [l for l in mine if not re.match(
        r"^([IWEF]\d{4} |WARNING: All log messages|To enable the)", l)]
    assert len(mine) == 1, (seed, t, mine)
    kept.add(_lost_line(mine[0], victim, host, model_dir))
  assert len(kept) == 1, (seed, kept)   # all name the same checkpoint
  kept = kept.pop()
  assert code == 0, (seed, launcher.err[-20:])
  resumed = [l for l in launcher.out if l.startswith("[worker 0] model_dir:")]
  assert resumed[-1].endswith("(resumed from step %d)" % kept if kept else
                              "(new)"), (seed, resumed)
  _assert_same_losses(model_dir, reference4, steps=10)


def test_sigterm_to_one_of_4_workers_stops_all_after_one_step_then_2_resume(
    reference4, tmp_path):
  """SIGTERM to a random worker at a random step: all 4 stop at the first
  step boundary after it, the chief saves that step, each exits 143 with
  one line; 2 workers resume with the uninterrupted run's losses."""
  victim, at, seed = _fault("SIGTERM")
  model_dir = tmp_path / "preempted"
  hosts, procs = _four_workers(model_dir)
  try:
    procs[victim].wait_for(r"^(\[worker \d\] )?step %d " % at)
    # Frozen a moment, the victim's last step line says where the signal
    # finds it: at that step's boundary or in the step after it.
    procs[victim].proc.send_signal(signal.SIGSTOP)
    time.sleep(0.3)   # its lines written so far arrive
    last = max(int(m.group(1)) for m in map(_STEP.match,
                                            list(procs[victim].out)) if m)
    procs[victim].proc.send_signal(signal.SIGTERM)
    procs[victim].proc.send_signal(signal.SIGCONT)
    seconds = _exit_seconds(procs, time.monotonic(), BOUND + LOADED)
  finally:
    _kill_all(procs)
  print("SIGTERM at step %d: the 4 exited after %s s" % (last, seconds))
  lines = [p.errors() for p in procs]
  assert [p.proc.returncode for p in procs] == [143] * 4, (seed, lines)
  assert [len(l) for l in lines] == [1] * 4, (seed, lines)
  k = int(re.search(r"after step (\d+): saved", lines[0][0]).group(1))
  assert k in (last, last + 1), (seed, last, lines)
  for t, l in enumerate(lines):
    by = "" if t == victim else " to worker task %d (%s) (all workers stop " \
        "together)" % (victim, hosts[victim])
    assert l[0] == ("meshtf.train: stopped by SIGTERM%s after step %d: saved "
                    "%s; train again with --model_dir=%s to continue from "
                    "step %d" % (by, k, model_dir / ("ckpt-%d" % k),
                                 model_dir, k)), (seed, t, l)
  with open(str(model_dir / ("ckpt-%d" % k) / "meta.json")) as f:
    assert json.load(f)["step"] == k
  assert len(_metrics(model_dir)) == k   # no worker trained past it
  assert not (model_dir / "train.lock").exists()
  # The same model_dir, trained on by 2 workers of 4 virtual CPUs.
  hosts = ["127.0.0.1:%d" % p for p in free_ports(2)]
  procs = [_Proc([sys.executable, "-m", "meshtf.train", "--model_dir=%s" %
                  model_dir] + FOUR + ["--worker_hosts=" + ",".join(hosts),
                                       "--task_index=%d" % t])
           for t in range(2)]
  try:
    codes = [p.finish() for p in procs]
  finally:
    _kill_all(procs)
  assert codes == [0, 0], (seed, [p.errors() for p in procs])
  assert "model_dir: %s (resumed from step %d)" % (model_dir, k) in \
      procs[0].out, (seed, procs[0].out[:12])
  _assert_same_losses(model_dir, reference4, steps=10)


def test_sigstop_of_one_of_4_workers_is_one_line_on_each_other_then_1_resumes(
    reference4, tmp_path):
  """SIGSTOP (a hung worker: its connections stay open) of a random worker
  at a random step: each of the 3 others exits 3 within the bound with one
  line naming it; one process resumes with the uninterrupted run's
  losses."""
  victim, at, seed = _fault("SIGSTOP")
  model_dir = tmp_path / "hung"
  hosts, procs = _four_workers(model_dir)
  others = [p for t, p in enumerate(procs) if t != victim]
  try:
    procs[victim].wait_for(r"^(\[worker \d\] )?step %d " % at)
    procs[victim].proc.send_signal(signal.SIGSTOP)
    seconds = _exit_seconds(others, time.monotonic(), BOUND + LOADED)
  finally:
    _kill_all(procs)
  print("the 3 others exited %s s after the SIGSTOP (bound %.0f s)" % (
      seconds, BOUND))
  lines = [p.errors() for p in others]
  assert [p.proc.returncode for p in others] == [3] * 3, (seed, lines)
  assert [len(l) for l in lines] == [1] * 3, (seed, lines)
  kept = {_lost_line(l[0], victim, hosts[victim], model_dir) for l in lines}
  assert len(kept) == 1, (seed, lines)
  kept = kept.pop()
  out = io.StringIO()
  assert main.run_command(["meshtf.train", "--model_dir=%s" % model_dir] +
                          FOUR, out=out, err=io.StringIO()) == 0
  assert ("model_dir: %s (%s)" % (model_dir, "resumed from step %d" % kept
                                  if kept else "new")) in out.getvalue()
  _assert_same_losses(model_dir, reference4, steps=10)
