"""The workers' meeting before TensorFlow starts (meshtf/train/rendezvous.py):
address checks, the greeting exchange on real 127.0.0.1 sockets (threads of
this process stand in for the workers), its deadline and its comparison of
the workers' configs. The binary's use of it is in test_cluster.py."""
import socket
import threading

import pytest
from conftest import free_ports

from meshtf.train import config as config_lib
from meshtf.train import errors
from meshtf.train import rendezvous
from meshtf.train import workers as workers_lib


def _hosts(n):
  return ["127.0.0.1:%d" % p for p in free_ports(n)]


def _meet_all(hosts, configs, timeout=20.0, skip=()):
  results, failures = {}, {}

  def one(i):
    w = workers_lib.Workers(hosts, i)
    try:
      results[i] = rendezvous.meet(
          w, rendezvous.greeting(w, configs[i], "train"), timeout,
          lambda line: None)
    except Exception as e:  # pylint: disable=broad-except
      failures[i] = e
  threads = [threading.Thread(target=one, args=(i,)) for i in
             range(len(hosts)) if i not in skip]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout + 10)
  return results, failures


def test_workers_meet_and_exchange_configs():
  hosts = _hosts(3)
  configs = [config_lib.default_config() for _ in hosts]
  results, failures = _meet_all(hosts, configs)
  assert failures == {}
  for i in range(3):
    assert sorted(results[i]) == [0, 1, 2]
    assert rendezvous.differences(results[i],
                                  workers_lib.Workers(hosts, i)) == []
  # After meeting, every port is free again for TensorFlow's server.
  for h in hosts:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(h.rsplit(":", 1)[1])))
    s.close()


def test_different_configs_are_one_line_naming_the_fields():
  hosts = _hosts(2)
  configs = [config_lib.default_config() for _ in hosts]
  configs[1].d_model = 64
  configs[1].train_steps = 30
  results, failures = _meet_all(hosts, configs)
  assert failures == {}
  got = rendezvous.differences(results[1], workers_lib.Workers(hosts, 1))
  assert len(got) == 1, got
  assert ("different configs: d_model 32 on task 0, 64 on task 1; "
          "train_steps 500 on task 0, 30 on task 1") in got[0], got[0]


def test_a_worker_that_never_starts_is_named_after_the_deadline():
  hosts = _hosts(3)
  configs = [config_lib.default_config() for _ in hosts]
  results, failures = _meet_all(hosts, configs, timeout=1.5, skip=(2,))
  assert sorted(failures) == [0, 1] and results == {}
  for i in (0, 1):
    assert isinstance(failures[i], errors.ClusterError)
    text = str(failures[i])
    assert ("worker task 2 (%s) did not join within 2 s" % hosts[2]) in text
    assert "nothing listens there" in text and "\n" not in text


def test_address_checks():
  hosts = _hosts(2)
  w = workers_lib.Workers(hosts, 0)
  assert rendezvous.check_addresses(w) == []
  port = int(hosts[1].rsplit(":", 1)[1])
  same = workers_lib.Workers([hosts[0], "localhost:%s" % hosts[0].rsplit(
      ":", 1)[1]], 1)
  got = rendezvous.check_addresses(same)
  assert len(got) == 1 and "are the same address" in got[0], got
  busy = socket.socket()
  busy.bind(("127.0.0.1", port))
  busy.listen(1)
  try:
    got = rendezvous.check_addresses(workers_lib.Workers(hosts, 1))
    assert len(got) == 1 and ("this worker's address %s (task 1) is in use"
                              % hosts[1]) in got[0], got
    # The same through the meeting itself (bound as given).
    with pytest.raises(errors.ConfigError) as e:
      rendezvous.meet(workers_lib.Workers(hosts, 1), {}, 1, print)
    assert "is in use" in str(e.value)
  finally:
    busy.close()
  got = rendezvous.check_addresses(workers_lib.Workers(
      ["127.0.0.1:1", "no-such-host.invalid:2222"], 1, "TF_CONFIG"))
  assert len(got) == 1 and "does not resolve" in got[0], got
  assert "the 2 workers come from the TF_CONFIG environment variable" \
      in got[0]
  got = rendezvous.check_addresses(workers_lib.Workers(
      ["192.0.2.1:2222", "127.0.0.1:1"], 0))
  assert len(got) == 1 and "is not an address of this machine" in got[0] \
      and "--task_index=0" in got[0], got


def test_why_a_worker_is_missing_is_named():
  """A peer whose name does not resolve (a Kubernetes pod not up yet) and
  one on an address no route leads to are named with why."""
  me = _hosts(1)[0]
  w = workers_lib.Workers([me, "no-such-host.invalid:2222",
                           "192.0.2.1:2222"], 0)
  with pytest.raises(errors.ClusterError) as e:
    rendezvous.meet(w, rendezvous.greeting(w, config_lib.default_config(),
                                           "train"), 1.5, lambda line: None)
  text = str(e.value)
  assert text.startswith("2 workers did not join within 2 s")
  assert "task 1 (no-such-host.invalid:2222): the name does not resolve" \
      in text
  assert "task 2 (192.0.2.1:2222): " in text and "\n" not in text
