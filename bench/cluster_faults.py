r"""What clusters do to a multi-worker run, on real worker processes on
127.0.0.1: a worker killed (SIGKILL), preempted (SIGTERM) or hung (SIGSTOP)
at a random step, and the run resumed with another number of workers.

Every scenario starts --workers binary processes (python -m meshtf.train
--worker_hosts=... --task_index=i, lm_tiny made smaller, mesh
data:4;model:2, so 2 virtual CPUs each for 4 workers), waits for the
chief's log line of a random step, does the thing to a random worker (or
to task 0 where the scenario says so), and measures each survivor's time
from the signal to its exit, its exit code and its stderr lines (one
expected, naming the worker). Then it resumes the same model_dir to the
end (with the launcher, as --resume_workers workers, or as one process)
and compares every step's loss in metrics.jsonl with an uninterrupted
one-process run's.

Scenarios:
  kill        SIGKILL to a random worker; resume with 4 workers
  kill_chief  SIGKILL to task 0 (the coordination service's host)
  term        SIGTERM to a random worker: all stop after one step and the
              chief saves it; resume as 2 workers
  stop        SIGSTOP to a random worker (hung; killed after the others
              exit); resume as 1 process
  stop_chief  SIGSTOP to task 0
  agreement   seconds per stop agreement (one int32 MAX allreduce over the
              mesh) against seconds per training step, 2 workers
  save        seconds to gather a checkpoint's values on 4 workers (lm_tiny's
              37 variables and slots, mesh data:4;model:2): one program per
              variable traced at every save (before) against one program
              for all, traced at the first save (VariableStore.full_values),
              interleaved in one run

Output, JSON lines: kind=scenario (signal, victim, step, per survivor exit
code / seconds to exit / its lines, the checkpoint the lines name, resume
mode, max relative loss difference), kind=agreement and kind=save.

Usage:
  python bench/cluster_faults.py                    # every scenario once
  python bench/cluster_faults.py --scenarios=kill,term --seed=3
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from meshtf.train.launch import free_ports  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--config=" + os.path.join(ROOT, "t2t_configs", "lm_tiny.py"),
         "--mesh_shape=data:4;model:2", "--batch_size=16",
         "--config.length=8", "--config.num_layers=1",
         "--config.checkpoint_every=5", "--config.eval_every=0",
         "--config.eval_steps=1", "--config.log_every=1"]
SCENARIOS = ("kill", "kill_chief", "term", "stop", "stop_chief", "agreement",
             "save")


def env():
  e = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  e.pop("TF_CONFIG", None)
  e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
  return e


class Worker(object):
  def __init__(self, argv):
    self.proc = subprocess.Popen(argv, cwd=ROOT, env=env(),
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    self.out, self.err = [], []
    self.exited_at = None
    for stream, lines in ((self.proc.stdout, self.out),
                          (self.proc.stderr, self.err)):
      threading.Thread(target=self._pump, args=(stream, lines),
                       daemon=True).start()

  @staticmethod
  def _pump(stream, lines):
    for line in iter(stream.readline, ""):
      lines.append(line.rstrip("\n"))

  def lines(self):
    return [l for l in self.err if l.strip() and not re.match(
        r"^([IWEF]\d{4} |WARNING: All log messages|To enable the)", l)]


def start_workers(n, model_dir, flags):
  hosts = ",".join("127.0.0.1:%d" % p for p in free_ports(n))
  return [Worker([sys.executable, "-m", "meshtf.train",
                  "--model_dir=" + model_dir] + flags +
                 ["--worker_hosts=" + hosts, "--task_index=%d" % t])
          for t in range(n)]


def wait_for_step(worker, step, timeout):
  deadline = time.monotonic() + timeout
  pattern = re.compile(r"^(\[worker \d+\] )?step %d " % step)
  while time.monotonic() < deadline:
    if any(pattern.match(l) for l in list(worker.out)):
      return True
    if worker.proc.poll() is not None:
      return False
    time.sleep(0.05)
  return False


def metrics(model_dir):
  path = os.path.join(model_dir, "metrics.jsonl")
  with open(path) as f:
    return [json.loads(l) for l in f]


def max_rel_diff(model_dir, reference):
  got = metrics(model_dir)
  if [r["step"] for r in got] != [r["step"] for r in reference]:
    return None, [r["step"] for r in got][-3:]
  return max(abs(g["loss"] - w["loss"]) / abs(w["loss"])
             for g, w in zip(got, reference)), None


def run_binary(argv, timeout):
  p = subprocess.run(argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True, timeout=timeout)
  return p.returncode, p.stderr


def resume(mode, model_dir, flags, timeout):
  """Trains model_dir to the end as `mode` (launch:N or one)."""
  if mode == "one":
    argv = [sys.executable, "-m", "meshtf.train", "--model_dir=" +
            model_dir] + flags
  else:
    argv = [sys.executable, "-m", "meshtf.train.launch", "--workers=%s" %
            mode.split(":")[1], "--"] + flags + ["--model_dir=" + model_dir]
  code, err = run_binary(argv, timeout)
  return code, [l for l in err.splitlines() if "error" in l][:3]


def scenario(name, args, rng, reference, flags):
  n = args.workers
  model_dir = tempfile.mkdtemp(prefix="cluster_faults_%s_" % name)
  signum = {"kill": signal.SIGKILL, "kill_chief": signal.SIGKILL,
            "term": signal.SIGTERM, "stop": signal.SIGSTOP,
            "stop_chief": signal.SIGSTOP}[name]
  victim = 0 if name.endswith("_chief") else rng.randrange(1, n) \
      if name.startswith("stop") else rng.randrange(n)
  step = rng.randrange(3, args.train_steps - 4)
  workers = start_workers(n, model_dir, flags)
  watched = workers[1] if victim == 0 else workers[0]
  record = {"kind": "scenario", "scenario": name, "workers": n,
            "signal": signal.Signals(signum).name, "victim": victim,
            "at_step": step, "peer_timeout_seconds": args.peer_timeout}
  try:
    if not wait_for_step(watched, step, args.timeout):
      record["error"] = "no step %d line: %s" % (step, watched.lines()[-3:])
      return record
    os.kill(workers[victim].proc.pid, signum)
    t0 = time.monotonic()
    survivors = [t for t in range(n) if t != victim or name == "term"]
    deadline = t0 + args.timeout
    while time.monotonic() < deadline and any(
        workers[t].proc.poll() is None for t in survivors):
      for t in survivors:
        if workers[t].exited_at is None and workers[t].proc.poll() is not None:
          workers[t].exited_at = time.monotonic() - t0
      time.sleep(0.05)
    for t in survivors:
      if workers[t].exited_at is None and workers[t].proc.poll() is not None:
        workers[t].exited_at = time.monotonic() - t0
    time.sleep(0.5)   # the pumps' last lines
    record["survivors"] = [{
        "task": t, "code": workers[t].proc.returncode,
        "seconds_to_exit": None if workers[t].exited_at is None else round(
            workers[t].exited_at, 2),
        "lines": len(workers[t].lines()),
        "names_victim": any("task %d (" % victim in l
                            for l in workers[t].lines()),
        "line": (workers[t].lines() or [""])[0][:300]}
                           for t in survivors]
    named = re.findall(r"ckpt-(\d+)", " ".join(
        l for t in survivors for l in workers[t].lines()))
    record["checkpoint_named"] = sorted({int(s) for s in named})
  finally:
    for w in workers:
      if w.proc.poll() is None:
        w.proc.kill()
        w.proc.wait()
  mode = {"kill": "launch:%d" % n, "kill_chief": "launch:%d" % n,
          "term": "launch:2", "stop": "one", "stop_chief": "launch:2"}[name]
  code, errs = resume(mode, model_dir, flags, args.timeout)
  record.update(resume=mode, resume_code=code, resume_errors=errs)
  if code == 0:
    record["max_rel_loss_diff"], record["steps_tail"] = max_rel_diff(
        model_dir, reference)
  return record


AGREEMENT_SCRIPT = r'''
import json, os, sys, time
sys.path.insert(0, %(root)r)
import tensorflow as tf
import meshtf as mtf
from meshtf.lowering import cluster
from meshtf.train import peers, workers as workers_lib
hosts, task = sys.argv[1].split(","), int(sys.argv[2])
os.environ["TF_CONFIG"] = cluster.tf_config(hosts, task)
info = mtf.start_multi_worker(num_virtual_cpus=2)
impl = mtf.SimdMeshImpl("data:2;model:2", "", info.devices)
agree = peers.StopAgreement(impl, workers_lib.Workers(hosts, task))
agree(None)
times = []
for _ in range(int(sys.argv[3])):
  t = time.perf_counter(); agree(None); times.append(time.perf_counter() - t)
times.sort()
print("RESULT " + json.dumps({"median_s": times[len(times) // 2],
                              "min_s": times[0]}))
peers.wait_for_all("bench", 30)
'''


def _script_result(name, script, workers, rounds, args):
  """Runs script as `workers` processes on free ports (argv: hosts, task,
  rounds); the JSON after task 0's "RESULT " line."""
  hosts = ",".join("127.0.0.1:%d" % p for p in free_ports(workers))
  procs = [subprocess.Popen([sys.executable, "-c", script % {"root": ROOT},
                             hosts, str(t), str(rounds)], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
           for t in range(workers)]
  outs = [p.communicate(timeout=args.timeout) for p in procs]
  found = [l for l in outs[0][0].splitlines() if l.startswith("RESULT ")]
  if not found:
    raise SystemExit("the %s scenario failed: %s" % (name,
                                                     outs[0][1][-2000:]))
  return json.loads(found[0][7:])


def agreement(args):
  return dict(kind="agreement", workers=2, mesh="data:2;model:2",
              calls=200, **_script_result("agreement", AGREEMENT_SCRIPT, 2,
                                          200, args))


SAVE_SCRIPT = r'''
import json, os, statistics, sys, time
sys.path.insert(0, %(root)r)
import tensorflow as tf
import meshtf as mtf
from meshtf.lowering import cluster
from meshtf.train import peers
hosts, task, rounds = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
os.environ["TF_CONFIG"] = cluster.tf_config(hosts, task)
info = mtf.start_multi_worker(num_virtual_cpus=2)
impl = mtf.SimdMeshImpl("data:4;model:2",
                        "batch:data;heads:model;d_ff:model;vocab:model",
                        info.devices)
dims = dict(vocab=16, d_model=32, heads=4, d_kv=8, d_ff=64, length=8)
shapes = {"embedding": "vocab,d_model", "final_norm": "d_model",
          "att_norm": "d_model", "q": "d_model,heads,d_kv",
          "k": "d_model,heads,d_kv", "v": "d_model,heads,d_kv",
          "o": "heads,d_kv,d_model", "ff_norm": "d_model",
          "wi": "d_model,d_ff", "wo": "d_ff,d_model",
          "logits": "d_model,vocab", "positions": "length,d_model"}
store = mtf.VariableStore()
for name, spec in shapes.items():
  shape = mtf.Shape([mtf.Dimension(d, dims[d]) for d in spec.split(",")])
  for suffix in ("", "/slot_m", "/slot_v"):
    store.get_or_create(name + suffix, shape, tf.float32, impl,
                        lambda begin, sizes: tf.ones(sizes))
store.get_or_create("global_step", mtf.Shape([]), tf.int64, impl,
                    lambda begin, sizes: tf.zeros(sizes, tf.int64))
entries = store.entries()
per_variable, one_program = [], []
for _ in range(rounds):
  t = time.perf_counter()
  old = [e.full_value() for e in entries]
  per_variable.append(time.perf_counter() - t)
  t = time.perf_counter()
  new = store.full_values()
  one_program.append(time.perf_counter() - t)
  assert all(bool(tf.reduce_all(a == new[e.name]))
             for e, a in zip(entries, old))
print("RESULT " + json.dumps({
    "variables": len(entries),
    "per_variable_median_s": statistics.median(per_variable),
    "one_program_first_s": one_program[0],
    "one_program_later_median_s": statistics.median(one_program[1:])}))
peers.wait_for_all("bench", 30)
'''


def save(args):
  return dict(kind="save", workers=4, mesh="data:4;model:2", rounds=5,
              **_script_result("save", SAVE_SCRIPT, 4, 5, args))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--scenarios", default=",".join(SCENARIOS))
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--train_steps", type=int, default=24)
  parser.add_argument("--peer_timeout", type=float, default=10.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--timeout", type=float, default=600.0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  flags = FLAGS + ["--train_steps=%d" % args.train_steps,
                   "--config.peer_timeout_seconds=%g" % args.peer_timeout]
  names = args.scenarios.split(",")
  reference = None
  if any(n not in ("agreement", "save") for n in names):
    ref_dir = tempfile.mkdtemp(prefix="cluster_faults_reference_")
    t = time.monotonic()
    code, err = run_binary([sys.executable, "-m", "meshtf.train",
                            "--model_dir=" + ref_dir] + flags, args.timeout)
    if code:
      raise SystemExit("the reference run failed: %s" % err[-2000:])
    reference = metrics(ref_dir)
    print(json.dumps({"kind": "reference", "mode": "one process",
                      "steps": len(reference), "seconds": round(
                          time.monotonic() - t, 1),
                      "final_loss": reference[-1]["loss"]}), flush=True)
  for name in names:
    t = time.monotonic()
    record = agreement(args) if name == "agreement" else save(args) \
        if name == "save" else scenario(name, args, rng, reference, flags)
    record["wall_s"] = round(time.monotonic() - t, 1)
    record["load_avg_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(record, sort_keys=True), flush=True)


if __name__ == "__main__":
  main()
