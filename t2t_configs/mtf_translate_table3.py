"""Mesh-TensorFlow (Shazeer et al., 2018) Table 3: Transformer machine
translation (WMT14 En-De / En-Fr), d_model = 1024, d_k = d_v = 128, with the
paper's data + model parallel layout on a 16x32 mesh:

  mesh_shape = rows:16;cols:32
  layout     = batch:rows;vocab:cols;d_ff:cols;heads:cols

Pick a row with the config string (default the largest):
  --config=t2t_configs/mtf_translate_table3.py:2.89B

  row     d_ff    heads  parameters  EN-DE  EN-FR BLEU
  0.15B    2048       4     0.15B    25.5   41.8
  0.24B    4096       8     0.24B    26.5   42.5
  0.42B    8192      16     0.42B    27.1   43.3
  0.77B   16384      32     0.77B    27.5   43.5
  1.48B   32768      64     1.48B    27.5   43.8
  2.89B   65536     128     2.89B    26.7   43.9

The parameter counts match 6 encoder + 6 decoder layers and a shared 32k
vocabulary with separate softmax weights (the test checks every row within
5%). The paper gives no batch size or length for translation; we use the
language models' 256 x 256. Rows with fewer than 32 heads leave attention
replicated over cols (heads cannot split 32 ways). Symbolic use only (512
devices).
"""
from meshtf.train import config as config_lib

ROWS = {  # name: (d_ff, heads)
    "0.15B": (2048, 4), "0.24B": (4096, 8), "0.42B": (8192, 16),
    "0.77B": (16384, 32), "1.48B": (32768, 64), "2.89B": (65536, 128),
}
PAPER_PARAMETERS = {k: float(k[:-1]) * 1e9 for k in ROWS}


def get_config(row="2.89B"):
  row = row or "2.89B"
  if row not in ROWS:
    raise ValueError("mtf_translate_table3: row %r is not one of %s" % (
        row, ", ".join(ROWS)))
  d_ff, heads = ROWS[row]
  c = config_lib.default_config()
  c.model_type = "bitransformer"
  c.vocab_size = 32768
  c.vocab_divisor = 128
  c.d_model = 1024
  c.num_layers = 6
  c.num_heads = heads
  c.d_kv = 128
  c.d_ff = d_ff
  c.length = 256
  c.batch_size = 256
  c.dropout_rate = 0.1
  c.moe.num_experts = 0
  c.mesh_shape = "rows:16;cols:32"
  c.layout = "batch:rows;vocab:cols;d_ff:cols" + (
      ";heads:cols" if heads % 32 == 0 else "")
  c.optimizer = "adafactor"
  c.plan_hardware = "tpuv2"         # --mode=plan: the paper's TPU v2 cores
  c.learning_rate = 0.01
  c.schedule = "rsqrt"
  c.warmup_steps = 10000
  c.train_steps = 250000
  c.checkpoint_every = 5000
  c.eval_every = 5000
  c.log_every = 100
  c.target_accuracy = 1.0
  c.stop_at_target = False
  return c
