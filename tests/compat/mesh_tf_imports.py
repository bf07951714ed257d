r"""Imports Mesh TensorFlow 0.1.21's ORIGINAL code on TensorFlow 2.21.

The installed `mesh-tensorflow` package does not import as-is on TF >= 2.16.
`import_mesh_tf()` puts three import stand-ins into sys.modules first, then
imports the package's own files (its core ops.py, placement_mesh_impl.py,
layers.py, optimize.py, transformer/transformer.py, transformer_layers.py,
attention.py), unedited, from site-packages. meshtf is never imported:
`block_meshtf()` makes `import meshtf` fail in the process, and
meshtf.compat.install() (which aliases mesh_tensorflow to meshtf) is never
called. Used by tests/compat/mesh_tf_t5.py in a child process.

The stand-ins, each providing only what Mesh TF's import-time code touches:

1. `tensorflow.compat.v1.estimator` (TF 2.16 removed Estimator).
   * ops.py defines two classes at import time with Estimator base classes:
     `MtfCheckpointSaverListener(tf_estimator.CheckpointSaverListener)` and
     `MtfRestoreHook(tf_estimator.SessionRunHook)`. The stand-in's bases are
     empty classes. The fixture never instantiates either hook: it runs what
     they run, `lowering.copy_slices_to_masters()` before each save and
     `lowering.copy_masters_to_slices()` after each restore, itself.
   * transformer.py uses `tf_estimator.ModeKeys.TRAIN / EVAL / PREDICT` at
     run time (Context.train is `mode == ModeKeys.TRAIN`, decode runs the
     encoder in PREDICT). The stand-in's ModeKeys carries the same string
     values as TF's real ModeKeys ("train", "eval", "infer"), so that
     comparison behaves as with the real Estimator. It is the only stand-in
     name used at run time, and only as these three constants.
   Anything else asked of it raises AttributeError naming the stand-in.

2. `mesh_tensorflow.transformer` (the package __init__ only).
   The real __init__ imports every transformer module, among them utils.py
   (needs pkg_resources, removed in setuptools 82, TPUEstimator and
   tensorflow_datasets), dataset.py and the vocabularies. The stand-in is an
   empty package whose __path__ is the installed transformer/ directory, so
   `from mesh_tensorflow.transformer import transformer` loads the installed
   file unchanged. The fixture uses transformer.py, transformer_layers.py and
   attention.py, none of which import utils.py / dataset.py.

3. `mesh_tensorflow.tpu_variables`.
   The real module calls `ops.register_tensor_conversion_function` at import
   time, which TF 2.21 no longer has in tensorflow.python.framework.ops. Only
   SimdMeshImpl (TPU) creates its ReplicatedVariable; the fixture lowers with
   PlacementMeshImpl, so the stand-in's ReplicatedVariable raises if built.

Example:
  >>> mtf, transformer, layers, optimize = import_mesh_tf()  # doctest: +SKIP
  >>> mtf.__file__                                           # doctest: +SKIP
  '.../site-packages/mesh_tensorflow/__init__.py'
"""
import importlib.machinery
import os
import sys
import types

STAND_IN_DOC = "tests/compat/mesh_tf_imports.py stand-in: "


def mesh_tf_package_dir():
  """The installed `mesh_tensorflow` package directory, or None (found
  without importing it).

  Example:
    >>> mesh_tf_package_dir()    # doctest: +SKIP
    '/usr/lib/python3.11/site-packages/mesh_tensorflow'
  """
  spec = importlib.machinery.PathFinder.find_spec("mesh_tensorflow")
  if spec is None or not spec.submodule_search_locations:
    return None
  return list(spec.submodule_search_locations)[0]


def block_meshtf():
  """Makes `import meshtf` raise ImportError in this process (the fixture
  must be Mesh TF's own code only); refuses if meshtf is already imported.

  Example:
    >>> block_meshtf()           # doctest: +SKIP
  """
  loaded = [m for m in sys.modules
            if m == "meshtf" or m.startswith("meshtf.")]
  if any(sys.modules[m] is not None for m in loaded):
    raise RuntimeError("meshtf is already imported in this process (%s); "
                       "the Mesh TF fixture must run without it"
                       % ", ".join(sorted(loaded)[:3]))
  sys.modules["meshtf"] = None   # `import meshtf` now raises ImportError


def _strict_module(name, doc):
  """A module whose missing attributes raise an error naming the stand-in."""
  module = types.ModuleType(name, STAND_IN_DOC + doc)

  def __getattr__(attr):  # noqa: N807
    raise AttributeError(
        "%s.%s: not provided by %s%s" % (name, attr, STAND_IN_DOC, doc))
  module.__getattr__ = __getattr__
  return module


def _estimator_stand_in():
  estimator = _strict_module(
      "tensorflow.compat.v1.estimator",
      "ModeKeys (TF's values) and the two hook base classes ops.py "
      "subclasses at import time.")

  class ModeKeys(object):
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"

  class CheckpointSaverListener(object):
    """Base class of ops.MtfCheckpointSaverListener (never instantiated)."""

  class SessionRunHook(object):
    """Base class of ops.MtfRestoreHook (never instantiated)."""

  estimator.ModeKeys = ModeKeys
  estimator.CheckpointSaverListener = CheckpointSaverListener
  estimator.SessionRunHook = SessionRunHook
  return estimator


def _tpu_variables_stand_in():
  module = _strict_module(
      "mesh_tensorflow.tpu_variables",
      "ReplicatedVariable, used only by SimdMeshImpl (TPU).")

  class ReplicatedVariable(object):

    def __init__(self, *args, **kwargs):
      raise NotImplementedError(
          STAND_IN_DOC + "ReplicatedVariable (TPU only) is not available; "
          "the fixture lowers with PlacementMeshImpl")
  module.ReplicatedVariable = ReplicatedVariable
  return module


def install_stand_ins():
  """Puts the three stand-ins into sys.modules (see the module docstring);
  returns their names.

  Example:
    >>> install_stand_ins()      # doctest: +SKIP
    ['tensorflow.compat.v1.estimator', 'mesh_tensorflow.transformer', \
'mesh_tensorflow.tpu_variables']
  """
  package_dir = mesh_tf_package_dir()
  if package_dir is None:
    raise ImportError("mesh-tensorflow 0.1.21 is not installed: pip install "
                      "--no-deps mesh-tensorflow==0.1.21 gin-config")
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  names = []
  if not hasattr(tf1, "estimator"):
    sys.modules["tensorflow.compat.v1.estimator"] = _estimator_stand_in()
    names.append("tensorflow.compat.v1.estimator")
  transformer = types.ModuleType(
      "mesh_tensorflow.transformer",
      STAND_IN_DOC + "the package without its __init__'s imports.")
  transformer.__path__ = [os.path.join(package_dir, "transformer")]
  sys.modules["mesh_tensorflow.transformer"] = transformer
  names.append("mesh_tensorflow.transformer")
  sys.modules["mesh_tensorflow.tpu_variables"] = _tpu_variables_stand_in()
  names.append("mesh_tensorflow.tpu_variables")
  return names


def import_mesh_tf():
  """Installs the stand-ins and imports Mesh TF's own modules.

  Returns:
    (mesh_tensorflow, transformer, transformer_layers, optimize), all from
    the installed package's files.

  Example:
    >>> mtf, transformer, layers, optimize = import_mesh_tf()  # doctest: +SKIP
  """
  if "mesh_tensorflow" in sys.modules:
    raise RuntimeError("mesh_tensorflow is already imported (%s)"
                       % getattr(sys.modules["mesh_tensorflow"], "__file__",
                                 "not from a file"))
  install_stand_ins()
  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf
  from mesh_tensorflow import optimize
  from mesh_tensorflow.transformer import transformer
  from mesh_tensorflow.transformer import transformer_layers
  # pylint: enable=g-import-not-at-top
  package_dir = os.path.realpath(mesh_tf_package_dir())
  for module in (mtf, optimize, transformer, transformer_layers, mtf.ops):
    path = os.path.realpath(module.__file__)
    if not path.startswith(package_dir + os.sep):
      raise RuntimeError("%s came from %s, not the installed package %s"
                         % (module.__name__, path, package_dir))
  return mtf, transformer, transformer_layers, optimize
