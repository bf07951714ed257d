"""The training binary with config.remat (meshtf/models/remat.py): lm_tiny
with each layer recomputed in the backward pass trains with the losses of
the run that keeps everything, step by step (the recomputation re-runs the
same ops, dropout included), and the header says what is recomputed.
(The full run to the target accuracy is in the README.)"""
import io
import json
import os

from meshtf.train import config as config_lib
from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run(tmp_path, remat):
  c = config_lib.load_file(os.path.join(ROOT, "t2t_configs", "lm_tiny.py"))
  c.mesh_shape, c.layout = "data:2;model:2", "batch:data;d_ff:model;heads:model"
  c.batch_size, c.train_steps, c.log_every = 8, 3, 1
  c.eval_every, c.eval_steps, c.checkpoint_every = 0, 1, 100
  c.stop_at_target = False
  c.dropout_rate = 0.1
  c.remat = remat
  out = io.StringIO()
  main.run(c, "train", str(tmp_path / remat), out=out, progress=False)
  with open(os.path.join(str(tmp_path / remat), main.METRICS_FILE)) as f:
    return [json.loads(l)["loss"] for l in f], out.getvalue()


def test_lm_tiny_trains_with_remat_as_without(tmp_path):
  plain, _ = _run(tmp_path, "none")
  full, header = _run(tmp_path, "full")
  assert len(plain) == 3 and full == plain   # bit for bit
  assert plain[-1] != plain[0]
  assert ("remat: full (each layer keeps its input; the backward pass "
          "recomputes the layer)") in header
