"""The binary's cluster settings (meshtf/train/workers.py): --worker_hosts /
--task_index or TF_CONFIG, and the checks made before any TensorFlow work.
The real two-process run is in test_main.py."""
import json

import pytest

from meshtf.train import config as config_lib
from meshtf.train import workers


def test_flags_and_tf_config():
  w = workers.from_flags("127.0.0.1:2222, 127.0.0.1:2223", 1, environ={})
  assert (w.hosts, w.index, w.num_workers, w.is_chief) == (
      ["127.0.0.1:2222", "127.0.0.1:2223"], 1, 2, False)
  assert workers.from_flags(None, None, environ={}) is None
  tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]},
                          "task": {"type": "worker", "index": 0}})
  w = workers.from_flags(None, None, environ={"TF_CONFIG": tf_config})
  assert w.hosts == ["a:1", "b:2", "c:3"] and w.is_chief
  # Flags win over TF_CONFIG.
  w = workers.from_flags("x:1,y:2", 1, environ={"TF_CONFIG": tf_config})
  assert w.hosts == ["x:1", "y:2"] and w.index == 1


@pytest.mark.parametrize("hosts,index,environ,expected", [
    ("a:1,b:2", None, {}, "--task_index is missing: pass --task_index=0..1"),
    ("a:1,b:2", 2, {}, "task index 2 is not a worker of the 2 listed: use "
     "0..1"),
    ("a:1,b", 0, {}, "'b' is not host:port"),
    (None, 1, {}, "--task_index=1 without --worker_hosts"),
    (None, None, {"TF_CONFIG": "{not json"}, "TF_CONFIG is not a worker "
     "cluster"),
    (None, None, {"TF_CONFIG": json.dumps({"cluster": {"ps": ["a:1"]},
                                           "task": {"index": 0}})},
     "TF_CONFIG is not a worker cluster ('worker')"),
])
def test_bad_cluster_is_one_line(hosts, index, environ, expected):
  with pytest.raises(config_lib.ConfigError) as e:
    workers.from_flags(hosts, index, environ=environ)
  assert expected in str(e.value) and len(str(e.value).splitlines()) == 1


def test_problems_before_any_tensorflow_work():
  c = config_lib.default_config()       # data:4;model:2, simd
  two = workers.Workers(["a:1", "b:2"], 0)
  layout = config_lib.mesh_layout(c)
  assert workers.problems(c, layout, two, "train") == []
  assert workers.problems(c, layout, None, "decode") == []
  three = workers.Workers(["a:1", "b:2", "c:3"], 0)
  c.backend = "placement"
  got = workers.problems(c, layout, three, "decode")
  assert len(got) == 3
  assert "--mode=decode runs in one process" in got[0]
  assert "backend='placement' cannot span 3 worker processes" in got[1]
  assert "has 8 processors, which 3 workers cannot share equally" in got[2]


def test_a_tf_config_from_the_environment_is_named_in_its_errors(
    monkeypatch):
  """A TF_CONFIG left over from another job makes a one-process run a
  worker of its cluster: the error it causes says where it came from."""
  import io
  from meshtf.train import main
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["a:1", "b:2", "c:3"]},
      "task": {"type": "worker", "index": 0}}))
  err = io.StringIO()
  code = main.run_command(["meshtf.train", "--mesh_shape=data:4;model:2"],
                          out=io.StringIO(), err=err)
  assert code == 2
  lines = err.getvalue().splitlines()
  assert len(lines) == 1, lines
  assert "which 3 workers cannot share equally" in lines[0]
  assert lines[0].endswith("(the 3 workers come from the TF_CONFIG "
                           "environment variable: unset TF_CONFIG to run one "
                           "process)"), lines[0]


def test_an_address_listed_twice_is_one_line():
  with pytest.raises(config_lib.ConfigError) as e:
    workers.from_flags("a:1,b:2,a:1", 0, environ={})
  assert str(e.value) == ("--worker_hosts lists a:1 twice (tasks 0 and 2): "
                          "every worker needs its own host:port")
