"""The catalogue of bad input to `python -m meshtf.train`: every case is one
line on stderr ("meshtf.train: error: ..." naming what, the sizes and the
fix), exit code 2, nothing on stdout, no traceback, and model_dir exactly
as it was (not created when it did not exist; config.json never rewritten).

The cases run through the binary's own flag parsing and main function in
this process (main.run_command: a TensorFlow start-up per case would cost
~3 s each); a few run as real processes to show that a user sees exactly
one line, TensorFlow's start-up lines included. The parsers, fuzzed, are
in test_parsers.py.
"""
import hashlib
import io
import json
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from meshtf.train import config as config_lib
from meshtf.train import main
from meshtf.train import model_dir as model_dir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "t2t_configs")
LM_TINY = os.path.join(CONFIGS, "lm_tiny.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """Input files the cases point at."""
  d = tmp_path_factory.mktemp("files")
  (d / "latin1.txt").write_bytes(b"the cat\ncaf\xe9 au lait\n")
  (d / "empty.txt").write_text("")
  (d / "blank.txt").write_text("\n   \n")
  (d / "folder").mkdir()
  (d / "noconf.py").write_text("x = 1\n")
  (d / "syntax.py").write_text("def get_config(:\n")
  (d / "bad_token.txt").write_text("5 9 400\n")
  (d / "returns_dict.py").write_text(
      "def get_config():\n  return {'d_model': 32}\n")
  (d / "returns_none.py").write_text("def get_config():\n  pass\n")
  (d / "saved").mkdir()   # a model_dir's config.json
  (d / "saved" / "config.json").write_text(_tiny_config_json())
  (d / "lacks_keys.py").write_text(
      "import ml_collections\n\ndef get_config():\n"
      "  return ml_collections.ConfigDict({'d_model': 32})\n")
  # Data files of issues 39 and 41.
  (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
  import gzip
  with gzip.open(d / "image.txt.gz", "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + bytes(64))
  (d / "pairs.tsv").write_text("a cat\tune chat\na dog without a tab\n")
  (d / "notes,2024.txt").write_text("notes of the year\n" * 50)
  words = "the quick brown fox jumps over a lazy dog".split()
  (d / "words.txt").write_text("".join(
      " ".join(words[(i + j) % 9] for j in range(7)) + "\n"
      for i in range(300)))
  # Checkpoints and a vocabulary of the T5 issue (38): one of another
  # network, one whose embedding is narrower than t5.1.1_tiny's, and a
  # sentencepiece model whose pieces and T5's 100 extra ids outgrow it.
  from meshtf.train import mesh_tf_checkpoint
  import numpy as np
  mesh_tf_checkpoint.write(str(d / "bert"), 7, {
      "bert/embeddings/word_embeddings": np.zeros([128, 32], np.float32)})
  mesh_tf_checkpoint.write(str(d / "narrow"), 7, {
      "shared/embedding": np.zeros([128, 16], np.float32)})
  import sentencepiece as spm
  spm.SentencePieceTrainer.train(
      input=str(d / "words.txt"), model_prefix=str(d / "spm30"),
      vocab_size=30, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  import tensorflow as tf
  with tf.io.TFRecordWriter(str(d / "docs.tfrecord")) as w:
    w.write(tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[b"a document"]))})).SerializeToString())
  return str(d)


# What lacks_keys.py's config lacks (the schema grows with the binary).
_LACKING = config_lib.missing_keys(ml_collections.ConfigDict({"d_model": 32}))


def _tiny_config_json():
  c = _load(LM_TINY)
  return c.to_json(indent=1, sort_keys=True)


def _load(path, arg=None):
  import importlib.util
  spec = importlib.util.spec_from_file_location("cfg_%d" % abs(hash(path)),
                                                path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*([arg] if arg else []))


# model_dir states a case starts from.
def _state_trained(d):
  """A model_dir trained with lm_tiny (its config.json and a checkpoint
  folder; the conflict check reads no checkpoint)."""
  d.mkdir()
  (d / "config.json").write_text(_tiny_config_json())
  (d / "ckpt-4").mkdir()
  (d / "ckpt-4" / "meta.json").write_text("{}")


def _state_locked(d):
  """A live run (this test process) holds the lock."""
  d.mkdir()
  owner = {"pid": os.getpid(), "host": __import__("socket").gethostname(),
           "process_start": model_dir_lib._process_start(os.getpid()),
           "started": "now", "command": "python -m meshtf.train"}
  (d / model_dir_lib.LOCK_FILE).write_text(json.dumps(owner))


def _state_broken_config(d):
  d.mkdir()
  (d / "config.json").write_text('{"d_model": 32,')
  (d / "ckpt-4").mkdir()


def _state_unknown_key_config(d):
  d.mkdir()
  (d / "config.json").write_text('{"d_modle": 32}')


def _state_damaged(d):
  """Every checkpoint damaged: a broken meta.json, a missing one."""
  d.mkdir()
  (d / "config.json").write_text(_tiny_config_json())
  (d / "ckpt-5").mkdir()
  (d / "ckpt-5" / "meta.json").write_text("{broken")
  (d / "ckpt-3").mkdir()


def _state_foreign_checkpoint(d):
  """An intact checkpoint of another model, and no config.json."""
  import tensorflow as tf
  (d / "ckpt-7").mkdir(parents=True)
  tf.raw_ops.SaveV2(prefix=str(d / "ckpt-7" / "variables"),
                    tensor_names=["w"], shape_and_slices=[""],
                    tensors=[tf.zeros([2, 3])])
  (d / "ckpt-7" / "meta.json").write_text(json.dumps(
      {"format": 1, "step": 7, "extra": {},
       "variables": {"w": {"shape": [2, 3], "dtype": "float32"}}}))


def _state_copied_checkpoint(d):
  """Trained to 30 (ckpt-10, 20, 30), then ckpt-10 copied in as ckpt-90:
  its name and its meta.json disagree (meta-only checkpoints: the name
  check needs no bundle)."""
  d.mkdir()
  (d / "config.json").write_text(_tiny_config_json())
  for name, step in (("ckpt-10", 10), ("ckpt-20", 20), ("ckpt-30", 30),
                     ("ckpt-90", 10)):
    (d / name).mkdir()
    (d / name / "meta.json").write_text(json.dumps(
        {"format": 1, "step": step, "extra": {}, "variables": {}}))


def _state_empty_config(d):
  d.mkdir()
  (d / "config.json").write_text("{}")
  (d / "ckpt-4").mkdir()
  (d / "ckpt-4" / "meta.json").write_text("{}")


def _state_text_trained(d):
  """Trained on a text file (config.json says so; the corpus lies beside
  model_dir)."""
  d.mkdir()
  corpus = d.parent / "corpus.txt"
  corpus.write_text("the cat sat on the mat\n" * 20)
  c = _load(LM_TINY)
  c.task.data_files = str(corpus)
  (d / "config.json").write_text(c.to_json(indent=1, sort_keys=True))
  from meshtf.train import text_data
  from meshtf.train import vocabulary
  vocabulary.train_vocabulary(["the cat sat on the mat", "a dog ran"] * 50,
                              24).save(str(d / text_data.VOCAB_NAME))
  (d / "ckpt-4").mkdir()
  (d / "ckpt-4" / "meta.json").write_text("{}")


def _state_trained_adam(d):
  """lm_tiny trained with Adam: a checkpoint of all its variables (slots
  slot_m, slot_v included; zeros)."""
  import tensorflow as tf
  from meshtf.train import experiment
  c = _load(LM_TINY)
  graph = experiment.build_training_graph(c)[0]
  d.mkdir()
  (d / "config.json").write_text(_tiny_config_json())
  (d / "ckpt-4").mkdir()
  names = sorted(v.name for v in graph.all_variables)
  shapes = {v.name: v.shape.to_integer_list for v in graph.all_variables}
  dtypes = {v.name: v.outputs[0].dtype for v in graph.all_variables}
  tf.raw_ops.SaveV2(prefix=str(d / "ckpt-4" / "variables"),
                    tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.zeros(shapes[n], dtypes[n]) for n in names])
  (d / "ckpt-4" / "meta.json").write_text(json.dumps(
      {"format": 1, "step": 4, "extra": {}, "variables": {
          n: {"shape": shapes[n], "dtype": dtypes[n].name} for n in names}}))


def _state_file(d):
  d.write_text("not a directory\n")


def _state_readonly(d):
  d.mkdir()
  d.chmod(0o555)


def _state_symlink_loop(d):
  """model_dir -> loop -> model_dir."""
  loop = d.parent / "loop"
  os.symlink(str(loop), str(d))
  os.symlink(str(d), str(loop))


STATES = {"none": lambda d: None, "trained": _state_trained,
          "locked": _state_locked, "broken_config": _state_broken_config,
          "unknown_key_config": _state_unknown_key_config,
          "damaged": _state_damaged, "file": _state_file,
          "foreign_checkpoint": _state_foreign_checkpoint,
          "readonly": _state_readonly, "symlink_loop": _state_symlink_loop,
          "copied_checkpoint": _state_copied_checkpoint,
          "empty_config": _state_empty_config,
          "text_trained": _state_text_trained,
          "trained_adam": _state_trained_adam}

# (case id, flags ({files} and {model_dir} are filled in), model_dir state,
#  the text the one line must contain). "--config=" + lm_tiny is added
# unless the flags name a --config or start with "NO_CONFIG".
T5_TINY = "--config=" + os.path.join(CONFIGS, "t5.py") + ":t5.1.1_tiny"

CASES = [
    # flags and config overrides
    ("unknown_key", ["--config.nope=1"], "none",
     "unknown config key 'nope' (--config.nope): did you mean 'norm_type'?"),
    ("unknown_flag", ["--nope"], "none", "unknown flag --nope"),
    ("bad_flag_value", ["--num_virtual_cpus=abc"], "none",
     "num_virtual_cpus"),
    ("bad_mode", ["--mode=bogus"], "none", "--mode"),
    ("positional", ["extra"], "none", "unexpected arguments extra"),
    ("train_steps_flag", ["--train_steps=-5"], "none",
     "--train_steps=-5 must be a positive integer: set --train_steps to 1 "
     "or more"),
    ("train_steps_override", ["--config.train_steps=0"], "none",
     "--config.train_steps=0 must be a positive integer"),
    ("batch_size_flag", ["--batch_size=0"], "none",
     "--batch_size=0 must be a positive integer"),
    ("decode_strategy", ["--config.decode_strategy=top"], "none",
     "decode_strategy='top' is unknown"),
    # numeric fields out of their range (meshtf/train/preflight.py RANGES)
    ("capacity_factor_inf", ["--config.moe.capacity_factor_train=inf"],
     "none", "--config.moe.capacity_factor_train=inf must be a finite "
     "number > 0: set --config.moe.capacity_factor_train=1.0"),
    ("bucket_mb_inf", ["--config.collective_bucket_mb=inf"], "none",
     "--config.collective_bucket_mb=inf must be a finite number >= 0"),
    ("seed_negative", ["--seed=-1"], "none",
     "--seed=-1 must be an integer in [0, 2**63): set --seed=0"),
    ("eval_seed_negative", ["--config.eval_seed=-7"], "none",
     "--config.eval_seed=-7 must be an integer in [-1, 2**63)"),
    ("momentum_negative", ["--config.optimizer=momentum",
                           "--config.momentum=-5"], "none",
     "--config.momentum=-5.0 must be a number in [0, 1): set "
     "--config.momentum=0.9"),
    ("weight_decay_huge", ["--config.weight_decay_rate=1e6"], "none",
     "the range is [0, 0.1 / learning_rate] = [0, 10] (AdamW runs use "
     "0.01-0.1): set --config.weight_decay_rate=0.01"),
    ("eval_steps_huge", ["--config.eval_steps=10000000"], "none",
     "--config.eval_steps=10000000 must be an integer in [1, 10000]"),
    ("decode_batches_huge", ["--mode=decode",
                             "--config.decode_batches=10000000"], "none",
     "--config.decode_batches=10000000 must be an integer in [1, 10000]"),
    ("layers_absurd", ["--config.num_layers=1000000"], "none",
     "--config.num_layers=1000000 must be an integer in [1, 10000]"),
    # sizes that cannot fit this machine's memory (the plan's estimate)
    # (the numbers are the plan's estimate, which moves as the planner
    # learns: the line's form and its order of magnitude are what is fixed)
    ("d_model_absurd", ["--config.d_model=1000000000"], "none",
     re.compile(r"the training step needs an estimated [0-9,]+ GB per device"
                r" \(parameters 1,170 GB, optimizer state 2,340 GB, "
                r"activations [0-9,]+ GB at their peak; meshtf/plan's "
                r"estimate\) x 8 virtual CPUs = [0-9,]+ GB, but this machine "
                r"has")),
    ("length_absurd", ["--config.length=100000"], "none",
     re.compile(r"activations [0-9],[0-9]{3} GB at their peak")),
    ("batch_size_absurd", ["--batch_size=100000000"], "none",
     re.compile(r"activations [0-9,.]+ (GB|TB) at their peak; meshtf/plan's "
                r"estimate\) x 8 virtual CPUs = [0-9,.]+ GB, but this "
                r"machine has")),
    # mesh, layout, devices
    ("mesh_malformed", ["--mesh_shape=data:2;model"], "none",
     "mesh_shape 'data:2;model' is malformed"),
    ("mesh_empty", ["--mesh_shape="], "none",
     "mesh_shape '' is malformed: it has no axes"),
    ("mesh_zero", ["--mesh_shape=data:0;model:2"], "none",
     "mesh_shape 'data:0;model:2': axis 'data' has size 0; every mesh axis "
     "needs at least 1 processor: e.g. --mesh_shape=data:1;model:2"),
    ("layout_malformed", ["--layout=batch:data;heads"], "none",
     "layout 'batch:data;heads' is malformed"),
    ("layout_plus", ["--layout=batch:data+"], "none",
     "layout 'batch:data+' is malformed"),
    ("layout_two_dims_one_axis", ["--layout=batch:data;length:data"], "none",
     "would split both dimension 'batch' (size 64) and dimension 'length'"),
    ("activation_layout_axis", ["--config.activation_layout=batch:zz"],
     "none", "names mesh axis 'zz'"),
    ("device_count", ["--num_virtual_cpus=2"], "none",
     "has 8 processors but num_virtual_cpus is 2: set --num_virtual_cpus=8"),
    ("virtual_cpus_negative", ["--num_virtual_cpus=-1"], "none",
     "--num_virtual_cpus=-1 must be an integer >= 0: set "
     "--num_virtual_cpus=0"),
    ("paper_config_512_devices",
     ["--config=" + os.path.join(CONFIGS, "mtf_lm_table2.py") + ":0.14B"],
     "none", "mesh_shape 'rows:16;cols:32' needs 512 devices, which this run"
     " would make as 512 virtual CPUs"),
    ("workers_without_index",
     ["--worker_hosts=127.0.0.1:7001,127.0.0.1:7002"], "none",
     "--worker_hosts names 2 workers but --task_index is missing"),
    ("index_without_workers", ["--task_index=1"], "none",
     "--task_index=1 without --worker_hosts"),
    ("workers_placement", ["--worker_hosts=127.0.0.1:7001,127.0.0.1:7002",
                           "--task_index=0", "--backend=placement"], "none",
     "backend='placement' cannot span 2 worker processes: use "
     "--backend=simd"),
    # config files
    ("config_without_get_config", ["--config={files}/noconf.py"], "none",
     "noconf.py defines no get_config(): a config file is a Python file"),
    ("config_folder", ["--config={files}/folder"], "none",
     "folder is a directory: pass a config file"),
    ("config_missing", ["--config={files}/none.py"], "none",
     "none.py does not exist"),
    ("config_syntax", ["--config={files}/syntax.py"], "none",
     "syntax.py is not a Python file"),
    ("config_returns_dict", ["--config={files}/returns_dict.py"], "none",
     "returns_dict.py: get_config() returned a dict, not an "
     "ml_collections.ConfigDict: return meshtf.train.config.default_config()"
     " with your changes"),
    ("config_returns_none", ["--config={files}/returns_none.py"], "none",
     "returns_none.py: get_config() returned None (no return statement?)"),
    ("config_returns_none_overridden", ["--config={files}/returns_none.py",
                                        "--config.d_model=8"], "none",
     "returns_none.py: get_config() returned None"),
    ("config_lacks_keys", ["--config={files}/lacks_keys.py"], "none",
     "lacks_keys.py lacks %d of the config's keys (%s, ...): start "
     "get_config() from meshtf.train.config.default_config()" % (
         len(_LACKING), ", ".join(_LACKING[:4]))),
    ("config_raises", ["--config=" + os.path.join(
        CONFIGS, "mtf_lm_table2.py") + ":9B"], "none",
     "row '9B' is not one of"),
    # data and prompt files
    ("data_missing", ["--config.task.data_files={files}/missing.txt"],
     "none", "data file {files}/missing.txt does not exist"),
    ("data_not_utf8", ["--config.task.data_files={files}/latin1.txt"],
     "none", "data file {files}/latin1.txt is not UTF-8 text: byte 0xe9 at "
     "line 2 (byte offset 11)"),
    ("data_empty", ["--config.task.data_files={files}/empty.txt"], "none",
     "data file {files}/empty.txt is empty"),
    ("data_blank", ["--config.task.data_files={files}/blank.txt"], "none",
     "data file {files}/blank.txt is empty"),
    ("data_folder", ["--config.task.data_files={files}/folder"], "none",
     "data file {files}/folder is a folder, not a text file"),
    ("eval_data_not_utf8", ["--config.task.data_files={files}/bad_token.txt",
                            "--config.task.eval_data_files="
                            "{files}/latin1.txt"], "none",
     "--config.task.eval_data_files"),
    # streamed data (issue 39) and the text-data cases of issue 41
    ("data_glob_matches_nothing", ["--config.task.data_files={files}/"
                                   "corpus/*.txt"], "none",
     "task.data_files pattern '{files}/corpus/*.txt' matches no file"),
    ("data_png_as_text", ["--config.task.data_files={files}/image.png"],
     "none", "data file {files}/image.png is not a text file (it is a PNG "
     "image)"),
    ("data_gzip_of_a_png", ["--config.task.data_files={files}/image.txt.gz"],
     "none", "image.txt.gz is not a text file (it is gzip-compressed and "
     "holds a PNG image)"),
    ("data_tsv_line_without_tab", ["--config.task.seq2seq=True",
                                   "--config.task.data_files="
                                   "{files}/pairs.tsv"], "none",
     "data file {files}/pairs.tsv line 2 has no tab: seq2seq data"),
    ("tfrecord_without_the_feature", ["--config.task.data_files="
                                      "{files}/docs.tfrecord",
                                      "--config.task.text_keys=body"],
     "none", "docs.tfrecord has no feature 'body' in its first record (its "
     "features: text): set --config.task.text_keys"),
    ("data_files_and_tfds_name", ["--config.task.data_files="
                                  "{files}/words.txt",
                                  "--config.task.tfds_name=lm1b"], "none",
     "task.data_files and task.tfds_name are both set"),
    ("comma_in_a_file_name", ["--config.task.data_files="
                              "{files}/notes,2024.txt"], "none",
     "a comma separates files: {files}/notes,2024.txt exists; write it as "
     "{files}/notes\\,2024.txt"),
    ("vocab_far_above_the_corpus", ["--config.task.data_files="
                                    "{files}/words.txt",
                                    "--config.vocab_size=5000"], "none",
     re.compile(r"vocab_size 5000 is far above what .*words.txt \(a 0.0 MB "
                r"sample\) yields: sentencepiece found only \d+ pieces in it"
                r".*set --config.vocab_size=\d+$")),
    ("vocab_below_the_characters", ["--config.task.data_files="
                                    "{files}/words.txt",
                                    "--config.vocab_size=12"], "none",
     re.compile(r"vocab_size 12 is too small for .*words.txt .*: its text has "
                r"\d+ distinct characters.*set --config.vocab_size=\d+ or "
                r"more$")),
    ("span_corruption_without_extra_ids", [
        "--config.model_type=bitransformer",
        "--config.task.objective=span_corruption",
        "--config.task.data_files={files}/words.txt"], "none",
     "task.extra_ids is 0: set --config.task.extra_ids=100 (T5's) or at "
     "least"),
    ("vocab_file_not_sentencepiece", ["--config.task.data_files="
                                      "{files}/words.txt",
                                      "--config.task.vocab_file="
                                      "{files}/image.png"], "none",
     "vocabulary file {files}/image.png is not a sentencepiece model"),
    # init_checkpoint and vocabulary files of a T5 fine-tune (issue 38)
    ("init_checkpoint_missing", [T5_TINY, "--config.init_checkpoint="
                                 "{files}/nowhere"], "none",
     "init_checkpoint {files}/nowhere does not exist: give a Mesh TF "
     "checkpoint prefix"),
    ("init_checkpoint_not_a_checkpoint", [
        T5_TINY, "--config.init_checkpoint={files}/words.txt"], "none",
     "init_checkpoint {files}/words.txt is a file that is not a checkpoint"),
    ("init_checkpoint_other_architecture", [
        T5_TINY, "--config.init_checkpoint={files}/bert"], "none",
     "init_checkpoint {files}/bert is of another architecture: none of the "
     "model's 52 weights is in it (its entries: "
     "bert/embeddings/word_embeddings; this config's model looks for: "
     "shared/embedding, "),
    ("init_checkpoint_shape", [T5_TINY,
                               "--config.init_checkpoint={files}/narrow"],
     "none", "entry 'shared/embedding' has shape [128, 16] but the model's "
     "variable 'shared/embedding' [vocab:128, d_model:32] needs [128, 32]"),
    ("vocab_file_too_big", [T5_TINY, "--config.task.data_files=" + os.path.join(
        CONFIGS, "t5_tiny_pairs.tsv"), "--config.task.seq2seq=True",
                            "--config.task.vocab_file="
                            "{files}/spm30.model"], "none",
     "vocab_size 128 does not fit task.vocab_file {files}/spm30.model: it "
     "has 30 pieces + 100 extra_ids = 130 ids"),
    ("prompts_not_utf8", ["--mode=decode",
                          "--config.decode_prompts_file={files}/latin1.txt"],
     "none", "decode prompt file {files}/latin1.txt is not UTF-8 text"),
    ("prompts_bad_token", ["--mode=decode", "--config.decode_prompts_file="
                           "{files}/bad_token.txt"], "none",
     "line 1 '5 9 400': copy prompts are token ids in 3..15"),
    ("prompts_missing", ["--mode=decode", "--config.decode_prompts_file="
                         "{files}/none.txt"], "none",
     "decode prompt file {files}/none.txt does not exist"),
    ("prompts_folder", ["--mode=decode", "--config.decode_prompts_file="
                        "{files}/folder"], "none", "is a folder"),
    # model_dir
    ("eval_without_checkpoint", ["--mode=eval"], "none",
     "no checkpoint in {model_dir} to eval: run --mode=train"),
    ("export_without_checkpoint", ["--mode=export"], "none",
     "no checkpoint in {model_dir} to export"),
    ("model_dir_is_a_file", [], "file",
     "--model_dir={model_dir} is a file, not a directory"),
    ("eval_model_dir_is_a_file", ["--mode=eval"], "file",
     "--model_dir={model_dir} is a file, not a directory"),
    ("model_dir_under_a_file", ["--model_dir={files}/latin1.txt/sub"],
     "none", "cannot create --model_dir={files}/latin1.txt/sub: "
     "{files}/latin1.txt is a file"),
    ("model_dir_symlink_loop", [], "symlink_loop",
     "--model_dir={model_dir}: {model_dir} is a symlink loop ({model_dir} "
     "-> {model_dir_parent}/loop -> {model_dir}): point it at a directory"),
    ("eval_model_dir_symlink_loop", ["--mode=eval"], "symlink_loop",
     "{model_dir} is a symlink loop"),
    ("model_dir_under_a_symlink_loop", ["--model_dir={model_dir}/sub"],
     "symlink_loop", "{model_dir} is a symlink loop"),
    ("model_dir_read_only", [], "readonly",
     "--model_dir={model_dir} is not writable"),
    ("model_dir_in_use", [], "locked",
     "--model_dir={model_dir} is in use by another training run (pid %d"
     % os.getpid()),
    ("config_conflicts_with_model_dir",
     ["--config=" + os.path.join(CONFIGS, "moe_tiny.py")], "trained",
     "does not match the model {model_dir} was trained with: "
     "moe.num_experts 4 here vs 0 in config.json"),
    ("override_conflicts_with_model_dir",
     ["NO_CONFIG", "--mode=eval", "--config.d_model=64"], "trained",
     "d_model 64 here vs 32 in config.json"),
    ("broken_config_json", ["NO_CONFIG", "--mode=eval"], "broken_config",
     "{model_dir}/config.json is broken"),
    ("unknown_key_in_config_json", ["NO_CONFIG", "--mode=eval"],
     "unknown_key_config", "config.json has unknown key 'd_modle'"),
    ("every_checkpoint_damaged", [], "damaged",
     "no intact checkpoint in {model_dir}: ckpt-5 is damaged (meta.json is "
     "broken"),
    ("eval_every_checkpoint_damaged", ["--mode=eval"], "damaged",
     "ckpt-3 is damaged (meta.json is missing)"),
    ("checkpoint_of_another_model", ["NO_CONFIG", "--mode=eval"],
     "foreign_checkpoint", "{model_dir}/ckpt-7 has no variable 'decoder/"),
    ("train_on_a_checkpoint_of_another_model", [], "foreign_checkpoint",
     "it was trained with another config: pass that --config, or use a new "
     "--model_dir"),
    # issue 41
    ("checkpoint_copied_under_a_newer_name", ["NO_CONFIG"],
     "copied_checkpoint", "checkpoint folder {model_dir}/ckpt-90 holds step "
     "10 (its meta.json says so), not step 90: it was renamed or copied: "
     "resuming from it would train again from step 10 and overwrite ckpt-20,"
     " ckpt-30; ckpt-10 exists too: move ckpt-90 out of {model_dir}"),
    ("eval_checkpoint_copied_under_a_newer_name", ["NO_CONFIG", "--mode=eval"],
     "copied_checkpoint", "{model_dir}/ckpt-90 holds step 10"),
    # rules naming a dim no tensor of the model has (they split nothing)
    ("layout_names_no_dim", ["--layout=Batch:data;heads:model"], "none",
     "--layout='Batch:data;heads:model': layout rule 'Batch:data' names dim "
     "'Batch', which no tensor of the model has, so it would split nothing: "
     "did you mean 'batch'? (the model's dims: batch, d_ff, d_kv, d_model, "
     "heads, length, max_length, memory_length, vocab): set "
     "--layout='batch:data;heads:model'"),
    ("activation_layout_names_no_dim",
     ["--config.activation_layout=Batch:data"], "none",
     "--config.activation_layout=Batch:data: layout rule 'Batch:data' names "
     "dim 'Batch'"),
    ("variable_layout_names_no_dim", ["--config.variable_layout=dmodel:data"],
     "none", "did you mean 'd_model'? (the model's dims: batch, d_ff, d_kv, "
     "d_model, heads, length, max_length, memory_length, vocab): set "
     "--config.variable_layout=d_model:data"),
    # silent surprises and misleading fixes
    ("text_model_given_token_id_prompts", [
        "NO_CONFIG", "--mode=decode",
        "--config.decode_prompts_file={files}/bad_token.txt"], "text_trained",
     "decode prompt file {files}/bad_token.txt holds token ids (line 1 '5 9 "
     "400'), but the model was trained on text (task.data_files="
     "{model_dir_parent}/corpus.txt): write its prompts as text, one per "
     "line"),
    ("model_dir_flag_empty", ["--model_dir="], "none",
     "--model_dir='' is empty: pass a directory, e.g. --model_dir=/tmp/lm "
     "(leave the flag out for the default one, "),
    ("model_dir_with_a_tilde", ["--mode=eval",
                                "--model_dir=~/meshtf-issue41-never"], "none",
     "no checkpoint in %s to eval" % os.path.expanduser(
         "~/meshtf-issue41-never")),
    ("model_dir_name_too_long", ["--model_dir={model_dir_parent}/" +
                                 "a" * 300], "none",
     "the folder name 'aaaaaaaaaaaa...' is 300 bytes, but the file system "
     "allows 255: pass a --model_dir with shorter names"),
    ("config_json_empty", ["NO_CONFIG", "--mode=eval"], "empty_config",
     "{model_dir}/config.json is empty ({{}}): it was not written by "
     "meshtf.train, which saves every key; pass --config=<the config file it"
     " was trained with>"),
    ("optimizer_changed", ["NO_CONFIG", "--config.optimizer=sgd"],
     "trained_adam", "holds the state of optimizer 'adam' (slot_m, slot_v) "
     "but this run's optimizer is 'sgd': the optimizer changed; to continue "
     "training from it, pass --config.optimizer=adam; else start a new "
     "--model_dir"),
    ("config_flag_names_a_config_json", [
        "--config={files}/saved/config.json", "--mode=eval"], "none",
     "--config={files}/saved/config.json is the config a training run saved "
     "in its model_dir (JSON), not a config file: pass --model_dir="
     "{files}/saved and no --config"),
    ("mesh_decimal_size", ["--mesh_shape=data:2.5;model:2"], "none",
     "dimension 'data' has size 2.5, but a size is a whole number"),
    # tracebacks
    ("jit_program_on_a_model_parallel_mesh", ["--config.jit_compile=program"],
     "none", "jit_compile='program' compiles the whole step with XLA, but TF "
     "2.21's XLA does not compile collectives on CPU devices, and mesh "
     "'data:4;model:2' (8 processors) with layout 'batch:data;heads:model;"
     "d_ff:model;vocab:model' needs them: set --config.jit_compile=segments"),
    ("config_group_given_a_value", ["--config.task=copy"], "none",
     re.compile(r"--config.task=copy: task is a group of keys \(data_files, "
                r"[a-z_, ]+, \.\.\.\): set one of them: "
                r"--config.task.problem=copy$")),
]


def _snapshot(path):
  """Every file under path with its bytes' digest (None: no such path)."""
  if not os.path.lexists(path):
    return None
  if os.path.islink(path) and not os.path.exists(path):
    return ("symlink", os.readlink(path))   # a loop, or to nothing
  if not os.path.isdir(path):
    with open(path, "rb") as f:
      return hashlib.sha1(f.read()).hexdigest()
  out = {}
  for root, dirs, names in os.walk(path):
    for name in dirs + names:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, path)
      if os.path.isdir(full):
        out[rel + "/"] = None
      else:
        with open(full, "rb") as f:
          out[rel] = hashlib.sha1(f.read()).hexdigest()
  return out


def _command(flags, model_dir):
  flags = list(flags)
  argv = ["meshtf.train"]
  if flags and flags[0] == "NO_CONFIG":
    flags = flags[1:]
  elif not any(f.startswith("--config=") for f in flags):
    argv.append("--config=" + LM_TINY)
  if not any(f.startswith("--model_dir=") for f in flags):
    argv.append("--model_dir=" + model_dir)
  return argv + flags


@pytest.mark.parametrize("case,flags,state,expected", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    case, flags, state, expected, files, tmp_path, monkeypatch):
  model_dir = str(tmp_path / "model")
  STATES[state](tmp_path / "model")
  if state == "readonly":   # root may write anyway: ask as a user would
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.path.abspath(
        p) == model_dir and mode & os.W_OK else real_access(p, mode))
  fill = lambda s: s.format(files=files, model_dir=model_dir,  # noqa: E731
                            model_dir_parent=str(tmp_path))
  before = _snapshot(model_dir)
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(_command([fill(f) for f in flags], model_dir),
                          out=out, err=err)
  lines = err.getvalue().splitlines()
  assert code == 2, (case, err.getvalue(), out.getvalue()[-2000:])
  assert len(lines) == 1 and lines[0].startswith("meshtf.train: error: "), (
      case, lines)
  if isinstance(expected, re.Pattern):
    assert expected.search(lines[0]), (case, lines[0])
  else:
    assert fill(expected) in lines[0], (case, lines[0])
  assert not out.getvalue(), case
  assert _snapshot(model_dir) == before, case


def test_the_catalogue_covers_the_issue():
  """Every case the issue lists is in the catalogue (by id)."""
  ids = {c[0] for c in CASES}
  assert {"data_not_utf8", "prompts_not_utf8", "data_empty", "data_folder",
          "model_dir_is_a_file", "model_dir_read_only", "mesh_zero",
          "virtual_cpus_negative", "config_without_get_config",
          "train_steps_flag", "paper_config_512_devices", "model_dir_in_use",
          "config_conflicts_with_model_dir", "every_checkpoint_damaged",
          } <= ids
  # issue 32: numbers out of range, sizes that cannot fit, config files
  # returning the wrong thing, a model_dir that is a symlink loop
  assert {"capacity_factor_inf", "bucket_mb_inf", "seed_negative",
          "eval_seed_negative", "momentum_negative", "weight_decay_huge",
          "eval_steps_huge", "d_model_absurd", "length_absurd",
          "batch_size_absurd", "config_returns_dict", "config_returns_none",
          "config_lacks_keys", "model_dir_symlink_loop"} <= ids
  # issue 39's bad data and issue 41's text-data cases
  assert {"data_glob_matches_nothing", "data_png_as_text",
          "data_tsv_line_without_tab", "tfrecord_without_the_feature",
          "data_files_and_tfds_name", "comma_in_a_file_name",
          "vocab_far_above_the_corpus", "vocab_below_the_characters"} <= ids
  # issue 41: rules naming no dim, a copied checkpoint, silent surprises,
  # misleading fixes, tracebacks
  assert {"checkpoint_copied_under_a_newer_name", "layout_names_no_dim",
          "activation_layout_names_no_dim", "variable_layout_names_no_dim",
          "text_model_given_token_id_prompts", "model_dir_flag_empty",
          "model_dir_with_a_tilde", "model_dir_name_too_long",
          "config_json_empty", "optimizer_changed",
          "config_flag_names_a_config_json",
          "jit_program_on_a_model_parallel_mesh",
          "config_group_given_a_value"} <= ids
  assert len(ids) == len(CASES)


# --- as a user sees it: real processes ----------------------------------------
def test_a_real_process_prints_exactly_one_line(files, tmp_path):
  """No TensorFlow start-up lines (oneDNN, CUDA, cuInit...): stderr is the
  error line and nothing else; stdout is empty. TF_CPP_MIN_LOG_LEVEL is
  left unset, as a user's shell has it."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  cases = [
      (["--mesh_shape=data:0;model:2"], "axis 'data' has size 0"),
      (["--config.task.data_files=%s/latin1.txt" % files],
       "is not UTF-8 text"),
      (["--model_dir=%s/latin1.txt" % files], "is a file, not a directory"),
      (["--config=%s/noconf.py" % files], "defines no get_config()"),
      # ml_collections' own warning line is not shown
      (["--config=%s/returns_none.py" % files], "get_config() returned None"),
      # issue 41: a rule that would split nothing; a group given a value
      (["--layout=Batch:data;heads:model"], "did you mean 'batch'?"),
      (["--config.task=copy"], "set one of them: --config.task.problem=copy"),
  ]
  procs = []
  for i, (flags, _) in enumerate(cases):
    model_dir = str(tmp_path / ("m%d" % i))
    procs.append((model_dir, subprocess.Popen(
        [sys.executable, "-m", "meshtf.train"] + _command(flags, model_dir)[1:],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)))
  for (flags, expected), (model_dir, proc) in zip(cases, procs):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, (flags, err)
    assert err.count("\n") == 1 and err.startswith("meshtf.train: error: "), (
        flags, err)
    assert expected in err and not out, (flags, err, out)
    assert not os.path.exists(model_dir)
