r"""Mesh TensorFlow's T5-style encoder-decoder as its users configured it
(way 2): Mesh TF 0.1.21's own Bitransformer, built by its gin-configurable
`make_bitransformer` from the `transformer/gin/defaults.gin` shipped inside
the installed `mesh-tensorflow` package (SelfAttention / EncDecAttention /
DenseReluDense stacks, the sublayer pipeline with dropout 0.1, shared
embedding and softmax weights, Adafactor, the Noam learning-rate schedule
and the T5 layout rules `ensemble:ensemble,batch:batch,d_ff:model,
heads:model,vocab:model,experts:batch`), on meshtf's core through
meshtf.compat.install(library=True). Only the sizes are made tiny, by gin
bindings after the defaults.

Trains STEPS steps with Mesh TF's own AdafactorOptimizer (its decay rate and
the learning rate are tf.Tensors computed from TF1's global step by
optimize.adafactor_decay_rate_pow and learning_rate_schedules) on each mesh
of MESHES, then decodes greedily (Bitransformer.decode, temperature 0).
Prints one JSON line per mesh: the losses, the decodes, and the seconds to
the first step (build + lower + run).

Mesh TF's transformer/utils.py (its TPUEstimator binary) does not import on
TF >= 2.16; the part of it that defaults.gin configures (utils.run's
optimizer, learning-rate schedule, layout rules, mesh shape and sequence
lengths; get_variable_dtype; tpu_mesh_shape; serialize_num_microbatches)
is stood in for below, under the same gin names, and the training step is
the one utils.py's model_fn builds: loss from call_simple, mtf.gradients,
optimizer(learning_rate=schedule(step=global_step)).apply_grads, global
step += 1.

Run as a script (its own process: the alias changes sys.modules):
  python tests/compat/mtf_bitransformer.py [--meshes=batch:8]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# Mesh shapes of the run (the defaults.gin layout rules name "ensemble",
# "batch" and "model": the axes a mesh lacks make their rules inactive).
MESHES = ("", "batch:8", "model:4,batch:2")
BATCH, STEPS, VOCAB = 8, 3, 32
# Tiny sizes over defaults.gin (one layer per stack; Mesh TF's default is
# 6 + 6); sublayers, rules, optimizer and schedule stay as shipped, except:
# float32 activations and master copies (defaults.gin's bfloat16 is for
# TPUs: "you will need to remove this if you want to run on CPU"); the Noam
# schedule's linear decay over the whole run, so that the learning rate
# changes from step to step (0.01, 0.0067, 0.0033); and no dropout (0.1 as
# shipped): meshtf's layout-invariant dropout (tested in tests/ops) costs
# this run 37 of its 87 CPU seconds (its Threefry bits, lowered per dropout;
# measured here), and the point is Mesh TF's code path. Dropout 0.1 gives
# equal losses on the three meshes too (--bindings='dropout_rate = 0.1').
TINY = """
num_layers = 1
d_model = 32
d_ff = 64
num_heads = 4
d_kv = 8
Unitransformer.max_length = 16
utils.run.sequence_length = {"inputs": 8, "targets": 8}
utils.get_variable_dtype.activation_dtype = "float32"
utils.get_variable_dtype.master_dtype = "float32"
learning_rate_schedule_noam.linear_decay_fraction = 1.0
dropout_rate = 0.0
"""


def register_utils_stand_ins(gin, mtf, tf):
  """Gin configurables named as transformer/utils.py's, for the bindings
  defaults.gin makes to them; returns run(), which gives the run settings
  gin bound."""
  module = "mesh_tensorflow.transformer.utils"

  @gin.configurable("run", module=module)
  def run(optimizer=None, learning_rate_schedule=None, layout_rules=None,
          mesh_shape=None, sequence_length=None):
    return dict(optimizer=optimizer,
                learning_rate_schedule=learning_rate_schedule,
                layout_rules=layout_rules, mesh_shape=mesh_shape,
                sequence_length=sequence_length)

  @gin.configurable("tpu_mesh_shape", module=module)
  def tpu_mesh_shape(model_parallelism=1, tpu_topology="2x2"):
    del tpu_topology
    return "model:%d" % model_parallelism

  @gin.configurable("serialize_num_microbatches", module=module)
  def serialize_num_microbatches(tokens_per_replica,
                                 tokens_per_microbatch_per_replica=None):
    if not tokens_per_microbatch_per_replica:
      return 1
    return max(1, tokens_per_replica // tokens_per_microbatch_per_replica)

  @gin.configurable("get_variable_dtype", module=module)
  def get_variable_dtype(master_dtype="bfloat16", slice_dtype="float32",
                         activation_dtype="float32"):
    return mtf.VariableDType(master_dtype=tf.as_dtype(master_dtype),
                             slice_dtype=tf.as_dtype(slice_dtype),
                             activation_dtype=tf.as_dtype(activation_dtype))

  return run, serialize_num_microbatches, get_variable_dtype


class Runner(object):
  """The run: meshtf and Mesh TF's library imported (way 2), defaults.gin
  parsed with TINY, the data made. train(mesh_shape) and decode(...) build,
  lower and run Mesh TF's Bitransformer on one mesh."""

  def __init__(self, bindings="", grappler=True):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if ROOT not in sys.path:
      sys.path.insert(0, ROOT)
    import meshtf  # pylint: disable=g-import-not-at-top
    import meshtf.compat  # pylint: disable=g-import-not-at-top
    self.meshtf = meshtf
    self._impls = {}
    self.devices = meshtf.virtual_cpu_devices(8)
    meshtf.compat.install(library=True)
    import gin  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
    package = meshtf.compat.installed_package_dir()
    assert transformer.__file__.startswith(package)
    self.tf, self.mtf, self.transformer = tf, mtf, transformer
    run, self.serialize_num_microbatches, self.get_variable_dtype = (
        register_utils_stand_ins(gin, mtf, tf))
    gin.parse_config_files_and_bindings(
        [os.path.join(package, "transformer", "gin", "defaults.gin")],
        TINY + bindings)
    if not grappler:
      tf.config.optimizer.set_experimental_options(
          {"disable_meta_optimizer": True})
    self.settings = run()
    self.length = self.settings["sequence_length"]["inputs"]
    rs = np.random.RandomState(0)
    # Inputs and targets with EOS (1) and padding (0) at the ends.
    size = [STEPS, BATCH, self.length]
    self.inputs = rs.randint(2, VOCAB, size=size).astype(np.int32)
    self.targets = rs.randint(2, VOCAB, size=size).astype(np.int32)
    for a in (self.inputs, self.targets):
      a[:, :, -2] = 1
      a[:, :, -1] = 0

  def mesh_impl(self, mesh_shape):
    """Mesh TF's SimdMeshImpl with utils.run's layout rules (as utils.py's
    model_fn makes its mesh impl)."""
    if mesh_shape not in self._impls:
      mtf = self.mtf
      rules = mtf.convert_to_layout_rules(self.settings["layout_rules"])
      self._impls[mesh_shape] = mtf.simd_mesh_impl.SimdMeshImpl(
          mesh_shape, rules,
          self.devices[:mtf.convert_to_shape(mesh_shape).size])
    return self._impls[mesh_shape]

  def _model(self, mesh_shape):
    return self.transformer.make_bitransformer(
        input_vocab_size=VOCAB, output_vocab_size=VOCAB,
        mesh_shape=mesh_shape, layout=self.settings["layout_rules"])

  def _features(self, mesh, *tf_tensors):
    mtf = self.mtf
    shape = mtf.Shape([mtf.Dimension("batch", BATCH),
                       mtf.Dimension("length", self.length)])
    return [mtf.import_tf_tensor(mesh, t, shape) for t in tf_tensors]

  def train_step(self, mesh_shape, impl=None):
    """The MeshFunction of one training step, as utils.py's model_fn."""
    mtf, tf = self.mtf, self.tf

    def build(mesh, inputs_tf, targets_tf):
      model = self._model(mesh_shape)
      inputs, targets = self._features(mesh, inputs_tf, targets_tf)
      assert self.serialize_num_microbatches(BATCH * self.length) == 1
      _, loss = model.call_simple(
          inputs=inputs, targets=targets, compute_loss=True, mode="train",
          variable_dtype=self.get_variable_dtype())
      variables = mesh.graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      learning_rate = self.settings["learning_rate_schedule"](
          step=tf.compat.v1.train.get_global_step(), total_train_steps=STEPS)
      optimizer = self.settings["optimizer"](learning_rate=learning_rate)
      optimizer.apply_grads(grads, variables)
      return loss
    return self.meshtf.MeshFunction(build, impl or self.mesh_impl(mesh_shape))

  def train(self, mesh_shape, steps=STEPS):
    """(losses, seconds per step, the MeshFunction) of `steps` steps from
    a fresh start (TF1's global step set to 0, as a new model_dir)."""
    global_step = self.tf.compat.v1.train.get_or_create_global_step()
    global_step.assign(0)
    step = self.train_step(mesh_shape)
    losses, seconds = [], []
    for i in range(steps):
      start = time.time()
      losses.append(float(step(self.tf.constant(self.inputs[i]),
                               self.tf.constant(self.targets[i]))))
      global_step.assign_add(1)   # utils.py's train_op increments it
      seconds.append(round(time.time() - start, 2))
    return losses, seconds, step

  def decode(self, mesh_shape, train_step):
    """Greedy decodes (Bitransformer.decode, temperature 0) of the first
    batch's inputs with train_step's variables."""
    mtf = self.mtf

    def build(mesh, inputs_tf):
      model = self._model(mesh_shape)
      inputs, = self._features(mesh, inputs_tf)
      return mtf.anonymize(model.decode(
          inputs, variable_dtype=self.get_variable_dtype(), temperature=0.0))
    fn = self.meshtf.MeshFunction(build, self.mesh_impl(mesh_shape),
                                  variable_store=train_step.variable_store)
    return fn(self.tf.constant(self.inputs[0])).numpy().tolist()


def install_semantics(runner):
  """What the Mesh TF surface does with a rule naming an absent mesh axis
  after compat.install() (each: the active rules on 'batch:2', or the error
  type), next to meshtf's own MeshLayout."""
  import meshtf.layouts  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import ops  # pylint: disable=g-import-not-at-top
  rules = "batch:batch;heads:model"
  devices = runner.devices[:2]
  makers = {
      "convert_to_layout_rules": lambda: runner.meshtf.MeshLayout(
          "batch:2", mtf.convert_to_layout_rules(rules)).layout_rules,
      "LayoutRules": lambda: runner.meshtf.MeshLayout("batch:2", (
          mtf.LayoutRules([("batch", "batch"), ("heads", "model")]))
                                                      ).layout_rules,
      "ops.MeshImpl": lambda: ops.MeshImpl(
          "batch:2", layout_rules=rules).layout_rules,
      "simd_mesh_impl.SimdMeshImpl": lambda: mtf.simd_mesh_impl.SimdMeshImpl(
          "batch:2", rules, devices).layout_rules,
      "placement_mesh_impl.PlacementMeshImpl": lambda: (
          mtf.placement_mesh_impl.PlacementMeshImpl("batch:2", rules,
                                                    devices).layout_rules),
      "meshtf.MeshLayout": lambda: meshtf.layouts.MeshLayout(
          "batch:2", rules).layout_rules,
  }
  out = {}
  for name, make in makers.items():
    try:
      out[name] = ";".join("%s:%s" % p for p in make().pairs)
    except Exception as e:  # pylint: disable=broad-except
      out[name] = type(e).__name__
  return out


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--meshes", default=";".join(MESHES),
                      help="mesh shapes separated by ';'")
  parser.add_argument("--no_decode", action="store_true")
  parser.add_argument("--bindings", default="",
                      help="more gin bindings, e.g. 'dropout_rate = 0.0'")
  parser.add_argument("--grappler", default="off", choices=["on", "off"],
                      help="TensorFlow's graph optimizer; off (the test's "
                      "choice) saves ~2/3 of the first call, changes no "
                      "comparison here (bench/first_step_mesh_tf.py "
                      "measures it on)")
  args = parser.parse_args(argv)
  start = time.time()
  runner = Runner("\n" + args.bindings.replace(";", "\n"),
                  grappler=args.grappler == "on")
  print(json.dumps({"setup_seconds": round(time.time() - start, 1),
                    "install_semantics": install_semantics(runner)}),
        flush=True)
  for mesh_shape in args.meshes.split(";"):
    losses, seconds, step = runner.train(mesh_shape)
    line = {"mesh": mesh_shape, "rules": runner.settings["layout_rules"],
            "losses": losses, "step_seconds": seconds}
    if not args.no_decode:
      start = time.time()
      line["decodes"] = runner.decode(mesh_shape, step)
      line["decode_seconds"] = round(time.time() - start, 2)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
