r"""Runs Mesh TensorFlow 0.1.21's own unit tests against meshtf.

Each test file is imported from the installed `mesh-tensorflow` package
(the optional test extra) in a child process (one per way, running its
files one after the other), after meshtf.compat.install()
made `mesh_tensorflow` resolve to meshtf: way 1 (`install()`: Mesh TF's
core and the library meshtf re-implements are meshtf's) for the core and
transformer_layers tests, way 2 (`install(library=True)`: Mesh TF's own
library modules on meshtf's core) for the library modules meshtf does not
re-implement. Their files are never edited; the only adaptations are
mechanical TF1 -> TF2 ones, made here:
  * the tests run in TF2's default eager mode (their __main__ would call
    tf.disable_v2_behavior(), which TF2 code does not use);
  * `mock` is unittest.mock when the `mock` backport is not installed;
  * 8 virtual CPU devices exist (as in meshtf's own tests).

Usage (prints one JSON line per file, then a summary line):
  python tests/compat/mtf_runner.py [--files=ops_test,layers_test] [-v]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (module under mesh_tensorflow, way): way 1 = "meshtf", 2 = "library".
FILES = [
    ("import_test", "meshtf"),
    ("ops_test", "meshtf"),
    ("layers_test", "meshtf"),
    ("simd_mesh_impl_test", "meshtf"),
    ("utils_test", "meshtf"),
    ("test_utils_test", "meshtf"),
    ("transformer.transformer_layers_test", "meshtf"),
    # First of its process: it enables eager execution at import, which TF
    # allows only before any op has run.
    ("transformer.dataset_test", "library"),
    ("transformer.adaptive_softmax_test", "library"),
    ("transformer.vocab_embeddings_test", "library"),
    ("transformer.memory_layers_test", "library"),
    ("transformer.funnel_transformer_test", "library"),
    ("transformer.learning_rate_schedules_test", "library"),
    ("transformer.utils_test", "library"),
]


def skip_unless_mesh_tf_installed():
  """The pytest mark of the tests that need the `mesh-tensorflow` package."""
  import pytest  # pylint: disable=g-import-not-at-top
  return pytest.mark.skipif(
      not mesh_tf_installed(),
      reason="mesh-tensorflow 0.1.21 is not installed (pip install -e "
             "'.[test]' installs it)")


def mesh_tf_installed():
  """True if the `mesh-tensorflow` package (its test files) is installed."""
  sys.path.insert(0, ROOT)
  try:
    from meshtf import compat  # pylint: disable=g-import-not-at-top
    return compat.installed_package_dir() is not None
  finally:
    sys.path.remove(ROOT)


class _Result(unittest.TestResult):
  """Collects (test id, outcome, reason) for every test."""

  def __init__(self, verbose=False):
    super().__init__()
    self.records = []
    self.verbose = verbose

  def _add(self, test, outcome, reason=""):
    self.records.append((test.id(), outcome, reason))
    if self.verbose:
      print("%-7s %s %s" % (outcome, test.id(), reason[:300]),
            file=sys.stderr, flush=True)

  def addSuccess(self, test):
    self._add(test, "passed")

  def addFailure(self, test, err):
    self._add(test, "failed", _reason(err))

  def addError(self, test, err):
    self._add(test, "error", _reason(err))

  def addSkip(self, test, reason):
    self._add(test, "skipped", reason)

  def addExpectedFailure(self, test, err):
    self._add(test, "passed")

  def addUnexpectedSuccess(self, test):
    self._add(test, "failed", "unexpected success")

  def addSubTest(self, test, subtest, err):
    if err is not None:
      self._add(subtest, "failed", _reason(err))


def _reason(err):
  """One line: the exception's type and message."""
  lines = traceback.format_exception_only(err[0], err[1])
  text = " ".join(line.strip() for line in lines)
  return " ".join(text.split())[:400]


def _adapt_environment():
  """The mechanical TF1 -> TF2 adaptations (see the module docstring)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  try:
    import mock  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    import unittest.mock  # pylint: disable=g-import-not-at-top
    sys.modules["mock"] = unittest.mock


def run_child(modules, way, verbose=False):
  """Runs Mesh TF test files (one way's) in this process, one after the
  other: a list of result dicts, one per file."""
  _adapt_environment()
  sys.path.insert(0, ROOT)
  import meshtf  # pylint: disable=g-import-not-at-top
  from meshtf import compat  # pylint: disable=g-import-not-at-top
  meshtf.virtual_cpu_devices(8)
  compat.install(library=(way == "library"))
  import importlib  # pylint: disable=g-import-not-at-top
  out = []
  for module in modules:
    start = time.time()
    try:
      mod = importlib.import_module("mesh_tensorflow." + module)
    except Exception as e:  # pylint: disable=broad-except
      out.append({"file": module, "way": way, "import_error":
                  _reason((type(e), e, None)), "records": []})
      continue
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    result = _Result(verbose)
    suite.run(result)
    out.append({"file": module, "way": way, "records": result.records,
                "seconds": round(time.time() - start, 1)})
  return out


def run_files(modules, way, timeout=600):
  """Runs one way's files in one child process (TF and meshtf imported
  once); returns their result dicts."""
  cmd = [sys.executable, os.path.abspath(__file__), "--child",
         ",".join(modules), "--way", way]
  broken = lambda why: [{"file": m, "way": way, "records": [],  # noqa: E731
                         "import_error": why} for m in modules]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return broken("timed out after %d s" % timeout)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("[")]
  if not lines:
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return broken("child exited %d: %s" % (proc.returncode, tail))
  return json.loads(lines[-1])


def summarize(result):
  """{'file', 'passed', 'failed', 'error', 'skipped', 'total'}."""
  counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
  for _, outcome, _ in result["records"]:
    counts[outcome] += 1
  line = {"file": result["file"], "way": result["way"]}
  line.update(counts)
  line["total"] = sum(counts.values())
  if result.get("import_error"):
    line["import_error"] = result["import_error"]
  line["seconds"] = result.get("seconds")
  return line


def run_all(files=None, jobs=2, timeout=600):
  """Runs the files (default: all of FILES), one child process per way,
  `jobs` at a time; results in FILES' order."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  ways = {}
  for m, w in FILES:
    if files is None or m in files:
      ways.setdefault(w, []).append(m)
  with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    futures = [pool.submit(run_files, ms, w, timeout)
               for w, ms in ways.items()]
    by_file = {r["file"]: r for f in futures for r in f.result()}
  return [by_file[m] for m, _ in FILES if m in by_file]


def failures(results):
  """'file::test: reason' for every test that did not pass."""
  out = []
  for r in results:
    if r.get("import_error"):
      out.append("%s: import error: %s" % (r["file"], r["import_error"]))
    for test_id, outcome, reason in r["records"]:
      if outcome in ("failed", "error"):
        out.append("%s::%s: %s" % (r["file"], test_id.split(".", 1)[-1],
                                   reason))
  return out


def failure_key(line):
  """'file::test' of a failures() line (its reason dropped)."""
  return line.split(": ", 1)[0]


def clean_reason(line):
  """A failures() line without object addresses (stable across runs)."""
  line = re.sub(r" at 0x[0-9a-f]+", "", line)
  return re.sub(r" id='\d+'", "", line)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--child")
  parser.add_argument("--way", default="meshtf")
  parser.add_argument("--files", default="")
  parser.add_argument("--jobs", type=int, default=2)
  parser.add_argument("--failures", action="store_true",
                      help="also print every failing test and its reason")
  parser.add_argument("-v", action="store_true")
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(run_child(args.child.split(","), args.way, args.v)))
    return 0
  files = set(args.files.split(",")) if args.files else None
  start = time.time()
  results = run_all(files, args.jobs)
  total = {"passed": 0, "total": 0}
  for r in results:
    line = summarize(r)
    total["passed"] += line["passed"]
    total["total"] += line["total"]
    print(json.dumps(line), flush=True)
  total["seconds"] = round(time.time() - start, 1)
  print(json.dumps({"summary": total}))
  if args.failures:
    print("\n".join(clean_reason(l) for l in failures(results)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
