"""The launcher's own bad input (meshtf/train/launch.py): one line, exit 2,
no worker started. Its runs of real workers (a lost worker restarted) are
in test_cluster.py."""
import io
import os

import pytest

from meshtf.train import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LM_TINY = "--config=" + os.path.join(ROOT, "t2t_configs", "lm_tiny.py")


@pytest.mark.parametrize("argv,expected", [
    (["--workers=3", "--", LM_TINY],
     "--workers=3: mesh_shape 'data:4;model:2' has 8 processors, which 3 "
     "workers cannot share equally (each gets the same number, one or "
     "more): use --workers=1, 2, 4 or 8"),
    (["--workers=16", "--", LM_TINY], "use --workers=1, 2, 4 or 8"),
    (["--workers=0", "--", LM_TINY], "--workers=0: start 1 or more workers"),
    (["--", LM_TINY], "the following arguments are required: --workers"),
    (["--workers=2", "--", LM_TINY, "--task_index=1"],
     "--task_index=1: the launcher gives each worker its --worker_hosts and "
     "--task_index: leave them out"),
    (["--workers=2", "--", LM_TINY, "--mode=decode"],
     "--mode=decode runs in one process"),
    (["--workers=2", "--", LM_TINY, "--backend=placement"],
     "backend='placement' cannot span 2 worker processes"),
    (["--workers=2", "--", "--config=nope.py"],
     "--config=nope.py: nope.py does not exist"),
    (["--workers=2", "--", LM_TINY, "--config.d_modle=8"],
     "unknown config key 'd_modle'"),
])
def test_bad_input_is_one_line(argv, expected):
  err = io.StringIO()
  assert launch.main(["launch"] + argv, out=io.StringIO(), err=err) == 2
  lines = err.getvalue().splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith("meshtf.train.launch: error: "), lines
  assert expected in lines[0], lines[0]


def test_the_documented_command_is_valid(monkeypatch):
  """docs/backends.md's launcher command passes the launcher's checks (its
  runs are test_cluster.py's, with fewer steps)."""
  import shlex
  with open(os.path.join(ROOT, "docs", "backends.md")) as f:
    text = f.read()
  start = text.index("python -m meshtf.train.launch --workers=")
  command = text[start:text.index("\n```", start)].replace("\\\n", " ")
  argv = shlex.split(command)[2:]
  options, flags = launch.parse(["launch"] + argv[1:])
  assert options.workers == 4 and options.restarts == 1
  monkeypatch.chdir(ROOT)   # the command's paths are the clone's
  assert launch.check(options.workers, flags) == 8
