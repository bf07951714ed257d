"""Mesh TF's layout-rule semantics where Mesh TF code meets meshtf: a rule
naming a mesh axis the mesh lacks is inactive under the Mesh TF surface
(mtf.convert_to_layout_rules, the Mesh TF MeshImpl constructors at their
Mesh TF module paths, Mesh TF's ops.LayoutRules / MeshImpl), with one
warning naming it; meshtf's own MeshLayout and mesh impls keep refusing it.
Under compat.install() the same holds for `mesh_tensorflow.*`
(tests/compat/mtf_bitransformer.py checks that in its own process)."""
import warnings

import numpy as np
import pytest

import harness
import meshtf as mtf
from meshtf.layouts import InactiveLayoutRuleWarning
from meshtf.compat import helpers as mesh_tf_helpers

from conftest import DEVICES

T5_RULES = ("ensemble:ensemble,batch:batch,d_ff:model,heads:model,"
            "vocab:model,experts:batch")


def test_mtf_convert_to_layout_rules_has_mesh_tf_semantics():
  rules = mtf.convert_to_layout_rules(T5_RULES)
  assert rules.absent_axes == "inactive"
  assert mtf.convert_to_layout_rules(rules) is rules
  assert mtf.convert_to_layout_rules(
      {"batch": "batch"}).absent_axes == "inactive"
  with pytest.warns(InactiveLayoutRuleWarning, match="'ensemble:ensemble'"):
    layout = mtf.MeshLayout("batch:8", rules)
  assert layout.layout_rules.pairs == [("batch", "batch"),
                                       ("experts", "batch")]
  with pytest.raises(mtf.LayoutError, match="'ensemble:ensemble'"):
    mtf.MeshLayout("batch:8", T5_RULES)


@pytest.mark.parametrize("mesh_tf_class,meshtf_class", [
    (mtf.simd_mesh_impl.SimdMeshImpl, mtf.SimdMeshImpl),
    (mtf.placement_mesh_impl.PlacementMeshImpl, mtf.PlacementMeshImpl),
])
@pytest.mark.parametrize("layout", [T5_RULES, {"batch": "batch",
                                               "heads": "model"}])
def test_mesh_tf_mesh_impls_make_absent_axis_rules_inactive(
    mesh_tf_class, meshtf_class, layout):
  with pytest.warns(InactiveLayoutRuleWarning) as caught:
    impl = mesh_tf_class("batch:2", layout, DEVICES[:2])
  assert len(caught) == 1 and "'heads:model'" in str(caught[0].message)
  assert ("batch", "batch") in impl.layout_rules.pairs
  assert "model" not in str(impl.layout_rules)
  with pytest.raises(mtf.LayoutError, match="names mesh axis"):
    meshtf_class("batch:2", layout, DEVICES[:2])


def test_mesh_tf_ops_layout_rules_and_mesh_impl():
  rules = mesh_tf_helpers.LayoutRules([("batch", "batch"), ("d_ff", "model")])
  assert isinstance(rules, mtf.LayoutRules) and rules.absent_axes == "inactive"
  with pytest.warns(InactiveLayoutRuleWarning, match="'d_ff:model'"):
    impl = mesh_tf_helpers.MeshImpl("batch:4", layout_rules=rules)
  assert impl.size == 4 and impl.layout_rules.pairs == [("batch", "batch")]
  with pytest.raises(mtf.LayoutError):
    mtf.MeshImpl("batch:4", layout_rules=mtf.LayoutRules(rules.pairs))


def test_a_mesh_axis_the_rules_all_name_warns_nothing():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    impl = mtf.simd_mesh_impl.SimdMeshImpl(
        "model:4;batch:2", "batch:batch;d_ff:model", DEVICES)
  assert impl.layout_rules.pairs == [("batch", "batch"), ("d_ff", "model")]


def test_t5_rules_are_layout_invariant_on_meshes_lacking_their_axes():
  """A dense block under the T5 rules on "batch:8" (only batch splits),
  "model:4;batch:2" (d_ff and heads split too) and one device: the
  single-device values and gradients, on both backends."""
  x = harness.random_array([8, 4], 0)

  def model(mesh, t):
    x = t["x"]
    h = mtf.relu(mtf.layers.dense(x, mtf.Dimension("d_ff", 8), name="wi"))
    ffn = mtf.layers.dense(h, x.shape[-1], name="wo")
    heads = mtf.layers.dense(x, mtf.Dimension("heads", 4), name="q")
    return {"ffn": ffn,
            "heads": mtf.reduce_sum(heads * heads, reduced_dim=heads.shape[-1])}

  rules = mtf.convert_to_layout_rules(T5_RULES)
  with pytest.warns(InactiveLayoutRuleWarning):
    runs = harness.assert_layout_invariant(
        model, {"x": (x, "batch:8;d_model:4")},
        [("batch:8", rules), ("model:4;batch:2", rules)], wrt=["x"])
  assert len(runs) == 4
  one = harness.run_model(model, {"x": (x, "batch:8;d_model:4")}, "", rules)
  two_d = runs[("simd", "model:4;batch:2", rules)]
  for name in ("ffn", "heads"):
    np.testing.assert_allclose(two_d.outputs[name], one.outputs[name],
                               rtol=1e-5)
