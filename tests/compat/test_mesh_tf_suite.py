"""Mesh TensorFlow 0.1.21's own unit tests, run against meshtf through
meshtf.compat (tests/compat/mtf_runner.py; the README's "Porting from Mesh
TensorFlow"). A ratchet: at least PASSED_AT_LEAST of them pass, and every
test that does not pass is listed, with its reason, in known_failures.txt
(a newly failing test fails here; a fixed one should leave the list)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mtf_runner  # noqa: E402  pylint: disable=g-import-not-at-top

PASSED_AT_LEAST = 127

pytestmark = pytest.mark.skipif(
    not mtf_runner.mesh_tf_installed(),
    reason="mesh-tensorflow 0.1.21 is not installed (pip install -e "
           "'.[test]' installs it): its test files are the suite")


def _known_failures():
  with open(os.path.join(HERE, "known_failures.txt")) as f:
    return {mtf_runner.failure_key(line.strip()) for line in f
            if line.strip() and not line.startswith("#")}


def test_mesh_tf_suite_ratchet():
  results = mtf_runner.run_all(jobs=2, timeout=300)
  lines = [mtf_runner.summarize(r) for r in results]
  for line in lines:
    print(line)
  passed = sum(line["passed"] for line in lines)
  failing = [mtf_runner.clean_reason(l) for l in mtf_runner.failures(results)]
  unlisted = [l for l in failing
              if mtf_runner.failure_key(l) not in _known_failures()]
  assert not unlisted, ("Mesh TF tests failing and not in "
                        "tests/compat/known_failures.txt:\n" +
                        "\n".join(unlisted))
  assert passed >= PASSED_AT_LEAST, (
      "%d Mesh TF tests pass, fewer than the %d reached before" % (
          passed, PASSED_AT_LEAST))
