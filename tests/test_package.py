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


def _modules_after(statement):
  """The meshtf modules and whether TensorFlow is loaded after running
  statement in a fresh interpreter."""
  code = (statement + "\nimport sys\n"
          "print('tensorflow' in sys.modules)\n"
          "print(' '.join(sorted(m for m in sys.modules "
          "if m.startswith('meshtf'))))\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  tf_loaded, modules = r.stdout.strip().split("\n")
  return tf_loaded == "True", modules.split()


def test_layouts_and_plan_import_without_tensorflow():
  # The pure parts stay pure: the lazy face (meshtf/__init__.py) loads
  # nothing, layouts/ is pure Python, and meshtf.plan loads its report (and
  # so TensorFlow) only when plan() is used.
  tf_loaded, modules = _modules_after("import meshtf")
  assert not tf_loaded and modules == ["meshtf"]
  tf_loaded, modules = _modules_after(
      "import meshtf.layouts as L\nL.MeshLayout('x:2', 'batch:x')")
  assert not tf_loaded, modules
  tf_loaded, modules = _modules_after(
      "import meshtf.plan\nmeshtf.plan.HARDWARE['cpu']")
  assert not tf_loaded, modules
  assert "meshtf.train.startup" not in modules


def test_face_names_resolve_lazily_and_completely():
  # One name loads what it needs; dir() loads the whole face, and every
  # name it lists is an attribute.
  assert mtf.einsum.__module__ == "meshtf.ops.einsum"
  assert mtf.Depend is mtf.ops.passthrough.DependOperation
  names = dir(mtf)
  assert len(mtf.__all__) > 250
  for name in mtf.__all__:
    assert hasattr(mtf, name), name
  assert "einsum" in names and "layers" in names
