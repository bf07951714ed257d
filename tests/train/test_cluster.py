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

The exhaustive scenarios (4 workers, SIGKILL at random steps, SIGSTOP,
resumes as 2 and 1) are bench/cluster_faults.py's.
"""
import io
import json
import os
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
    self._threads = [threading.Thread(target=self._pump, args=(s, l),
                                      daemon=True)
                     for s, l in ((self.proc.stdout, self.out),
                                  (self.proc.stderr, self.err))]
    for t in self._threads:
      t.start()

  @staticmethod
  def _pump(stream, lines):
    for line in iter(stream.readline, ""):
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


def _assert_same_losses(model_dir, reference):
  got = _metrics(model_dir)
  assert [r["step"] for r in got] == list(range(12))
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
