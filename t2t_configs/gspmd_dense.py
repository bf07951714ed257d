"""GSPMD (Xu et al., 2021) section 5.1: the dense Transformer language
model with 2-D sharding on an (X, Y) mesh (Tables 2 and 3; Table 4's
pipelined rows are t2t_configs/gspmd_pipeline.py).

As the paper trained them (5.1): 32-bit parameters, 16-bit (bfloat16)
activations, Adafactor; sequences of 1024 tokens, vocabulary 32000; the
batch of each row of the tables. Table 2 ("wide"): M = d_model 8192,
H = d_ff 65536, N = heads 128, D = d_kv 256, about 2B parameters per layer
(attention + feed-forward); its 1T row is 4x wider per layer (M 16384,
H 131072, N 256). Table 3 ("narrow"): M 4096, H 16384, N 64, D 128,
64 layers, 16B parameters. The paper states no rematerialization for
these rows (remat "none").

Sharding (GSPMD Table 1, on the (X, Y) mesh). GSPMD annotates the
weights: here config.variable_layout, the weights' own rules (the layout
rules are the same, the default for everything nothing annotates); its
activation annotations are config.activation_layout, which the
Transformer's layers apply to the residual stream (BSM), the attention
projections (BSND), the feed-forward hidden (BSH) and the attention
mask. The sharding completion (meshtf/layouts/completion/) lays out the
rest, the backward pass included:

  variant     layout (weights)                   activation_layout
  finalized   d_model:x;d_ff:y;heads:y;vocab:y   batch:x;d_model:y;d_ff:y;heads:y
  attempt2    d_model:x;d_ff:y;heads:y;vocab:y   batch:x;d_ff:y;heads:y
  attempt1    d_model:x;d_ff:y;heads:y;vocab:y   (none: M on X, H and N on Y
                                                  in every tensor)

"finalized" (the default) is GSPMD's "2D finalized": M is on X in the
weights but on Y in the activations, and the batch is on X. Each layer
then allgathers BSM over Y and its weights over X, and reduces its output
BSM over Y (GSPMD Figure 7: a reduce-scatter), and every long-lived
tensor is split over all X * Y devices. `--mode=plan` reports a row's
memory, flops, collectives and step time on the paper's TPU v3 cores
without running it.

Pick a row and a variant with the config string:
  --config=t2t_configs/gspmd_dense.py:table2_64B_16x32            (finalized)
  --config=t2t_configs/gspmd_dense.py:table2_64B_16x32,attempt1
  --config=t2t_configs/gspmd_dense.py:tiny                 (8 virtual CPUs)

  row                    layers  M      H       N    D   mesh        batch
  table2_64B_8x16          32    8192   65536  128  256  (8,16)         64
  table2_64B_16x32         32    8192   65536  128  256  (16,32)       256
  table2_64B_32x64         32    8192   65536  128  256  (32,64)      1024
  table2_128B_32x64        64    8192   65536  128  256  (32,64)       512
  table2_256B_32x64       128    8192   65536  128  256  (32,64)       256
  table2_512B_32x64       256    8192   65536  128  256  (32,64)       128
  table2_1T_32x64         128   16384  131072  256  256  (32,64)       128
  table3_16B_4x16          64    4096   16384   64  128  (4,16)         48
  table3_16B_8x16 ... table3_16B_32x8: (8,16) 96, (8,32) 192, (16,4) 48,
                                       (16,8) 96, (32,8) 192

The old row names without the table prefix (64B_16x32, 16B_4x16, ...)
are the same rows. The vocabulary, 32000 = 250 * 128, splits evenly over every Y
above. The paper rows are for symbolic use (64 to 2048 devices); "tiny"
is the 2-D model and sharding scaled down to an x:2;y:4 mesh that trains
here (float32).
"""
from meshtf.train import config as config_lib

WIDE = (8192, 65536, 128, 256)
NARROW = (4096, 16384, 64, 128)
ROWS = {  # name: (layers, (M, H, N, D), mesh (X, Y), batch)
    "table2_64B_8x16": (32, WIDE, (8, 16), 64),
    "table2_64B_16x32": (32, WIDE, (16, 32), 256),
    "table2_64B_32x64": (32, WIDE, (32, 64), 1024),
    "table2_128B_32x64": (64, WIDE, (32, 64), 512),
    "table2_256B_32x64": (128, WIDE, (32, 64), 256),
    "table2_512B_32x64": (256, WIDE, (32, 64), 128),
    "table2_1T_32x64": (128, (16384, 131072, 256, 256), (32, 64), 128),
    "table3_16B_4x16": (64, NARROW, (4, 16), 48),
    "table3_16B_8x16": (64, NARROW, (8, 16), 96),
    "table3_16B_8x32": (64, NARROW, (8, 32), 192),
    "table3_16B_16x4": (64, NARROW, (16, 4), 48),
    "table3_16B_16x8": (64, NARROW, (16, 8), 96),
    "table3_16B_32x8": (64, NARROW, (32, 8), 192),
}
# The names before the rows were named after the paper's tables.
ALIASES = {name.split("_", 1)[1]: name for name in ROWS}
TINY = (2, (16, 32, 4, 4), (2, 4), 8)
WEIGHTS = "d_model:x;d_ff:y;heads:y;vocab:y"
VARIANTS = {  # name: (layout, activation_layout)
    "finalized": (WEIGHTS, "batch:x;d_model:y;d_ff:y;heads:y"),
    "attempt2": (WEIGHTS, "batch:x;d_ff:y;heads:y"),
    "attempt1": (WEIGHTS, ""),
}


def get_config(arg="table2_64B_16x32"):
  row, _, variant = (arg or "table2_64B_16x32").partition(",")
  row = ALIASES.get(row, row)
  variant = variant or "finalized"
  if (row not in ROWS and row != "tiny") or variant not in VARIANTS:
    raise ValueError(
        "gspmd_dense: %r is not ROW[,VARIANT] with ROW in %s or tiny (or "
        "an old name: %s), and VARIANT in %s" % (
            arg, ", ".join(ROWS), ", ".join(ALIASES), ", ".join(VARIANTS)))
  c = config_lib.default_config()
  c.model_type = "lm"
  c.vocab_size = 32000
  c.vocab_divisor = 128
  c.length = 1024
  c.dropout_rate = 0.0
  c.moe.num_experts = 0
  c.activation_dtype = "bfloat16"   # "16-bit floating-point activations"
  c.remat = "none"
  c.optimizer = "adafactor"
  c.plan_hardware = "tpuv3"         # --mode=plan: the paper's TPU v3 cores
  c.learning_rate = 0.01
  c.schedule = "rsqrt"
  c.warmup_steps = 10000
  c.train_steps = 100000
  c.checkpoint_every = 1000
  c.eval_every = 1000
  c.log_every = 10
  c.target_accuracy = 1.0
  c.stop_at_target = False
  layers, (m, h, n, d), (x, y), c.batch_size = ROWS.get(row, TINY)
  c.mesh_shape = "x:%d;y:%d" % (x, y)
  c.layout, c.activation_layout = VARIANTS[variant]
  c.variable_layout = c.layout      # GSPMD's weight annotations
  c.d_model, c.d_ff, c.num_heads, c.d_kv, c.num_layers = m, h, n, d, layers
  if row == "tiny":
    c.vocab_size, c.vocab_divisor, c.length = 64, 8, 8
    c.learning_rate, c.warmup_steps, c.train_steps = 0.01, 0, 40
    c.checkpoint_every, c.eval_every, c.log_every = 20, 20, 10
    c.activation_dtype = "float32"
    c.plan_hardware = "cpu"
  return c
