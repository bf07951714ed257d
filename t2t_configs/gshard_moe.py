"""GShard (Lepikhin et al., 2020) Table 1: the MoE Transformer family for
massively multilingual translation, MoE(E experts, L layers).

Shared by all rows (appendix A.2): d_model 1024, feed-forward and expert
hidden size 8192, 16 heads, d_k = d_v = 128, dropout 0.1; every other
feed-forward layer (encoder and decoder) is a top-2 MoE layer with E
experts; L counts encoder + decoder layers (12 = 6 + 6). Training uses as
many cores as experts, one expert per core (section 3): a 1-D mesh where
the batch, the routing groups and the experts all split over the cores,
so dispatch and combine are alltoalls (Algorithm 2):

  mesh_shape = cores:E
  layout     = batch:cores;group:cores;experts:cores

Pick a row with the config string (default the largest 36-layer one):
  --config=t2t_configs/gshard_moe.py:table1_2048E_36L

  row               experts/layer  layers  weights  batch (tokens)
  table1_2048E_36L      2048          36     600B       4M
  table1_2048E_12L      2048          12     200B       4M
  table1_512E_36L        512          36     150B       1M
  table1_512E_12L        512          12      50B       1M
  table1_128E_36L        128          36      37B       1M
  table1_128E_12L        128          12    12.5B       1M
  table1_2048E_60L      2048          60       1T       4M

(the old names without "table1_" are the same rows). As the paper trained
them (4.3, 5.1): float32 weights and activations -- bfloat16 activations
for the 60-layer 1T model -- and rematerialization for the 36- and
60-layer models, which do not fit 16 GB without it ("28% and 34% of the
total cycles are spent on recomputation for 36L and 60L models
respectively, and 0% for 12L and 24L"): remat "full", each layer
recomputed from its input.

Expert capacity is GShard's 2S/E per group (section 3.1: "C needs to be
at least 1"): 16 slots at 128 experts, 4 at 512, 1 at 2048 (meshtf's
default floor of 4 slots would double the 2048-expert layers' expert
flops and grow their dispatch tensors 4x).

GSPMD's Table 6 MoE language model is t2t_configs/gspmd_moe.py.

Assumptions (not in the papers): sequences of 1024 tokens (the batch in
sequences is tokens / 1024), one shared 64k vocabulary (the paper has 64k
source and 32k target pieces), routing groups of at most 1024 tokens. The
auxiliary-loss coefficient is 0.01 in Lingvo's scaling (E**2 times ours).
Adafactor with factored second moments, beta1 = 0, update clipping 1.0 and
rsqrt decay after 10k steps, as in appendix A.2. Symbolic use only.
"""
from meshtf.layouts import presets
from meshtf.train import config as config_lib

ROWS = {  # name: (experts per layer, enc+dec layers, batch tokens)
    "table1_2048E_36L": (2048, 36, 4 << 20),
    "table1_2048E_12L": (2048, 12, 4 << 20),
    "table1_512E_36L": (512, 36, 1 << 20),
    "table1_512E_12L": (512, 12, 1 << 20),
    "table1_128E_36L": (128, 36, 1 << 20),
    "table1_128E_12L": (128, 12, 1 << 20),
    "table1_2048E_60L": (2048, 60, 4 << 20),
}
# The names before the rows were named after the paper's tables.
ALIASES = {name[len("table1_"):]: name for name in ROWS}
PAPER_WEIGHTS = {"2048E_36L": 600e9, "2048E_12L": 200e9, "512E_36L": 150e9,
                 "512E_12L": 50e9, "128E_36L": 37e9, "128E_12L": 12.5e9,
                 "2048E_60L": 1e12}
PAPER_WEIGHTS.update({ALIASES[k]: v for k, v in list(PAPER_WEIGHTS.items())})
LENGTH = 1024


def get_config(row="table1_2048E_36L"):
  row = ALIASES.get(row or "table1_2048E_36L", row or "table1_2048E_36L")
  if row not in ROWS:
    raise ValueError("gshard_moe: row %r is not one of %s (or an old "
                     "name: %s)" % (row, ", ".join(ROWS), ", ".join(ALIASES)))
  c = config_lib.default_config()
  c.vocab_size = 64000
  c.vocab_divisor = 128
  c.d_model = 1024
  c.num_heads = 16
  c.d_kv = 128
  c.d_ff = 8192
  c.dropout_rate = 0.1
  c.length = LENGTH
  experts, layers, tokens = ROWS[row]
  c.model_type = "bitransformer"
  c.num_layers = layers // 2
  c.num_decoder_layers = layers // 2
  c.batch_size = tokens // LENGTH
  # "We use float32 for both model weights and activations"; the 1T
  # model's activations were bfloat16.
  c.activation_dtype = "bfloat16" if layers == 60 else "float32"
  c.remat = "full" if layers >= 36 else "none"
  c.moe.num_experts = experts
  c.moe.layers = "odd"
  c.moe.hidden_size = 8192
  c.moe.group_size = 1024
  c.moe.gating = "top_2"
  c.moe.capacity_factor_train = 1.0   # 2N / (G E) per group (k = 2)
  c.moe.capacity_factor_eval = 2.0
  # GShard 3.1: C = 2S/E, "at least 1" -- 1 slot per expert and group at
  # 2048 experts (S = 1024), not meshtf's default floor of 4.
  c.moe.min_expert_capacity = 1
  c.moe.loss_coef = 0.01 * experts ** 2
  c.mesh_shape = "cores:%d" % experts
  c.layout = presets.expert_parallel("cores")
  c.optimizer = "adafactor"
  c.plan_hardware = "tpuv3"         # --mode=plan: the paper's TPU v3 cores
  c.learning_rate = 0.01              # 1 / sqrt(max(step, 10k))
  c.schedule = "rsqrt"
  c.warmup_steps = 10000
  c.train_steps = 1000000000000 // tokens   # 1 trillion tokens
  c.checkpoint_every = 5000
  c.eval_every = 5000
  c.log_every = 100
  c.target_accuracy = 1.0
  c.stop_at_target = False
  return c
