"""T5 (Raffel et al. 2020) in meshtf's own Transformer: the released T5.1.0
and T5.1.1 sizes, set up to fine-tune a released checkpoint (docs/t5.md).

Both versions: an encoder-decoder whose only position signal is T5's
relative position bias (32 buckets, max distance 128, one table per stack
as released), RMS norm without bias, no dense biases, padding zeroed before
each layer as Mesh TF does, vocabulary 32,128 (32,000 sentencepiece pieces
+ 100 sentinels, padded to a multiple of 128), Adafactor with heads and
d_kv factored together as Mesh TF factors its combined variables (so
init_optimizer restores the released slots), the loss summed over the
targets and divided by batch x length (Mesh TF's default).
  T5.1.0: ReLU feed-forward, the embedding tied to the softmax with the
    d_model^-0.5 logit scale; sizes small, base, large, 3B, 11B.
  T5.1.1: gated-GELU feed-forward (wi_0, wi_1), untied logits
    (decoder/logits); sizes small, base, large, xl, xxl.
Fine-tuning settings (T5's): batch 128 x length 512, constant learning
rate 0.001, dropout 0.1; the mesh is T5's model parallelism for the size on
an 8-core slice (small 1, base 2, large / 3B / xl 8, 11B / xxl 16). A
"tiny" size of each (d_model 32, 2 + 2 layers) runs on this machine's CPUs.

Fine-tune a released checkpoint for 1,000 steps past its step:

  python -m meshtf.train --config=t2t_configs/t5.py:t5.1.1_small \\
      --config.init_checkpoint=/path/to/t5.1.1_small \\
      --config.finetune_steps=1000 --config.task.vocab_file=... \\
      --model_dir=/tmp/t5_small_ft

What a size needs on a mesh, without devices:

  python -m meshtf.train --config=t2t_configs/t5.py:t5.1.1_xxl --mode=plan \\
      --model_dir=/tmp/t5_plan
"""
from meshtf.layouts import presets
from meshtf.train import config as config_lib

# size -> (d_model, d_ff, num_heads, d_kv, num_layers per stack,
#          model parallelism): T5's released shapes.
T5_1_0 = {
    "small": (512, 2048, 8, 64, 6, 1),
    "base": (768, 3072, 12, 64, 12, 2),
    "large": (1024, 4096, 16, 64, 24, 8),
    "3B": (1024, 16384, 32, 128, 24, 8),
    "11B": (1024, 65536, 128, 128, 24, 16),
    "tiny": (32, 64, 4, 8, 2, 2),    # not released: CPU-sized, same shape
}
T5_1_1 = {
    "small": (512, 1024, 6, 64, 8, 1),
    "base": (768, 2048, 12, 64, 12, 2),
    "large": (1024, 2816, 16, 64, 24, 8),
    "xl": (2048, 5120, 32, 64, 24, 8),
    "xxl": (4096, 10240, 64, 64, 24, 16),
    "tiny": (32, 64, 4, 8, 2, 2),    # not released: CPU-sized, same shape
}
NAMES = (["t5.1.0_" + s for s in T5_1_0] + ["t5.1.1_" + s for s in T5_1_1])
CORES = 8   # a TPU v3-8's cores: data parallelism fills the rest


def get_config(arg="t5.1.1_small"):
  version, _, size = (arg or "t5.1.1_small").partition("_")
  table = {"t5.1.0": T5_1_0, "t5.1.1": T5_1_1}.get(version, {})
  if size not in table:
    raise ValueError("t5: %r is not one of %s" % (arg, ", ".join(NAMES)))
  d_model, d_ff, heads, d_kv, layers, model_parallel = table[size]
  c = config_lib.default_config()
  c.model_type = "bitransformer"
  c.vocab_size = 32128
  c.vocab_divisor = 128
  c.d_model, c.d_ff, c.num_heads, c.d_kv = d_model, d_ff, heads, d_kv
  c.num_layers, c.num_decoder_layers = layers, layers
  c.length = 512
  c.moe.num_experts = 0
  c.positional_embedding = "none"
  c.relative_attention = "bias_shared"
  c.relative_attention_num_buckets = 32
  c.relative_attention_max_distance = 128
  c.norm_type = "rms_norm"
  c.mask_padding = True
  c.loss_normalization = "batch_length"
  c.z_loss = 1e-4
  c.label_smoothing = 0.0
  if version == "t5.1.0":
    c.activation, c.gated = "relu", False
    c.shared_embedding_and_softmax_weights = True
  else:
    c.activation, c.gated = "gelu", True
    c.shared_embedding_and_softmax_weights = False
  c.dropout_rate = 0.1
  c.optimizer = "adafactor"
  c.adafactor_factor_dims_together = "heads,d_kv"
  c.learning_rate = 0.001
  c.schedule = "constant"
  c.warmup_steps = 0
  c.clip_gradient_norm = 0.0   # Adafactor clips its own updates
  c.batch_size = 128
  c.train_steps = 1000000      # with init_checkpoint, finetune_steps counts
  #                              from the checkpoint's step instead
  c.checkpoint_every = 5000
  c.keep_checkpoints = 3
  c.eval_every = 5000
  c.eval_steps = 4
  c.log_every = 100
  c.target_accuracy = 1.0
  c.stop_at_target = False
  c.task.extra_ids = 100       # T5's sentinels, after the vocab_file's
  #                              32,000 pieces (with --config.task.vocab_file)
  c.plan_hardware = "tpuv3"
  c.activation_dtype = "bfloat16"
  data = max(CORES // model_parallel, 1)
  c.mesh_shape = "data:%d;model:%d" % (data, model_parallel)
  c.layout = presets.STANDARD
  if size == "tiny":
    c.vocab_size = 128
    c.length = 32
    c.batch_size = 8
    c.train_steps = 100
    c.checkpoint_every = 50
    c.eval_every = 50
    c.log_every = 10
    c.plan_hardware = "cpu"
    c.activation_dtype = "float32"
    c.adafactor_min_dim_size_to_factor = 16
  return c
