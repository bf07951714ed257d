"""--mode=decode (meshtf/train/decode.py): strategies, prompt files, outputs.

- A tiny LM trained in-process on the synthetic copy task (4 devices, data +
  model parallel) decodes a prompt file of token ids with greedy, beam and
  sampling decoding: every strategy copies the prompts (exact match 1.0),
  sampling among the top 1 token equals greedy, and the decodes file has
  one line per prompt.
- The two greedy decoders (key/value caches in one mtf.while_loop, and
  re-running the model on the growing prefix) agree token for token on a
  language model and an encoder-decoder; sampling among the top 1 equals
  greedy there too; beam search keeps each prompt.
- A text LM decodes a text prompt file with the vocabulary training saved.
- Bad prompt files are one-line errors naming the file, line and fix,
  raised before any TensorFlow work; through the binary: exit 2, nothing
  written.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from meshtf.train import config as config_lib
from meshtf.train import decode as decode_lib
from meshtf.train import experiment
from meshtf.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


COPY = """
from meshtf.train import config as config_lib


def get_config():
  c = config_lib.default_config()
  c.moe.num_experts = 0
  c.num_layers = 1
  c.task.problem = "copy"
  c.length = 10                # prompts of 2..4 symbols
  c.batch_size = 16
  c.mesh_shape = "data:2;model:2"
  c.layout = "batch:data;heads:model;d_ff:model;vocab:model"
  c.train_steps = 400
  c.eval_every = 25
  c.eval_steps = 4
  c.log_every = 50
  c.checkpoint_every = 1000
  c.target_accuracy = 0.998    # 0.99 let a repeated symbol slip
  return c
"""


def _copy_config():
  scope = {}
  exec(COPY, scope)  # pylint: disable=exec-used
  return scope["get_config"]()


class _Quiet(object):
  def write(self, s):
    pass

  def flush(self):
    pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("copy"))
  config = _copy_config()
  result = main.run(config, "train", model_dir, out=_Quiet(), progress=False)
  assert result["reached"], result["eval"]
  return config, model_dir


PROMPTS = ["5 9 4", "3 15", "7 7 8 12", "10 4", "6 13 11", "14 3 5 9"]


def _with(config, **fields):
  c = config.copy_and_resolve_references()
  c.unlock()
  for k, v in fields.items():
    c[k] = v
  return c


def test_strategies_decode_a_prompt_file(trained, tmp_path):
  config, model_dir = trained
  prompt_file = tmp_path / "prompts.txt"
  prompt_file.write_text("\n".join(PROMPTS) + "\n\n")   # a blank line too
  results = {}
  for strategy, extra in (("greedy", {}), ("beam", {"decode_beam_size": 3}),
                          ("sample", {"decode_top_k": 1})):
    out = str(tmp_path / ("%s.txt" % strategy))
    c = _with(config, decode_strategy=strategy,
              decode_prompts_file=str(prompt_file), decode_output_file=out,
              **extra)
    log = []
    results[strategy] = r = main.run(c, "decode", model_dir,
                                      out=_Log(log))
    assert r["count"] == len(PROMPTS)
    assert r["exact_match"] == 1.0, (strategy, r["outputs"])
    with open(out) as f:
      assert f.read().splitlines() == PROMPTS   # copies of the prompts
    assert any("decodes written to " + out in l for l in log)
    if strategy == "beam":
      assert any("beam search, 3 beams" in l for l in log), log
  # Sampling among the single likeliest token is greedy decoding.
  np.testing.assert_array_equal(results["sample"]["first_decoded"],
                                results["greedy"]["first_decoded"])
  # Without a prompt file: held-out batches, default output nowhere.
  r = main.run(_with(config, decode_strategy="sample",
                     decode_temperature=0.5), "decode", model_dir,
               out=_Quiet())
  assert r["count"] == config.decode_batches * config.batch_size
  assert r["exact_match"] > 0.9 and "output_file" not in r


class _Log(object):
  def __init__(self, lines):
    self.lines = lines

  def write(self, s):
    if s.strip():
      self.lines.append(s)

  def flush(self):
    pass


@pytest.mark.parametrize("model_type", ["lm", "bitransformer"])
def test_decoders_agree_on_fresh_weights(model_type, tmp_path):
  """Greedy with caches == greedy recomputing the prefix == sampling among
  the top 1; beam search keeps each row's prompt."""
  c = config_lib.default_config()
  c.model_type = model_type
  c.moe.num_experts = 0
  c.num_layers = 1
  c.length = 8
  c.batch_size = 4
  c.mesh_shape = "data:2;model:2"
  c.layout = "batch:data;heads:model;d_ff:model;vocab:model"
  c.decode_top_k = 1
  c.decode_beam_size = 2
  config_lib.validate(c)
  session = main.Session(c, str(tmp_path / "none"), "decode")
  decoder = session.decoder()
  batch = experiment.make_data(c, str(tmp_path)).eval_batch(0)
  cached = decoder.decode(batch, "greedy", "cached")
  recomputed = decoder.decode(batch, "greedy", "recompute")
  assert cached.tolist() == recomputed.tolist()
  assert decoder.decode(batch, "sample").tolist() == cached.tolist()
  start = 0 if model_type == "bitransformer" else (
      decode_lib.prompts(batch) != 0)
  assert (cached != 0).sum() > np.sum(start)   # tokens were generated
  beam = decoder.decode(batch, "beam")
  assert beam.shape == cached.shape
  if model_type == "lm":
    p = decode_lib.prompts(batch)
    assert (np.where(p != 0, beam, 0) == p).all()
    assert ((beam != 0) & (p == 0)).any()


def test_greedy_decode_matches_a_plain_loop():
  """greedy_decode fills positions after the prompt one at a time from
  the predictor and stops a row at EOS."""
  batch = {"targets": np.array([[5, 6, 2, 6, 5, 1, 0, 0],
                                [7, 2, 7, 1, 0, 0, 0, 0]], np.int32)}
  batch["targets_weights"] = np.array([[0, 0, 0, 1, 1, 1, 0, 0],
                                       [0, 0, 1, 1, 0, 0, 0, 0]], np.float32)
  calls = []

  def predict(features):  # "repeat the previous token"; row 1 then EOS
    t = features["targets"]
    calls.append(t.copy())
    out = np.zeros_like(t)
    out[:, 1:] = t[:, :-1]
    out[1, 3] = 1
    return out
  out = decode_lib.greedy_decode(predict, batch, seq2seq=False)
  assert out.tolist() == [[5, 6, 2, 2, 2, 2, 2, 2], [7, 2, 2, 1, 0, 0, 0, 0]]
  assert len(calls) == 6       # positions 2..7, one model call each
  exact, token = decode_lib.decode_accuracy(out, batch, seq2seq=False)
  assert (exact, token) == (0.0, 0.2)   # refs [6, 5, 1] and [7, 1]
  assert experiment.perplexity(0.0) == 1.0


def test_text_lm_decodes_text_prompts(tmp_path):
  text = tmp_path / "train.txt"
  text.write_text("\n".join("the cat sat on the mat number %d" % i
                            for i in range(40)) + "\n")
  c = config_lib.default_config()
  c.moe.num_experts = 0
  c.num_layers = 1
  c.task.data_files = str(text)
  c.vocab_size = 48   # the text yields 29 pieces; far more is refused
  c.length = 16
  c.batch_size = 4
  c.mesh_shape = "all:2"
  c.layout = "batch:all"
  c.train_steps = 2
  c.eval_every = 0
  c.eval_steps = 1
  c.stop_at_target = False
  model_dir = str(tmp_path / "m")
  main.run(c, "train", model_dir, out=_Quiet(), progress=False)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\nsat on\n")
  c.decode_prompts_file = str(prompts)
  r = main.run(c, "decode", model_dir, out=_Quiet())
  assert r["exact_match"] is None and r["count"] == 2
  with open(os.path.join(model_dir, "decodes-2.txt")) as f:
    lines = f.read().splitlines()
  assert len(lines) == 2 and lines == r["outputs"]
  assert all(isinstance(l, str) for l in lines)
  # A prompt longer than the length leaves no room: one clear error.
  prompts.write_text("the cat\n" + " ".join(["mat"] * 40) + "\n")
  with pytest.raises(decode_lib.PromptError, match=r"line 2: the prompt has "
                     r"\d+ tokens but length 16 .*--config.length"):
    decode_lib.read_prompts(c, model_dir)


@pytest.mark.parametrize("lines,expected", [
    ("5 9 x\n", "line 1 '5 9 x': not token ids"),
    ("5 9\n1 5\n", "line 2 '1 5': reverse prompts are token ids in 3..15"),
    ("5 6 7 8 9 10 11\n", "need length >= 16, the length is 10"),
    ("\n\n", "is empty (no non-blank line)"),
    (b"5 9\n\xff 3\n", "is not UTF-8 text: byte 0xff at line 2 (byte offset"
     " 4)"),
])
def test_bad_prompt_files_are_clear_errors(lines, expected, tmp_path):
  c = config_lib.default_config()
  c.length = 10
  path = tmp_path / "p.txt"
  if isinstance(lines, bytes):
    path.write_bytes(lines)
  else:
    path.write_text(lines)
  c.decode_prompts_file = str(path)
  with pytest.raises(decode_lib.PromptError) as e:
    decode_lib.read_prompts(c, str(tmp_path))
  assert expected in str(e.value) and str(path) in str(e.value)
  assert len(str(e.value).splitlines()) == 1
  c.decode_prompts_file = str(tmp_path / "none.txt")
  with pytest.raises(decode_lib.PromptError, match="does not exist"):
    decode_lib.read_prompts(c, str(tmp_path))
  c.decode_prompts_file = str(tmp_path)
  with pytest.raises(decode_lib.PromptError, match="is a folder"):
    decode_lib.read_prompts(c, str(tmp_path))


def test_bad_prompt_file_through_the_binary(trained, tmp_path):
  config, model_dir = trained
  path = tmp_path / "p.txt"
  path.write_text("5 9 400\n")
  cfg = tmp_path / "copy.py"
  cfg.write_text(COPY)
  before = sorted(os.listdir(model_dir))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run(
      [sys.executable, "-m", "meshtf.train", "--config=" + str(cfg),
       "--model_dir=" + model_dir, "--mode=decode",
       "--config.decode_prompts_file=" + str(path)],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  ours = [l for l in proc.stderr.splitlines() if l.startswith("meshtf")]
  assert len(ours) == 1 and "line 1 '5 9 400'" in ours[0], proc.stderr
  assert "copy prompts are token ids in 3..15" in ours[0]
  assert "Traceback" not in proc.stderr
  assert sorted(os.listdir(model_dir)) == before
