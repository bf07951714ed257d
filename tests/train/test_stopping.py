"""Clean stops (meshtf/train/stopping.py): SIGINT and SIGTERM during
training save a checkpoint at the step reached, say where in one line and
exit 130 / 143; training again continues from that step with the numbers of
an uninterrupted run. A stop while tracing the first step, during export,
or a second signal stops at once, leaving nothing half-written.

The signal test uses real processes (two: one stopped by SIGINT, its
resumption stopped by SIGTERM); the reference and the final resumption run
in this process (a TensorFlow start-up each would cost ~10 s). The stops
at once are driven in this process by signals sent to itself at the moment
under test.
"""
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from meshtf.train import main
from meshtf.train import stopping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STEPS = 40

# A small dense model on 2 virtual CPUs: cheap to trace and to run.
TINY = '''
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.moe.num_experts = 0
  c.num_layers = 1
  c.d_model = 16
  c.d_ff = 32
  c.num_heads = 2
  c.mesh_shape = "data:2"
  c.layout = "batch:data"
  c.batch_size = 8
  c.length = 8
  c.train_steps = %d
  c.checkpoint_every = 1000
  c.eval_every = 0
  c.eval_steps = 1
  c.log_every = 1
  c.stop_at_target = False
  return c
''' % STEPS


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
  path = tmp_path_factory.mktemp("configs") / "tiny_stop.py"
  path.write_text(TINY)
  return str(path)


def _metrics(model_dir):
  with open(os.path.join(str(model_dir), main.METRICS_FILE)) as f:
    return [json.loads(l) for l in f]


def _run(tiny_path, model_dir, *flags):
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train", "--config=" + tiny_path,
                           "--model_dir=" + str(model_dir)] + list(flags),
                          out=out, err=err)
  return code, out.getvalue(), err.getvalue()


def _signal_when(tiny_path, model_dir, line_start, signum):
  """Starts the binary, sends signum once a stdout line starts with
  line_start; returns (exit code, stdout, stderr)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.Popen(
      [sys.executable, "-m", "meshtf.train", "--config=" + tiny_path,
       "--model_dir=" + str(model_dir)], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if line.startswith(line_start):
      proc.send_signal(signum)
      break
  # Room for a machine twice as slow as a loaded 2-core one (~70 s).
  out, err = proc.communicate(timeout=400)
  return proc.returncode, "".join(seen) + out, err


def _stopped_at(err, signame, model_dir):
  pattern = (r"meshtf\.train: stopped by %s after step (\d+): saved "
             r"%s/ckpt-\1; train again with --model_dir=%s to continue from "
             r"step \1\n$" % (signame, re.escape(str(model_dir)),
                              re.escape(str(model_dir))))
  m = re.match(pattern, err)
  assert m, err[-3000:]
  return int(m.group(1))


def test_sigint_then_sigterm_save_and_resume_with_identical_losses(
    tiny_path, tmp_path):
  reference = tmp_path / "reference"
  code, _, err = _run(tiny_path, reference)
  assert code == 0, err
  want = _metrics(reference)
  assert [r["step"] for r in want] == list(range(STEPS))

  model_dir = tmp_path / "stopped"
  code, out, err = _signal_when(tiny_path, model_dir, "step 3 ",
                                signal.SIGINT)
  assert code == 130, (code, err[-3000:], out[-2000:])
  first = _stopped_at(err, "SIGINT", model_dir)
  assert 3 <= first < STEPS, first
  assert (model_dir / ("ckpt-%d" % first) / "meta.json").exists()
  assert not (model_dir / "train.lock").exists()

  code, out, err = _signal_when(tiny_path, model_dir,
                                "step %d " % (first + 2), signal.SIGTERM)
  assert code == 143, (code, err[-3000:], out[-2000:])
  assert "model_dir: %s (resumed from step %d)" % (model_dir, first) in out
  second = _stopped_at(err, "SIGTERM", model_dir)
  assert first + 2 <= second < STEPS, (first, second)

  code, out, err = _run(tiny_path, model_dir)
  assert code == 0 and err == "", err
  assert "resumed from step %d" % second in out
  got = _metrics(model_dir)
  assert [r["step"] for r in got] == list(range(STEPS))
  for g, w in zip(got, want):
    assert g["loss"] == pytest.approx(w["loss"], rel=1e-6, abs=1e-6), g
    assert g["accuracy"] == pytest.approx(w["accuracy"], abs=1e-6), g


# --- stops at once, in this process ----------------------------------------------
def _snapshot(path):
  out = {}
  for root, _, names in os.walk(str(path)):
    for name in names:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        out[os.path.relpath(full, str(path))] = hashlib.sha1(
            f.read()).hexdigest()
  return out


def _checkpoint_files(snapshot):
  return {k: v for k, v in snapshot.items()
          if k.startswith(("ckpt-", "checkpoint.json"))}


def _kill_self(times=1):
  for _ in range(times):
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def trained(tiny_path, tmp_path_factory):
  """A model_dir trained for 4 steps (ckpt-4)."""
  model_dir = tmp_path_factory.mktemp("trained") / "m"
  code, _, err = _run(tiny_path, model_dir, "--train_steps=4")
  assert code == 0, err
  return model_dir


def test_a_stop_while_tracing_stops_at_once_and_keeps_the_checkpoint(
    tiny_path, trained, tmp_path, monkeypatch):
  import shutil
  from meshtf.models import training
  model_dir = tmp_path / "m"
  shutil.copytree(str(trained), str(model_dir))
  before = _snapshot(model_dir)
  handler = signal.getsignal(signal.SIGINT)
  build = training.TrainStep._build

  def build_then_signal(self, *args, **kwargs):   # while tracing
    _kill_self()
    return build(self, *args, **kwargs)
  monkeypatch.setattr(training.TrainStep, "_build", build_then_signal)
  code, out, err = _run(tiny_path, model_dir, "--train_steps=8")
  assert code == 130, err
  assert err == (
      "meshtf.train: stopped by SIGINT while tracing and lowering the "
      "training step: %s keeps ckpt-4 (train again with this --model_dir to "
      "continue from there)\n" % model_dir), err
  after = _snapshot(model_dir)
  assert _checkpoint_files(after) == _checkpoint_files(before)
  assert not [n for n in os.listdir(str(model_dir))
              if ".tmp" in n or n == "train.lock"]
  assert [r["step"] for r in _metrics(model_dir)] == [0, 1, 2, 3]
  assert signal.getsignal(signal.SIGINT) is handler   # restored


def test_a_second_signal_stops_at_once(tiny_path, trained, tmp_path,
                                       monkeypatch):
  import shutil
  from meshtf.train import training_loop
  model_dir = tmp_path / "m"
  shutil.copytree(str(trained), str(model_dir))
  before = _checkpoint_files(_snapshot(model_dir))
  first_step = training_loop.print_first_step

  def signal_twice(*args, **kwargs):   # after the first step: deferred
    first_step(*args, **kwargs)
    _kill_self(2)
  monkeypatch.setattr(training_loop, "print_first_step", signal_twice)
  code, _, err = _run(tiny_path, model_dir, "--train_steps=8")
  assert code == 130, err
  assert err.startswith("meshtf.train: stopped at once by a second SIGINT "
                        "while training: %s keeps ckpt-4" % model_dir), err
  assert _checkpoint_files(_snapshot(model_dir)) == before


def test_a_stop_during_export_leaves_no_half_written_savedmodel(
    trained, monkeypatch):
  import tensorflow as tf
  before = _snapshot(trained)
  save = tf.saved_model.save

  def save_then_signal(module, path, **kwargs):
    save(module, path, **kwargs)
    assert os.path.isdir(path)   # the temporary SavedModel, complete
    _kill_self()
  monkeypatch.setattr(tf.saved_model, "save", save_then_signal)
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train", "--model_dir=%s" % trained,
                           "--mode=export"], out=out, err=err)
  assert code == 130, err.getvalue()
  assert err.getvalue() == (
      "meshtf.train: stopped by SIGINT while exporting (the SavedModel is "
      "written under a temporary name until complete): nothing was written;"
      " %s keeps ckpt-4\n" % trained)
  assert _snapshot(trained) == before


def test_stop_requests_defer_the_first_signal_only():
  handlers = [signal.getsignal(s) for s in stopping.SIGNALS]
  with stopping.StopRequests() as stops:
    with pytest.raises(stopping.Interrupted) as e:
      stops.phase = "starting"
      _kill_self()
    assert (e.value.signum, e.value.phase, e.value.second) == (
        signal.SIGINT, "starting", False)
    with stops.deferred("training"):
      os.kill(os.getpid(), signal.SIGTERM)
      assert stops.signum == signal.SIGTERM
      with pytest.raises(stopping.Interrupted) as e:
        _kill_self()
      assert e.value.second and e.value.exit_code == 130
  assert stopping.exit_code(signal.SIGTERM) == 143
  assert [signal.getsignal(s) for s in stopping.SIGNALS] == handlers
