"""The Mesh TensorFlow surface of meshtf, a wing of its own: Mesh TF's op
classes and helpers (op_classes.py, helpers.py, composed as ops.py), its
layers (layers.py = meshtf's layers + layers_extra.py + local_attention.py),
its MoE1D / MoE2D (moe_layers.py; moe.py composes the module path), its
module paths (placement_mesh_impl, simd_mesh_impl with rings.py and
logical_to_physical.py, utils, tpu_variables, test_utils), and `install()`.

The wing imports meshtf's core; the core never imports the wing. The
package face (meshtf/__init__.py) is the one place the two meet, so
`import meshtf as mtf` offers every Mesh TF name.

Run Mesh TensorFlow code on meshtf: `mesh_tensorflow` as an alias.

Two ways to port Mesh TensorFlow (0.1.21) code:

1. Change the import (`import meshtf as mtf`), or call `install()` so that
   `import mesh_tensorflow as mtf` and its submodules (ops, layers, optimize,
   placement_mesh_impl, simd_mesh_impl, utils, tpu_variables, test_utils,
   transformer.transformer / transformer_layers / moe) give meshtf's.
2. Keep Mesh TensorFlow's model library: `install(library=True)` makes only
   its core (ops, the mesh impls, utils, tpu_variables, test_utils) resolve
   to meshtf; its library modules (layers.py, transformer/*.py, ...) load
   from the installed `mesh-tensorflow` package on top of meshtf's core.

Either way Mesh TF's layout-rule semantics hold under `mesh_tensorflow`:
`LayoutRules`, `convert_to_layout_rules`, `MeshImpl` and the two mesh impls
treat a rule naming a mesh axis the mesh lacks as inactive (one warning), as
T5's default rules expect; meshtf's own MeshLayout refuses it.

Call it before the first `import mesh_tensorflow`.

Example:
  >>> import meshtf.compat
  >>> meshtf.compat.install()
  >>> import mesh_tensorflow as mtf
  >>> mtf.Dimension("batch", 8)
  Dimension(name='batch', size=8)
"""
import importlib
import importlib.machinery
import os
import sys
import types

# Mesh TF's core modules: always meshtf's (both ways).
_CORE = {
    "ops": "meshtf",
    "ops_with_redefined_builtins": "meshtf",
    "placement_mesh_impl": "meshtf.compat.placement_mesh_impl",
    "simd_mesh_impl": "meshtf.compat.simd_mesh_impl",
    "utils": "meshtf.compat.utils",
    "tpu_variables": "meshtf.compat.tpu_variables",
    "test_utils": "meshtf.compat.test_utils",
}
# Mesh TF's library modules meshtf re-implements: meshtf's in way 1 only.
_LIBRARY = {
    "layers": "meshtf.compat.layers",
    "optimize": "meshtf.models.optimize",
    "beam_search": "meshtf.models.decoding",
    "transformer.transformer": "meshtf.models.transformer",
    "transformer.transformer_layers": "meshtf.compat.transformer_layers",
    "transformer.moe": "meshtf.compat.moe",
}
_PACKAGE = "mesh_tensorflow"
_installed_mode = None


def installed_package_dir():
  """The installed `mesh-tensorflow` package's directory, or None.

  Found without importing it (its __init__ needs TF1's estimator).

  Example:
    >>> installed_package_dir()   # doctest: +SKIP
    '/usr/lib/python3/site-packages/mesh_tensorflow'
  """
  spec = importlib.machinery.PathFinder.find_spec(_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    return None
  return list(spec.submodule_search_locations)[0]


def _namespace_module(name, source, path=None):
  """A module holding `source`'s public names (a copy: `from x import *`
  and attribute access both work), with `path` as its __path__."""
  module = types.ModuleType(name, source.__doc__)
  for key, value in vars(source).items():
    if not key.startswith("__"):
      setattr(module, key, value)
  if path is not None:
    module.__path__ = [path]
  return module


def _mesh_tf_ops_module(name, meshtf, path=None):
  """A copy of the meshtf facade as Mesh TF's ops.py namespace: its
  LayoutRules and MeshImpl are Mesh TF's (rules naming a mesh axis the mesh
  lacks are inactive, as in Mesh TF; meshtf's own MeshLayout refuses them).
  mtf.convert_to_layout_rules is Mesh TF's in the facade already."""
  from meshtf.compat import helpers  # pylint: disable=g-import-not-at-top
  module = _namespace_module(name, meshtf, path)
  module.LayoutRules = helpers.LayoutRules
  module.MeshImpl = helpers.MeshImpl
  return module


def _lazy_submodules(module, names):
  """Attribute access `module.name` imports `module.__name__ + '.' + name`
  (Mesh TF's `mtf.layers` without importing the library up front)."""
  def __getattr__(attr):  # noqa: N807  (PEP 562 hook)
    if attr in names:
      return importlib.import_module(module.__name__ + "." + attr)
    raise AttributeError("module %r has no attribute %r" %
                         (module.__name__, attr))
  module.__getattr__ = __getattr__


def _stub_tf1_estimator():
  """Mesh TF's library imports `tensorflow.compat.v1.estimator` for its
  ModeKeys; TF >= 2.16 has no Estimator. A stub with ModeKeys lets those
  modules import; anything else from it raises a clear error."""
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  if hasattr(tf1, "estimator"):
    return
  estimator = types.ModuleType("tensorflow.compat.v1.estimator",
                               "meshtf.compat's stand-in: ModeKeys only.")

  class ModeKeys(object):
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"

  estimator.ModeKeys = ModeKeys

  def __getattr__(attr):  # noqa: N807
    raise AttributeError(
        "tf.compat.v1.estimator.%s: TensorFlow >= 2.16 has no Estimator; "
        "meshtf.compat provides only ModeKeys. Train with meshtf.train or a "
        "tf.function loop instead." % attr)
  estimator.__getattr__ = __getattr__
  tf1.estimator = estimator
  sys.modules["tensorflow.compat.v1.estimator"] = estimator


def install(library=False):
  """Makes `import mesh_tensorflow` resolve to meshtf.

  Args:
    library: False (way 1): Mesh TF's library names (layers, optimize,
      transformer.transformer, ...) are meshtf's too; other submodules
      (transformer.adaptive_softmax, ...) load from the installed
      `mesh-tensorflow` package if there is one. True (way 2): only the
      core is meshtf's; every library module loads from the installed
      package (which must be installed: pip install mesh-tensorflow==0.1.21
      --no-deps).

  Returns:
    the `mesh_tensorflow` module.

  Example:
    >>> install()                    # doctest: +SKIP
    >>> import mesh_tensorflow.transformer.transformer as t   # meshtf's
  """
  global _installed_mode
  mode = "library" if library else "meshtf"
  if _installed_mode is not None:
    if _installed_mode != mode:
      raise RuntimeError(
          "meshtf.compat.install(library=%s): already installed with "
          "library=%s in this process; the two ways cannot be mixed" % (
              library, _installed_mode == "library"))
    return sys.modules[_PACKAGE]
  if _PACKAGE in sys.modules:
    raise RuntimeError(
        "meshtf.compat.install(): mesh_tensorflow is already imported (%r); "
        "call install() before the first import of mesh_tensorflow" %
        getattr(sys.modules[_PACKAGE], "__file__", None))
  package_dir = installed_package_dir()
  if library and package_dir is None:
    raise ImportError(
        "meshtf.compat.install(library=True) loads Mesh TensorFlow's model "
        "library from the installed package, which is not installed: pip "
        "install --no-deps mesh-tensorflow==0.1.21 gin-config")
  import meshtf  # pylint: disable=g-import-not-at-top
  meshtf._load_face()  # the lazy face, whole: its namespace is copied below
  _stub_tf1_estimator()

  aliases = dict(_CORE)
  if not library:
    aliases.update(_LIBRARY)
  top = _mesh_tf_ops_module(_PACKAGE, meshtf, package_dir)
  top.__meshtf_compat__ = mode
  lazy = {"layers", "optimize", "beam_search", "transformer"}
  for name in ("layers", "optimize"):
    delattr(top, name)   # Mesh TF's `mtf.layers` is the aliased module
  _lazy_submodules(top, lazy)
  sys.modules[_PACKAGE] = top
  # The transformer package: our own module, so that the installed
  # package's __init__ (which imports its whole library) never runs.
  transformer_dir = (os.path.join(package_dir, "transformer")
                     if package_dir else None)
  transformer = types.ModuleType(_PACKAGE + ".transformer")
  if transformer_dir:
    transformer.__path__ = [transformer_dir]
  else:
    transformer.__path__ = []
  sys.modules[_PACKAGE + ".transformer"] = transformer
  top.transformer = transformer
  _lazy_submodules(transformer, {"attention", "moe", "transformer",
                                 "transformer_layers", "utils",
                                 "learning_rate_schedules", "dataset",
                                 "vocabulary"})
  for sub, target in aliases.items():
    module = importlib.import_module(target)
    if target == "meshtf":
      module = _mesh_tf_ops_module(_PACKAGE + "." + sub, meshtf)
    full = _PACKAGE + "." + sub
    sys.modules[full] = module
    parent = sys.modules[full.rsplit(".", 1)[0]]
    setattr(parent, full.rsplit(".", 1)[1], module)
  _installed_mode = mode
  return top
