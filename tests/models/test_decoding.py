"""Decoding (meshtf/models/decoding.py; Unitransformer.sample_autoregressive
and beam_search, Bitransformer.decode).

The cached decoder (one mtf.while_loop, key/value caches updated one
position per step) is checked against re-running the full model on the
growing prefix; its tokens (greedy and sampled) are the same on 1 device
and on virtual devices (8 for SPMD, 4 for placement) under layouts
splitting the batch, the vocab / heads / d_ff (the paper layout, and
unevenly over 3 processors) and d_model with the caches' memory_length, on
both backends. Beam search is
checked against numpy (log probabilities from the full model, GNMT length
penalty) and against greedy decoding; the encoder-decoder decodes on two
layouts; a trained tiny LM decodes the copy task.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import harness
from conftest import load_file
import meshtf as mtf
from meshtf.lowering import mesh_impl as mesh_impl_lib
from meshtf.models import decoding
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer
from meshtf.models import transformer_layers as tl


def _load_test_transformer():
  """test_transformer.py's helpers (the copy-task batches, the tiny
  encoder-decoder); pytest imports test files by path, not as modules."""
  return load_file(os.path.join(os.path.dirname(__file__),
                                "test_transformer.py"),
                   "_test_transformer_helpers")


_tt = _load_test_transformer()
# pylint: disable=protected-access
_copy_batch, _tiny_bitransformer = _tt._copy_batch, _tt._tiny_bitransformer

TWO = "rows:2;cols:4"
PAPER = "batch:rows;vocab:cols;d_ff:cols;heads:cols"
B, L, V = 8, 8, 16
MEM = "d_model:rows;memory_length:cols"   # the caches split on memory_length
LAYOUTS = [("all:8", "batch:all"), (TWO, PAPER), (TWO, MEM)]
# The placement backend runs a loop body eagerly, device by device: the
# same layouts on 4 devices halve its time and still split every dim 2-way.
FOUR = "rows:2;cols:2"
PLACEMENT_LAYOUTS = [("all:4", "batch:all"), (FOUR, PAPER), (FOUR, MEM)]
STOP = 7   # a token this untrained LM emits often (checked below)


def _run(model_fn, arrays, mesh_shape="all:1", layout="",
         backend="placement", store=None):
  """Builds model_fn(mesh, {name: Tensor}) and lowers it once (no
  gradients, unlike harness.run_model); returns (numpy outputs, graph)."""
  graph = mtf.Graph(seed=0)
  mesh = mtf.Mesh(graph, "mesh")
  inputs = {n: mtf.import_tf_tensor(mesh, tf.constant(a), s, name=n)
            for n, (a, s) in sorted(arrays.items())}
  outputs = model_fn(mesh, inputs)
  impl = harness.make_impl(backend, mesh_shape, layout)
  with harness.graph_optimizer_off(), mesh_impl_lib.poison_padding():
    lowering = mtf.Lowering(graph, {mesh: impl}, variable_store=store,
                            outputs=list(outputs.values()))
    out = {n: lowering.export_to_tf_tensor(t).numpy()
           for n, t in outputs.items()}
  return out, graph


def _check_layouts(model_fn, arrays, base, simd_layouts,
                   placement_layouts=()):
  """model_fn's outputs equal base on each layout of each backend."""
  runs = [("simd", l) for l in simd_layouts]
  runs += [("placement", l) for l in placement_layouts]
  for backend, (mesh_shape, layout) in runs:
    out, _ = _run(model_fn, arrays, mesh_shape, layout, backend)
    for n, v in base.items():
      np.testing.assert_array_equal(out[n], v, err_msg="%s %s %s %s" % (
          backend, mesh_shape, layout, n))


def _tiny_lm(vocab=V, **kwargs):
  return transformer.make_unitransformer(
      vocab_size=vocab, d_model=8, num_layers=1, num_heads=4, d_kv=4,
      d_ff=16, max_length=L, vocab_divisor=1, **kwargs)


def _prompts():
  """Prompts of 0-3 tokens (rows 0 and 4 both empty)."""
  rs = np.random.RandomState(0)
  prompts = np.zeros([B, L], np.int32)
  for b in range(B):
    prompts[b, :b % 4] = rs.randint(2, V, size=b % 4)
  return prompts


def _prefix_len(ids):
  return np.argmax(np.concatenate([ids == 0, np.ones([len(ids), 1], bool)],
                                  1), 1)


def _naive_greedy(lm, ids, stop_at_token=None):
  """The full model on the growing prefix, argmax of position i: L copies
  of the model (a reference, on one device)."""
  mesh, length = ids.mesh, ids.shape.dims[-1]
  n_prompt = decoding.prompt_length(ids)
  pos = mtf.range(mesh, length, tf.int32)
  done = mtf.greater_equal(n_prompt, length.size)
  for i in range(length.size):
    logits, _ = lm.call_simple(tl.autoregressive_inputs(ids),
                               compute_loss=False, mode="infer")
    here = mtf.one_hot(mtf.constant(mesh, i, dtype=tf.int32), length,
                       dtype=tf.int32)
    token = mtf.reduce_sum(mtf.argmax(logits, lm.output_vocab_dim) * here,
                           reduced_dim=length)
    write = mtf.logical_and(mtf.less_equal(n_prompt, i),
                            mtf.logical_not(done))
    ids = mtf.where(mtf.logical_and(write, mtf.equal(pos, i)), token, ids,
                    output_shape=ids.shape)
    if stop_at_token is not None:
      done = mtf.logical_or(done, mtf.logical_and(
          write, mtf.equal(token, stop_at_token)))
  return ids


# --- language model: cached == naive, sampling, every layout ------------------
# Odd rows decode greedily, even rows sample among the top 3: one decoding
# loop covers both on each layout (a per-row temperature; 0 adds no noise,
# so it is argmax). Every row stops after MAX_STEPS tokens.
TEMPERATURE = np.array([1.0, 0.0] * (B // 2), np.float32)
MAX_STEPS = 5


def test_lm_cached_decoding_matches_naive_and_every_layout():
  lm = _tiny_lm()
  prompts = _prompts()
  arrays = {"p": (prompts, "batch:%d;length:%d" % (B, L)),
            "t": (TEMPERATURE, "batch:%d" % B)}

  def decode(mesh, x):
    return {"mixed": lm.sample_autoregressive(
        x["p"], temperature=x["t"], sampling_keep_top_k=3,
        stop_at_token=None, max_steps=MAX_STEPS)}

  def reference(mesh, x):
    out = decode(mesh, x)
    p = x["p"]
    out["greedy"] = lm.sample_autoregressive(p, stop_at_token=STOP)
    out["greedy_nostop"] = lm.sample_autoregressive(p, stop_at_token=None)
    out["naive_nostop"] = _naive_greedy(lm, p)
    out["top1"] = lm.sample_autoregressive(p, temperature=1.0,
                                           sampling_keep_top_k=1,
                                           stop_at_token=None)
    # The full model's logits along the sampled sequences.
    out["logits"], _ = lm.call_simple(tl.autoregressive_inputs(out["mixed"]),
                                      compute_loss=False, mode="infer")
    return out
  ref, graph = _run(reference, arrays)
  # One set of weights: the first passes, the loop bodies and the naive
  # copies all read the same variables.
  assert not [v.name for v in graph.all_variables if v.name.endswith("_1")]
  n_prompt = _prefix_len(prompts)
  generated = np.arange(L)[None, :] >= n_prompt[:, None]
  for name in ("greedy", "greedy_nostop", "top1", "mixed"):
    np.testing.assert_array_equal(ref[name][~generated], prompts[~generated],
                                  err_msg=name + " kept the prompt")
  np.testing.assert_array_equal(ref["greedy_nostop"], ref["naive_nostop"])
  np.testing.assert_array_equal(ref["top1"], ref["greedy_nostop"])
  # Stopping: the greedy tokens through the first generated STOP, then 0.
  want, stops = ref["greedy_nostop"].copy(), 0
  for b in range(B):
    hits = np.where(generated[b] & (want[b] == STOP))[0]
    if len(hits):
      want[b, hits[0] + 1:] = 0
      stops += hits[0] + 1 < L
  assert stops >= 2, "STOP=%d is no longer emitted: pick another" % STOP
  np.testing.assert_array_equal(ref["greedy"], want)
  # max_steps: MAX_STEPS tokens, then padding; greedy rows are greedy.
  capped = generated & (np.arange(L)[None, :] < n_prompt[:, None] + MAX_STEPS)
  assert (ref["mixed"][generated & ~capped] == 0).all()
  greedy_rows = TEMPERATURE == 0
  np.testing.assert_array_equal(ref["mixed"][greedy_rows][capped[greedy_rows]],
                                ref["greedy_nostop"][greedy_rows][
                                    capped[greedy_rows]])
  # Sampled rows: only tokens among each position's top 3 under the full
  # model, often not the greedy ones; the same (empty) prompt in rows 0
  # and 4 gets different samples.
  sampled = capped & ~greedy_rows[:, None]
  top3 = np.argsort(-ref["logits"], -1)[..., :3]
  assert (top3 == ref["mixed"][..., None]).any(-1)[capped].all()
  assert (ref["mixed"] != ref["greedy_nostop"])[sampled].mean() > 0.2
  assert (ref["mixed"][0] != ref["mixed"][4]).any()
  # The same tokens on every layout and backend, uneven splits included
  # (vocab:16, heads:4 and d_ff over 3: padded stripes, one processor
  # without a head).
  uneven = ("a:3", "vocab:a;heads:a;d_ff:a")
  _check_layouts(decode, arrays, {"mixed": ref["mixed"]}, LAYOUTS + [uneven],
                 PLACEMENT_LAYOUTS + [uneven])


def test_sample_logits_draws_fresh_noise_per_step():
  """Uniform logits sampled in a loop with the step mixed in: every step
  draws anew (a fixed draw would repeat each row's token), uniformly."""
  n, steps = 64, 8

  def model(mesh, x):
    row, vocab = mtf.Dimension("batch", n), mtf.Dimension("vocab", V)
    step_dim = mtf.Dimension("length", steps)

    def body(i, ids):
      token = decoding.sample_logits(mtf.zeros(mesh, [row, vocab]), vocab,
                                     temperature=1.0, step=i)
      return [i + 1, mtf.where(mtf.equal(mtf.range(mesh, step_dim, tf.int32),
                                         i), token, ids,
                               output_shape=ids.shape)]
    _, ids = mtf.while_loop(
        lambda i, ids: mtf.less(i, steps), body,
        [mtf.constant(mesh, 0, dtype=tf.int32),
         mtf.zeros(mesh, [row, step_dim], dtype=tf.int32)])
    return {"ids": ids}
  ids = _run(model, {})[0]["ids"]
  assert np.mean([len(set(r)) for r in ids]) > 5      # ~6.5 of 8 distinct
  counts = np.bincount(ids.ravel(), minlength=V)
  assert counts.min() > 10 and counts.max() < 60      # 32 expected each


# --- beam search and the encoder-decoder --------------------------------------
def _penalized(ids, log_probs, alpha, eos=decoding.EOS_ID, start=None):
  """numpy: sum of log P from position start[b] (the generated part; 0 by
  default) up to and including the first EOS from there (else the whole
  row), over GNMT's ((5 + length) / 6) ** alpha of the whole length."""
  out = []
  if start is None:
    start = np.zeros(len(ids), int)
  for row, lp, s in zip(ids, log_probs, start):
    ends = np.where(row[s:] == eos)[0]
    n = s + ends[0] + 1 if len(ends) else len(row)
    out.append(sum(lp[t, row[t]] for t in range(s, n))
               / ((5.0 + n) / 6.0) ** alpha)
  return np.array(out)


def test_length_penalty_matches_numpy():
  lengths = np.arange(1, 9, dtype=np.float32)
  for alpha in (0.0, 0.6, 1.0):
    want = ((5.0 + lengths) / 6.0) ** alpha
    np.testing.assert_allclose([decoding.length_penalty(n, alpha)
                                for n in lengths], want, rtol=1e-6)

    def model(mesh, x, alpha=alpha):
      return {"p": decoding.length_penalty(x["n"], alpha)}
    out, _ = _run(model, {"n": (lengths.astype(np.int32), "length:8")})
    np.testing.assert_allclose(out["p"], want, rtol=1e-6)


def test_encdec_beam_search_and_greedy_decode():
  alpha, beam = 0.6, 4
  model_obj = _tiny_bitransformer()
  rs = np.random.RandomState(3)
  inputs = rs.randint(2, V, size=[B, L]).astype(np.int32)
  for b in range(B):
    inputs[b, L - b % 3:] = 0
  arrays = {"inputs": (inputs, "batch:%d;length:%d" % (B, L))}

  def decode(mesh, x):
    return {"beam": model_obj.decode(x["inputs"], beam_size=beam,
                                     alpha=alpha)}

  def reference(mesh, x):
    out = {"greedy": model_obj.decode(x["inputs"])}
    shared = model_obj._shared_params(mesh, None)  # pylint: disable=W0212
    enc_id = mtf.minimum(x["inputs"], 1)
    enc = model_obj.encode(x["inputs"], "infer", encoder_sequence_id=enc_id,
                           shared_params=shared)
    kwargs = dict(encoder_output=enc, encoder_sequence_id=enc_id,
                  shared_params=shared)
    zeros = mtf.zeros(mesh, "batch:%d;length:%d" % (B, L), dtype=tf.int32)
    out["greedy_nostop"] = model_obj.decoder.sample_autoregressive(
        zeros, stop_at_token=None, has_partial_sequences=False, **kwargs)
    for k, eos in ((1, -1), (beam, decoding.EOS_ID)):
      ids = mtf.zeros(mesh, "batch:%d;beam:%d;length:%d" % (B, k, L),
                      dtype=tf.int32)
      fn, states = decoding.incremental_logits_fn(
          model_obj.decoder, ids, has_partial_sequences=False, **kwargs)
      out["beams%d" % k], out["scores%d" % k] = decoding.beam_search(
          fn, ids, alpha, states, eos_id=eos)
    out["beam"] = mtf.gather(out["beams%d" % beam], 0, ids.shape.dims[1])
    for name in ("greedy", "beam"):
      logits, _ = model_obj.call_simple(
          x["inputs"], out[name], compute_loss=False, mode="infer",
          decoder_sequence_id=mtf.ones(mesh, zeros.shape, dtype=tf.int32))
      out["lp_" + name] = mtf.log_softmax(logits, logits.shape.dims[-1])
    return out
  ref, _ = _run(reference, arrays)
  greedy, best = ref["greedy"], ref["beams%d" % beam][:, 0]
  # Greedy: each token is the full model's argmax given the tokens before
  # it (the naive decoder), through the first EOS, zeros after.
  lp = ref["lp_greedy"]
  for b in range(B):
    ends = np.where(greedy[b] == decoding.EOS_ID)[0]
    n = ends[0] + 1 if len(ends) else L
    np.testing.assert_array_equal(greedy[b, :n], lp[b, :n].argmax(-1))
    assert (greedy[b, n:] == 0).all()
  # Beam size 1 without EOS is greedy decoding.
  np.testing.assert_array_equal(ref["beams1"][:, 0], ref["greedy_nostop"])
  # The best beam's score is numpy's penalised log probability, and at
  # least greedy's.
  got = _penalized(best, ref["lp_beam"], alpha)
  np.testing.assert_allclose(ref["scores%d" % beam][:, 0], got, rtol=1e-4,
                             atol=1e-4)
  assert (got >= _penalized(greedy, lp, alpha) - 1e-5).all()
  assert (np.diff(ref["scores%d" % beam], axis=1) <= 1e-6).all()
  assert (best == decoding.EOS_ID).any(1).sum() >= B // 2
  # decode(beam_size=4) returns that best beam on two layouts.
  _check_layouts(decode, arrays, {"beam": best}, [(TWO, PAPER)],
                 [(FOUR, MEM)])


def test_lm_beam_search_continues_prompts():
  """Prompted beam search of the tiny LM (EOS = STOP, which it emits; row
  3's prompt holds a forced STOP that must not end it): every beam starts
  with its prompt; the best score is numpy's (the full model's log P of
  the generated tokens over the penalty of the whole length) and at least
  greedy's; beam 1 without EOS is greedy; all-zero prompts are no
  prompts; the same tokens on a split layout of each backend."""
  alpha, beam = 0.6, 4
  lm = _tiny_lm(eos_id=STOP)
  prompts = _prompts()
  prompts[3, 1] = STOP
  n_prompt = _prefix_len(prompts)
  arrays = {"p": (prompts, "batch:%d;length:%d" % (B, L))}

  def zeros(mesh, k):
    return mtf.zeros(mesh, "batch:%d;beam:%d;length:%d" % (B, k, L),
                     dtype=tf.int32)

  def decode(mesh, x):
    return {"best": lm.beam_search(zeros(mesh, beam), None, alpha=alpha,
                                   prompts=x["p"])}

  def reference(mesh, x):
    out = decode(mesh, x)
    p = x["p"]
    for key, k, eos, prompt in (("beams", beam, STOP, p),
                                ("beams1", 1, -1, p),
                                ("noprompt", beam, STOP, None),
                                ("zeroprompt", beam, STOP, mtf.zeros_like(p))):
      ids = zeros(mesh, k)
      fn, states = decoding.incremental_logits_fn(
          lm, ids, has_partial_sequences=False)
      out[key], out[key + "_scores"] = decoding.beam_search(
          fn, ids, alpha, states, eos_id=eos, prompts=prompt)
    out["greedy"] = lm.sample_autoregressive(p, stop_at_token=STOP)
    out["greedy_nostop"] = lm.sample_autoregressive(p, stop_at_token=None)
    out["beam_method"] = mtf.gather(out["beams"], 0, mtf.Dimension("beam",
                                                                   beam))
    for name in ("greedy", "beam_method"):
      logits, _ = lm.call_simple(tl.autoregressive_inputs(out[name]),
                                 compute_loss=False, mode="infer")
      out["lp_" + name] = mtf.log_softmax(logits, lm.output_vocab_dim)
    return out
  ref, _ = _run(reference, arrays)
  beams, best = ref["beams"], ref["beams"][:, 0]
  in_prompt = np.arange(L)[None, :] < n_prompt[:, None]
  for k in range(beam):
    np.testing.assert_array_equal(beams[:, k][in_prompt], prompts[in_prompt])
  np.testing.assert_array_equal(ref["best"], best)   # the method, eos STOP
  assert best[3, 2] != 0      # the forced STOP at position 1 did not end it
  # The best beam's score: the full model's log P of the generated tokens
  # (through the first generated STOP) over the whole length's penalty.
  got = _penalized(best, ref["lp_beam_method"], alpha, STOP, n_prompt)
  np.testing.assert_allclose(ref["beams_scores"][:, 0], got, rtol=1e-4,
                             atol=1e-4)
  assert (np.diff(ref["beams_scores"], axis=1) <= 1e-6).all()
  finished = [(best[b, n_prompt[b]:] == STOP).any() for b in range(B)]
  assert sum(finished) >= B // 2, best
  greedy = _penalized(ref["greedy"], ref["lp_greedy"], alpha, STOP, n_prompt)
  assert (got >= greedy - 1e-5).all(), (got, greedy)
  np.testing.assert_array_equal(ref["beams1"][:, 0], ref["greedy_nostop"])
  for name in ("", "_scores"):
    np.testing.assert_array_equal(ref["zeroprompt" + name],
                                  ref["noprompt" + name])
  _check_layouts(decode, arrays, {"best": best}, [(TWO, PAPER)],
                 [(FOUR, MEM)])


def test_beam_search_junk_never_finishes():
  """Vocab 3 < 2 * beam: the candidates of a step include one grown from
  the -INF beam left by the forced prompt steps; ending in EOS (the likely
  token), it must not finish: -INF / penalty(3) would beat the -INF of the
  empty finished slot. The slot stays a filler: the prompt, score -INF."""
  alpha = 0.6
  logits = np.array([0.0, 5.0, 0.0], np.float32)   # EOS = 1 is likely

  def model(mesh, x):
    ids = mtf.zeros(mesh, "batch:2;beam:2;length:4", dtype=tf.int32)
    const = mtf.import_tf_tensor(mesh, tf.constant(logits), "vocab:3")

    def logits_fn(step, unused_ids, states):
      return mtf.broadcast(const, "batch:2;beam:2;vocab:3"), states
    beams, scores = decoding.beam_search(logits_fn, ids, alpha,
                                         decode_length=3, prompts=x["p"])
    return {"beams": beams, "scores": scores}
  prompts = np.array([[2, 2, 0, 0], [0, 0, 0, 0]], np.int32)
  out, _ = _run(model, {"p": (prompts, "batch:2;length:4")})
  eos_lp = logits[1] - np.log(np.exp(logits).sum())
  np.testing.assert_array_equal(out["beams"][0], [[2, 2, 1, 0], [2, 2, 0, 0]])
  np.testing.assert_allclose(out["scores"][0], [
      eos_lp / (8.0 / 6.0) ** alpha, -decoding.INF], rtol=1e-5)
  np.testing.assert_array_equal(out["beams"][1, 0], [1, 0, 0, 0])


# --- a trained LM decodes the copy task ---------------------------------------
def test_trained_lm_decodes_the_copy():
  length, n = 16, 7
  lm = transformer.make_unitransformer(
      vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_kv=8, d_ff=64,
      max_length=length, vocab_divisor=1, loss_on_targets_only=True,
      z_loss=0.0)
  train = training.TrainStep(
      transformer.loss_fn(lm), harness.make_impl("placement", "all:1", ""),
      optimize.AdamWeightDecayOptimizer(optimize.warmup_then_decay(
          3e-2, 20, "constant"), bias_correction=True),
      clip_gradient_norm=1.0)
  rs = np.random.RandomState(0)
  history = []
  for _ in range(200):
    history.append(float(train({"targets": _copy_batch(rs, 32, n)})[
        "accuracy"]))
    if len(history) >= 5 and min(history[-5:]) >= 0.98:
      break
  store = train.variable_store
  values = {v: store.full_value(v) for v in store.names()
            if not v.endswith(("/slot_m", "/slot_v")) and v != "global_step"}
  want = _copy_batch(np.random.RandomState(1), B, n)
  prompts = want.copy()
  prompts[:, n + 1:] = 0          # [s_1..s_n, EOS, 0...]: decode the copy

  def decode(mesh, x, more=False):
    out = {"ids": lm.sample_autoregressive(x["p"])}
    if more:
      out["removed"] = lm.sample_autoregressive(x["p"],
                                                remove_partial_sequences=True)
      out["never_end"] = lm.sample_autoregressive(x["p"], never_end=True)
    return out
  arrays = {"p": (prompts, "batch:%d;length:%d" % (B, length))}
  runs = {}
  for mesh_shape, layout, backend in (("all:1", "", "placement"),
                                      (TWO, PAPER, "simd")):
    restored = mtf.VariableStore()
    restored.restore_values(values)
    runs[backend], _ = _run(
        lambda mesh, x, m=mesh_shape: decode(mesh, x, more=m == "all:1"),
        arrays, mesh_shape, layout, backend, restored)
    assert not restored.unrestored_names()
    copied = runs[backend]["ids"][:, n + 1:] == want[:, n + 1:]
    assert copied.mean() >= 0.95, (len(history), runs[backend]["ids"], want)
  # remove_partial_sequences: the continuation alone, from position 0;
  # never_end: the copy, then anything but EOS.
  one = runs["placement"]
  np.testing.assert_array_equal(one["removed"][:, :n + 1],
                                one["ids"][:, n + 1:])
  assert (one["removed"][:, n + 1:] == 0).all()
  np.testing.assert_array_equal(one["never_end"][:, :-1], one["ids"][:, :-1])
  assert (one["never_end"][:, n + 1:] != decoding.EOS_ID).all()


# --- Mesh TF's greedy_decode and compute_topk_scores_and_seq ------------------
GV, GL = 8, 6    # the counting model's vocab and length


def _counting_logits_fn(mesh, on_value=10.0):
  """A hand-checkable model: the next token is (previous + 1) % GV; at
  position 0 the previous token is the row's state `start`."""
  vocab = mtf.Dimension("vocab", GV)

  def logits_fn(step, ids, states):
    start, = states
    length = ids.shape.dims[-1]
    before = mtf.one_hot(step - 1, length, dtype=tf.int32)
    prev = mtf.reduce_sum(ids * before, reduced_dim=length)
    prev = mtf.where(mtf.equal(step, 0), start, prev, output_shape=prev.shape)
    return mtf.one_hot(mtf.mod(prev + 1, GV), vocab, on_value=on_value,
                       off_value=0.0), [start]
  return logits_fn


def _greedy(starts, forced=None, on_value=10.0, **kwargs):
  """greedy_decode of the counting model -> (model_fn, arrays) for _run."""
  def model(mesh, x):
    zeros = mtf.zeros(mesh, "batch:%d;length:%d" % (len(starts), GL),
                      dtype=tf.int32)
    ids = decoding.greedy_decode(
        _counting_logits_fn(mesh, on_value), zeros,
        initial_states=[x["start"]], forced_ids=x.get("forced"), **kwargs)
    return {"ids": ids}
  arrays = {"start": (np.array(starts, np.int32), "batch:%d" % len(starts))}
  if forced is not None:
    arrays["forced"] = (np.array(forced, np.int32),
                        "batch:%d;length:%d" % (len(starts), GL))
  return model, arrays


@pytest.mark.parametrize("starts,forced,want", [
    # Row 0 reaches EOS (1) at position 3 and keeps counting until row 1 is
    # done: the length is full.
    ([5, 2], None, [[6, 7, 0, 1, 2, 3], [3, 4, 5, 6, 7, 0]]),
    # Both rows reach EOS by position 3: the loop stops, the rest stay 0.
    ([5, 6], None, [[6, 7, 0, 1, 0, 0], [7, 0, 1, 2, 0, 0]]),
    # Forced tokens replace the argmax (row 1's forced EOS at 3 included),
    # and the model continues from them.
    ([5, 2], [[0, 4, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]],
     [[6, 4, 5, 6, 7, 0], [3, 4, 5, 1, 2, 3]]),
])
def test_greedy_decode_matches_the_hand_count(starts, forced, want):
  model, arrays = _greedy(starts, forced)
  base = {"ids": np.array(want, np.int32)}
  out, _ = _run(model, arrays)
  np.testing.assert_array_equal(out["ids"], base["ids"])
  _check_layouts(model, arrays, base,
                 [("all:2", "batch:all"), ("a:2;b:2", "length:a;vocab:b")])


def test_greedy_decode_samples_with_temperature():
  """Logits 100 apart: sampling at temperature 1 is the argmax. Flat
  logits: fresh noise per position, the same tokens on every layout."""
  model, arrays = _greedy([5, 2], on_value=100.0, temperature=1.0)
  out, _ = _run(model, arrays)
  np.testing.assert_array_equal(out["ids"], [[6, 7, 0, 1, 2, 3],
                                             [3, 4, 5, 6, 7, 0]])
  starts = list(range(8))
  model, arrays = _greedy(starts, on_value=0.0, temperature=1.0, eos_id=-1)
  base, _ = _run(model, arrays)
  assert np.mean([len(set(r)) for r in base["ids"]]) > 3   # ~4.4 of 6
  _check_layouts(model, arrays, base, [("a:2;b:2", "batch:a;vocab:b")])


def test_compute_topk_scores_and_seq_matches_numpy():
  rs = np.random.RandomState(3)
  seq = rs.randint(0, 9, size=[2, 4, 3]).astype(np.int32)
  scores = rs.permutation(8).reshape(2, 4).astype(np.float32)
  gather_np = rs.randn(2, 4).astype(np.float32)
  flags = rs.rand(2, 4) > 0.5
  beam = mtf.Dimension("beam", 2)

  def model(mesh, x):
    out = decoding.compute_topk_scores_and_seq(
        x["seq"], x["scores"], x["gather"], mtf.cast(x["flags"], tf.bool),
        beam, prefix="alive")
    return dict(zip(["seq", "scores", "flags", "selector"], out))
  arrays = {"seq": (seq, "batch:2;double_beam:4;length:3"),
            "scores": (scores, "batch:2;double_beam:4"),
            "gather": (gather_np, "batch:2;double_beam:4"),
            "flags": (flags.astype(np.int32), "batch:2;double_beam:4")}
  top = np.argsort(-scores, axis=1)[:, :2]          # best first
  rows = np.arange(2)[:, None]
  want = {"seq": seq[rows, top], "scores": gather_np[rows, top],
          "flags": flags[rows, top], "selector": np.eye(4)[top]}
  out, graph = _run(model, arrays)
  for n, v in want.items():
    np.testing.assert_array_equal(out[n], v, err_msg=n)
  names = [op.name for op in graph.operations]
  assert {"alive_seq", "alive_scores", "alive_flags"} <= set(names), names
  _check_layouts(model, arrays, out, [("all:2", "double_beam:all")])


# --- errors -------------------------------------------------------------------
def test_bad_arguments_raise_clear_errors():
  lm = _tiny_lm()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.zeros(mesh, "batch:2;length:%d" % L, dtype=tf.int32)
  with pytest.raises(ValueError, match="sampling_keep_top_k"):
    lm.sample_autoregressive(ids, temperature=1.0, sampling_keep_top_k=0)
  with pytest.raises(ValueError, match="max_steps"):
    lm.sample_autoregressive(ids, max_steps=0)
  with pytest.raises(ValueError, match="int32"):
    lm.sample_autoregressive(mtf.zeros(mesh, ids.shape))
  with pytest.raises(ValueError, match="max_length"):
    lm.sample_autoregressive(mtf.zeros(mesh, "batch:2;length:%d" % (2 * L),
                                       dtype=tf.int32))
  with pytest.raises(ValueError, match="autoregressive"):
    decoding.sample_autoregressive(transformer.make_unitransformer(
        V, 8, 1, 2, 4, 16, L, autoregressive=False), ids)
  model_obj = _tiny_bitransformer()
  with pytest.raises(ValueError, match="deterministic"):
    model_obj.decode(ids, beam_size=2, temperature=0.5)
  with pytest.raises(ValueError, match="beam_size"):
    model_obj.decode(ids, beam_size=0)
  beams = mtf.zeros(mesh, "batch:2;beam:3;length:%d" % L, dtype=tf.int32)
  with pytest.raises(ValueError, match=r"prompts .*without the beam dim"):
    lm.beam_search(beams, None, prompts=beams)
  vocab = mtf.Dimension("vocab", 4)
  with pytest.raises(ValueError, match="greedy_decode: logits_fn returned"):
    decoding.greedy_decode(lambda step, ids, states: (
        mtf.one_hot(step, vocab) * mtf.ones(mesh, "batch:2"), states), ids)
  # A name reused with another shape is an error, not a silent new variable.
  mtf.get_variable(mesh, "w", "a:2")
  with pytest.raises(ValueError, match="get_variable: variable 'w' exists"):
    mtf.get_variable(mesh, "w", "a:3")
