"""The lost-worker line's linger (meshtf/train/peers.py), before any
TensorFlow cluster: a worker's health is then whether anything listens on
its port. Real multi-worker faults are test_cluster.py's."""
import socket
import threading
import time

from meshtf.train import peers
from meshtf.train import workers as workers_lib


def _listening():
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  s.listen(4)
  return s, "127.0.0.1:%d" % s.getsockname()[1]


def test_a_survivor_lingers_while_another_survivor_runs(monkeypatch):
  """Task 0 named task 2 lost; task 1 still answers, so task 0 keeps
  answering too until task 1 has exited (a later check of task 1's would
  otherwise find task 0 gone and name it lost as well)."""
  monkeypatch.setattr(peers, "LINGER_SECONDS", 0.2)
  other, other_host = _listening()
  gone, gone_host = _listening()
  gone.close()
  workers = workers_lib.Workers(["127.0.0.1:1", other_host, gone_host], 0)
  closed_at = []

  def exit_later():
    time.sleep(1.5)
    closed_at.append(time.monotonic())
    other.close()
  threading.Thread(target=exit_later, daemon=True).start()
  start = time.monotonic()
  peers.linger(workers, {2: "its process is gone"}, start + 30,
               poll_seconds=0.1)
  assert closed_at and time.monotonic() >= closed_at[0]   # not before
  assert time.monotonic() - start < 30   # not until the bound either


def test_a_survivor_lingers_at_most_until_the_bound(monkeypatch):
  monkeypatch.setattr(peers, "LINGER_SECONDS", 0.2)
  other, other_host = _listening()
  try:
    workers = workers_lib.Workers(["127.0.0.1:1", other_host], 0)
    start = time.monotonic()
    peers.linger(workers, {}, start + 1.0, poll_seconds=0.1)
    assert time.monotonic() >= start + 1.0
  finally:
    other.close()


def test_alone_a_survivor_lingers_linger_seconds(monkeypatch):
  monkeypatch.setattr(peers, "LINGER_SECONDS", 0.5)
  workers = workers_lib.Workers(["127.0.0.1:1", "127.0.0.1:2"], 0)
  start = time.monotonic()
  peers.linger(workers, {1: "its process is gone"}, start + 30,
               poll_seconds=0.1)
  assert 0.5 <= time.monotonic() - start < 30
