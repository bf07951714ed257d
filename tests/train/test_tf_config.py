"""TF_CONFIG for a scheduler's job (meshtf/train/tf_config.py): Slurm's host
lists and tasks, Kubernetes Indexed Jobs, and the recipes docs/backends.md
shows: each command there, run with the variables its scheduler sets, gives
a TF_CONFIG that the binary reads as the intended cluster."""
import io
import json
import pathlib
import re
import shlex

import pytest

from meshtf.train import tf_config
from meshtf.train import workers

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def test_slurm_host_lists_expand():
  assert tf_config.expand_hostlist("node[01-03,07],gpu5") == [
      "node01", "node02", "node03", "node07", "gpu5"]
  assert tf_config.expand_hostlist("rack[1-2]-n[1,3]") == [
      "rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]
  assert tf_config.expand_hostlist("a") == ["a"]
  for bad in ("node[1-", "node[3-1]", "node[x]"):
    with pytest.raises(ValueError):
      tf_config.expand_hostlist(bad)


def test_slurm_tasks_per_node_get_consecutive_ports():
  spec = json.loads(tf_config.slurm({
      "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "4",
      "SLURM_PROCID": "3"}, 2222))
  assert spec == {"cluster": {"worker": ["n1:2222", "n1:2223", "n2:2222",
                                         "n2:2223"]},
                  "task": {"type": "worker", "index": 3}}


def test_a_missing_variable_is_one_line():
  err = io.StringIO()
  assert tf_config.main(["kubernetes", "--job=lm", "--service=lm",
                         "--workers=2"], environ={}, err=err) == 2
  assert err.getvalue() == (
      "meshtf.train.tf_config: error: JOB_COMPLETION_INDEX is not set: run "
      "this inside a pod of an Indexed Job (completionMode: Indexed)\n")


def _recipe_commands(scheduler):
  """The `python -m meshtf.train.tf_config <scheduler> ...` invocations in
  docs/backends.md."""
  text = (ROOT / "docs" / "backends.md").read_text()
  found = re.findall(r"\$\(python -m meshtf\.train\.tf_config (%s[^)]*)\)"
                     % scheduler, text)
  return [shlex.split(f) for f in found]


@pytest.mark.parametrize("scheduler,environ,hosts,index", [
    ("slurm", {"SLURM_JOB_NODELIST": "node[01-04]", "SLURM_NTASKS": "4",
               "SLURM_PROCID": "2"},
     ["node01:2222", "node02:2222", "node03:2222", "node04:2222"], 2),
    ("kubernetes", {"JOB_COMPLETION_INDEX": "1"},
     ["lm-0.lm:2222", "lm-1.lm:2222", "lm-2.lm:2222", "lm-3.lm:2222"], 1),
])
def test_the_documented_recipes_give_the_cluster(scheduler, environ, hosts,
                                                 index):
  commands = _recipe_commands(scheduler)
  assert len(commands) == 1, commands
  out = io.StringIO()
  assert tf_config.main(commands[0], environ=environ, out=out) == 0
  w = workers.from_flags(None, None, {"TF_CONFIG": out.getvalue()})
  assert (w.hosts, w.index, w.source) == (hosts, index, "TF_CONFIG")
  assert w.from_environment
