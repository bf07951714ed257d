"""Streamed text through the training binary (meshtf.train.main.run,
in-process): a bitransformer trains on T5's span corruption from a gzip
text file and, resumed from its checkpoint, continues with the losses of
the uninterrupted run (the input position is in the checkpoint's
meta.json); a decoder-only LM trains on a glob of TFRecord shards. Both
export a SavedModel whose decode_text signature turns prompt strings into
the strings --mode=decode writes -- for the LM in a fresh process where
meshtf cannot be imported, on more prompts than the export batch."""
import gzip
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys

import numpy as np

from meshtf.train import config as config_lib
from meshtf.train import main


def _words(n, seed):
  rng = random.Random(seed)
  letters = "abcdefghijklmnop"
  vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 6)))
           for _ in range(60)]
  return [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 30)))
          for _ in range(n)]


def _config(**task):
  c = config_lib.default_config()
  c.moe.num_experts = 0
  c.num_layers = 1
  c.length = 32
  c.batch_size = 4
  c.mesh_shape = "all:2"
  c.layout = "batch:all"
  c.eval_every = 0
  c.eval_steps = 1
  c.stop_at_target = False
  c.checkpoint_every = 100
  c.log_every = 100
  for k, v in task.items():
    c.task[k] = v
  return c


PROMPTS = ["abc de", "fgh ij klm", "no"]


def _decode_and_export(c, model_dir, tmp_path):
  """(the --mode=decode strings of PROMPTS, the export's path)."""
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("\n".join(PROMPTS) + "\n")
  c.decode_prompts_file = str(prompts)
  decoded = main.run(c, "decode", model_dir, out=io.StringIO())["outputs"]
  c.decode_prompts_file = ""
  c.export_batch_size = 2     # fewer than the prompts: decode_text batches
  path = main.run(c, "export", model_dir, out=io.StringIO())["path"]
  return decoded, path


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f)}


def test_span_corruption_trains_from_gzip_and_resumes_exactly(tmp_path):
  path = tmp_path / "corpus.txt.gz"
  with gzip.open(path, "wt") as f:
    f.write("\n".join(_words(400, 1)) + "\n")
  c = _config(data_files=str(path), objective="span_corruption",
              extra_ids=8)
  c.model_type = "bitransformer"
  c.vocab_size = 48
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  c.train_steps = 6
  c.checkpoint_every = 4
  result = main.run(c, "train", whole, out=io.StringIO(), progress=False)
  assert all(math.isfinite(r["loss"]) for r in result["history"])
  with open(os.path.join(whole, "ckpt-4", "meta.json")) as f:
    position = json.load(f)["extra"]["input"]
  assert position["step"] == 4 and sorted(position["lanes"]) == [
      "0", "1", "2", "3"]
  # The run stopped after its checkpoint of step 4, and started again.
  shutil.copytree(whole, parts)
  shutil.rmtree(os.path.join(parts, "ckpt-6"))
  out = io.StringIO()
  main.run(c, "train", parts, out=out, progress=False)
  assert "resumed from step 4" in out.getvalue()
  assert "input:" not in out.getvalue()     # the position was used
  want, got = _losses(whole), _losses(parts)
  assert sorted(got) == list(range(6))
  np.testing.assert_allclose([got[4], got[5]], [want[4], want[5]],
                             rtol=1e-6)
  assert os.path.isfile(os.path.join(parts, "vocab.model"))
  decoded, path = _decode_and_export(c, parts, tmp_path)
  assert len(decoded) == 3 and any(decoded), decoded
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (its ops: the SavedModel's tokenizer)
  model = tf.saved_model.load(path)
  got = model.signatures["decode_text"](text=tf.constant(PROMPTS))
  assert [t.decode() for t in got["outputs"].numpy()] == decoded


def test_tfrecord_shards_train_an_lm(tmp_path):
  import tensorflow as tf
  texts = _words(300, 2)
  for shard in range(3):
    name = str(tmp_path / ("train-%05d-of-00003.tfrecord" % shard))
    with tf.io.TFRecordWriter(name) as w:
      for t in texts[shard::3]:
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "body": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[t.encode()]))})).SerializeToString())
  c = _config(data_files=str(tmp_path / "train-*.tfrecord"),
              text_keys="body")
  c.vocab_size = 48
  c.train_steps = 2
  model_dir = str(tmp_path / "m")
  result = main.run(c, "train", model_dir, out=io.StringIO(),
                    progress=False)
  assert [r["step"] for r in result["history"]] == [0, 1]
  assert all(math.isfinite(r["loss"]) for r in result["history"])
  with open(os.path.join(model_dir, "ckpt-2", "meta.json")) as f:
    assert json.load(f)["extra"]["input"]["data"]["units"] == 3
  decoded, path = _decode_and_export(c, model_dir, tmp_path)
  assert len(decoded) == 3 and any(decoded)
  script = (
      "import json, sys\n"
      "class NoMeshtf:\n"
      "  def find_spec(self, name, *args):\n"
      "    if name.split('.')[0] == 'meshtf':\n"
      "      raise ImportError('meshtf is not installed here')\n"
      "sys.meta_path.insert(0, NoMeshtf())\n"
      "try:\n"
      "  import meshtf\n"
      "  sys.exit('meshtf imported')\n"
      "except ImportError:\n"
      "  pass\n"
      "import tensorflow as tf\n"
      "import tensorflow_text\n"
      "m = tf.saved_model.load(sys.argv[1])\n"
      "out = m.signatures['decode_text'](text=tf.constant(sys.argv[2:]))\n"
      "print(json.dumps([t.decode() for t in out['outputs'].numpy()]))\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  done = subprocess.run([sys.executable, "-c", script, path] + PROMPTS,
                        cwd=str(tmp_path), env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert json.loads(done.stdout.strip().splitlines()[-1]) == decoded
