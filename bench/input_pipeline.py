r"""The streaming input pipeline (meshtf/train/streams.py) at corpus scale.

1. The pipeline alone: examples/s and tokens/s of packed LM batches (batch
   64 x length 128, the binary's prefetch on) with 1, 2 and 4 reader
   threads, over the bench's corpus (the 170 MB size).
2. The input work alone (a fresh process per corpus, no model): the data
   checks, the streams and the vocabulary trained on its bounded sample,
   the first batch; its peak RSS.
3. Through the binary: `python -m meshtf.train` (t2t_configs/lm_tiny.py,
   an 8,000-piece vocabulary, length 128, the corpus as
   --config.task.data_files) on corpora of 17 MB, 170 MB and 1.7 GB: the
   time from the process's start to its first step's metrics line, its
   peak RSS (VmHWM, polled) and the step's token rate (the last
   metrics.jsonl record's tokens_per_sec) -- which the pipeline's rate is
   measured against.

The corpus is made here, never downloaded: a 17 MB block of synthetic text
(lines of 4-120 words drawn Zipf-like from 30,000 made-up words, numbered)
written 1, 10 and 100 times; it is deleted afterwards. Check the disk first
(`df -h /tmp`): the largest run needs 1.7 GB there.

  python bench/input_pipeline.py                          # everything
  python bench/input_pipeline.py --sizes_mb=17 --threads=1,2 --steps=10
  python bench/input_pipeline.py --skip_binary --batches=100

One JSON object per measurement ({"bench": "input_pipeline", "part":
"pipeline" | "input" | "binary", ...}).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLOCK_MB = 17


def make_block(path, megabytes=BLOCK_MB, seed=0):
  """A block of synthetic text of about `megabytes` MB at path."""
  import numpy as np
  rng = np.random.default_rng(seed)
  letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
  lengths = rng.integers(2, 10, 30000)
  words = ["".join(rng.choice(letters, n)) for n in lengths]
  target = int(megabytes * 1e6)
  # About one word per 6.5 bytes; the ranks are reused when they run out.
  ranks = np.minimum(rng.zipf(1.2, max(target // 4, 1000)), len(words)) - 1
  written, line, at = 0, 0, 0
  with open(path, "w") as f:
    while written < target:
      n = int(rng.integers(4, 121))
      if at + n > len(ranks):
        at = 0
      text = " ".join(words[i] for i in ranks[at:at + n]) + " %d\n" % line
      at += n
      line += 1
      f.write(text)
      written += len(text)
  return path


def make_corpus(block, path, copies):
  with open(block, "rb") as src:
    data = src.read()
  with open(path, "wb") as f:
    for _ in range(copies):
      f.write(data)
  return path


# --- 1. the pipeline alone ------------------------------------------------------
def pipeline_rate(corpus, threads, batches, batch_size=64, length=128,
                  vocab_size=8000):
  """Examples/s and tokens/s of `batches` packed batches after the first
  (the vocabulary trained on its bounded sample first, not timed)."""
  sys.path.insert(0, ROOT)
  from meshtf.train import objectives
  from meshtf.train import sources
  from meshtf.train import streams
  from meshtf.train import text_data
  from meshtf.train import vocabulary
  spec = sources.ReadSpec("text")
  units = sources.make_units([corpus], "text", sources.unit_bytes(length))
  t0 = time.time()
  vocab = vocabulary.train_vocabulary(
      text_data.sample_texts(units, spec, 4 << 20), vocab_size)
  vocab_s = time.time() - t0
  obj = objectives.Objective("lm", length, decoder_only=True)
  stream = streams.Stream(units, spec, obj, batch_size, 0, vocab,
                          reader_threads=threads)
  t0 = time.time()
  stream.batch(0)
  first_s = time.time() - t0
  examples = tokens = 0
  t0 = time.time()
  for step in range(1, batches + 1):
    b = stream.batch(step)
    examples += int(b["targets_segmentation"].max(axis=1).sum())
    tokens += int((b["targets"] > 0).sum())
  seconds = time.time() - t0
  stream.close()
  return {"bench": "input_pipeline", "part": "pipeline",
          "reader_threads": threads, "batches": batches,
          "batch_size": batch_size, "length": length,
          "vocab_size": vocab.size, "corpus_mb": round(
              os.path.getsize(corpus) / 1e6, 1), "units": len(units),
          "vocab_train_s": round(vocab_s, 2),
          "first_batch_s": round(first_s, 3),
          "examples_per_s": round(examples / seconds, 1),
          "tokens_per_s": round(tokens / seconds, 1),
          "host": platform.node(), "cpus": os.cpu_count()}


# --- 2. the input work before the first step ---------------------------------
def input_work(corpus):
  """In a fresh process: the binary's data checks (config.validate), the
  streams and the vocabulary (make_text_data: the sample read and trained
  on) and the first batch, timed; the process's peak RSS (no TensorFlow
  model, so the input's own memory)."""
  code = (
      "import json, os, resource, sys, time\n"
      "sys.path.insert(0, %r)\n"
      "from meshtf.train import config as config_lib, text_data\n"
      "c = config_lib.load_file(%r)\n"
      "c.task.data_files = %r\n"
      "c.vocab_size, c.length = 8000, 128\n"
      "t0 = time.time(); config_lib.validate(c, check_layout=False)\n"
      "t1 = time.time(); text = text_data.make_text_data(c, %r)\n"
      "t2 = time.time(); text.train.batch(0); t3 = time.time()\n"
      "print(json.dumps({'validate_s': t1 - t0, 'streams_and_vocab_s': "
      "t2 - t1, 'first_batch_s': t3 - t2, 'peak_rss_gb': resource."
      "getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}))\n") % (
          ROOT, os.path.join(ROOT, "t2t_configs", "lm_tiny.py"), corpus,
          os.path.join(os.path.dirname(corpus), "unused_model_dir"))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout
  got = json.loads(out.strip().splitlines()[-1])
  return dict({k: round(v, 3) for k, v in got.items()},
              bench="input_pipeline", part="input",
              corpus_mb=round(os.path.getsize(corpus) / 1e6, 1),
              host=platform.node(), cpus=os.cpu_count())


# --- 3. through the binary ------------------------------------------------------
def binary_run(corpus, steps, work):
  """Time to the first step's metrics line, peak RSS, the step's token
  rate: `python -m meshtf.train` in a fresh process on `corpus`."""
  model_dir = os.path.join(work, "model")
  shutil.rmtree(model_dir, ignore_errors=True)
  cmd = [sys.executable, "-m", "meshtf.train",
         "--config=" + os.path.join(ROOT, "t2t_configs", "lm_tiny.py"),
         "--model_dir=" + model_dir,
         "--config.task.data_files=" + corpus,
         "--config.vocab_size=8000", "--config.length=128",
         "--config.eval_every=0", "--config.eval_steps=1",
         "--config.stop_at_target=False", "--config.log_every=1000",
         "--train_steps=%d" % steps]
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get(
      "PYTHONPATH", ""))
  metrics = os.path.join(model_dir, "metrics.jsonl")
  t0 = time.time()
  proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  first_step_s, peak_kb = None, 0
  while proc.poll() is None:
    peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
    if first_step_s is None and os.path.exists(metrics) and \
        os.path.getsize(metrics) > 0:
      first_step_s = time.time() - t0
    time.sleep(0.1)
  wall = time.time() - t0
  out, err = proc.communicate()
  if proc.returncode:
    raise RuntimeError("the binary failed: %s" % err[-2000:])
  with open(metrics) as f:
    records = [json.loads(line) for line in f]
  rates = [r["tokens_per_sec"] for r in records if r["tokens_per_sec"]]
  shutil.rmtree(model_dir, ignore_errors=True)
  return {"bench": "input_pipeline", "part": "binary",
          "corpus_mb": round(os.path.getsize(corpus) / 1e6, 1),
          "steps": steps, "wall_s": round(wall, 1),
          "first_step_s": round(first_step_s, 1) if first_step_s else None,
          "peak_rss_gb": round(peak_kb / 1e6, 3),
          "step_tokens_per_s": round(rates[-1], 1) if rates else None,
          "config": "lm_tiny, vocab 8000, length 128, batch 64",
          "host": platform.node(), "cpus": os.cpu_count()}


def _vm_hwm_kb(pid):
  try:
    with open("/proc/%d/status" % pid) as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes_mb", default="17,170,1700",
                      help="corpus sizes through the binary (multiples of "
                      "%d MB)" % BLOCK_MB)
  parser.add_argument("--threads", default="1,2,4")
  parser.add_argument("--batches", type=int, default=300)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--skip_binary", action="store_true")
  parser.add_argument("--skip_pipeline", action="store_true")
  parser.add_argument("--work", default=None,
                      help="where the corpus is written (default: a new "
                      "folder in the temp dir; deleted afterwards)")
  args = parser.parse_args(argv)
  work = args.work or tempfile.mkdtemp(prefix="meshtf-input-bench-")
  os.makedirs(work, exist_ok=True)
  try:
    block = make_block(os.path.join(work, "block.txt"))
    if not args.skip_pipeline:
      corpus = make_corpus(block, os.path.join(work, "corpus_170.txt"), 10)
      for threads in [int(t) for t in args.threads.split(",")]:
        print(json.dumps(pipeline_rate(corpus, threads, args.batches),
                         sort_keys=True), flush=True)
      os.remove(corpus)
    if not args.skip_binary:
      for mb in [int(m) for m in args.sizes_mb.split(",")]:
        copies = max(1, round(mb / BLOCK_MB))
        corpus = make_corpus(block, os.path.join(work, "corpus_%d.txt" % mb),
                             copies)
        print(json.dumps(input_work(corpus), sort_keys=True), flush=True)
        print(json.dumps(binary_run(corpus, args.steps, work),
                         sort_keys=True), flush=True)
        os.remove(corpus)
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
