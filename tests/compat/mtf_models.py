r"""The literal port (way 2): Mesh TensorFlow 0.1.21's own Unitransformer,
LayerStack, SelfAttention, DenseReluDense and MoE1D (its transformer/*.py)
and its own SgdOptimizer (optimize.py), loaded from the installed
`mesh-tensorflow` package on top of meshtf's core by
meshtf.compat.install(library=True), trained 3 steps on 8 virtual CPUs
under several layouts. Prints one JSON line per (model, layout) with the
losses.

Run as a script (its own process: the alias changes sys.modules):
  python tests/compat/mtf_models.py
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
BATCH, LENGTH, VOCAB, STEPS = 8, 16, 32, 3
# (name, mesh_shape, layout). Mesh TF's MoE1D picks its group count from
# the mesh axis that splits the batch, so MoE numbers agree between layouts
# that split the batch alike (as in Mesh TF itself).
LAYOUTS = {
    "dense": [("one_device", "all:1", ""),
              ("data", "data:8", "batch:data"),
              ("data_model", "data:2;model:4",
               "batch:data;heads:model;d_ff:model;vocab:model")],
    "moe": [("data_model", "data:4;model:2",
             "batch:data;heads:model;d_ff:model;vocab:model"),
            ("data_experts", "data:4;model:2",
             "batch:data;experts:model")],
}


def main():
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.path.insert(0, ROOT)
  import meshtf
  import meshtf.compat
  devices = meshtf.virtual_cpu_devices(8)
  meshtf.compat.install(library=True)
  import numpy as np
  import tensorflow as tf
  import mesh_tensorflow as mtf
  from mesh_tensorflow import optimize
  from mesh_tensorflow.transformer import moe
  from mesh_tensorflow.transformer import transformer
  from mesh_tensorflow.transformer import transformer_layers
  assert transformer.__file__.startswith(meshtf.compat.installed_package_dir())
  data = np.random.RandomState(0).randint(
      1, VOCAB, size=[STEPS, BATCH, LENGTH]).astype(np.int32)

  def build_fn(kind, mesh_shape, layout):
    def build(mesh, tokens):
      ffn = (moe.MoE1D(num_experts=4, hidden_size=64) if kind == "moe" else
             transformer_layers.DenseReluDense(hidden_size=64))
      stack = transformer.LayerStack(
          [transformer_layers.SelfAttention(num_heads=4, key_value_size=8),
           ffn] * 2, dropout_rate=0.0, norm_epsilon=1e-6)
      model = transformer.Unitransformer(
          layer_stack=stack, d_model=32, input_vocab_size=VOCAB,
          output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH,
          layout=layout, mesh_shape=mesh_shape)
      shape = mtf.Shape([mtf.Dimension("batch", BATCH),
                         mtf.Dimension("length", LENGTH)])
      inputs = mtf.import_tf_tensor(mesh, tokens, shape)
      _, loss = model.call_simple(
          inputs=inputs, targets=inputs, compute_loss=True, mode="train",
          sequence_id=mtf.ones(mesh, shape, dtype=tf.int32),
          variable_dtype=mtf.VariableDType(tf.float32))
      variables = [v.outputs[0] for v in mesh.graph.trainable_variables]
      optimize.SgdOptimizer(0.5).apply_grads(
          mtf.gradients([loss], variables), variables)
      return loss
    return build

  for kind, layouts in LAYOUTS.items():
    for name, mesh_shape, layout in layouts:
      mesh_layout = meshtf.MeshLayout(mesh_shape, layout)
      impl = meshtf.SimdMeshImpl(mesh_layout, None,
                                 devices[:mesh_layout.size])
      step = meshtf.MeshFunction(build_fn(kind, mesh_shape, layout), impl)
      losses = [float(step(tf.constant(data[i]))) for i in range(STEPS)]
      print(json.dumps({"model": kind, "layout": name, "mesh": mesh_shape,
                        "rules": layout, "losses": losses}), flush=True)


if __name__ == "__main__":
  main()
