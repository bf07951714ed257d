"""The literal port (way 2 of the README's "Porting from Mesh
TensorFlow"): Mesh TF 0.1.21's own Unitransformer and MoE1D, from its
package, on meshtf's core, train with the same losses on different layouts
of 8 virtual CPUs (tests/compat/mtf_models.py, in its own process)."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mtf_runner  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = mtf_runner.skip_unless_mesh_tf_installed()


def test_mesh_tf_unitransformer_and_moe1d_train_alike_on_every_layout():
  out = subprocess.run([sys.executable, os.path.join(HERE, "mtf_models.py")],
                       capture_output=True, text=True, timeout=600,
                       cwd=mtf_runner.ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  runs = [json.loads(l) for l in out.stdout.splitlines()
          if l.startswith("{")]
  for model in ("dense", "moe"):
    losses = [r["losses"] for r in runs if r["model"] == model]
    assert len(losses) == (3 if model == "dense" else 2), runs
    # Training moves: three SGD steps lower the loss.
    assert losses[0][-1] < losses[0][0] - 0.3, losses
    for other in losses[1:]:
      np.testing.assert_allclose(other, losses[0], rtol=1e-5)
