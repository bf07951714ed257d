"""The training binary `python -m meshtf.train` (meshtf/train/main.py).

A tiny MoE language model (1 layer whose feed-forward is a 4-expert MoE)
on 4 devices with a data + model + expert parallel layout:

- train in-process: summary (mesh, layout, parameters per device,
  collectives incl. the MoE alltoall), per-step metrics in metrics.jsonl,
  TensorBoard events, checkpoints every 4 steps;
- eval gives the same held-out loss/accuracy as training's final eval,
  perplexity = exp(loss); decode greedily decodes held-out prompts; export
  writes a SavedModel that a subprocess which never imports meshtf loads
  and calls: its greedy decode equals the mesh's, its scores are per
  example;
- KILL-RESUME: a training subprocess is SIGKILLed once a checkpoint
  exists; a restarted one resumes from it, and the losses of every step
  equal those of an uninterrupted run (within 1e-6);
- RESHARD: a checkpoint saved under data:2;model:2 continues training
  under another mesh and layout (all:4, data + expert parallel only) with
  the uninterrupted run's losses (within float summation order);
- MULTI-WORKER: two binary processes form the mesh, each reading only its
  rows of every batch; losses and checkpoint equal the one-process run's;
- LOCK: while a training process runs, a second run into its model_dir is
  one line (exit 2); after the first is SIGKILLed its stale lock is taken
  over with a warning line;
- SELF-HEALING: a model_dir with a damaged newest checkpoint, leftovers of
  a killed save and a stale lock resumes from the newest intact checkpoint
  (one warning line naming the damaged one, which is moved aside) with the
  uninterrupted run's losses;
- DIVERGENCE: a NaN loss stops training at once with one line naming the
  step and the causes, exit code 1, and no checkpoint that is not finite;
- a model_dir remembers its config: eval / decode / export need no
  --config.
Bad input through the binary is in test_catalogue.py.
"""
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from meshtf.train import decode as decode_lib
from meshtf.train import experiment
from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

TINY = '''
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.num_layers = 1
  c.moe.layers = "all"
  c.moe.group_size = 16        # 4 groups under every layout tested
  c.mesh_shape = "data:2;model:2"
  c.batch_size = 8
  c.length = 8
  c.train_steps = 12
  c.checkpoint_every = 4
  c.keep_checkpoints = 5
  c.eval_every = 0
  c.eval_steps = 1
  c.log_every = 4
  c.decode_batches = 1
  c.stop_at_target = False
  return c
'''

# TensorFlow's own start-up lines on stderr (CUDA probing, CPU features).
_TF_NOISE = ("WARNING: All log messages before absl::InitializeLog()",
             "To enable the following instructions")


def _our_lines(stderr):
  out = []
  for line in stderr.splitlines():
    if not line.strip() or line.startswith(_TF_NOISE):
      continue
    if len(line) > 5 and line[0] in "IWEF" and line[1:5].isdigit():
      continue  # C++ log line: I0000 00:00:...
    out.append(line)
  return out


def _env():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
  path = tmp_path_factory.mktemp("configs") / "tiny.py"
  path.write_text(TINY)
  return str(path)


def _config(tiny_path):
  spec = importlib.util.spec_from_file_location("tiny_config", tiny_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _binary(tiny_path, model_dir, *args):
  return [sys.executable, "-m", "meshtf.train", "--config=" + tiny_path,
          "--model_dir=" + str(model_dir)] + list(args)


def _metrics(model_dir):
  with open(os.path.join(model_dir, main.METRICS_FILE)) as f:
    return [json.loads(l) for l in f]


@pytest.fixture(scope="module")
def reference(tiny_path, tmp_path_factory):
  """An uninterrupted in-process training run (12 steps)."""
  model_dir = str(tmp_path_factory.mktemp("reference"))
  log = []
  result = main.run(_config(tiny_path), "train", model_dir,
                    out=_Lines(log), progress=False)
  return model_dir, result, "\n".join(log)


class _Lines(object):
  def __init__(self, lines):
    self.lines = lines

  def write(self, s):
    self.lines.append(s)

  def flush(self):
    pass


# --- train / eval / decode / export -------------------------------------------
def test_train_writes_summary_metrics_events_and_checkpoints(reference):
  model_dir, result, log = reference
  for text in ("mesh: data:2;model:2 = 4 processors, simd backend",
               "layout: batch:data;group:data;experts:data;heads:model",
               "per device", "collectives per step", "alltoall",
               "model_dir: %s (new)" % model_dir, "final eval accuracy",
               "target 0.9900"):
    assert text in log, (text, log)
  # The header is on screen before the step is traced, then its time.
  order = [log.index(t) for t in ("layout: ", "model_dir: ",
                                  "tracing and lowering the training step",
                                  "first step (trace + lowering + run)",
                                  "collectives per step", "step 4  loss")]
  assert order == sorted(order), log
  records = _metrics(model_dir)
  assert [r["step"] for r in records] == list(range(12))
  for key in ("loss", "accuracy", "learning_rate", "tokens_per_sec",
              "moe_load_max", "moe_dropped", "moe_aux_loss"):
    assert all(math.isfinite(r[key]) for r in records), key
  assert records[-1]["loss"] < records[0]["loss"]
  assert result["history"][-1]["loss"] == records[-1]["loss"]
  names = sorted(os.listdir(model_dir))
  assert {"ckpt-4", "ckpt-8", "ckpt-12", "config.json", "train",
          "eval"} <= set(names), names
  assert any(n.startswith("events.out.tfevents") for n in
             os.listdir(os.path.join(model_dir, "train")))
  kinds = {s["kind"] for s in result["collective_stats"]}
  assert "alltoall" in kinds and "allreduce_sum" in kinds


def test_eval_decode_and_export_served_without_meshtf(reference, tiny_path,
                                                      tmp_path):
  model_dir, trained, _ = reference
  config = _config(tiny_path)
  log = []
  ev = main.run(config, "eval", model_dir, out=_Lines(log))
  assert ev["step"] == 12
  assert ev["accuracy"] == pytest.approx(trained["eval"]["accuracy"],
                                         abs=1e-6)
  assert ev["loss"] == pytest.approx(trained["eval"]["loss"], rel=1e-5)
  assert ev["perplexity"] == pytest.approx(math.exp(ev["loss"]))

  dec = main.run(config, "decode", model_dir, out=_Lines(log))
  assert 0.0 <= dec["exact_match"] <= dec["token_accuracy"] <= 1.0
  batch, decoded = dec["first_batch"], dec["first_decoded"]
  prompt_len, _ = decode_lib.decode_prompts(batch, seq2seq=False)
  for row in range(len(decoded)):  # the prompt is kept, the rest decoded
    p = prompt_len[row]
    assert (decoded[row, :p] == batch["targets"][row, :p]).all()

  ex = main.run(config, "export", model_dir, out=_Lines(log))
  inputs = str(tmp_path / "inputs.npz")
  np.savez(inputs, targets=batch["targets"], prompt_length=prompt_len)
  script = tmp_path / "serve.py"
  script.write_text(SERVE)
  out = subprocess.run([sys.executable, str(script), ex["path"], inputs],
                       cwd=str(tmp_path), capture_output=True, text=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                PYTHONPATH=""), timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  served = json.loads(out.stdout.strip().splitlines()[-1])
  assert served["meshtf_imported"] is False
  assert served["signatures"] == ["decode", "score"]
  # The exported model (1 device, plain TF) decodes like the mesh.
  assert served["decoded"] == decoded.tolist()
  nonpad = (batch["targets"][:3] != 0).sum(axis=1)
  assert served["num_tokens"] == nonpad.tolist()
  assert all(0 < l < 10 for l in served["loss"]) and len(served["loss"]) == 3


SERVE = '''
import json, sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
data = np.load(sys.argv[2])
targets = tf.constant(data["targets"])
decoded = model.signatures["decode"](
    targets=targets, prompt_length=tf.constant(data["prompt_length"]))
score = model.signatures["score"](targets=targets[:3])
print(json.dumps({
    "signatures": sorted(model.signatures),
    "decoded": decoded["outputs"].numpy().tolist(),
    "loss": score["loss"].numpy().tolist(),
    "num_tokens": score["num_tokens"].numpy().astype(int).tolist(),
    "meshtf_imported": any(m.startswith("meshtf") for m in sys.modules)}))
'''


# --- kill and resume, reshard -------------------------------------------------
def test_killed_training_resumes_with_identical_losses(reference, tiny_path,
                                                       tmp_path):
  model_dir = tmp_path / "killed"
  proc = subprocess.Popen(_binary(tiny_path, model_dir), cwd=ROOT,
                          env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  lock = model_dir / "train.lock"
  deadline = time.time() + 240
  while not lock.exists() and proc.poll() is None and \
      time.time() < deadline:
    time.sleep(0.02)
  # A second run into the same model_dir while the first trains: refused.
  err2 = _Lines([])
  code = main.run_command(_binary(tiny_path, model_dir)[2:], out=_Lines([]),
                          err=err2)
  assert code == 2, err2.lines
  assert "is in use by another training run (pid %d on host" % proc.pid in \
      "".join(err2.lines), err2.lines
  first = model_dir / "ckpt-4" / "meta.json"
  while not first.exists() and proc.poll() is None and \
      time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate()
  assert first.exists(), err[-3000:]
  assert proc.returncode == -signal.SIGKILL
  assert not (model_dir / "ckpt-12").exists(), "finished before the kill"
  assert lock.exists()   # left behind by the killed run

  out = subprocess.run(_binary(tiny_path, model_dir), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from step" in out.stdout, out.stdout
  assert out.stderr.splitlines() == [
      "meshtf.train: warning: --model_dir=%s was locked by pid %d on host %s "
      "(since %s), which is no longer running: took the lock over" % (
          model_dir, proc.pid, socket.gethostname(),
          _lock_started(out.stderr))], out.stderr
  assert not lock.exists()
  records = _metrics(str(model_dir))
  assert [r["step"] for r in records] == list(range(12))
  want = reference[1]["history"]
  for got, ref in zip(records, want):
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-6), (
        got["step"])
    assert got["accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6)


def _lock_started(stderr):
  return stderr.split("(since ", 1)[1].split(")", 1)[0]


def _resume(reference, tiny_path, tmp_path, step, mesh_shape, layout):
  """Trains on from the reference run's checkpoint at `step` in a new
  model_dir under another mesh and layout; returns (result, log lines)."""
  model_dir = tmp_path / ("resumed_%d" % step)
  model_dir.mkdir()
  name = "ckpt-%d" % step
  shutil.copytree(os.path.join(reference[0], name), model_dir / name)
  config = _config(tiny_path)
  config.mesh_shape, config.layout = mesh_shape, layout
  log = []
  result = main.run(config, "train", str(model_dir), out=_Lines(log),
                    progress=False)
  return result, log


def test_checkpoint_continues_under_another_mesh_and_layout(reference,
                                                            tiny_path,
                                                            tmp_path):
  result, log = _resume(reference, tiny_path, tmp_path, 4, "all:4",
                        "batch:all;group:all;experts:all")
  assert result["start_step"] == 4
  assert "resumed from step 4" in "\n".join(log)
  want = reference[1]["history"][4:]
  got = result["history"]
  assert [r["step"] for r in got] == list(range(4, 12))
  for g, w in zip(got, want):
    assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), g["step"]


def test_checkpoint_continues_under_an_uneven_layout(reference, tiny_path,
                                                      tmp_path):
  """The same run resumed on 3 processors: experts:4, heads:4 and vocab:16
  split 3 ways (padded stripes; expert and head groups alltoall and reduce
  across them); the summary says what the padding costs, and the losses
  are the uninterrupted run's."""
  result, log = _resume(reference, tiny_path, tmp_path, 8, "a:3",
                        "experts:a;heads:a;vocab:a")
  text = "\n".join(log)
  assert "uneven splits:" in text and "vocab:16/3 -> 6" in text, text
  got = result["history"]
  assert [r["step"] for r in got] == list(range(8, 12))
  for g, w in zip(got, reference[1]["history"][8:]):
    assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), g["step"]


def test_two_worker_processes_train_like_one(reference, tiny_path, tmp_path):
  """Two real binary processes (2 virtual CPUs each) form the 4-device
  mesh: each reads only its half of every batch, the MoE alltoall and the
  gradient sums cross processes, the chief alone writes, and losses and
  the checkpoint equal the one-process run's."""
  from conftest import free_ports
  hosts = ",".join("127.0.0.1:%d" % p for p in free_ports(2))
  model_dir = tmp_path / "two_workers"
  procs = [subprocess.Popen(
      _binary(tiny_path, model_dir, "--train_steps=4",
              "--worker_hosts=" + hosts, "--task_index=%d" % t),
      cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for t in range(2)]
  outs = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=300)
      assert p.returncode == 0, err[-3000:]
      outs.append(out)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert "it reads batch rows 0..3 of 8" in outs[0], outs[0]
  assert "[worker 1] workers: 2 (this is task 1); it reads batch rows 4..7 " \
      "of 8" in outs[1], outs[1]
  records = _metrics(str(model_dir))   # one writer: 4 lines, not 8
  assert [r["step"] for r in records] == list(range(4))
  for got, ref in zip(records, reference[1]["history"]):
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6), got["step"]
  from meshtf.train import checkpoint
  _, got, _ = checkpoint.CheckpointManager(str(model_dir)).read()
  _, want, _ = checkpoint.CheckpointManager(reference[0]).read(
      os.path.join(reference[0], "ckpt-4"))
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)


# --- a model_dir that heals, a run that cannot silently diverge ---------------
def test_resume_skips_a_damaged_checkpoint_and_cleans_leftovers(
    reference, tiny_path, tmp_path):
  """The newest checkpoint's data is truncated, a killed save left its
  temporary folder and index file, and a dead run left its lock: training
  warns (one line each), resumes from the newest intact checkpoint with the
  uninterrupted run's losses, moves the damaged one aside and removes the
  leftovers."""
  model_dir = tmp_path / "healed"
  model_dir.mkdir()
  for name in ("ckpt-4", "ckpt-8", "config.json", "checkpoint.json"):
    src = os.path.join(reference[0], name)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(
        src, model_dir / name)
  data = [f for f in os.listdir(model_dir / "ckpt-8") if ".data-" in f][0]
  with open(model_dir / "ckpt-8" / data, "r+b") as f:
    f.truncate(100)
  (model_dir / ".tmp-ckpt-9-abc123").mkdir()
  (model_dir / ".tmp-ckpt-9-abc123" / "meta.json").write_text("{")
  (model_dir / "checkpoint.json.tmp-4242").write_text("{")
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (model_dir / "train.lock").write_text(json.dumps(
      {"pid": dead.pid, "host": socket.gethostname(), "started": "then"}))
  config_before = (model_dir / "config.json").read_bytes()
  log, err = [], _Lines([])
  result = main.run(_config(tiny_path), "train", str(model_dir),
                    out=_Lines(log), err=err, progress=False)
  warnings = "".join(err.lines).splitlines()
  assert len(warnings) == 2, warnings
  assert "was locked by pid %d" % dead.pid in warnings[0]
  assert warnings[1].startswith(
      "meshtf.train: warning: checkpoint %s is damaged (the variables bundle"
      " does not read: " % (model_dir / "ckpt-8")), warnings[1]
  assert warnings[1].endswith("using ckpt-4 (step 4) instead; moved to "
                              "damaged-ckpt-8"), warnings[1]
  text = "".join(log)
  assert "removed what an interrupted run left: .tmp-ckpt-9-abc123, " \
      "checkpoint.json.tmp-4242" in text, text
  assert result["start_step"] == 4
  for got, want in zip(result["history"], reference[1]["history"][4:]):
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]
  names = set(os.listdir(model_dir))
  assert {"damaged-ckpt-8", "ckpt-8", "ckpt-12"} <= names, names
  assert not any(n.startswith((".tmp", "train.lock", "checkpoint.json.tmp"))
                 for n in names), names
  # config.json was rewritten only after every check passed (same config).
  assert (model_dir / "config.json").read_bytes() == config_before


@pytest.mark.parametrize("checkpoint_every,what", [
    (1000, "the loss is "),         # caught by the loss of the next step
    (1, "variable '"),              # caught when saving, before writing
])
def test_divergence_stops_with_one_line_and_no_bad_checkpoint(
    checkpoint_every, what, tiny_path, tmp_path):
  """--config.learning_rate=1e30 --config.clip_gradient_norm=0: the issue's
  example. Training stops at the first step whose loss (or whose updated
  variables, at a checkpoint) is not finite; exit code 1; one line."""
  model_dir = tmp_path / "diverged"
  out, err = _Lines([]), _Lines([])
  code = main.run_command(
      _binary(tiny_path, model_dir)[2:] + [
          "--config.learning_rate=1e30", "--config.clip_gradient_norm=0",
          "--config.checkpoint_every=%d" % checkpoint_every], out=out,
      err=err)
  lines = "".join(err.lines).splitlines()
  assert code == 1, lines
  assert len(lines) == 1, lines
  head = "meshtf.train: error: training diverged at step "
  assert lines[0].startswith(head), lines[0]
  step = int(lines[0][len(head):].split(":")[0])
  assert lines[0][len(head):].split(": ", 1)[1].startswith(what), lines[0]
  for text in ("learning_rate 1e+30 is too high", "gradients are not clipped "
               "(clip_gradient_norm 0)", "lower --config.learning_rate",
               "set --config.clip_gradient_norm=1.0"):
    assert text in lines[0], (text, lines[0])
  from meshtf.train import checkpoint
  manager = checkpoint.CheckpointManager(str(model_dir))
  saved = [s for s, _ in manager.checkpoints()]
  assert saved == list(range(1, step)) if checkpoint_every == 1 else not saved
  assert lines[0].endswith(
      "model_dir keeps ckpt-%d, nothing was saved after it" % saved[-1]
      if saved else "no checkpoint was saved"), lines[0]
  for _, path in manager.checkpoints():
    _, values, _ = manager.verify(path)
    assert all(np.isfinite(v).all() for v in values.values()), path
  assert all(math.isfinite(r["loss"]) for r in _metrics(str(model_dir)))
  assert not (model_dir / "train.lock").exists()


def test_eval_and_decode_need_no_config(reference, tmp_path):
  """model_dir/config.json supplies the config: the README's
  `--mode=eval --model_dir=D` commands run as written."""
  model_dir, trained, _ = reference
  out, err = _Lines([]), _Lines([])
  code = main.run_command(["meshtf.train", "--mode=eval",
                           "--model_dir=" + model_dir], out=out, err=err)
  assert code == 0 and not err.lines, err.lines
  text = "".join(out.lines)
  assert "eval at step 12: loss %.4f  accuracy %.4f" % (
      trained["eval"]["loss"], trained["eval"]["accuracy"]) in text, text
  prompts = tmp_path / "two.txt"
  prompts.write_text("5 9 4\n3 15\n")
  out = _Lines([])
  code = main.run_command(["meshtf.train", "--mode=decode",
                           "--model_dir=" + model_dir,
                           "--config.decode_prompts_file=" + str(prompts),
                           "--config.decode_output_file=" +
                           str(tmp_path / "out.txt")], out=out, err=err)
  assert code == 0 and not err.lines, err.lines
  shown = [l for l in "".join(out.lines).splitlines()
           if l.startswith("  input ")]
  # Two prompts, two lines (the batch's padding rows are not shown); the
  # language model's input ends with the separator (2).
  assert [l.split(" -> ")[0] for l in shown] == ["  input [5, 9, 4, 2]",
                                                 "  input [3, 15, 2]"], shown
  assert len((tmp_path / "out.txt").read_text().splitlines()) == 2


def test_train_steps_below_the_trained_step_writes_nothing(reference,
                                                           tmp_path):
  """Issue 41: --train_steps=6 on a model trained to 12 said "already
  trained" but rewrote config.json's train_steps (and added empty event
  files). Now the run says what to pass and leaves model_dir as it was."""
  import hashlib

  def _snapshot(path):
    out = {}
    for root, _, names in os.walk(path):
      for name in names:
        with open(os.path.join(root, name), "rb") as f:
          out[os.path.relpath(os.path.join(root, name), path)] = \
              hashlib.sha1(f.read()).hexdigest()
    return out
  model_dir = str(tmp_path / "m")
  shutil.copytree(reference[0], model_dir)
  before = _snapshot(model_dir)
  out, err = _Lines([]), _Lines([])
  code = main.run_command(["meshtf.train", "--model_dir=" + model_dir,
                           "--train_steps=6"], out=out, err=err)
  assert code == 0 and not err.lines, err.lines
  assert ("is already trained to step 12 (train_steps 6): nothing to train, "
          "nothing written; pass --train_steps=13 or more to train on"
          ) in "".join(out.lines)
  assert _snapshot(model_dir) == before
