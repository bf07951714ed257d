"""Layout presets (meshtf/layouts/presets.py): named once, valid on their
meshes, and not spelled out again where the configs and benches use them."""
import ast
import pathlib

from meshtf.layouts import MeshLayout
from meshtf.layouts import convert_to_layout_rules
from meshtf.layouts import presets

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _rules(layout):
  return dict(convert_to_layout_rules(layout).pairs)


def test_the_moe_preset_is_expert_plus_model_parallelism():
  moe = _rules(presets.MOE_STANDARD)
  assert moe == {**_rules(presets.expert_parallel()),
                 **_rules(presets.model_parallel()),
                 **_rules("expert_hidden:model")}
  assert _rules(presets.STANDARD) == {**_rules(presets.DATA_PARALLEL),
                                      **_rules(presets.model_parallel())}


def test_presets_lay_out_on_their_meshes():
  for mesh, layout in [("data:8", presets.DATA_PARALLEL),
                       ("data:4;model:2", presets.STANDARD),
                       ("data:4;model:2", presets.MOE_STANDARD),
                       ("cores:16", presets.expert_parallel("cores")),
                       ("rows:2;cols:4", presets.standard("rows", "cols"))]:
    layout = MeshLayout(mesh, layout)
    assert layout.tensor_layout("batch:8;d_ff:16").dim_axes[0] == (0,)


def test_no_config_or_bench_spells_a_preset_out():
  spelled = {presets.STANDARD, presets.MOE_STANDARD,
             presets.expert_parallel(), presets.expert_parallel("cores")}
  found = []
  for path in sorted([*ROOT.glob("t2t_configs/*.py"), *ROOT.glob("bench/*.py"),
                      *ROOT.glob("meshtf/train/*.py")]):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and node.value in spelled:
        found.append("%s:%d" % (path.relative_to(ROOT), node.lineno))
  assert found == []
