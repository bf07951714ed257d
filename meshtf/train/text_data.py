"""The binary's real-text data: text files (plain, TSV, gzip), TFRecord
files and local TFDS datasets, streamed (meshtf/train/streams.py) with a
sentencepiece vocabulary (meshtf/train/vocabulary.py) and an objective
(meshtf/train/objectives.py), from the config's task fields.

`task_problems(config)` checks the task before TensorFlow starts (one line
per problem: a glob matching nothing, a missing, binary, non-UTF-8 or empty
file, a TSV line without a tab, a TFRecord without the named feature, a
vocabulary file that does not fit vocab_size, objectives the model cannot
train on, data_files and tfds_name both set); `make_text_data(config,
model_dir)` builds the train and held-out streams and the vocabulary --
model_dir's vocab.model if training saved one, else task.vocab_file with
task.extra_ids sentinels, else one trained on a bounded sample of the data
(task.vocab_sample_mb) -- and writes nothing.

Example:
  >>> text = make_text_data(config, "/tmp/m")
  >>> text.train.batch(0)["targets"].shape
  (64, 128)
  >>> text.vocab.size
  1000
"""
import collections
import os

import numpy as np

from meshtf.train import errors
from meshtf.train import objectives as objectives_lib
from meshtf.train import sources
from meshtf.train import vocabulary as vocabulary_lib

VOCAB_NAME = "vocab.model"
# How many files' first bytes the preflight reads (every file is stat'ed; a
# file after these that is not text is found when it is read).
CHECKED_FILES = 32

# Missing or unusable training data (the binary prints it as one line).
DataError = errors.DataError


def text_file_problem(path, what, fix):
  """One line saying why `path` (read whole: a prompt file) cannot be read
  as text -- it does not exist, is a folder, is binary ("not a text file"),
  is not UTF-8 (line and byte named) or has no non-blank line -- or None.

  Example:
    >>> text_file_problem("latin1.txt", "data file", "--config.task.data_files")
    "data file latin1.txt is not UTF-8 text: byte 0xe9 at line 3 ..."
  """
  return sources.file_problem(path, what, fix, head_bytes=None)


# --- the task's fields ------------------------------------------------------------
def data_patterns(task, key="data_files"):
  return sources.split_patterns(task[key])


def is_text_task(config):
  task = config.task
  return bool(str(task.data_files).strip() or task.tfds_name)


def objective_name(config):
  """task.objective, or the default: seq2seq for pairs, else lm."""
  task = config.task
  if task.objective:
    return task.objective
  return "seq2seq" if _pairs(config) else "lm"


def _pairs(config):
  """Whether the documents are (input, target) pairs."""
  task = config.task
  if str(task.data_files).strip() and not _tfrecord_files(config):
    return bool(task.seq2seq)
  return len(_text_keys(task)) == 2


def _text_keys(task):
  return tuple(k.strip() for k in str(task.text_keys).split(",")
               if k.strip())


def _tfrecord_files(config):
  files = data_patterns(config.task)
  return bool(files) and sources.file_format(
      files[0], config.task.data_format) == "tfrecord"


def task_problems(config):
  """One line per problem of a text task (see the module docstring),
  before TensorFlow starts; [] for a synthetic task. Reads at most the
  first bytes of CHECKED_FILES files (and a vocab_file).

  Example:
    >>> c.task.data_files = "corpus/*.txt"; task_problems(c)
    ["task.data_files pattern 'corpus/*.txt' matches no file: ..."]
  """
  task = config.task
  out = []
  patterns = data_patterns(task)
  if patterns and task.tfds_name:
    out.append("task.data_files and task.tfds_name are both set (%r, %r): "
               "the binary reads one source: clear one of them "
               "(--config.task.tfds_name= or --config.task.data_files=)" % (
                   str(task.data_files), str(task.tfds_name)))
    return out
  if task.data_format not in sources.FORMATS:
    out.append("task.data_format=%r is unknown: use --config.task."
               "data_format=%s" % (task.data_format,
                                   " | ".join(sources.FORMATS)))
    return out
  if task.objective and task.objective not in objectives_lib.OBJECTIVES:
    out.append("task.objective=%r is unknown: use --config.task.objective="
               "%s (or '' for lm / seq2seq by the data)" % (
                   task.objective, " | ".join(objectives_lib.OBJECTIVES)))
    return out
  eval_patterns = data_patterns(task, "eval_data_files")
  if patterns or eval_patterns:
    if not patterns:
      out.append("task.eval_data_files is set but task.data_files is empty: "
                 "set --config.task.data_files")
    keys = _text_keys(task)
    for key, group in (("data_files", patterns),
                       ("eval_data_files", eval_patterns)):
      files, problems = sources.expand(group, "task." + key)
      out.extend(problems)
      out.extend(_file_problems(config, files, group, key, keys))
  elif not task.tfds_name:
    return out
  elif not task.tfds_data_dir or not os.path.isdir(task.tfds_data_dir):
    out.append("task.tfds_data_dir=%r does not exist; meshtf never "
               "downloads: prepare %s there first (tfds build) or set "
               "--config.task.data_files" % (task.tfds_data_dir,
                                             task.tfds_name))
  out.extend(_objective_problems(config))
  out.extend(_vocab_file_problems(config))
  return out


def _file_problems(config, files, patterns, key, keys):
  out = []
  task = config.task
  fix = "--config.task.%s=a.txt,b.txt" % key
  hints = set()   # a name split at its comma: said once, for both halves
  for i, path in enumerate(files):
    fmt = sources.file_format(path, task.data_format)
    if not os.path.lexists(path):
      hint = sources.comma_hint(path, patterns)
      if hint and hint in hints:
        continue
      hints.add(hint)
      out.append("data file %s does not exist%s: pass existing %s files, "
                 "e.g. %s" % (path, hint, "TFRecord" if fmt == "tfrecord"
                              else "text", fix))
      continue
    if i >= CHECKED_FILES:
      continue
    problem = sources.file_problem(
        path, "data file", fix, fmt, pairs=bool(task.seq2seq) and
        fmt == "text", text_keys=keys)
    if problem:
      out.append(problem)
  if files and any(sources.file_format(f, task.data_format) == "tfrecord"
                   for f in files) and any(
                       sources.file_format(f, task.data_format) == "text"
                       for f in files):
    out.append("task.%s mixes TFRecord and text files: pass one kind, or "
               "set --config.task.data_format" % key)
  if files and sources.file_format(files[0], task.data_format) == \
      "tfrecord" and len(keys) not in (1, 2):
    out.append("task.text_keys %r must name one feature (lm) or two "
               "(input,target): set --config.task.text_keys" % (
                   str(task.text_keys)))
  return out


def _objective_problems(config):
  task = config.task
  name = objective_name(config)
  pairs = _pairs(config)
  bitransformer = config.model_type == "bitransformer"
  if name == "seq2seq" and not pairs:
    if bitransformer:
      return ["a bitransformer needs input<TAB>target text (or a "
              "pretraining objective): set --config.task.seq2seq=True, or "
              "--config.task.objective=span_corruption or prefix_lm"]
    return ["task.objective=seq2seq needs (input, target) pairs: set "
            "--config.task.seq2seq=True (input<TAB>target lines) or two "
            "--config.task.text_keys"]
  if name in ("lm", "prefix_lm", "span_corruption") and pairs:
    return ["task.objective=%s reads one text per example but the data is "
            "(input, target) pairs: set --config.task.seq2seq=False (or one "
            "text_keys), or --config.task.objective=seq2seq" % name]
  if name == "lm" and bitransformer:
    return ["a bitransformer cannot train on task.objective=lm (it has no "
            "inputs): set --config.task.objective=span_corruption or "
            "prefix_lm, or --config.model_type=lm"]
  if name == "span_corruption":
    obj = objectives_lib.Objective(
        name, config.length, not bitransformer, 0, task.noise_density,
        task.mean_noise_span_length)
    spans = objectives_lib.max_noise_spans(
        obj.tokens_length, task.noise_density, task.mean_noise_span_length)
    if task.extra_ids < spans:
      return ["task.objective=span_corruption at length %d makes up to %d "
              "noise spans per example, each replaced by a sentinel id, but "
              "task.extra_ids is %d: set --config.task.extra_ids=100 (T5's) "
              "or at least %d" % (config.length, spans, task.extra_ids,
                                  spans)]
  return []


def _vocab_file_problems(config):
  task = config.task
  if not task.vocab_file:
    return []
  try:
    vocab = vocabulary_lib.load_vocabulary(
        task.vocab_file, task.extra_ids, config.vocab_divisor)
  except DataError as e:
    return [str(e)]
  problem = vocab_size_problem(config, vocab, "task.vocab_file %s" %
                               task.vocab_file)
  return [problem] if problem else []


def vocab_size_problem(config, vocab, what):
  """One line when config.vocab_size does not fit the vocabulary: below
  its size, or above it by more than the padding to vocab_divisor."""
  if vocab.size <= config.vocab_size <= vocab.padded_size:
    return None
  return ("vocab_size %d does not fit %s: it has %d pieces%s = %d ids "
          "(%d padded to vocab_divisor %d): set --config.vocab_size=%d" % (
              config.vocab_size, what, vocab.base_size,
              " + %d extra_ids" % vocab.extra_ids if vocab.extra_ids else "",
              vocab.size, vocab.padded_size, config.vocab_divisor,
              vocab.size))


# --- the streams --------------------------------------------------------------------
TextData = collections.namedtuple("TextData", [
    "train", "held_out", "vocab", "vocab_is_new", "objective"])


def make_text_data(config, model_dir):
  """The text task's streams and vocabulary (see the module docstring);
  raises DataError on unusable data; writes nothing (training saves
  `vocab` as model_dir/vocab.model when vocab_is_new)."""
  task = config.task
  eval_seed = config.seed + 1 if config.eval_seed < 0 else config.eval_seed
  if task.tfds_name:
    keys = _text_keys(task)
    bitransformer = config.model_type == "bitransformer"
    if not task.objective and len(keys) != (2 if bitransformer else 1):
      # else a KeyError or lost inputs
      raise DataError(
          "model_type=%s needs %s TFDS text feature%s but task.text_keys is "
          "%r: set --config.task.text_keys=%s" % (
              config.model_type, "two (input,target)" if bitransformer else
              "one", "s" if bitransformer else "", task.text_keys,
              "input_feature,target_feature" if bitransformer else "text"))
    problems = _objective_problems(config)
    if problems:
      raise DataError(problems[0])
    train_units = tfds_units(task.tfds_name, task.tfds_data_dir,
                             task.tfds_split, keys)
    eval_units = tfds_units(task.tfds_name, task.tfds_data_dir,
                            task.tfds_eval_split, keys)
    spec = sources.ReadSpec("tfrecord", len(keys) == 2, keys,
                            {k: "bytes" for k in keys})
    where = "TFDS dataset %s in %s" % (task.tfds_name, task.tfds_data_dir)
    names = (where + " split %r" % task.tfds_split,
             where + " split %r" % task.tfds_eval_split)
  else:
    files, problems = sources.expand(data_patterns(task))
    eval_files, more = sources.expand(data_patterns(task, "eval_data_files"))
    if problems or more:
      raise DataError((problems + more)[0])
    eval_files = eval_files or files
    fmt = sources.file_format(files[0], task.data_format)
    length = config.length
    train_units = sources.make_units(files, task.data_format,
                                     sources.unit_bytes(length))
    eval_units = sources.make_units(eval_files, task.data_format,
                                    sources.unit_bytes(length))
    if fmt == "tfrecord":
      keys = _text_keys(task)
      problem, kinds = sources.tfrecord_problem(files[0], keys)
      if problem:
        raise DataError(problem)
      spec = sources.ReadSpec("tfrecord", len(keys) == 2, keys, kinds)
    else:
      spec = sources.ReadSpec("text", bool(task.seq2seq))
    names = (", ".join(files[:3]) + (" (+%d files)" % (len(files) - 3)
                                     if len(files) > 3 else ""),
             ", ".join(eval_files[:3]) + (
                 " (+%d files)" % (len(eval_files) - 3)
                 if len(eval_files) > 3 else ""))
  vocab, is_new = _vocabulary(config, model_dir, train_units, spec, names[0])
  if vocab is not None and vocab.size > config.vocab_size:
    raise DataError(
        "the data's vocabulary (%s) has %d ids but vocab_size is %d: set "
        "--config.vocab_size=%d" % (
            os.path.join(model_dir, VOCAB_NAME) if not is_new else
            "trained now", vocab.size, config.vocab_size, vocab.size))
  objective = make_objective(config, vocab)
  from meshtf.train import streams
  threads = task.reader_threads
  train = streams.Stream(train_units, spec, objective, config.batch_size,
                         config.seed, vocab, threads, prefetch=True,
                         name=names[0])
  held = streams.Stream(eval_units, spec, objective, config.batch_size,
                        eval_seed, vocab, threads, prefetch=False, cache=True,
                        name=names[1])
  return TextData(train, held, vocab, is_new, objective)


def make_objective(config, vocab):
  """The config's objectives.Objective (span corruption's first sentinel
  is the vocabulary's <extra_id_0>: its size - 1)."""
  task = config.task
  name = objective_name(config)
  first_sentinel = None
  if name == "span_corruption":
    if vocab is None or vocab.extra_ids < 1:
      raise DataError("task.objective=span_corruption needs sentinel ids: "
                      "set --config.task.extra_ids=100 (T5's)%s" % (
                          "" if vocab is None else " (the vocabulary has "
                          "none: a model_dir trained without extra ids "
                          "needs a new --model_dir)"))
    first_sentinel = vocab.sentinel_id(0)
  return objectives_lib.Objective(
      name, config.length, decoder_only=config.model_type == "lm",
      first_sentinel=first_sentinel, noise_density=task.noise_density,
      mean_noise_span_length=task.mean_noise_span_length)


def model_vocabulary(config, model_dir):
  """The vocabulary a text task's model uses without reading its data:
  model_dir/vocab.model (training saves it), else task.vocab_file with
  task.extra_ids; None when neither exists.

  Example:
    >>> model_vocabulary(config, "/tmp/m").decode([5, 9, 1])
    'the cat'
  """
  path = os.path.join(model_dir, VOCAB_NAME)
  if os.path.isfile(path):
    return vocabulary_lib.load_vocabulary(path, 0, config.vocab_divisor)
  if config.task.vocab_file:
    return vocabulary_lib.load_vocabulary(
        config.task.vocab_file, config.task.extra_ids, config.vocab_divisor)
  return None


def _vocabulary(config, model_dir, units, spec, name):
  """(vocabulary, whether it is new: not yet in model_dir)."""
  task = config.task
  saved = os.path.join(model_dir, VOCAB_NAME)
  if os.path.isfile(saved):
    return vocabulary_lib.load_vocabulary(saved, 0, config.vocab_divisor), \
        False
  if task.vocab_file:
    return vocabulary_lib.load_vocabulary(
        task.vocab_file, task.extra_ids, config.vocab_divisor), True
  if spec.format == "tfrecord" and all(
      spec.kinds.get(k) == "int64" for k in spec.keys):
    return None, False   # token ids already: no text to encode
  sample = sample_texts(units, spec, int(task.vocab_sample_mb * (1 << 20)))
  vocab = vocabulary_lib.train_vocabulary(
      sample, config.vocab_size, task.extra_ids, config.vocab_divisor,
      source="%s (a %.1f MB sample)" % (name, sum(map(len, sample)) / 1e6))
  return vocab, True


def sample_texts(units, spec, budget_bytes):
  """Up to about budget_bytes of the documents' texts (both of a pair),
  from units spread evenly over the data: what a vocabulary is trained on,
  so its time does not grow with the corpus.

  Example:
    >>> len("".join(sample_texts(units, spec, 1 << 20))) <= (1 << 20) + 4096
    True
  """
  per_unit = sources.unit_bytes(1)
  count = max(1, min(len(units), -(-budget_bytes // per_unit)))
  picks = sorted({int(i * len(units) / count) for i in range(count)})
  share = max(budget_bytes // len(picks), 1)
  out, total = [], 0
  for i in picks:
    got = 0
    for doc in sources.read_unit(units[i], spec):
      for text in doc:
        if isinstance(text, str):
          out.append(text)
          got += len(text)
      if got >= share:
        break
    total += got
    if total >= budget_bytes:
      break
  return out


# --- TFDS ---------------------------------------------------------------------------
def tfds_units(name, data_dir, split, text_keys=("text",)):
  """The units (TFDS's file instructions: a shard file's records of the
  split) of a TFDS dataset prepared in a LOCAL data_dir; meshtf never
  downloads. The dataset's code need not be installed: TFDS reads a
  prepared dataset from its files (features.json, dataset_info.json). A
  missing package, dataset, split or feature raises DataError (one line)
  before anything is written.

  Args:
    name: TFDS name, optionally with config and version ("wmt14/de-en:1.0.0").
    data_dir: the directory it was prepared in (`tfds build --data_dir`).
    split: a TFDS split ("train", "validation", "train[:10%]").
    text_keys: one scalar text feature (lm) or two (input, target:
      seq2seq); "a/b" names feature b nested in feature dict a.

  Example:
    >>> units = tfds_units("lm1b", "/data/tfds", "train")
    >>> units[0].kind, units[0].start
    ('tfrecord', 0)
  """
  text_keys = tuple(text_keys)
  if len(text_keys) not in (1, 2):
    raise DataError("TFDS text_keys %s must name one text feature (lm) or "
                    "two (input,target): set --config.task.text_keys"
                    % ",".join(text_keys))
  if not data_dir or not os.path.isdir(data_dir):
    raise DataError("TFDS data_dir %r does not exist; meshtf never downloads "
                    "datasets: prepare %s there first (tfds build) or use "
                    "--config.task.data_files" % (data_dir, name))
  try:
    import tensorflow_datasets as tfds
  except ImportError:
    raise DataError("tensorflow_datasets is not installed: pip install "
                    "tensorflow-datasets, or use --config.task.data_files"
                    ) from None
  builder = _tfds_builder(tfds, name, data_dir)
  where = "TFDS dataset %s in %s" % (name, data_dir)
  for key in text_keys:
    _check_text_feature(tfds, builder.info.features, key, where)
  file_format = str(getattr(builder.info, "file_format", "tfrecord"))
  if "tfrecord" not in file_format.lower():
    raise DataError("%s is stored as %s; meshtf streams TFRecord-prepared "
                    "datasets: prepare it with --file_format=tfrecord" % (
                        where, file_format))
  try:
    instructions = builder.info.splits[split].file_instructions
  except Exception as e:  # tfds raises many kinds; report one line
    raise DataError("%s: cannot read split %r (tfds: %s): set "
                    "--config.task.tfds_split / tfds_eval_split to one of %s"
                    % (where, split, _first_line(e), ", ".join(sorted(
                        builder.info.splits.keys())))) from None
  units = []
  for ins in instructions:
    take = int(ins.take)
    if take == 0:
      continue
    start = int(ins.skip)
    units.append(sources.Unit("tfrecord", ins.filename, start,
                              None if take < 0 else start + take))
  if not units:
    raise DataError("%s split %r has no examples: set "
                    "--config.task.tfds_split / tfds_eval_split" % (
                        where, split))
  return units


def _first_line(e):
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _tfds_builder(tfds, name, data_dir):
  """The prepared builder of `name` in data_dir: the installed dataset code
  when that version is prepared there, else whatever the files in data_dir
  hold (the code is not installed, or another TFDS release prepared it)."""
  from absl import logging as absl_logging
  # Looking up a dataset that is not there logs misleading warnings
  # ("Variant folder ... has no dataset_info.json"); our error says it all.
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    return _find_tfds_builder(tfds, name, data_dir)
  finally:
    absl_logging.set_verbosity(verbosity)


def _find_tfds_builder(tfds, name, data_dir):
  not_found = tfds.core.registered.DatasetNotFoundError
  problem = None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  except not_found:
    pass
  except Exception as e:  # e.g. the dataset code needs a missing package
    problem = e
  try:
    builder = tfds.core.read_only_builder.builder_from_files(
        name, data_dir=data_dir)
    if builder.is_prepared():
      return builder
  except not_found:
    pass
  except Exception as e:  # e.g. a damaged dataset_info.json
    problem = e
  raise DataError(
      "TFDS dataset %s is not prepared in %s%s; meshtf never downloads: "
      "prepare it there first (tfds build %s --data_dir=%s) or use "
      "--config.task.data_files" % (
          name, data_dir,
          " (tfds: %s)" % _first_line(problem) if problem else "",
          name.split(":")[0], data_dir))


def _check_text_feature(tfds, features, key, where):
  """The scalar text feature `key` ("a/b": nested) of a FeaturesDict."""
  feature = features
  for part in key.split("/"):
    if not isinstance(feature, tfds.features.FeaturesDict) or \
        part not in feature.keys():
      raise DataError("%s has no feature %r (its features: %s): set "
                      "--config.task.text_keys" % (
                          where, key, ", ".join(sorted(_feature_names(
                              tfds, features)))))
    feature = feature[part]
  if getattr(feature, "np_dtype", None) not in (object, np.str_, np.bytes_) \
      or tuple(feature.shape) != ():
    raise DataError("%s feature %r is not a text string (%s): set "
                    "--config.task.text_keys to text features" % (
                        where, key, type(feature).__name__))


def _feature_names(tfds, features, prefix=""):
  out = []
  for k in features.keys():
    if isinstance(features[k], tfds.features.FeaturesDict):
      out += _feature_names(tfds, features[k], prefix + k + "/")
    else:
      out.append(prefix + k)
  return out


__all__ = ["DataError", "VOCAB_NAME", "TextData", "text_file_problem",
           "task_problems", "make_text_data", "make_objective",
           "model_vocabulary", "vocab_size_problem", "sample_texts",
           "tfds_units", "is_text_task", "objective_name"]
