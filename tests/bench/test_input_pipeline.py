"""bench/input_pipeline.py: its corpus is text of the size asked for, and a
pipeline measurement on a small one has every field. No timing is
asserted."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import input_pipeline  # noqa: E402


def test_corpus_and_a_pipeline_measurement(tmp_path):
  block = input_pipeline.make_block(str(tmp_path / "b.txt"), megabytes=0.5)
  size = os.path.getsize(block)
  assert 500000 <= size < 520000
  corpus = input_pipeline.make_corpus(block, str(tmp_path / "c.txt"), 3)
  assert os.path.getsize(corpus) == 3 * size
  with open(corpus) as f:
    first = f.readline().split()
  assert len(first) >= 5 and first[-1] == "0"
  got = input_pipeline.pipeline_rate(corpus, threads=2, batches=5,
                                     batch_size=8, length=32,
                                     vocab_size=300)
  assert got["part"] == "pipeline" and got["reader_threads"] == 2
  assert got["units"] == -(-3 * size // 65536) and got["vocab_size"] <= 300
  assert got["examples_per_s"] > 0 and got["tokens_per_s"] > 0
