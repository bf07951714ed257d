"""Export a trained model as a SavedModel that plain TensorFlow serves.

The latest checkpoint is restored on a 1-device mesh, so every variable is
one plain tf.Variable holding its full value; the model is lowered there
into ordinary TensorFlow ops. The SavedModel has two signatures (three for
a text task):

  score(targets[, inputs])  -> {"loss": [n] mean cross entropy per example
                                over its non-padding target tokens,
                                "num_tokens": [n]}
  decode(targets, prompt_length) (language model) or decode(inputs)
                            -> {"outputs": [n, length] greedy decoding:
                                the prompt, then the model's tokens until
                                EOS (1), then padding}

  decode_text(text)         (text tasks) -> {"outputs": [n] strings}: each
                            prompt (a language model continues it; an
                            encoder-decoder decodes it) tokenized, decoded
                            greedily and detokenized in the graph with
                            tensorflow-text's SentencepieceTokenizer (the
                            vocabulary training saved); any n (batches of
                            the export batch size inside); the same
                            strings as --mode=decode of a prompt file

Decoding uses the model's key/value caches in one while loop
(meshtf.models.decoding), or re-runs the model on the growing prefix when
the config's decode method says so (see experiment.decode_method).
Inputs are int32 [n, length] with n <= the export batch size (batches are
padded to it inside). Loading needs TensorFlow only (and, for
decode_text, `import tensorflow_text`, which registers its ops):

Example:
  >>> m = tf.saved_model.load("/tmp/m/export")
  >>> m.signatures["score"](targets=tf.constant(ids))["loss"]
  >>> m.signatures["decode_text"](text=tf.constant(["the cat"]))["outputs"]
"""
import os
import shutil

import numpy as np
import tensorflow as tf

import meshtf as mtf
from meshtf.lowering import variables as variables_lib
from meshtf.models import transformer
from meshtf.train import checkpoint as checkpoint_lib
from meshtf.train import data as data_lib
from meshtf.train import experiment
from meshtf.train import vocabulary


def _restore(found, store):
  """Restores found (an IntactCheckpoint or an init_checkpoint.RestorePlan)
  into store; returns the names it restores."""
  from meshtf.train import init_checkpoint
  if isinstance(found, init_checkpoint.RestorePlan):
    found.restore_into(store)
    return set(found.sources)
  store.restore_values(found.values)
  return set(found.values)


def export(config, model_dir, export_dir, checkpoint=None):
  """Writes the SavedModel of a checkpoint (default: model_dir's newest
  intact one; or a verified checkpoint_lib.IntactCheckpoint) to export_dir
  (replacing it atomically); returns export_dir."""
  from meshtf.train import startup
  device = tf.config.list_logical_devices("CPU")[0].name
  startup.devices_ready()   # TensorFlow's start-up lines are over
  impl = mtf.PlacementMeshImpl("all:1", "", [device])
  store = variables_lib.VariableStore()
  found = checkpoint or checkpoint_lib.CheckpointManager(
      model_dir).read_newest_intact()
  if found is None:
    raise FileNotFoundError("no checkpoint in %s" % model_dir)
  restored = _restore(found, store)
  # The experiment of the export's one-processor mesh, not the run's: its
  # MoE layers count their groups for one processor (moe.num_groups = 0
  # follows the mesh), so its model is another object.
  one_processor = experiment.Experiment(config, None)
  sink, model = one_processor.sink, one_processor.model
  seq2seq = config.model_type == "bitransformer"
  batch = config.export_batch_size or config.batch_size
  length = config.length

  def features_of(mesh, targets, inputs=None, decoding=False):
    ones = tf.ones_like(targets)
    feats = {"targets": targets,
             "targets_segmentation": ones if decoding else tf.minimum(
                 targets, 1),
             "targets_position": tf.cumsum(ones, axis=1, exclusive=True)}
    if not decoding:
      feats["targets_position"] *= feats["targets_segmentation"]
    if inputs is not None:
      seg = tf.minimum(inputs, 1)
      feats.update(inputs=inputs, inputs_segmentation=seg,
                   inputs_position=tf.cumsum(tf.ones_like(inputs), axis=1,
                                             exclusive=True) * seg)
    return transformer.import_features(mesh, feats)

  def build_score(mesh, targets, *inputs):
    sink.clear()
    feats = features_of(mesh, targets, inputs[0] if inputs else None)
    loss, _ = experiment.per_example_loss(model, feats)
    sink.clear()
    n = mtf.reduce_sum(mtf.cast(mtf.not_equal(feats["targets"], 0),
                                tf.float32),
                       reduced_dim=feats["targets"].shape.dims[-1])
    return {"loss": loss, "num_tokens": n}

  def build_argmax(mesh, targets, *inputs):
    sink.clear()
    logits, _, _ = transformer.compute_logits_loss_metrics(
        model, features_of(mesh, targets, inputs[0] if inputs else None,
                           decoding=True), "eval")
    sink.clear()
    return mtf.argmax(logits, logits.shape.dims[-1])

  def build_decode(mesh, targets, *inputs):
    sink.clear()
    feats = {"targets": targets}
    if inputs:
      feats["inputs"] = inputs[0]
    ids = experiment.decode_ids(model, transformer.import_features(
        mesh, feats))
    sink.clear()
    return ids

  score_fn = mtf.MeshFunction(build_score, impl, variable_store=store,
                              seed=config.seed)
  cached = experiment.decode_method(config) == "cached"
  if cached:
    decode_fn = mtf.MeshFunction(build_decode, impl, variable_store=store,
                                 seed=config.seed)
  argmax_fn = mtf.MeshFunction(build_argmax, impl, variable_store=store,
                               seed=config.seed)
  # Run both once: creates the variables (from the restored values).
  zeros = np.zeros([batch, length], np.int32)
  args = (zeros, zeros) if seq2seq else (zeros,)
  score_fn(*args)
  (decode_fn if cached else argmax_fn)(*args)
  missing = [n for n in store.names() if n not in restored]
  if missing:
    raise ValueError("export: variables %s are not in the checkpoint" %
                     missing[:3])

  module = tf.Module()
  # Tracked by the module, so the SavedModel holds them.
  module.model_variables = [e.slices[0] for e in store.entries()]

  def pad(x):
    n = tf.shape(x)[0]
    tf.debugging.assert_less_equal(
        n, batch, message="export: batch larger than the export batch size "
        "%d (config.export_batch_size)" % batch)
    # Static shapes: meshtf dims have fixed sizes.
    return tf.ensure_shape(tf.pad(x, [[0, batch - n], [0, 0]]),
                           [batch, length]), n

  spec = tf.TensorSpec([None, length], tf.int32)

  if seq2seq:
    @tf.function(autograph=False, input_signature=[spec, spec])
    def score(targets, inputs):
      t, n = pad(targets)
      i, _ = pad(inputs)
      out = score_fn(t, i)
      return {k: v[:n] for k, v in out.items()}

    @tf.function(autograph=False, input_signature=[spec])
    def decode(inputs):
      i, n = pad(inputs)
      if cached:
        out = decode_fn(tf.zeros_like(i), i)
      else:
        out = _greedy(lambda cur: argmax_fn(cur, i),
                      tf.zeros([batch], tf.int32), tf.zeros_like(i))
      return {"outputs": out[:n]}
  else:
    @tf.function(autograph=False, input_signature=[spec])
    def score(targets):
      t, n = pad(targets)
      out = score_fn(t)
      return {k: v[:n] for k, v in out.items()}

    @tf.function(autograph=False, input_signature=[
        spec, tf.TensorSpec([None], tf.int32)])
    def decode(targets, prompt_length):
      t, n = pad(targets)
      p = tf.ensure_shape(tf.pad(prompt_length, [[0, batch - n]],
                                 constant_values=length), [batch])
      if cached:  # the prompt: the prefix up to the first 0
        keep = tf.range(length)[tf.newaxis, :] < p[:, tf.newaxis]
        out = decode_fn(tf.where(keep, t, 0))
      else:
        out = _greedy(lambda cur: argmax_fn(cur), p, t)
      return {"outputs": out[:n]}

  module.score = score
  module.decode = decode
  signatures = {"score": score.get_concrete_function(),
                "decode": decode.get_concrete_function()}
  decode_text = _text_signature(config, model_dir, module, decode, seq2seq,
                                batch, length)
  if decode_text is not None:
    module.decode_text = decode_text
    signatures["decode_text"] = decode_text.get_concrete_function()
  # Written under a temporary name and renamed when complete: a stop
  # (Ctrl-C, SIGTERM, an error) leaves the previous export or none, never
  # half of one.
  base = export_dir.rstrip("/")
  tmp, old = base + ".tmp-%d" % os.getpid(), base + ".old-%d" % os.getpid()
  try:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
    tf.saved_model.save(module, tmp, signatures=signatures)
    if os.path.exists(export_dir):
      os.rename(export_dir, old)
    os.rename(tmp, export_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(old) and not os.path.exists(export_dir):
      os.rename(old, export_dir)
    raise
  shutil.rmtree(old, ignore_errors=True)
  return export_dir


def signature_names(export_dir):
  """The signatures of an export, from its saved_model.pb (no loading).

  Example:
    >>> signature_names("/tmp/m/export")
    ['decode', 'decode_text', 'score']
  """
  from tensorflow.core.protobuf import saved_model_pb2
  proto = saved_model_pb2.SavedModel()
  with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
    proto.ParseFromString(f.read())
  return sorted(k for k in proto.meta_graphs[0].signature_def
                if not k.startswith("__"))


def _text_signature(config, model_dir, module, decode, seq2seq, batch,
                    length):
  """decode_text for a text task (None for a synthetic one): strings in,
  strings out, tokenized with the vocabulary's own bytes in the graph."""
  from meshtf.train import text_data
  if not text_data.is_text_task(config):
    return None
  vocab = text_data.model_vocabulary(config, model_dir)
  if vocab is None:
    return None   # token-id data: the id signatures are the interface
  import tensorflow_text as tft   # registers the SentencePiece ops
  module.tokenizer = tft.SentencepieceTokenizer(model=vocab.model_proto)
  size = vocab.size
  eos = data_lib.EOS

  def one_batch(ids, lengths):
    """Decodes [batch, length] prompts; returns the generated ids (after
    the prompt, through the first EOS; ids past the vocabulary as
    unknown) and the mask of them."""
    if seq2seq:
      out = decode(inputs=ids)["outputs"]
      start = tf.zeros_like(lengths)
    else:
      out = decode(targets=ids, prompt_length=lengths)["outputs"]
      start = lengths
    positions = tf.range(length)[tf.newaxis, :]
    after = positions >= start[:, tf.newaxis]
    eos_before = tf.cumsum(tf.cast(tf.logical_and(after, tf.equal(
        out, eos)), tf.int32), axis=1, exclusive=True)
    keep = after & tf.equal(eos_before, 0) & (out > eos)
    return tf.where(out >= size, vocabulary.UNK_ID, out), keep

  @tf.function(autograph=False, input_signature=[
      tf.TensorSpec([None], tf.string)])
  def decode_text(text):
    tokens = module.tokenizer.tokenize(tf.strings.strip(text))
    lengths = tf.cast(tokens.row_lengths(), tf.int32)
    room = length - 1   # + EOS (inputs), or + one generated token (lm)
    check = tf.debugging.assert_less_equal(
        lengths, room, message="decode_text: a prompt has more tokens than "
        "length - 1 = %d leaves room for" % room)
    with tf.control_dependencies([check]):
      if seq2seq:
        tokens = tf.concat([tokens, tf.ones_like(tokens[:, :1])], axis=1)
      ids = tokens.to_tensor(0, shape=[None, length])
    n = tf.shape(ids)[0]
    chunks = (n + batch - 1) // batch
    pad = chunks * batch - n
    ids = tf.reshape(tf.pad(ids, [[0, pad], [0, 0]]), [chunks, batch,
                                                       length])
    lengths_c = tf.reshape(tf.pad(lengths, [[0, pad]], constant_values=1),
                           [chunks, batch])
    # Each chunk is one export batch; map_fn runs them in order.
    out, keep = tf.map_fn(
        lambda x: one_batch(x[0], x[1]), (ids, lengths_c),
        fn_output_signature=(tf.int32, tf.bool))
    out = tf.reshape(out, [-1, length])[:n]
    keep = tf.reshape(keep, [-1, length])[:n]
    return {"outputs": module.tokenizer.detokenize(
        tf.ragged.boolean_mask(out, keep))}
  return decode_text


def _greedy(predict, prompt_length, prompt):
  """Greedy decoding in plain TF: positions >= prompt_length are filled
  one at a time with argmax predictions (predict(cur) -> [b, length]) until
  EOS; later positions stay 0."""
  b, length = prompt.shape
  positions = tf.range(length)[tf.newaxis, :]
  cur = tf.where(positions < prompt_length[:, tf.newaxis], prompt, 0)
  done = tf.zeros([b], tf.bool)

  def body(i, cur, done):
    preds = predict(cur)[:, i]
    write = tf.logical_and(i >= prompt_length, tf.logical_not(done))
    mask = tf.logical_and(tf.equal(positions, i), write[:, tf.newaxis])
    cur = tf.where(mask, preds[:, tf.newaxis], cur)
    done = tf.logical_or(done, tf.logical_and(write,
                                              tf.equal(preds, data_lib.EOS)))
    return i + 1, cur, done

  _, cur, _ = tf.while_loop(
      lambda i, cur, done: tf.logical_and(i < length,
                                          tf.logical_not(tf.reduce_all(done))),
      body, [tf.reduce_min(prompt_length), cur, done])
  return cur


__all__ = ["export", "signature_names"]
