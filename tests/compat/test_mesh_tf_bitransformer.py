"""Mesh TensorFlow model code as its users wrote it (way 2 of the README's
"Porting from Mesh TensorFlow"): Mesh TF 0.1.21's own Bitransformer, built
from the defaults.gin shipped in its package with T5's default layout rules
(which name mesh axes "ensemble" and "model" that some meshes lack), trained
3 steps with Mesh TF's own AdafactorOptimizer and Noam learning-rate
schedule (tf.Tensors of the global step, mixed into meshtf arithmetic) on one
device, "batch:8" and "model:4,batch:2": equal losses, equal greedy decodes
(tests/compat/mtf_bitransformer.py, in its own process)."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mtf_runner  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = mtf_runner.skip_unless_mesh_tf_installed()
T5_RULES = ("ensemble:ensemble,batch:batch,d_ff:model,heads:model,"
            "vocab:model,experts:batch")


def test_mesh_tf_bitransformer_from_defaults_gin_trains_and_decodes_alike():
  out = subprocess.run(
      [sys.executable, os.path.join(HERE, "mtf_bitransformer.py")],
      capture_output=True, text=True, timeout=900, cwd=mtf_runner.ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [json.loads(l) for l in out.stdout.splitlines()
           if l.startswith("{")]
  # Under compat.install() every Mesh TF entry point leaves a rule naming an
  # absent mesh axis inactive; meshtf's own MeshLayout refuses it.
  semantics = lines[0]["install_semantics"]
  assert semantics.pop("meshtf.MeshLayout") == "LayoutError", semantics
  assert set(semantics.values()) == {"batch:batch"}, semantics
  runs = {r["mesh"]: r for r in lines[1:]}
  assert sorted(runs) == ["", "batch:8", "model:4,batch:2"], runs.keys()
  assert all(r["rules"] == T5_RULES for r in runs.values())   # from gin
  # One warning per mesh lacking an axis, naming the inactive rules.
  warned = [l for l in out.stderr.splitlines()
            if "InactiveLayoutRuleWarning" in l and "'ensemble:ensemble'" in l]
  assert len(warned) == 3, warned
  assert any("mesh 'batch:8'" in l and "'d_ff:model'" in l for l in warned)
  one = runs[""]
  # Training moves: Adafactor at the scheduled rate lowers the loss.
  assert one["losses"][-1] < one["losses"][0] - 0.05, one["losses"]
  decodes = np.array(one["decodes"])
  assert decodes.shape == (8, 8) and decodes.min() >= 0, decodes
  for mesh in ("batch:8", "model:4,batch:2"):
    np.testing.assert_allclose(runs[mesh]["losses"], one["losses"],
                               rtol=1e-5, err_msg=mesh)
    assert runs[mesh]["decodes"] == one["decodes"], mesh
