"""bfloat16 activations with float32 variables (VariableDType) train the
Transformer LM through TrainStep: every variable stays float32, the loss
follows the float32 run within bfloat16's precision, and layouts agree
within it on the virtual CPUs (meshes of 4 keep the test fast)."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.models import dtypes
from meshtf.models import layers
from meshtf.models import optimize
from meshtf.models import training
from meshtf.models import transformer

BF16 = dtypes.VariableDType(tf.float32, tf.float32, tf.bfloat16)
STEPS = 3


def _train(vdt, mesh_shape, layout):
  lm = transformer.make_unitransformer(
      vocab_size=32, d_model=16, num_layers=1, num_heads=4, d_kv=4, d_ff=32,
      max_length=8, vocab_divisor=8, norm_type="layer_norm")
  impl = harness.make_impl("simd", mesh_shape, layout)
  step = training.TrainStep(transformer.loss_fn(lm, variable_dtype=vdt),
                            impl, optimize.AdamWeightDecayOptimizer(
                                0.01, bias_correction=True))
  ids = np.random.RandomState(0).randint(1, 32, size=[8, 8]).astype(np.int32)
  losses = [float(step({"targets": ids})["loss"]) for _ in range(STEPS)]
  stored = {v.name: v.outputs[0].dtype for v in step.graph.all_variables
            if v.name != "global_step"}
  return losses, stored, step


def test_bf16_activations_train_with_float32_variables_on_any_layout():
  f32, _, _ = _train(None, "all:1", "")
  data, stored, step = _train(BF16, "all:4", "batch:all")
  model, _, _ = _train(BF16, "rows:2;cols:2",
                       "batch:rows;heads:cols;d_ff:cols;vocab:cols")
  # Variables (norm scales and optimizer slots too) are stored in float32;
  # the model computed in bfloat16.
  assert set(stored.values()) == {tf.float32}, stored
  assert any(t.dtype == tf.bfloat16 for op in step.graph.operations
             for t in op.outputs)
  assert data[-1] < data[0]
  # bfloat16 keeps 8 bits of mantissa: ~0.4% per rounding.
  np.testing.assert_allclose(data, f32, rtol=1e-2)
  np.testing.assert_allclose(model, data, rtol=1e-2)


@pytest.mark.parametrize("norm", [layers.rms_norm, layers.layer_norm])
def test_norms_keep_float32_statistics_and_variables(norm):
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.cast(mtf.random_normal(mesh, "batch:4;d:8"), tf.bfloat16)
  y = norm(x, mtf.Dimension("d", 8))
  assert y.dtype == tf.bfloat16
  assert {v.outputs[0].dtype for v in graph.all_variables} == {tf.float32}
  means = [op for op in graph.operations if "reduce" in type(op).__name__.
           lower() and op.outputs[0].dtype == tf.float32]
  assert means, "the statistics are computed in float32"
