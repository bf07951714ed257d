"""Error type and message helpers for layout problems (pure Python)."""


class LayoutError(ValueError):
  """A mesh shape / layout combination that cannot be lowered."""


class InactiveLayoutRuleWarning(UserWarning):
  """Mesh TensorFlow-style layout rules name a mesh axis the mesh lacks;
  those rules do nothing on that mesh (layout_rules.rules_on_mesh)."""


class UnusedLayoutRuleWarning(UserWarning):
  """Layout rules name a dim that no tensor of the graph being lowered has
  (and that is no misspelling of one): they split nothing there
  (MeshLayout.check_rule_dims)."""


def describe_mesh(mesh_shape):
  return "'" + ";".join("%s:%d" % (d.name, d.size) for d in mesh_shape.dims) + "'"


def describe_shape(shape):
  return "[" + ", ".join("%s:%d" % (d.name, d.size) for d in shape.dims) + "]"


def tensor_label(tensor_name):
  return "tensor %r" % tensor_name if tensor_name else "a tensor"
