"""A disk that fills during training: one line (exit 2) naming the full
disk and the checkpoint that stays intact, nothing half-written.

The real thing: the binary trains into a 160 kB tmpfs mounted in a private
mount namespace (`unshare -rm`, where the kernel allows it; otherwise the
test is skipped, saying why). The classification of the errors a full disk
raises (TensorFlow's and the OS's) is checked in this process.
"""
import errno
import os
import shutil
import subprocess
import sys

import pytest

from meshtf.train import errors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

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
  c.train_steps = 300
  c.checkpoint_every = 2
  c.eval_every = 0
  c.eval_steps = 1
  c.log_every = 1000
  c.stop_at_target = False
  return c
'''


def _can_mount_tmpfs(where):
  if not shutil.which("unshare"):
    return "no unshare command"
  r = subprocess.run(["unshare", "-rm", "sh", "-c",
                      "mount -t tmpfs -o size=64k none %s" % where],
                     capture_output=True, text=True, timeout=60)
  return None if r.returncode == 0 else (
      "cannot mount a tmpfs in a user mount namespace here: %s" %
      r.stderr.strip()[:200])


def test_a_disk_that_fills_during_training_is_one_line_and_keeps_the_last_checkpoint(  # noqa: E501
    tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  why = _can_mount_tmpfs(str(disk))
  if why:
    pytest.skip(why)
  config = tmp_path / "tiny.py"
  config.write_text(TINY)
  model_dir = disk / "m"
  check = ("from meshtf.train import checkpoint\n"
           "found = checkpoint.CheckpointManager(%r).read_newest_intact()\n"
           "print('INTACT', found.step, len(found.damaged))\n" % str(model_dir))
  script = (
      "mount -t tmpfs -o size=160k none {disk} && "
      "{python} -m meshtf.train --config={config} --model_dir={model_dir} "
      "2>{tmp}/err >{tmp}/out; echo $? >{tmp}/rc; ls -a {model_dir} "
      ">{tmp}/ls; {python} -c \"$CHECK\" >{tmp}/check 2>&1").format(
          disk=disk, python=sys.executable, config=config,
          model_dir=model_dir, tmp=tmp_path)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHECK=check)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  # ~20 s of CPU; room for a loaded machine twice as slow.
  subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=env,
                 timeout=500, check=True)
  err = (tmp_path / "err").read_text()
  assert (tmp_path / "rc").read_text().strip() == "2", err[-3000:]
  lines = err.splitlines()
  assert len(lines) == 1, err[-3000:]
  assert lines[0].startswith(
      "meshtf.train: error: the disk of --model_dir=%s is full (No space "
      "left on device writing " % model_dir), lines[0]
  assert lines[0].endswith(
      "is intact; free space on it (or pass --model_dir on a disk with "
      "room) and train again to continue from there"), lines[0]
  step, damaged = (tmp_path / "check").read_text().split()[-2:]
  assert int(step) >= 2 and damaged == "0", (tmp_path / "check").read_text()
  assert "%s/ckpt-%s is intact" % (model_dir, step) in lines[0]
  listing = (tmp_path / "ls").read_text().split()
  assert not [n for n in listing if "tmp" in n or n == "train.lock"], listing


def test_what_a_full_disk_raises_is_recognised():
  import tensorflow as tf
  assert errors.is_disk_full(OSError(errno.ENOSPC, "No space left"))
  assert errors.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
  assert not errors.is_disk_full(OSError(errno.EACCES, "Permission denied"))
  full = tf.errors.ResourceExhaustedError(
      None, None, "{{function_node __wrapped__SaveV2}} /m/x.tempstate1; No "
      "space left on device [Op:SaveV2]")
  assert errors.is_disk_full(full)
  assert not errors.is_disk_full(tf.errors.ResourceExhaustedError(
      None, None, "OOM when allocating tensor"))
  from meshtf.train import training_loop
  assert training_loop._disk_full_reason(full, "/m") == (
      "No space left on device writing x.tempstate1")


def test_a_full_disk_while_model_dir_is_created_is_one_line(tmp_path,
                                                            monkeypatch):
  """Issue 41: a raw "[Errno 28] No space left on device" (no path), and
  the folders made before it stayed. (Measured on a full 4 kB tmpfs: mkdir
  of the second folder fails.) Now the saves' disk-full line, nothing left
  behind."""
  import io
  from meshtf.train import main
  model_dir = tmp_path / "new" / "model"
  real_mkdir = os.mkdir

  def mkdir(path, *args, **kwargs):
    if os.path.abspath(path) == str(model_dir):
      raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real_mkdir(path, *args, **kwargs)
  monkeypatch.setattr(os, "mkdir", mkdir)
  err = io.StringIO()
  code = main.run_command([
      "meshtf.train", "--config=" + os.path.join(ROOT, "t2t_configs",
                                                 "lm_tiny.py"),
      "--model_dir=%s" % model_dir, "--train_steps=1"], out=io.StringIO(),
                          err=err)
  assert code == 2 and err.getvalue() == (
      "meshtf.train: error: the disk of --model_dir=%s is full (No space "
      "left on device creating %s): nothing was written; free space on it "
      "(or pass --model_dir on a disk with room) and train again\n" % (
          model_dir, model_dir)), err.getvalue()
  assert os.listdir(str(tmp_path)) == []
