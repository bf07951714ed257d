"""Mesh-TensorFlow (Shazeer et al., 2018) Table 2: Transformer-decoder
language models on the Billion-Word benchmark, d_model = 1024,
d_k = d_v = 256, on a 16x32 TPUv2 mesh (512 cores) with the paper's
data + model parallel layout:

  mesh_shape = rows:16;cols:32
  layout     = batch:rows;vocab:cols;d_ff:cols;heads:cols

"Batch size for all models was 256 sequences of 256 tokens each ... The
batch was split along the mesh dimension of size 16 and the model
dimensions were split along the mesh dimension of size 32."

Pick a row with the config string (default the largest):
  --config=t2t_configs/mtf_lm_table2.py:4.9B

  row     d_ff     heads   parameters (paper)
  0.14B     4096       4   0.14B   (perplexity 35.0)
  0.22B     8192       8
  0.37B    16384      16
  0.67B    32768      32
  1.28B    65536      64
  2.48B   131072     128
  4.9B    262144     256   4.9B    (perplexity 24.0)

The table's body is missing from our copy of the paper; the rows are
reconstructed from its caption, its text (d_ff up to 262144 and up to 256
heads; 0.14B -> 4.9B parameters) and the parameter counts, which this
family matches with 6 layers, d_ff = 1024 * heads and a 32k vocabulary
(the test checks the endpoints). Rows with fewer than 32 heads cannot split
heads over the 32 columns; their layout leaves attention replicated over
cols (d_ff and vocab stay model parallel).

These configs are for building (and checking the layout of) the paper's
graphs symbolically; running them needs 512 devices.
"""
from meshtf.train import config as config_lib

ROWS = {  # name: (d_ff, heads)
    "0.14B": (4096, 4), "0.22B": (8192, 8), "0.37B": (16384, 16),
    "0.67B": (32768, 32), "1.28B": (65536, 64), "2.48B": (131072, 128),
    "4.9B": (262144, 256),
}
PAPER_PARAMETERS = {"0.14B": 0.14e9, "4.9B": 4.9e9}


def get_config(row="4.9B"):
  row = row or "4.9B"
  if row not in ROWS:
    raise ValueError("mtf_lm_table2: row %r is not one of %s" % (
        row, ", ".join(ROWS)))
  d_ff, heads = ROWS[row]
  c = config_lib.default_config()
  c.model_type = "lm"
  c.vocab_size = 32768
  c.vocab_divisor = 128
  c.d_model = 1024
  c.num_layers = 6
  c.num_heads = heads
  c.d_kv = 256
  c.d_ff = d_ff
  c.length = 256
  c.batch_size = 256
  c.dropout_rate = 0.0
  c.moe.num_experts = 0
  c.mesh_shape = "rows:16;cols:32"
  c.layout = "batch:rows;vocab:cols;d_ff:cols" + (
      ";heads:cols" if heads % 32 == 0 else "")
  c.optimizer = "adafactor"
  c.plan_hardware = "tpuv2"         # --mode=plan: the paper's TPU v2 cores
  c.learning_rate = 0.01
  c.schedule = "rsqrt"
  c.warmup_steps = 10000
  c.train_steps = 10 * 800000000 // (256 * 256)  # ~10 epochs of ~0.8B tokens
  c.checkpoint_every = 5000
  c.eval_every = 5000
  c.log_every = 100
  c.target_accuracy = 1.0
  c.stop_at_target = False
  return c
