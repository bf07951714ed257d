"""The papers' rows on the plan's estimate path: parameters, per-device
weights and flops per device of one row per table family, against the
paper's numbers (GSPMD's flops implied by its FLOPS utilization x step
time x 61.5 TFLOP/s; parameter counts in its units of 2^30)."""
import os

import pytest

import meshtf.plan  # noqa: F401
from meshtf.lowering import lowering as lowering_lib
from meshtf.plan import accounting
from meshtf.train import config as config_lib
from meshtf.train import experiment

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "t2t_configs")
GIB = 2.0 ** 30
TPUV3_PEAK = 61.5e12


def _counts(name, row, **overrides):
  """(parameters, parameter bytes per device, flops per device)."""
  c = config_lib.load_file(os.path.join(CONFIGS, name + ".py"), row)
  for k, v in overrides.items():
    setattr(c, k, v)
  layout = config_lib.mesh_layout(c)
  graph, _ = experiment.build_training_graph(c, layout)
  graph_layout = layout.assign(lowering_lib.all_operations(graph.operations))
  acc = accounting.account(graph.operations, graph_layout)
  params = sum(v.outputs[0].shape.size for v in graph.trainable_variables)
  return params, acc.memory["parameters"], acc.flops


@pytest.mark.parametrize("row,x,y,step,util", [
    ("64B_8x16", 8, 16, 5.74, 0.627),     # GSPMD Table 2
    ("16B_16x4", 16, 4, 3.10, 0.457)])    # GSPMD Table 3
def test_gspmd_dense_rows(row, x, y, step, util):
  """2D finalized: every weight matrix split over all X * Y devices
  (float32; the norm scales under 0.5%); 32 (64) layers of 2 M H + 4 M N D
  parameters plus the vocabulary; the flops within 3% of those the
  paper's utilization implies."""
  params, per_device, flops = _counts("gspmd_dense", row,
                                      activation_dtype="bfloat16")
  c = config_lib.load_file(os.path.join(CONFIGS, "gspmd_dense.py"), row)
  m, h, n, d = c.d_model, c.d_ff, c.num_heads, c.d_kv
  layers = c.num_layers * (2 * m * h + 4 * m * n * d)
  assert layers < params < layers * 1.02     # + the 32000 x M vocabulary
  assert params / GIB == pytest.approx(float(row.split("B")[0]), rel=0.02)
  assert per_device == pytest.approx(params * 4 / (x * y), rel=0.005)
  assert flops == pytest.approx(util * step * TPUV3_PEAK, rel=0.03)


def test_gspmd_moe_row():
  """GSPMD Table 6, 32 experts: 10 x 2^30 parameters (9.66 with the
  reconstructed dimensions), each core holds its own expert's weights and
  the replicated dense part, flops within 3% of the utilization's."""
  params, per_device, flops = _counts("gspmd_moe", "10B_32E")
  assert params / GIB == pytest.approx(10, rel=0.04)
  expert = 2 * 1536 * 6144 * 16
  dense = params - 32 * expert
  assert per_device == pytest.approx(4 * (dense + expert), rel=0.01)
  assert flops == pytest.approx(0.582 * 0.98 * TPUV3_PEAK, rel=0.03)


def test_gshard_rows_in_units_of_2_30():
  """GShard Table 1, MoE(128E, 12L): 12.5B weights (12.4 x 2^30), the
  experts split one per core."""
  params, per_device, _ = _counts("gshard_moe", "128E_12L")
  assert params / GIB == pytest.approx(12.5, rel=0.02)
  expert = 2 * 1024 * 8192 * 6     # 6 MoE layers of [1024, 8192] x 2
  assert per_device == pytest.approx(4 * (params - 127 * expert), rel=0.01)
