"""--config.init_checkpoint through the binary's runner (meshtf/train/
init_checkpoint.py, mesh_tf_checkpoint.py), on a tiny T5.1.1-shaped model.

A run trained to step 4 and exported as a Mesh TF checkpoint (float32
weights, its Adafactor slots factored as Mesh TF factors them) starts a
fine-tune in a new model_dir that takes exactly the steps the original run
takes when resumed: the same losses at steps 5 and 6 (weights, slots and
step restored bit for bit, on another layout). The header carries the
restore block; a fine-tune with nothing to train is one line; a meshtf
model_dir restores as an init_checkpoint too.
"""
import io
import json
import os

import t5_tiny
from meshtf.train import experiment
from meshtf.train import init_checkpoint
from meshtf.train import main


def _config(**overrides):
  c = t5_tiny.config()
  c.task.problem = "reverse"
  c.mesh_shape, c.layout = "data:2;model:2", "batch:data;heads:model;d_ff:model"
  c.train_steps, c.log_every, c.eval_every, c.eval_steps = 4, 1, 0, 1
  c.checkpoint_every, c.stop_at_target = 100, False
  c.learning_rate, c.warmup_steps = 0.01, 0
  for k, v in overrides.items():
    c[k] = v
  return c


def _train(config, model_dir):
  out = io.StringIO()
  main.run(config, "train", model_dir, out=out, progress=False)
  with open(os.path.join(model_dir, main.METRICS_FILE)) as f:
    losses = {r["step"]: r["loss"] for r in map(json.loads, f)}
  return losses, out.getvalue()


def test_a_fine_tune_from_an_exported_checkpoint_repeats_the_run(tmp_path):
  original = str(tmp_path / "original")
  _train(_config(), original)
  # A meshtf model_dir is an init_checkpoint too (told apart by content).
  config = _config(init_optimizer=True)
  graph, _ = experiment.build_training_graph(config)
  plan = init_checkpoint.plan_restore(config, graph,
                                      experiment.build_model(config),
                                      original)
  assert (plan.kind, plan.step, plan.weights[0], plan.slots[0]) == (
      init_checkpoint.MESHTF, 4, 52, 90)
  assert not plan.missing and not plan.unused and not plan.conversions
  export = _config(export_format="mesh_tf", export_dtype="float32")
  result = main.run(export, "export", original, out=io.StringIO())
  assert result["path"] == os.path.join(original, "mesh_tf", "model.ckpt-4")
  resumed, _ = _train(_config(train_steps=6), original)
  tuned, header = _train(
      _config(init_checkpoint=os.path.join(original, "mesh_tf"),
              init_optimizer=True, finetune_steps=2,
              mesh_shape="model:2;data:2",
              layout="batch:data;d_kv:model;vocab:model"),
      str(tmp_path / "tuned"))
  # Metrics are keyed by the steps taken before: steps 5 and 6 are 4, 5.
  assert sorted(tuned) == [4, 5]
  assert [tuned[4], tuned[5]] == [resumed[4], resumed[5]]
  assert "init_checkpoint: %s (Mesh TF), step 4" % result["path"] in header
  assert "  restored 52 of 52 weights, 90 of 90 optimizer slots, the step" \
      in header
  assert "from init_checkpoint at step 4, to step 6" in header
  # Nothing to train past the checkpoint's step: one line, nothing written.
  try:
    main.run(_config(init_checkpoint=result["path"]), "train",
             str(tmp_path / "nothing"), out=io.StringIO())
  except main.UsageError as e:
    assert "init_checkpoint is at step 4 but train_steps is 4" in str(e)
  else:
    raise AssertionError("a fine-tune with nothing to train ran")
  assert not os.path.exists(str(tmp_path / "nothing"))
