"""Two worker processes on 127.0.0.1, 4 virtual CPUs each, form one 8-device
mesh; training matches the single-process run."""
import json
import os
import subprocess
import sys

import numpy as np

import harness
from conftest import free_ports
from meshtf.examples import two_layer

SCRIPT = os.path.join(os.path.dirname(__file__), "multi_worker_main.py")


def test_two_workers_form_one_mesh():
  ports = ",".join(str(p) for p in free_ports(2))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  procs = [subprocess.Popen([sys.executable, SCRIPT, str(t), ports, "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env) for t in range(2)]
  results = {}
  try:
    for t, p in enumerate(procs):
      out, err = p.communicate(timeout=480)
      assert p.returncode == 0, err[-3000:]
      line = [l for l in out.splitlines() if l.startswith("RESULT ")][0]
      results[t] = json.loads(line[len("RESULT "):])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  # Each worker ran its own four processors and read only its rows.
  assert results[0]["local"] == [0, 1, 2, 3]
  assert results[1]["local"] == [4, 5, 6, 7]
  assert {r[0] for r in results[0]["rows_read"]} == {0}
  assert {r[0] for r in results[1]["rows_read"]} == {8}
  # The same numbers as one process with 8 devices.
  single, step = two_layer.train("rows:2;cols:4", "batch:rows;hidden:cols",
                                 16, 8, 32, 3, 0.5, harness.DEVICES, seed=0,
                                 log=lambda s: None, backend="simd")
  for t in range(2):
    np.testing.assert_allclose(results[t]["losses"][:3], single, rtol=1e-5)
    np.testing.assert_allclose(np.array(results[t]["w"]),
                               step.variable_value("w"), rtol=1e-5,
                               atol=1e-6)
    # All variables gathered by one program, and by it again after a step:
    # what gathering each variable alone gives.
    assert results[t]["all_first_w"] == results[t]["w"]
    assert results[t]["all_again"]["w"] == results[t]["w_again"]
    assert results[t]["w_again"] != results[t]["w"]   # the step changed it
