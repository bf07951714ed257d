"""GSPMD (Xu et al., 2021) section 5.4, Table 6: the sparse MoE
Transformer language model, one expert per device: a 1-D mesh splits the
experts of the MoE layers and the batch of every other layer (data
parallelism), so dispatch and combine are alltoalls (Figure 8a).

  mesh_shape = cores:E
  layout     = batch:cores;group:cores;experts:cores

  row          experts  devices  batch (x 1024 tokens)  step    peak
  10B_32E         32       32        128                0.98 s  10.8 GB
  37B_128E       128      128        512                1.01 s  11.2 GB
  145B_512E      512      512       2048                1.10 s  11.2 GB
  577B_2048E    2048     2048       8192                1.51 s  11.6 GB
  (AllToAll time: 2%, 6%, 9%, 11% of the step; FLOPS utilization 58.2%,
  49.8%, 49.8%, 46.8%.)

The paper gives no model dimensions. They are reconstructed from its
parameter counts, which are in units of 2^30 (its dense 64B model is
32 x 2.15e9 = 68.7e9 = 64.0 x 2^30): the counts grow by exactly
0.28125 x 2^30 per expert (37 - 10, 145 - 37, 577 - 145 over 96, 384 and
1536 experts), which is 16 MoE layers of M x H = 1536 x 6144
(2 M H x 16 = 0.28125 x 2^30); with 32 layers (MoE every other one, as
GShard's), attention N x D = M and a 32000 vocabulary the totals are
9.7, 36.7, 144.3 and 576.5 x 2^30 (the paper's 10, 37, 145, 577). As a
check, not a fit: top-2 routing with sequences of 1024 tokens then does
8.4e9 flops per token, 57% of peak at the 32-expert row's 0.98 s (the
paper: 58.2%). Top-2 gating with capacity 2S/E per group of S = 1024
tokens (GShard's; capacity 1 at 2,048 experts), 16-bit activations and
Adafactor, as GSPMD's dense models.

The paper states no rematerialization policy for these rows; its
compiler's rematerialization "will automatically recompute part of the
activations" (GShard 5.1). Planned without any (remat "none") they do not
fit 16 GB: 18.3 GB per core at 32 experts, 20.1 GB at 2,048 -- each
layer's attention probabilities (3.2 GB), the MoE layers'
dispatch and combine tensors and expert activations, the bfloat16 copies
of the weights the backward pass reads. These rows keep the outputs of
the einsums that contract an activation with a weight and recompute the
rest -- attention's scores and context, MoE dispatch and combine, the
elementwise ops, norms and softmaxes (remat "weight_einsum_outputs", the
rule of JAX's dots_with_no_batch_dims_saveable; meshtf/models/remat.py):
9.8 GB at 32 experts, 10.5 GB at 2,048 (0.88-0.91x the paper's peaks) for
3.5% more flops. Those flops are 1.049x what the paper's FLOPS
utilization implies at 32 experts (the profiler's count, which includes
recomputation, GSPMD 5.2; the model's without recomputation: 1.012x);
over the four rows, whose work per device is nearly the same, the model's
flops are 0.85-1.15x the implied ones, so the utilization does not pin
the policy down. Keeping every einsum's output (remat "einsum_outputs", +0.1%
flops) plans 13.8-14.6 GB (1.24-1.28x); recomputing each layer from its
input (remat "full", as GShard does for its 36- and 60-layer models)
8.1-8.5 GB for 26% more flops (bench/results/
cpu2_paper_memory_2026-11-27.jsonl, one run of bench/paper_memory.py).

Symbolic use only (32 to 2,048 devices): --mode=plan.
"""
from meshtf.layouts import presets
from meshtf.train import config as config_lib

ROWS = {"10B_32E": 32, "37B_128E": 128, "145B_512E": 512, "577B_2048E": 2048}
PAPER = {  # name: (parameters x 2^30, step s, peak GB, alltoall share,
  #                 FLOPS utilization), GSPMD Table 6
    "10B_32E": (10, 0.98, 10.8, 0.02, 0.582),
    "37B_128E": (37, 1.01, 11.2, 0.06, 0.498),
    "145B_512E": (145, 1.10, 11.2, 0.09, 0.498),
    "577B_2048E": (577, 1.51, 11.6, 0.11, 0.468),
}


def get_config(row="577B_2048E"):
  row = row or "577B_2048E"
  if row not in ROWS:
    raise ValueError("gspmd_moe: row %r is not one of %s" % (
        row, ", ".join(ROWS)))
  experts = ROWS[row]
  c = config_lib.default_config()
  c.model_type = "lm"
  c.vocab_size = 32000
  c.vocab_divisor = 128
  c.d_model = 1536
  c.d_ff = 6144
  c.num_heads = 12
  c.d_kv = 128
  c.num_layers = 32
  c.length = 1024
  c.batch_size = 4 * experts
  c.dropout_rate = 0.0
  c.activation_dtype = "bfloat16"
  c.remat = "weight_einsum_outputs"   # see the docstring
  c.moe.num_experts = experts
  c.moe.layers = "odd"
  c.moe.hidden_size = 6144
  c.moe.group_size = 1024
  c.moe.gating = "top_2"
  c.moe.capacity_factor_train = 1.0   # 2S / E per group (k = 2)
  c.moe.capacity_factor_eval = 2.0
  c.moe.min_expert_capacity = 1
  c.moe.loss_coef = 0.01 * experts ** 2
  c.mesh_shape = "cores:%d" % experts
  c.layout = presets.expert_parallel("cores")
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
