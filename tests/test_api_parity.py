"""Mesh TensorFlow's op, layer and optimizer names (the op-library issue's
list) exist in meshtf, so ported model code finds them. Their behaviour is
tested in the per-family test files."""
import pytest

import meshtf as mtf

OPS = """
sin cos exp log sqrt rsqrt square tanh sigmoid relu squared_relu leaky_relu
gelu elu selu swish softplus sign abs negative reciprocal pow floordiv mod
minimum maximum where add_n logical_and logical_or logical_not equal
not_equal less less_equal greater greater_equal cast to_float to_bfloat16
to_int32 identity broadcast
reduce_sum reduce_mean reduce_max reduce_min reduce_all reduce_any
reduce_logsumexp softmax log_softmax reduce_first nth_largest_element
nth_smallest_element
reshape transpose rename_dimension replace_dimensions anonymize
combined_dimension
slice mtf_slice pad concat split stack unstack shift dynamic_shift
halo_exchange pool_tensor_1d stride_tensor_1d
one_hot gather top_k top_1 argmax cumsum range mtf_range
sample_with_temperature sort
random_uniform random_normal dropout
conv1d conv2d conv3d conv2d_transpose conv3d_transpose conv2d_with_blocks
conv3d_with_blocks conv2d_transpose_with_blocks conv3d_transpose_with_blocks
max_pool2d avg_pool2d max_pool3d avg_pool3d
while_loop custom_gradient recompute_grad depend Print serialize_training_step
assign assign_add assign_sub assign_slice assign_add_slice assign_sub_slice
read_variable get_variable
einsum matmul gradients import_tf_tensor import_fully_replicated constant
zeros ones zeros_like ones_like Lowering Graph Mesh Dimension Shape
convert_to_shape convert_to_dimension convert_to_layout_rules
""".split()

LAYERS = """
dense dense_relu_dense dense_product layer_norm rms_norm batch_norm embedding
multihead_attention dot_product_attention masked_local_attention_1d
attention_mask_autoregressive attention_mask_ignore_padding
attention_mask_same_segment softmax_cross_entropy_with_logits
conv1d conv2d conv3d conv2d_transpose conv3d_transpose conv2d_with_blocks
conv3d_with_blocks conv2d_transpose_with_blocks conv3d_transpose_with_blocks
""".split()

OPTIMIZERS = """
SgdOptimizer MomentumOptimizer AdamWeightDecayOptimizer AdafactorOptimizer
clip_by_global_norm get_global_step make_optimizer
""".split()


@pytest.mark.parametrize("where,names", [(mtf, OPS), (mtf.layers, LAYERS),
                                         (mtf.optimize, OPTIMIZERS)],
                         ids=["ops", "layers", "optimize"])
def test_mesh_tensorflow_names_exist(where, names):
  missing = [n for n in names if not callable(getattr(where, n, None))]
  assert not missing, "missing from %s: %s" % (where.__name__, missing)
