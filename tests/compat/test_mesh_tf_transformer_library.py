"""Way 2 serves the Mesh TF transformer names that meshtf's own transformer
(way 1) does not carry (the README's difference-table row): Mesh TF
0.1.21's own Unitransformer with GeneralBilinearSelfAttention,
TalkingHeadsSelfAttention, ParallelLayer, sublayer_* functions, sinusoid
positional embeddings and autoregressive_inputs / shift_targets gives the
same loss on two layouts of 8 virtual CPUs
(tests/compat/mtf_transformer_library.py, in its own process)."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mtf_runner  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = mtf_runner.skip_unless_mesh_tf_installed()


def test_mesh_tf_transformer_library_layers_through_way_2():
  out = subprocess.run(
      [sys.executable, os.path.join(HERE, "mtf_transformer_library.py")],
      capture_output=True, text=True, timeout=600, cwd=mtf_runner.ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "legacy mode" not in out.stderr   # the sublayers were used
  lines = [json.loads(l) for l in out.stdout.splitlines()
           if l.startswith("{")]
  runs = [r for r in lines if "layout" in r]
  expected = [r["expected_checksum"] for r in lines
              if "expected_checksum" in r]
  assert len(runs) == 2 and len(expected) == 1, lines
  assert all(np.isfinite(r["loss"]) and r["loss"] > 1.0 for r in runs), runs
  np.testing.assert_allclose(runs[1]["loss"], runs[0]["loss"], rtol=1e-5)
  assert [r["checksum"] for r in runs] == expected * 2, runs
