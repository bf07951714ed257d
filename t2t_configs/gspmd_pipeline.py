"""GSPMD (Xu et al., 2021) section 5.2, Table 4: the narrow dense
Transformer of Table 3 (M 4096, H 16384, N 64, D 128, 64 layers, 16B
parameters) pipelined over a 3-D mesh (L, X, Y): L shards the pipeline
stages, X the batch (data parallelism), Y the model dims as in 2D
sharding -- except that the weights are not sharded along X (each
microbatch would allgather them).

  mesh_shape        = l:L;x:X;y:Y
  layout            = stage:l;batch:x;d_ff:y;heads:y;vocab:y
  activation_layout = stage:l;batch:x;d_model:y;d_ff:y;heads:y

The batch is num_microbatches x microbatch_size sequences of 1024 tokens.
Rows are named mesh_batch; the paper's step time and peak memory as read
from our copy of Table 4 (its cells are scrambled in the text; the
columns are matched by their bubble fractions, (L-1)/(M+L-1): 4 stages
x 16 microbatches 15.8%, measured 16.1%; 4 x 32: 8.6% / 8.0%;
2 x 16: 5.9% / 5.6%; 8 x 32: 17.9% / 14.8% and 16.5%, the two 8-stage
columns told apart by their peak memory: (8,16,2) holds twice the
weights per device of (8,8,4)):

  row             mesh (L,X,Y)  stages  batch    step     peak
  4x16x4_16x64    (4,16,4)      4       16 x 64  23.7 s   11.5 GB
  4x16x4_32x32    (4,16,4)      4       32 x 32  22.2 s   13.1 GB
  8x8x4_32x32     (8,8,4)       8       32 x 32  22.3 s   13.3 GB
  8x16x2_32x32    (8,16,2)      8       32 x 32  23.4 s   15.0 GB
  2x16x8_16x64    (2,16,8)      2       16 x 64  24.0 s   14.9 GB

The paper recomputes the forward pass in the backward (GPipe) and keeps
16-bit activations; this config keeps the model's defaults for both
(the plan prices what the graph does). Symbolic use only (256 devices).
"""
from meshtf.train import config as config_lib

ROWS = {  # name: ((L, X, Y), num_microbatches, microbatch_size)
    "4x16x4_16x64": ((4, 16, 4), 16, 64),
    "4x16x4_32x32": ((4, 16, 4), 32, 32),
    "8x8x4_32x32": ((8, 8, 4), 32, 32),
    "8x16x2_32x32": ((8, 16, 2), 32, 32),
    "2x16x8_16x64": ((2, 16, 8), 16, 64),
}
PAPER = {  # name: (step seconds, peak GB per device), GSPMD Table 4
    "4x16x4_16x64": (23.7, 11.5), "4x16x4_32x32": (22.2, 13.1),
    "8x8x4_32x32": (22.3, 13.3), "8x16x2_32x32": (23.4, 15.0),
    "2x16x8_16x64": (24.0, 14.9),
}


def get_config(row="4x16x4_32x32"):
  row = row or "4x16x4_32x32"
  if row not in ROWS:
    raise ValueError("gspmd_pipeline: row %r is not one of %s" % (
        row, ", ".join(ROWS)))
  (l, x, y), microbatches, microbatch = ROWS[row]
  c = config_lib.default_config()
  c.model_type = "lm"
  c.vocab_size = 32000
  c.vocab_divisor = 128
  c.d_model, c.d_ff, c.num_heads, c.d_kv = 4096, 16384, 64, 128
  c.num_layers = 64
  c.length = 1024
  c.batch_size = microbatches * microbatch
  c.pipeline_stages = l
  c.num_microbatches = microbatches
  c.dropout_rate = 0.0
  c.moe.num_experts = 0
  c.mesh_shape = "l:%d;x:%d;y:%d" % (l, x, y)
  c.layout = "stage:l;batch:x;d_ff:y;heads:y;vocab:y"
  c.activation_layout = "stage:l;batch:x;d_model:y;d_ff:y;heads:y"
  c.optimizer = "adafactor"
  c.plan_hardware = "tpuv3"
  c.learning_rate = 0.01
  c.schedule = "rsqrt"
  c.warmup_steps = 10000
  c.train_steps = 100000
  c.checkpoint_every = 1000
  c.eval_every = 1000
  c.log_every = 10
  c.target_accuracy = 1.0
  c.stop_at_target = False
  return c
