"""Package-level promises: importing creates no devices; Mesh TensorFlow
names exist."""
import subprocess
import sys

import meshtf as mtf


def test_import_creates_no_devices_and_starts_no_tf_work():
  code = ("import meshtf, tensorflow as tf\n"
          "cpu = tf.config.list_physical_devices('CPU')[0]\n"
          "tf.config.set_logical_device_configuration(cpu, "
          "[tf.config.LogicalDeviceConfiguration()] * 3)\n"
          "print(len(tf.config.list_logical_devices('CPU')))\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "3"


def test_mesh_tensorflow_names():
  for name in ["Dimension", "Shape", "convert_to_shape", "convert_to_dimension",
               "convert_to_layout_rules", "LayoutRules", "Graph", "Mesh",
               "Tensor", "Operation", "import_tf_tensor",
               "import_fully_replicated", "get_variable", "einsum",
               "reduce_sum", "gradients", "Lowering", "PlacementMeshImpl"]:
    assert hasattr(mtf, name), name
  # Mesh TF's constructors: meshtf's classes with Mesh TF's rule semantics.
  assert issubclass(mtf.placement_mesh_impl.PlacementMeshImpl,
                    mtf.PlacementMeshImpl)
  assert issubclass(mtf.simd_mesh_impl.SimdMeshImpl, mtf.SimdMeshImpl)


def test_graph_names_unique():
  graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  a = mtf.ones(mesh, "k:2", name="x")
  b = mtf.ones(mesh, "k:2", name="x")
  assert a.operation.name == "x" and b.operation.name == "x_1"
  assert [op.name for op in graph.operations] == ["x", "x_1"]
