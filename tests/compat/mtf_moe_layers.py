r"""Mesh TF's MoE layers, both ways: `--way=1` runs meshtf's own
transformer_moe_layer_v1 / v2 (meshtf.compat.install(): mesh_tensorflow's
transformer.moe is meshtf.models.moe), `--way=2` Mesh TF 0.1.21's own
transformer/moe.py from the installed package on meshtf's core
(install(library=True)). Every variable takes a value drawn from its name,
so the two ways' numbers are comparable; each case runs on two layouts of
8 virtual CPUs. Prints one JSON line per (case, layout): the output, the
loss and the gradients of sum(output * r) + loss w.r.t. the input and
every variable.

Run as a script (its own process: the alias changes sys.modules):
  python tests/compat/mtf_moe_layers.py --way=1
"""
import argparse
import json
import os
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
BATCH, LENGTH, D_MODEL = 8, 8, 8
# Deterministic second-expert policies only: the random policy's draws are
# keyed by op names, which differ between the two implementations.
CASES = {
    "v1_top2_all": dict(layer="v1", num_experts=4, hidden_size=16,
                        group_size=16, capacity_factor_train=1.0,
                        min_expert_capacity=2, second_policy_train="all",
                        use_second_place_loss=True, z_loss=1e-3),
    "v1_top2_threshold_eval": dict(
        layer="v1", train=False, num_experts=4, hidden_size=16,
        group_size=16, capacity_factor_eval=1.0, min_expert_capacity=2,
        second_policy_eval="threshold", second_threshold_eval=0.3),
    "v1_switch": dict(layer="v1", moe_gating="switch", num_experts=4,
                      hidden_size=16, group_size=16,
                      capacity_factor_train=1.0, min_expert_capacity=2,
                      switch_policy_train="argmax", activation="gelu"),
    "v2_top2_all": dict(layer="v2", expert_x=2, expert_y=2, hidden_size=16,
                        group_size=16, capacity_factor_train=1.0,
                        second_policy_train="all"),
}
LAYOUTS = {
    "v1": [("data_experts", "data:4;model:2", "batch:data;experts:model"),
           ("data_hidden", "data:4;model:2",
            "batch:data;expert_hidden:model;d_model_split:model")],
    "v2": [("data_x", "data:4;model:2", "batch:data;expert_x:model"),
           ("data_y", "data:4;model:2", "batch:data;expert_y:model")],
}


def value_for(name, shape):
  """A variable's value from its name alone (the same in both ways)."""
  import numpy as np
  rng = np.random.RandomState(zlib.crc32(name.encode()))
  return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--way", type=int, choices=(1, 2), required=True)
  parser.add_argument("--cases", default=",".join(CASES))
  args = parser.parse_args()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.path.insert(0, ROOT)
  import meshtf
  import meshtf.compat
  devices = meshtf.virtual_cpu_devices(8)
  meshtf.compat.install(library=args.way == 2)
  import numpy as np
  import tensorflow as tf
  import mesh_tensorflow as mtf
  from mesh_tensorflow.transformer import moe
  in_package = moe.__file__.startswith(meshtf.compat.installed_package_dir())
  assert in_package == (args.way == 2), moe.__file__

  rng = np.random.RandomState(0)
  x_np = rng.standard_normal([BATCH, LENGTH, D_MODEL]).astype(np.float32)
  r_np = rng.standard_normal([BATCH, LENGTH, D_MODEL]).astype(np.float32)
  nonpadding_np = np.ones([BATCH, LENGTH], np.float32)
  nonpadding_np[:, -2:] = 0.0   # padding routes nowhere

  def build_fn(case, mesh_shape, layout):
    kwargs = dict(CASES[case])
    kind, train = kwargs.pop("layer"), kwargs.pop("train", True)
    activation = kwargs.pop("activation", "relu")
    hparams = (moe.MoE1D(**kwargs) if kind == "v1" else
               moe.MoE2D(**kwargs))._hparams  # pylint: disable=protected-access
    # Mesh TF 0.1.21's MoE2D leaves out hparams its own layer reads
    # (AttributeError there); meshtf's defaults them.
    for attr, default in (("moe_min_expert_capacity", 4),
                          ("moe_word_embed_mode", None), ("moe_z_loss", None)):
      if not hasattr(hparams, attr):
        setattr(hparams, attr, default)

    def build(mesh, x_tf, r_tf, nonpadding_tf):
      batch, length = mtf.Dimension("batch", BATCH), mtf.Dimension(
          "length", LENGTH)
      d_model = mtf.Dimension("d_model", D_MODEL)
      x = mtf.import_tf_tensor(mesh, x_tf, mtf.Shape([batch, length,
                                                      d_model]))
      r = mtf.import_tf_tensor(mesh, r_tf, x.shape)
      nonpadding = mtf.import_tf_tensor(mesh, nonpadding_tf,
                                        mtf.Shape([batch, length]))
      common = dict(layout=layout, mesh_shape=mesh_shape,
                    nonpadding=nonpadding, num_microbatches=1)
      variable_dtype = mtf.VariableDType(tf.float32)
      if kind == "v1":
        y, loss = moe.transformer_moe_layer_v1(
            x, d_model, hparams, train, variable_dtype,
            activation=activation, **common)
      else:
        y, loss = moe.transformer_moe_layer_v2(
            x, d_model, hparams, train, variable_dtype, **common)
      objective = mtf.reduce_sum(y * r) + loss
      variables = [v.outputs[0] for v in mesh.graph.trainable_variables]
      grads = mtf.gradients([objective], [x] + variables)
      out = {"y": y, "loss": loss, "grad/x": grads[0]}
      for v, g in zip(mesh.graph.trainable_variables, grads[1:]):
        out["grad/" + v.name] = g
      return out
    return build

  for case in args.cases.split(","):
    kind = CASES[case]["layer"]
    for name, mesh_shape, layout in LAYOUTS[kind]:
      mesh_layout = meshtf.MeshLayout(mesh_shape, layout)
      impl = meshtf.SimdMeshImpl(mesh_layout, None, devices)
      step = meshtf.MeshFunction(build_fn(case, mesh_shape, layout), impl)
      inputs = (tf.constant(x_np), tf.constant(r_np),
                tf.constant(nonpadding_np))
      step(*inputs)   # creates the variables
      store = step.variable_store
      store.restore_values({
          n: value_for(n, store.entry(n).shape.to_integer_list)
          for n in store.names()})
      out = step(*inputs)
      print(json.dumps({
          "case": case, "layout": name, "way": args.way,
          "values": {k: np.asarray(v).tolist() for k, v in out.items()}}),
            flush=True)


if __name__ == "__main__":
  main()
