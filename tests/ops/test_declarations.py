"""Every operation class states its plan facts (meshtf/graph.py's declared
hooks): the plan reads them instead of recognising classes by name, so a
class that states no cost kind would be priced as a kernel silently."""
import importlib
import pkgutil

import meshtf as mtf
from meshtf import graph as graph_lib
from meshtf.layouts import mesh_layout as mesh_layout_lib
from meshtf.op_kinds import CostKind
from meshtf.plan import estimate

# The packages whose modules define Operation subclasses: the core, the
# models' own ops and the Mesh TensorFlow wing.
_PACKAGES = ("meshtf.ops", "meshtf.models", "meshtf.compat")


def _operation_classes():
  for name in _PACKAGES:
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
      importlib.import_module(info.name)
  found, stack = [], [graph_lib.Operation]
  while stack:
    for sub in stack.pop().__subclasses__():
      stack.append(sub)
      if sub.__module__.startswith("meshtf."):
        found.append(sub)
  return sorted(set(found), key=lambda c: (c.__module__, c.__qualname__))


def _states(cls, fact):
  """Whether cls or a class it inherits from, below Operation, states
  `fact` in its own body."""
  return any(fact in c.__dict__ for c in cls.__mro__
             if c is not graph_lib.Operation and c is not object)


def test_every_operation_class_states_its_cost_kind():
  classes = _operation_classes()
  names = {c.__qualname__ for c in classes}
  # The walk reaches the core, the models' and the compat wing's classes.
  assert {"EinsumOperation", "StepRandomUniformOperation",
          "BinaryOpWithBroadcasting", "Conv2dOperation"} <= names
  silent = [c.__module__ + "." + c.__qualname__ for c in classes
            if not _states(c, "cost_kind")]
  assert silent == []


def test_cost_kinds_are_the_closed_vocabulary():
  for cls in _operation_classes():
    kind = next(c.__dict__["cost_kind"] for c in cls.__mro__
                if "cost_kind" in c.__dict__)
    assert isinstance(kind, (CostKind, property)), cls


def _mesh():
  return mtf.Mesh(mtf.Graph(), "m")


def test_an_einsum_is_a_kernel_with_two_operands_a_reduction_with_one():
  mesh = _mesh()
  x = mtf.ones(mesh, "b:4;d:8")
  w = mtf.ones(mesh, "d:8;e:2")
  assert mtf.einsum([x, w], output_shape="b:4;e:2").operation.cost_kind \
      is CostKind.KERNEL
  assert mtf.einsum([x], output_shape="b:4").operation.cost_kind \
      is CostKind.REDUCING


def test_linear_readers_say_which_pending_sums_they_keep():
  mesh = _mesh()
  layout = mesh_layout_lib.MeshLayout("x:2", "d:x")
  a = mtf.ones(mesh, "b:4;e:2")
  b = mtf.ones(mesh, "b:4;e:2")
  summed = (a + b).operation
  assert summed.keeps_pending([(0,), (0,)], layout)
  assert not summed.keeps_pending([(0,), None], layout)
  assert not (a * b).operation.keeps_pending([(0,), (0,)], layout)
  assert mtf.negative(a).operation.keeps_pending([(0,)], layout)
  assert not mtf.exp(a).operation.keeps_pending([(0,)], layout)
  assert (a * 2.0).operation.keeps_pending([(0,)], layout)
  # A cast keeps a sum pending only where a loop sums its result later.
  cast = mtf.cast(a, "bfloat16").operation
  assert not cast.keeps_pending([(0,)], layout)
  # A rename moves nothing: still pending.
  renamed = mtf.rename_dimension(a, "e", "f").operation
  assert renamed.keeps_pending([(0,)], layout)


def test_the_estimate_follows_a_declaration_not_a_class_name():
  """A custom op the plan has never heard of, declared linear, keeps its
  input's sum pending in the estimate, as its lowering would."""

  class Negate(graph_lib.Operation):
    cost_kind = CostKind.FUSIBLE

    def __init__(self, x):
      super().__init__([x], name="negate")
      self._outputs = [graph_lib.Tensor(self, x.shape, x.dtype)]

    def keeps_pending(self, pending_axes, layout):
      return pending_axes[0] is not None

  def reduced(linear):
    mesh = _mesh()
    x = mtf.ones(mesh, "b:4;d:8")
    w = mtf.ones(mesh, "d:8;e:2")
    y = mtf.einsum([x, w], output_shape="b:4;e:2")
    z = Negate(y).outputs[0] if linear else mtf.exp(y)
    out = mtf.reduce_sum(z * z, output_shape="b:4")
    graph_layout = mesh_layout_lib.MeshLayout("x:2", "d:x").assign(
        mesh.graph.operations)
    records = estimate.estimate_collectives(
        mesh.graph.operations, graph_layout, outputs=[out])
    return [(r["kind"], r["count"], [(why.op, why.tensor)
                                     for why in r["reasons"]])
            for r in records]

  # One allreduce of the einsum's partial sums either way: read by exp,
  # which is not linear; past the linear op, by the square.
  assert reduced(False) == [("allreduce_sum", 1, [("exp", "einsum:0")])]
  assert reduced(True) == [("allreduce_sum", 1, [("multiply",
                                                  "negate:0")])]
