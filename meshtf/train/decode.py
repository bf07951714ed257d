"""--mode=decode: greedy, sampling or beam-search decoding of held-out
examples or of a prompt file, with accuracy where the answers are known.

Strategies (config.decode_strategy):
  greedy  the argmax token at each position: key/value caches in one
          mtf.while_loop, or re-running the model on the growing prefix
          (config.decode_method = cached | recompute)
  sample  samples with config.decode_temperature among the
          config.decode_top_k most likely tokens (0: all)
  beam    beam search of config.decode_beam_size beams with GNMT's length
          penalty (config.decode_alpha); a language model's beams continue
          its prompt

Prompts (config.decode_prompts_file; empty: config.decode_batches held-out
batches of the task):
  synthetic task  one input per line as space-separated token ids (e.g.
                  "5 9 4" for reverse); the task knows each answer, so
                  exact-match and token accuracy are reported
  text data       one line of text per prompt, encoded with the vocabulary
                  that training saved in model_dir (a language model
                  continues it; an encoder-decoder translates it)

The decodes of a prompt file are written, one line per prompt, to
config.decode_output_file (default model_dir/decodes-<step>.txt), through a
temporary file, so an existing file is never half-written.

Example:
  >>> prompts = read_prompts(config, "/tmp/m")    # before any TF work
  >>> result = decode(session, data, step, log, prompts)
  >>> result["exact_match"]
  1.0
"""
import os
import re
import time

import numpy as np

from meshtf.train import data as data_lib

STRATEGIES = ("greedy", "sample", "beam")
# A prompt file for t2t_configs/lm_tiny.py (the synthetic copy task).
EXAMPLE_PROMPTS = "t2t_configs/lm_tiny_prompts.txt"


class PromptError(ValueError):
  """A prompt file that cannot be decoded (printed as one line)."""


# --- prompts ------------------------------------------------------------------
class Prompts(object):
  """Parsed prompts: batches in the task's feature format.

  Attributes:
    lines: the prompt file's lines (stripped), one per prompt.
    batches: feature dicts of batch_size rows (the last padded with copies
      of the first prompt, whose decodes are dropped).
    count: the number of prompts.
    has_answers: True when the rows carry reference outputs (synthetic).
    vocab: the vocabulary.Vocabulary of text prompts, else None.
  """

  def __init__(self, lines, batches, count, has_answers, vocab=None):
    self.lines = lines
    self.batches = batches
    self.count = count
    self.has_answers = has_answers
    self.vocab = vocab


def read_prompts(config, model_dir):
  """The prompts of config.decode_prompts_file, or None when it is unset.
  Raises PromptError naming the file, line and fix on a bad prompt; reads
  only (no TensorFlow work).

  Example:
    >>> p = read_prompts(config, model_dir)     # "5 9 4" -> reverse task
    >>> p.batches[0]["targets"][0, :5].tolist()
    [5, 9, 4, 2, 4]
  """
  from meshtf.train import text_data
  path = str(config.decode_prompts_file or "")
  if not path:
    return None
  problem = text_data.text_file_problem(
      path, "decode prompt file", "--config.decode_prompts_file=%s (one "
      "prompt per line)" % EXAMPLE_PROMPTS)
  if problem:
    raise PromptError(problem)
  # utf-8-sig: a byte-order mark (Windows editors write one) is not part
  # of the first prompt.
  with open(path, encoding="utf-8-sig") as f:
    numbered = [(i + 1, l.strip()) for i, l in enumerate(f) if l.strip()]
  seq2seq = config.model_type == "bitransformer"
  task = config.task
  if task.data_files or task.tfds_name:
    return _text_prompts(config, model_dir, path, numbered, seq2seq)
  synthetic = data_lib.SyntheticTask(task.problem, config.vocab_size,
                                     config.length, seq2seq=seq2seq)
  examples = []
  for number, line in numbered:
    try:
      x = [int(t) for t in line.replace(",", " ").split()]
      synthetic.check_prompt(x)
    except ValueError as e:
      raise PromptError("%s line %d %r: %s (synthetic task %r: a prompt is "
                        "the input's token ids separated by spaces)" % (
                            path, number, line[:40], str(e).split(
                                "invalid literal")[0].strip() or
                            "not token ids", task.problem))
    examples.append((x, synthetic.answer(x)))
  return Prompts([l for _, l in numbered],
                 _batches(examples, config.batch_size, synthetic.batch_of),
                 len(examples), has_answers=True)


# A line of token ids ("5 9 4"): what a synthetic task's prompt is.
_TOKEN_IDS = re.compile(r"\d+([\s,]+\d+)+")


def _text_prompts(config, model_dir, path, numbered, seq2seq):
  from meshtf.train import text_data
  vocab = text_data.model_vocabulary(config, model_dir)
  if vocab is None:
    raise PromptError("text prompts need the vocabulary training saved in "
                      "model_dir, but %s does not exist: train with this "
                      "--model_dir first (or set --config.task.vocab_file)"
                      % os.path.join(model_dir, text_data.VOCAB_NAME))
  if numbered and all(_TOKEN_IDS.fullmatch(l) for _, l in numbered):
    # Encoded as text, digits the corpus lacks are unknown pieces: every
    # prompt would decode to nothing useful, without a word.
    task = config.task
    raise PromptError(
        "decode prompt file %s holds token ids (line %d %r), but the model "
        "was trained on text (%s): write its prompts as text, one per line "
        "(the vocabulary the model was trained with encodes them); token "
        "ids are the synthetic tasks' prompts" % (
            path, numbered[0][0], numbered[0][1][:40],
            "task.data_files=%s" % task.data_files if task.data_files else
            "task.tfds_name=%s" % task.tfds_name))
  length = config.length
  rows = []
  for number, line in numbered:
    ids = vocab.encode(line)
    room = length - 1   # + EOS (inputs) or + one generated token (lm)
    if not ids or len(ids) > room:
      raise PromptError(
          "%s line %d: the prompt has %d tokens but length %d leaves room for"
          " %d%s: shorten it or raise --config.length" % (
              path, number, len(ids), length, room,
              "" if seq2seq else " (and one generated token)"))
    row = np.zeros([length], np.int32)
    if seq2seq:
      row[:len(ids) + 1] = ids + [data_lib.EOS]
      rows.append({"inputs": row, "targets": np.zeros([length], np.int32)})
    else:
      row[:len(ids)] = ids
      rows.append({"targets": row})

  def batch_of(group):
    out = {k: np.stack([r[k] for r in group]) for k in group[0]}
    # No answer: no weights (decode_prompts then takes the prompt's
    # non-zero tokens as the prompt).
    out["targets_weights"] = np.zeros(out["targets"].shape, np.float32)
    return out
  return Prompts([l for _, l in numbered],
                 _batches(rows, config.batch_size, batch_of), len(rows),
                 has_answers=False, vocab=vocab)


def _batches(items, batch_size, batch_of):
  out = []
  for start in range(0, len(items), batch_size):
    group = list(items[start:start + batch_size])
    group += [items[0]] * (batch_size - len(group))
    out.append(batch_of(group))
  return out


# --- prompts and answers of a batch -------------------------------------------
def decode_prompts(batch, seq2seq):
  """(prompt lengths [batch], reference outputs: list of token lists ending
  in EOS) of a batch of the synthetic task (or text data)."""
  targets = batch["targets"]
  weights = batch.get("targets_weights", (targets != 0).astype(np.float32))
  lengths, refs = [], []
  for row in range(targets.shape[0]):
    if seq2seq:
      p = 0
    else:
      nz = np.nonzero(weights[row] > 0)[0]
      p = int(nz[0]) if len(nz) else int(np.sum(targets[row] != 0))
    ref = [int(t) for t in targets[row, p:]]
    if data_lib.EOS in ref:
      ref = ref[:ref.index(data_lib.EOS) + 1]
    lengths.append(p)
    refs.append(ref)
  return np.array(lengths, np.int32), refs


def prompts(batch):
  """A language-model batch's targets with everything after each row's
  prompt set to 0 (what decoding starts from)."""
  targets = batch["targets"]
  prompt_len, _ = decode_prompts(batch, seq2seq=False)
  keep = np.arange(targets.shape[1])[None, :] < prompt_len[:, None]
  return np.where(keep, targets, 0).astype(np.int32)


def greedy_decode(predict, batch, seq2seq):
  """Greedy decoding with predict(features) -> argmax ids [batch, length]
  (numpy): position i gets the model's prediction given positions < i,
  for every row whose prompt ends before i, until EOS. Returns targets
  [batch, length] with the prompt and the decoded tokens.

  Example:
    >>> out = greedy_decode(lambda f: model_argmax(f), batch, seq2seq=False)
  """
  targets = batch["targets"]
  b, length = targets.shape
  prompt_len, _ = decode_prompts(batch, seq2seq)
  cur = np.where(np.arange(length)[None, :] < prompt_len[:, None], targets,
                 0).astype(np.int32)
  done = np.zeros([b], bool)
  features = {"targets_segmentation": np.ones([b, length], np.int32),
              "targets_position": np.tile(np.arange(length, dtype=np.int32),
                                          [b, 1])}
  if seq2seq:
    features["inputs"] = batch["inputs"]
    features["inputs_segmentation"] = (batch["inputs"] != 0).astype(np.int32)
    features["inputs_position"] = (
        features["inputs_segmentation"] * np.arange(length)).astype(np.int32)
  for i in range(int(prompt_len.min()), length):
    write = (i >= prompt_len) & ~done
    if not write.any():
      break
    preds = predict(dict(features, targets=cur))
    cur[write, i] = preds[write, i]
    done |= write & (preds[:, i] == data_lib.EOS)
  return cur


def outputs(decoded, batch, seq2seq):
  """Each row's decoded tokens after its prompt, through the first EOS."""
  prompt_len, _ = decode_prompts(batch, seq2seq)
  out = []
  for row in range(decoded.shape[0]):
    got = [int(t) for t in decoded[row, prompt_len[row]:]]
    if data_lib.EOS in got:
      got = got[:got.index(data_lib.EOS) + 1]
    out.append(got)
  return out


def decode_accuracy(decoded, batch, seq2seq, rows=None):
  """(exact-match accuracy, token accuracy) of decoded targets against the
  batch's reference outputs (through EOS), over `rows` (default all)."""
  _, refs = decode_prompts(batch, seq2seq)
  got = outputs(decoded, batch, seq2seq)
  rows = range(len(refs)) if rows is None else rows
  exact = tokens = total = 0
  for row in rows:
    exact += got[row] == refs[row]
    tokens += sum(a == b for a, b in zip(got[row], refs[row]))
    total += len(refs[row])
  return exact / float(max(len(rows), 1)), tokens / float(max(total, 1))


# --- the model as decoding functions ------------------------------------------
class Decoder(object):
  """A session's model as decoding MeshFunctions (one per strategy, built
  on first use, sharing the session's variables).

  Example:
    >>> decoded = Decoder(session).decode(batch, "beam")   # [batch, length]
  """

  def __init__(self, session):
    self.session = session
    self._fns = {}

  def _mesh_function(self, key, build_ids):
    if key not in self._fns:
      session = self.session

      def build(mesh, features):
        from meshtf.models import transformer
        session.sink.clear()
        ids = build_ids(transformer.import_features(mesh, features))
        session.sink.clear()
        return ids
      self._fns[key] = session.mtf.MeshFunction(
          build, session.impl, variable_store=session.store,
          seed=session.config.seed)
    return self._fns[key]

  def decode(self, batch, strategy=None, method=None):
    """Decodes a batch's prompts (language model) or inputs
    (encoder-decoder); returns the decoded targets [batch, length]: the
    prompt, the generated tokens through EOS, then zeros."""
    config = self.session.config
    strategy = strategy or config.decode_strategy
    method = method or config.decode_method
    seq2seq = config.model_type == "bitransformer"
    from meshtf.train import experiment as experiment_lib
    model = self.session.model
    if strategy == "greedy" and method == "recompute":
      fn = self._mesh_function("argmax", self._argmax)
      out = greedy_decode(lambda f: np.asarray(fn(f)), batch, seq2seq)
    else:
      options = self.session.experiment.decode_options(strategy)
      fn = self._mesh_function(
          strategy, lambda f: experiment_lib.decode_ids(model, f, **options))
      if seq2seq:
        features = {"inputs": batch["inputs"]}
      else:
        features = {"targets": prompts(batch)}
      out = np.asarray(fn(features))
    self._check_restored()
    return out

  def _argmax(self, features):
    from meshtf.models import transformer
    mtf = self.session.mtf
    logits, _, _ = transformer.compute_logits_loss_metrics(
        self.session.model, features, "eval")
    return mtf.argmax(logits, logits.shape.dims[-1])

  def _check_restored(self):
    """Decoding must use only trained weights: a variable the checkpoint
    lacks (e.g. a layer that made new variables in a second call) would
    silently start from its initializer."""
    saved = self.session.restored_names
    if saved is None:
      return   # nothing was restored: fresh weights throughout
    fresh = [n for n in self.session.store.names() if n not in saved]
    if fresh:
      raise RuntimeError(
          "decoding created variables the checkpoint does not have (%s): a "
          "layer did not reuse its weights when called again" % fresh[:3])


# --- the mode -----------------------------------------------------------------
def decode(session, data, step, log, prompt_set=None):
  """--mode=decode: decodes config.decode_batches held-out batches, or the
  prompts of a prompt file (see the module docstring); returns
  {"exact_match", "token_accuracy" (None without answers), "outputs",
  "examples", "seconds", "first_batch", "first_decoded", ...}."""
  config = session.config
  seq2seq = config.model_type == "bitransformer"
  decoder = session.decoder()
  t0 = time.time()
  if prompt_set is None:
    batches = [data.eval_batch(i) for i in range(config.decode_batches)]
    count = len(batches) * config.batch_size
    has_answers = True
  else:
    batches, count = prompt_set.batches, prompt_set.count
    has_answers = prompt_set.has_answers
  exact = token = 0.0
  rows_done = 0
  decoded_rows = []
  first = None
  for batch in batches:
    decoded = decoder.decode(batch)
    rows = list(range(min(config.batch_size, count - rows_done)))
    if has_answers:
      e, t = decode_accuracy(decoded, batch, seq2seq, rows)
      exact += e * len(rows)
      token += t * len(rows)
    decoded_rows.extend(outputs(decoded, batch, seq2seq)[:len(rows)])
    rows_done += len(rows)
    if first is None:
      first = (batch, decoded)
  vocab = prompt_set.vocab if prompt_set is not None else data.vocab
  texts = [_text(vocab, o) for o in decoded_rows]
  result = {"exact_match": exact / count if has_answers else None,
            "token_accuracy": token / count if has_answers else None,
            "step": step, "outputs": texts, "count": count,
            "strategy": config.decode_strategy,
            "examples": _examples(first[0], first[1], seq2seq, vocab,
                                  rows=min(3, count)),
            "seconds": time.time() - t0,
            "first_batch": first[0], "first_decoded": first[1]}
  for ex in result["examples"][:3]:
    log("  input %s -> decoded %s%s" % (
        ex["input"], ex["decoded"], " (reference %s)" % (ex["reference"],)
        if has_answers else ""))
  what = ("%d prompts of %s" % (count, config.decode_prompts_file)
          if prompt_set is not None else "%d held-out examples" % count)
  how = _strategy_words(config)
  if has_answers:
    log("decode at step %d: exact match %.4f, token accuracy %.4f over %s "
        "(%s, %.1f s)" % (step, result["exact_match"],
                          result["token_accuracy"], what, how,
                          result["seconds"]))
  else:
    log("decode at step %d: %s (%s, %.1f s)" % (step, what, how,
                                                result["seconds"]))
  if prompt_set is not None:
    path = config.decode_output_file or os.path.join(
        session.model_dir, "decodes-%d.txt" % step)
    _write_lines(path, texts)
    result["output_file"] = path
    log("decodes written to %s" % path)
  return result


def _strategy_words(config):
  s = config.decode_strategy
  if s == "greedy":
    return "greedy, %s" % config.decode_method
  if s == "sample":
    return "sampling at temperature %g, top_k %s" % (
        config.decode_temperature, config.decode_top_k or "all")
  return "beam search, %d beams, alpha %g" % (config.decode_beam_size,
                                              config.decode_alpha)


def _text(vocab, tokens):
  """A decoded output as a line: text with a vocabulary, else ids."""
  if vocab is not None:
    # The model's vocab dim may be larger than the sentencepiece model
    # (vocab_size is a maximum, and padded to vocab_divisor): an id beyond
    # it decodes as the unknown piece.
    size = vocab.get_piece_size()
    return vocab.decode([t if t < size else vocab.unk_id() for t in tokens
                         if t > data_lib.EOS])
  return " ".join(str(t) for t in tokens if t != data_lib.EOS)


def _examples(batch, decoded, seq2seq, vocab=None, rows=3):
  """The first `rows` rows of a batch as printable examples (a prompt
  file's last batch is padded with copies of its first prompt: those are
  not shown)."""
  prompt_len, refs = decode_prompts(batch, seq2seq)
  got = outputs(decoded, batch, seq2seq)
  out = []
  for row in range(min(rows, len(refs))):
    source = batch["inputs"][row] if seq2seq else \
        batch["targets"][row, :prompt_len[row]]
    source = [int(t) for t in source if t]
    if vocab is not None:
      out.append({"input": repr(_text(vocab, source)),
                  "decoded": repr(_text(vocab, got[row])),
                  "reference": repr(_text(vocab, refs[row]))})
    else:
      out.append({"input": source, "decoded": got[row],
                  "reference": refs[row]})
  return out


def _write_lines(path, lines):
  """Writes lines to path through a temporary file renamed over it."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = path + ".tmp-%d" % os.getpid()
  with open(tmp, "w", encoding="utf-8") as f:
    for line in lines:
      f.write(line.replace("\n", " ") + "\n")
  os.replace(tmp, path)


__all__ = ["STRATEGIES", "PromptError", "Prompts", "read_prompts",
           "decode_prompts", "prompts", "greedy_decode", "outputs",
           "decode_accuracy", "Decoder", "decode"]
