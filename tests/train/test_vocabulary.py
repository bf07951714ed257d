"""Sentencepiece vocabularies with T5's extra ids (meshtf/train/
vocabulary.py): the id convention, saving and loading, training on a sample,
and sentencepiece's errors as one line with the fix."""
import io

import pytest
import sentencepiece as spm

from meshtf.train import errors
from meshtf.train import vocabulary

TEXT = ["the quick brown fox %d jumps over the lazy dog" % i
        for i in range(300)]


def _base_model(tmp_path, **ids):
  """A small sentencepiece model file (T5's ids unless `ids` says)."""
  options = dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  options.update(ids)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXT), model_writer=model, vocab_size=60,
      hard_vocab_limit=False, minloglevel=2, **options)
  path = tmp_path / "base.model"
  path.write_bytes(model.getvalue())
  return str(path)


def test_extra_ids_follow_t5s_convention(tmp_path):
  path = _base_model(tmp_path)
  base = spm.SentencePieceProcessor(model_file=path)
  v = vocabulary.load_vocabulary(path, extra_ids=100, pad_to_multiple=128)
  n = base.get_piece_size()
  # As T5's 32,000 + 100 = 32,100 padded to 32,128: here n + 100 -> 256.
  assert (v.base_size, v.extra_ids, v.size) == (n, 100, n + 100)
  assert v.padded_size == 256 and v.padded_size % 128 == 0
  assert v.sentinel_id(0) == v.size - 1 and v.sentinel_id(99) == n
  assert v.id_to_piece(v.sentinel_id(0)) == "\u2581<extra_id_0>"
  assert v.id_to_piece(n) == "\u2581<extra_id_99>"
  assert (v.processor.pad_id(), v.processor.eos_id(),
          v.processor.unk_id()) == (0, 1, 2)
  ids = v.encode("the lazy fox")
  assert ids == base.encode("the lazy fox")       # the base ids unchanged
  assert v.decode(ids + [vocabulary.EOS_ID, 7]) == "the lazy fox"
  # A sentinel is one id both ways; ids past size decode as unknown.
  assert v.encode("<extra_id_0>") == [v.sentinel_id(0)]
  assert "<extra_id_0>" in v.decode(ids[:1] + [v.sentinel_id(0)])
  assert v.decode([v.padded_size - 1]) == v.decode([2])
  # Saved with its sentinels: loading it again (extra_ids=0) finds them.
  v.save(str(tmp_path / "vocab.model"))
  again = vocabulary.load_vocabulary(str(tmp_path / "vocab.model"))
  assert (again.base_size, again.extra_ids, again.size) == (n, 100, n + 100)
  with pytest.raises(errors.DataError, match="already has the piece"):
    vocabulary.load_vocabulary(str(tmp_path / "vocab.model"), extra_ids=5)


def test_training_on_a_sample_and_its_errors(tmp_path):
  v = vocabulary.train_vocabulary(TEXT, 48, extra_ids=4, pad_to_multiple=8)
  assert v.size <= 48 and v.extra_ids == 4 and v.padded_size % 8 == 0
  assert v.decode(v.encode(TEXT[7])) == TEXT[7]
  # Lines over sentencepiece's length limit are cut, not an INTERNAL error.
  long_lines = [" ".join(TEXT)] * 3
  assert vocabulary.train_vocabulary(long_lines, 40).size > 10

  def one_line(fn, *args, **kwargs):
    with pytest.raises(errors.DataError) as e:
      fn(*args, **kwargs)
    assert "\n" not in str(e.value) and "INTERNAL" not in str(e.value)
    return str(e.value)
  msg = one_line(vocabulary.train_vocabulary, TEXT, 16, source="t.txt")
  assert "vocab_size 16 is too small for t.txt: its text has" in msg, msg
  assert "set --config.vocab_size=" in msg, msg
  need = int(msg.rsplit("=", 1)[1].split()[0])
  assert vocabulary.train_vocabulary(TEXT, need).size <= need  # the fix works
  msg = one_line(vocabulary.train_vocabulary, TEXT, 5000, source="t.txt")
  assert "vocab_size 5000 is far above what t.txt yields" in msg, msg
  fix = int(msg.rsplit("=", 1)[1])
  assert vocabulary.train_vocabulary(TEXT, fix).size <= fix
  msg = one_line(vocabulary.train_vocabulary, ["", " "], 40, source="e.txt")
  assert "e.txt has no text" in msg
  (tmp_path / "not.model").write_bytes(b"\x89PNG\r\n garbage")
  msg = one_line(vocabulary.load_vocabulary, str(tmp_path / "not.model"))
  assert "is not a sentencepiece model" in msg, msg
  msg = one_line(vocabulary.load_vocabulary, str(tmp_path / "none.model"))
  assert "cannot be read (No such file or directory)" in msg, msg
  default_ids = _base_model(tmp_path, pad_id=-1, unk_id=0, bos_id=1,
                            eos_id=2)
  msg = one_line(vocabulary.load_vocabulary, default_ids)
  assert "has pad, EOS and unknown ids -1, 2, 0" in msg, msg
