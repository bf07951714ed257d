"""The SPMD program's options for GPUs, checked on CPU: the collectives'
communication_hint (chosen from the device names, overridable) and XLA
(jit_compile "segments" / "program") giving the same numbers."""
import numpy as np
import pytest
import tensorflow as tf

import harness
import meshtf as mtf
from meshtf.lowering import simd_collectives as sc

GPUS = ["/job:localhost/replica:0/task:0/device:GPU:%d" % i for i in range(8)]


def test_the_hint_is_nccl_only_when_every_device_is_a_gpu():
  assert sc.device_type(GPUS[3]) == "GPU"
  assert sc.device_type("/gpu:1") == sc.device_type("GPU:1") == "GPU"
  assert sc.device_type("/job:w/replica:0/task:1/device:CPU:0") == "CPU"
  assert sc.default_communication_hint(GPUS) == "nccl"
  assert sc.default_communication_hint(["/gpu:0", "/device:GPU:1"]) == "nccl"
  assert sc.default_communication_hint(harness.DEVICES) == "auto"
  assert sc.default_communication_hint(GPUS[:1] + harness.DEVICES[:1]) == \
      "auto"   # NCCL cannot serve the CPU
  assert sc.default_communication_hint(["/job:w/task:0/device:TPU:0"]) == \
      "auto"


def test_the_spmd_impls_are_the_ones_with_program_options():
  # MeshFunction asks impl.is_spmd before it enters program_options.
  from meshtf.lowering import mesh_impl, placement, simd, tpu
  for cls in (mesh_impl.MeshImpl, placement.PlacementMeshImpl,
              simd.SimdMeshImpl, tpu.TpuMeshImpl):
    assert cls.is_spmd == hasattr(cls, "program_options"), cls
  impl = mtf.PlacementMeshImpl("all:2", "batch:all", harness.DEVICES[:2])
  with pytest.raises(ValueError, match="options of the SPMD backend"):
    mtf.MeshFunction(lambda mesh: None, impl, jit_compile="segments")


def test_which_collectives_xla_can_compile_in_a_whole_program():
  assert sc.xla_program_refusal("allreduce", "SUM", True, GPUS) is None
  assert "on CPU devices" in sc.xla_program_refusal("allreduce", "SUM", True,
                                                    harness.DEVICES)
  assert "CollectiveGatherV2" in sc.xla_program_refusal("allconcat", None,
                                                        True, GPUS)
  assert "CollectiveAllToAllV2" in sc.xla_program_refusal("permute", None,
                                                          True, GPUS)
  assert "MAX" in sc.xla_program_refusal("allreduce", "MAX", True, GPUS)
  assert "constant group key" in sc.xla_program_refusal("allreduce", "SUM",
                                                        False, GPUS)
  assert "not ring" in sc.xla_program_refusal("allreduce", "SUM", True, GPUS,
                                              "ring")


def _graph():
  """A lowering with an allreduce, an allconcat and an alltoall."""
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  x = mtf.get_variable(mesh, "x", "batch:8;hidden:8")
  y = mtf.reduce_sum(x, reduced_dim=mtf.Dimension("hidden", 8))  # allreduce
  w = mtf.reshape(x, "batch:8;h3:8")           # allconcat: h3 unsplit
  v = mtf.get_variable(mesh, "v", "a:8;b:8")
  z = mtf.reshape(v, "a2:8;b2:8")              # alltoall: a, then b2 on cols
  return graph, mesh, [y, w, z]


def _hints(impl, **options):
  graph, mesh, outputs = _graph()
  with impl.program_options(**options):
    lowering = mtf.Lowering(graph, {mesh: impl}, outputs=outputs,
                            launch=False)
  return {(n.op, n.attr["communication_hint"].s.decode())
          for n in lowering.program.graph.as_graph_def().node
          if n.op in sc.COLLECTIVE_OPS}


@pytest.mark.parametrize("devices, kwargs, options, hint", [
    (harness.DEVICES, {}, {}, "auto"),
    (GPUS, {}, {}, "nccl"),
    (GPUS, {"communication_hint": "ring"}, {}, "ring"),
    (harness.DEVICES, {}, {"communication_hint": "nccl"}, "nccl"),
])
def test_emitted_collectives_carry_the_hint(devices, kwargs, options, hint):
  # launch=False traces only: GPU device names need no GPU.
  impl = mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols;a:cols;"
                          "b2:cols", devices, **kwargs)
  own = (kwargs.get("communication_hint") or
         sc.default_communication_hint(devices))
  assert impl.communication_hint == own
  assert _hints(impl, **options) == {(op, hint) for op in sc.COLLECTIVE_OPS}


def _build(mesh, x_tf):
  w = mtf.get_variable(mesh, "w", "io:8;hidden:8",
                       initializer=mtf.random_normal_initializer(stddev=0.5))
  x = mtf.import_tf_tensor(mesh, x_tf, "batch:8;io:8")
  h = mtf.relu(mtf.einsum([x, w], output_shape="batch:8;hidden:8"))
  loss = mtf.reduce_mean(mtf.square(h))
  g, = mtf.gradients([loss], [w])
  mtf.assign_sub(w, g * 0.1)
  return loss


def _losses(impl, steps=3, **kwargs):
  fn = mtf.MeshFunction(_build, impl, **kwargs)
  x = harness.random_array([8, 8], 0)
  return [float(fn(x)) for _ in range(steps)], fn


def test_a_mesh_function_overrides_the_hint_of_its_traces():
  impl = mtf.SimdMeshImpl("all:4", "batch:all", harness.DEVICES[:4])
  ring, fn = _losses(impl, communication_hint="ring")
  nodes = fn.lowering.program.graph.as_graph_def().node
  assert {n.attr["communication_hint"].s.decode() for n in nodes
          if n.op in sc.COLLECTIVE_OPS} == {"ring"}
  assert impl.communication_hint == "auto"   # the impl's own is untouched
  auto, _ = _losses(impl)
  np.testing.assert_allclose(ring, auto, rtol=1e-6)


def test_jit_program_on_one_device_gives_the_same_numbers():
  impl = mtf.SimdMeshImpl("all:1", "", harness.DEVICES[:1])
  plain, _ = _losses(impl)
  jitted, fn = _losses(impl, jit_compile=True)
  assert fn.lowering.program.function_def.attr["_XlaMustCompile"].b
  np.testing.assert_allclose(jitted, plain, rtol=1e-5)


def _remat_losses(impl, jit_compile):
  """Two training steps of a 2-layer LM recomputed in the backward pass
  (remat="full"), and its TrainStep."""
  from meshtf.models import optimize
  from meshtf.models import transformer
  lm = transformer.make_unitransformer(
      vocab_size=16, d_model=8, num_layers=2, num_heads=2, d_kv=4, d_ff=16,
      max_length=8, vocab_divisor=1, remat="full")
  step = mtf.training.TrainStep(transformer.loss_fn(lm), impl,
                                optimize.AdafactorOptimizer(),
                                jit_compile=jit_compile)
  ids = np.random.RandomState(0).randint(1, 16, size=(2, 8)).astype(np.int32)
  return [float(step({"inputs": ids, "targets": ids})["loss"])
          for _ in range(2)], step


def test_jit_program_keeps_a_recomputation_apart_from_the_forward_pass():
  """XLA drops control dependencies and merges identical computations, so
  under jit_compile="program" the recomputation's inputs pass through an
  optimization barrier with the output gradients they wait for (else XLA
  merged the copies back into the forward pass: bench/fusion_check.py
  --barrier=off); without XLA they stay identities with control
  dependencies. Same losses either way."""
  impl = mtf.SimdMeshImpl("all:1", "", harness.DEVICES[:1])
  plain, step = _remat_losses(impl, False)
  ops = [n.op for n in
         step.mesh_function.lowering.program.graph.as_graph_def().node]
  assert "XlaOptimizationBarrier" not in ops
  jitted, step = _remat_losses(impl, "program")
  ops = [n.op for n in
         step.mesh_function.lowering.program.graph.as_graph_def().node]
  assert "XlaOptimizationBarrier" in ops
  np.testing.assert_allclose(jitted, plain, rtol=1e-5)
  one = harness.DEVICES[:1]
  assert [mtf.SimdMeshImpl("all:1", "", one, jit_compile=j).compiled_by_xla
          for j in (False, "segments", "program")] == [False, False, True]
  assert mtf.TpuMeshImpl("all:1", "", one).compiled_by_xla


def test_jit_segments_compile_all_but_the_collectives():
  impl = mtf.SimdMeshImpl("rows:2;cols:2", "batch:rows;hidden:cols",
                          harness.DEVICES[:4], jit_compile="segments")
  jitted, fn = _losses(impl, steps=2)
  nodes = fn.lowering.program.graph.as_graph_def().node
  marked = {n.op for n in nodes if n.attr["_XlaCompile"].b}
  assert "Einsum" in marked or "BatchMatMulV2" in marked or "MatMul" in marked
  collectives = {n.op for n in nodes if n.op in sc.COLLECTIVE_OPS}
  assert collectives and not collectives & marked
  plain, _ = _losses(impl, steps=2, jit_compile=False)
  np.testing.assert_allclose(jitted, plain, rtol=1e-5)


def test_jit_program_refuses_collectives_on_cpu_in_one_line():
  impl = mtf.SimdMeshImpl("all:2", "batch:all", harness.DEVICES[:2])
  with pytest.raises(ValueError) as e:
    _losses(impl, jit_compile="program")
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith("jit_compile='program' cannot compile the "
                            "allreduce_sum over mesh axes ['all']")
  assert "not yet implemented for CPU" in message
  assert "jit_compile='segments'" in message


def _program_call_configs(fn):
  """The ConfigProtos that the step's per-device call ops carry (what
  TensorFlow instantiates each device's program with)."""
  from tensorflow.core.protobuf import config_pb2
  concrete = fn._fn.get_concrete_function(  # pylint: disable=protected-access
      tf.TensorSpec([8, 8], tf.float32))
  program = fn.lowering.program.name.decode()
  configs = []
  for op in concrete.graph.get_operations():
    if (op.type == "StatefulPartitionedCall" and
        op.get_attr("f").name == program):
      config = config_pb2.ConfigProto()
      config.ParseFromString(op.get_attr("config_proto"))
      configs.append(config)
  return configs


def test_grappler_is_off_for_cpu_steps_and_gives_the_same_numbers():
  from meshtf.lowering import grappler
  impl = mtf.SimdMeshImpl("all:4", "batch:all", harness.DEVICES[:4])
  assert impl.grappler == "off"
  assert grappler.default_grappler(GPUS, jit_compile="") == "default"
  assert grappler.default_grappler(harness.DEVICES, "segments") == "default"
  off, fn = _losses(impl)
  configs = _program_call_configs(fn)
  assert len(configs) == 4
  assert all(c.graph_options.rewrite_options.disable_meta_optimizer
             for c in configs)
  on, fn = _losses(impl, grappler="default")
  assert not any(c.graph_options.rewrite_options.disable_meta_optimizer
                 for c in _program_call_configs(fn))
  assert impl.grappler == "off"   # the impl's own is untouched
  np.testing.assert_allclose(off, on, rtol=1e-6)


@pytest.mark.parametrize("make, match", [
    (lambda: mtf.SimdMeshImpl("all:2", "", harness.DEVICES[:2],
                              grappler="fast"),
     "grappler='fast' is not one of 'default', 'off'"),
    (lambda: mtf.SimdMeshImpl("all:2", "", harness.DEVICES[:2],
                              communication_hint="gloo"),
     "communication_hint='gloo' is not one of auto, ring, nccl"),
    (lambda: mtf.SimdMeshImpl("all:2", "", harness.DEVICES[:2],
                              jit_compile="fast"),
     "jit_compile='fast' is not one of"),
    (lambda: mtf.MeshFunction(_build, mtf.PlacementMeshImpl(
        "all:2", "", harness.DEVICES[:2]), jit_compile="segments"),
     "options of the SPMD backend.*PlacementMeshImpl"),
])
def test_bad_options_raise_one_line_with_the_fix(make, match):
  with pytest.raises(ValueError, match=match) as e:
    make()
  assert "\n" not in str(e.value)


def test_program_options_are_one_frozen_value_checked_when_made():
  import dataclasses
  from meshtf.lowering.program_options import ProgramOptions
  options = ProgramOptions(jit_compile=True, grappler="off")
  assert (options.jit_compile, options.grappler,
          options.communication_hint) == ("program", "off", None)
  assert options.given and not ProgramOptions().given
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.jit_compile = "segments"
  with pytest.raises(ValueError, match="^MeshFunction: jit_compile='x'"):
    ProgramOptions.checked("MeshFunction", jit_compile="x")
  # The impl and a MeshFunction take the value as it is, checked once.
  impl = mtf.SimdMeshImpl("all:2", "", harness.DEVICES[:2],
                          options=ProgramOptions(communication_hint="ring",
                                                 jit_compile="segments"))
  assert (impl.communication_hint, impl.jit_compile) == ("ring", "segments")
  with impl.program_options(options=ProgramOptions(jit_compile="")):
    assert impl.jit_compile == "" and impl.communication_hint == "ring"
  assert impl.jit_compile == "segments"


def _bf16_build(mesh, x_tf):
  """bfloat16 through an allreduce, an allconcat and an alltoall."""
  x = mtf.cast(mtf.import_tf_tensor(mesh, x_tf, "a:8;b:8"), tf.bfloat16)
  return {"sum": mtf.reduce_sum(x, reduced_dim=mtf.Dimension("a", 8)),
          "concat": mtf.reshape(x, "a3:8;b:8"),
          "alltoall": mtf.reshape(x, "a2:8;b2:8")}


def test_bfloat16_moves_as_itself_and_sums_in_float32():
  impl = mtf.SimdMeshImpl("rows:2;cols:4", "a:cols;b2:cols",
                          harness.DEVICES)
  fn = mtf.MeshFunction(_bf16_build, impl)
  x = harness.random_array([8, 8], 1)
  got = {k: v.numpy() for k, v in fn(x).items()}
  wire = {}
  for n in fn.lowering.program.graph.as_graph_def().node:
    if n.op in sc.COLLECTIVE_OPS:
      wire.setdefault(n.op, set()).add(tf.as_dtype(n.attr["T"].type).name)
  # Gathers and all-to-alls move bfloat16's bits as float16 (half float32's
  # bytes); the sum runs in float32.
  assert wire == {"CollectiveGatherV2": {"float16"},
                  "CollectiveAllToAllV2": {"float16"},
                  "CollectiveReduceV2": {"float32"}}
  one = mtf.MeshFunction(_bf16_build, mtf.SimdMeshImpl(
      "all:1", "", harness.DEVICES[:1]))(x)
  for k, v in one.items():
    assert got[k].dtype == v.numpy().dtype   # bfloat16 out
  # Moves are bitwise those of one device; the sum (partial sums rounded
  # to bfloat16 on each processor) within bfloat16's rounding.
  for k in ("concat", "alltoall"):
    np.testing.assert_array_equal(got[k].astype(np.float32),
                                  one[k].numpy().astype(np.float32))
  np.testing.assert_allclose(got["sum"].astype(np.float32),
                             one["sum"].numpy().astype(np.float32),
                             rtol=2 ** -7, atol=2 ** -7)
