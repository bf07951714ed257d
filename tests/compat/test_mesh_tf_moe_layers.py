"""meshtf's MoE1D / MoE2D layers (way 1) give Mesh TF 0.1.21's own numbers
(its transformer/moe.py run on meshtf's core, way 2): outputs, losses and
gradients w.r.t. the input and every variable, for top-2 (second choices
all / by threshold, second-place loss, z-loss, padding), switch and the
two-level layer, each on two layouts of 8 virtual CPUs
(tests/compat/mtf_moe_layers.py, one process per way)."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mtf_moe_layers  # noqa: E402  pylint: disable=g-import-not-at-top
import mtf_runner  # noqa: E402  pylint: disable=g-import-not-at-top

pytestmark = mtf_runner.skip_unless_mesh_tf_installed()


def test_meshtf_moe_layers_give_mesh_tf_numbers():
  script = os.path.join(HERE, "mtf_moe_layers.py")
  # Both ways at once (two cores).
  procs = {way: subprocess.Popen(
      [sys.executable, script, "--way=%d" % way], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, cwd=mtf_runner.ROOT)
           for way in (1, 2)}
  results = {}
  for way, proc in procs.items():
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    results[way] = {(r["case"], r["layout"]): r["values"] for r in
                    map(json.loads, (l for l in out.splitlines()
                                     if l.startswith("{")))}
  expected = {(case, layout[0]) for case, spec in mtf_moe_layers.CASES.items()
              for layout in mtf_moe_layers.LAYOUTS[spec["layer"]]}
  assert set(results[1]) == set(results[2]) == expected
  for key, mesh_tf in results[2].items():
    ours = results[1][key]
    # Same variables (names and shapes: a Mesh TF checkpoint loads).
    assert sorted(ours) == sorted(mesh_tf), key
    for name, value in mesh_tf.items():
      np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(value),
                                 rtol=1e-5, atol=1e-6,
                                 err_msg="%s %s" % (key, name))
    assert float(mesh_tf["loss"]) > 0, key
    assert any(np.abs(np.asarray(v)).max() > 0 for n, v in mesh_tf.items()
               if n.endswith("gating/kernel")), key
  # Layout-invariant too: both layouts of a case agree.
  for case, spec in mtf_moe_layers.CASES.items():
    first, second = [results[1][(case, layout[0])]
                     for layout in mtf_moe_layers.LAYOUTS[spec["layer"]]]
    for name, value in first.items():
      # Two layouts sum in two orders: the harness's float32 tolerance.
      np.testing.assert_allclose(np.asarray(second[name]), np.asarray(value),
                                 rtol=1e-5, atol=1e-5,
                                 err_msg="%s %s" % (case, name))
