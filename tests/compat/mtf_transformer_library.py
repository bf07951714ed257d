r"""Way 2 serves the Mesh TF transformer names that way 1 leaves out: Mesh
TensorFlow 0.1.21's own Unitransformer (its transformer/transformer.py and
transformer_layers.py, from the installed `mesh-tensorflow` package, on
meshtf's core through meshtf.compat.install(library=True)) built with
GeneralBilinearSelfAttention, TalkingHeadsSelfAttention, ParallelLayer
with its default layers, a LayerStack whose
sublayers_initial / per_layer / final are Mesh TF's sublayer_* functions,
sinusoid_positional_embedding_weights (sinusoid_positional_embedding=True),
and autoregressive_inputs / shift_targets for the decoder inputs. One
forward + loss per layout on 8 virtual CPUs; prints one JSON line per
layout with the loss and a checksum of the shifted inputs.

Run as a script (its own process: the alias changes sys.modules):
  python tests/compat/mtf_transformer_library.py
"""
import functools
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# Not LocalSelfAttention: in Mesh TF 0.1.21 itself its call fails outside
# incremental decoding (its short-sequence path calls attention.attention
# without the context, `context.train` on None; its long one passes
# local_attention_1d an `autoregressive=` it does not take).
BATCH, LENGTH, VOCAB, D_MODEL = 8, 16, 32, 32
LAYOUTS = [("data", "data:8", "batch:data"),
           ("data_model", "data:2;model:4",
            "batch:data;heads:model;d_ff:model;vocab:model")]


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
  from mesh_tensorflow.transformer import transformer
  from mesh_tensorflow.transformer import transformer_layers
  assert transformer.__file__.startswith(meshtf.compat.installed_package_dir())
  assert transformer_layers.__file__.startswith(
      meshtf.compat.installed_package_dir())
  rs = np.random.RandomState(0)
  targets_np = rs.randint(2, VOCAB, size=[BATCH, LENGTH]).astype(np.int32)
  targets_np[:, LENGTH // 2] = 1      # an EOS mid-sequence: shift_targets
  targets_np[:, -3:] = 0              # padding at the end
  sequence_id_np = (np.arange(LENGTH) <= LENGTH // 2).astype(np.int32)
  sequence_id_np = np.tile(2 - sequence_id_np, [BATCH, 1])
  sequence_id_np[:, -3:] = 0

  def build(mesh_shape, layout):
    def fn(mesh, targets_tf, sequence_id_tf):
      stack = transformer.LayerStack(
          [transformer_layers.GeneralBilinearSelfAttention(
              heads_dims=[("heads", 4)]),
           transformer_layers.TalkingHeadsSelfAttention(
               key_heads_dims=[("heads", 4)],
               softmax_heads_dims=[("heads", 4), ("softmax_heads", 2)],
               value_heads_dims=[("heads", 4)], key_size=8, value_size=8),
           transformer_layers.DenseReluDense(hidden_size=64),
           # Its own defaults (DenseReluDense and SelfAttention side by
           # side): its 32x1024 attention output weight once drew an inf
           # from meshtf's initializer RNG (a uniform rounded to 1.0).
           transformer_layers.ParallelLayer()],
          sublayers_initial=[
              functools.partial(transformer.sublayer_dropout,
                                dropout_rate=0.0)],
          sublayers_per_layer=[
              transformer.sublayer_rms_norm,
              transformer.sublayer_call_layer,
              functools.partial(transformer.sublayer_rezero,
                                initial_value=0.5),
              transformer.sublayer_residual],
          sublayers_final=[transformer.sublayer_rms_norm,
                           transformer.sublayer_mask_padding],
          )
      model = transformer.Unitransformer(
          layer_stack=stack, d_model=D_MODEL, input_vocab_size=VOCAB,
          output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH,
          sinusoid_positional_embedding=True, layout=layout,
          mesh_shape=mesh_shape)
      shape = mtf.Shape([mtf.Dimension("batch", BATCH),
                         mtf.Dimension("length", LENGTH)])
      targets = mtf.import_tf_tensor(mesh, targets_tf, shape)
      sequence_id = mtf.import_tf_tensor(mesh, sequence_id_tf, shape)
      inputs = transformer.autoregressive_inputs(targets, sequence_id)
      shifted = transformer.shift_targets(targets, bos_id=3)
      _, loss = model.call_simple(
          inputs=inputs, targets=targets, compute_loss=True, mode="train",
          sequence_id=sequence_id,
          variable_dtype=mtf.VariableDType(tf.float32))
      checksum = mtf.reduce_sum(mtf.to_float(
          inputs * 100 + shifted * mtf.range(mesh, shape.dims[1], tf.int32)))
      return loss, checksum
    return fn

  for name, mesh_shape, layout in LAYOUTS:
    mesh_layout = meshtf.MeshLayout(mesh_shape, layout)
    impl = meshtf.SimdMeshImpl(mesh_layout, None, devices[:mesh_layout.size])
    step = meshtf.MeshFunction(build(mesh_shape, layout), impl)
    loss, checksum = step(tf.constant(targets_np), tf.constant(sequence_id_np))
    print(json.dumps({"layout": name, "mesh": mesh_shape, "rules": layout,
                      "loss": float(loss), "checksum": float(checksum)}),
          flush=True)
  # The shifted inputs by hand, so the checksum is also checked for value.
  inputs_np = np.zeros_like(targets_np)
  inputs_np[:, 1:] = np.abs(targets_np[:, :-1])
  inputs_np *= np.concatenate([np.zeros([BATCH, 1], np.int32), (
      sequence_id_np[:, 1:] == sequence_id_np[:, :-1])], axis=1)
  shifted_np = np.zeros_like(targets_np)
  shifted_np[:, 1:] = targets_np[:, :-1]
  shifted_np *= shifted_np != 1
  shifted_np += ((shifted_np == 0) & (targets_np != 0)) * 3
  print(json.dumps({"expected_checksum": float(np.sum(
      inputs_np * 100 + shifted_np * np.arange(LENGTH)))}), flush=True)


if __name__ == "__main__":
  main()
