"""Multi-worker runs of the training binary: several processes, one mesh.

Start the same command on every host with its own --task_index:

  python -m meshtf.train --worker_hosts=10.0.0.1:2222,10.0.0.2:2222 \\
      --task_index=0 --mesh_shape=data:4;model:2 ...

(or set TF_CONFIG, as for tf.distribute, and leave the flags out; a
TF_CONFIG taken from the environment is named in the header and in every
error it causes, since one left over from another job would otherwise
silently make a one-process run a worker of a cluster). Each
worker runs the mesh's SPMD program on its own devices (mesh size / number
of workers of them; --num_virtual_cpus counts the whole mesh's) and
collectives cross processes. Each worker makes or reads only its share of
every batch: the rows its processors hold (mtf.host_rows). Task 0, the
chief, writes checkpoints, metrics and summaries; every worker restores from
the same model_dir, so it must be on a filesystem all workers see.

Example:
  >>> w = from_flags("127.0.0.1:2222,127.0.0.1:2223", 1)
  >>> w.num_workers, w.index, w.is_chief
  (2, 1, False)
"""
import collections
import json
import os

from meshtf.train import config as config_lib

MODES = ("train", "eval")


class Workers(collections.namedtuple("Workers",
                                     ["hosts", "index", "source"])):
  """The cluster: worker addresses (host:port), this process's index and
  where they came from ("--worker_hosts" or "TF_CONFIG")."""

  def __new__(cls, hosts, index, source="--worker_hosts"):
    return super().__new__(cls, list(hosts), int(index), source)

  @property
  def num_workers(self):
    return len(self.hosts)

  @property
  def is_chief(self):
    return self.index == 0

  @property
  def address(self):
    """This worker's host:port."""
    return self.hosts[self.index]

  def describe(self, task):
    """'task 1 (127.0.0.1:2223)': a worker as the one-line errors name it.

    Example:
      >>> Workers(["a:1", "b:2"], 0).describe(1)
      'task 1 (b:2)'
    """
    return "task %d (%s)" % (task, self.hosts[task])

  @property
  def from_environment(self):
    """True when the cluster came from the TF_CONFIG environment variable
    (not from this command's flags)."""
    return self.source == "TF_CONFIG"

  def origin(self):
    """Where the cluster came from, for the one-line errors it causes:
    '' for flags, else a clause naming TF_CONFIG and how to run alone.

    Example:
      >>> Workers(["a:1", "b:2"], 0, "TF_CONFIG").origin()[:51]
      ' (the 2 workers come from the TF_CONFIG environment'
    """
    if not self.from_environment:
      return ""
    return (" (the %d workers come from the TF_CONFIG environment variable:"
            " unset TF_CONFIG to run one process)" % self.num_workers)


def from_flags(worker_hosts, task_index, environ=None):
  """Workers from --worker_hosts/--task_index, else from TF_CONFIG, else
  None (one process). Raises ConfigError on a malformed cluster.

  Example:
    >>> from_flags("", None, {"TF_CONFIG": tf_config}).hosts
    ['10.0.0.1:2222', '10.0.0.2:2222']
  """
  environ = os.environ if environ is None else environ
  if worker_hosts:
    hosts = [h.strip() for h in str(worker_hosts).split(",") if h.strip()]
    index = task_index
    source = "--worker_hosts"
    if index is None:
      raise config_lib.ConfigError([
          "--worker_hosts names %d workers but --task_index is missing: pass"
          " --task_index=0..%d, this process's place in the list" % (
              len(hosts), len(hosts) - 1)])
  elif environ.get("TF_CONFIG"):
    source = "TF_CONFIG"
    try:
      spec = json.loads(environ["TF_CONFIG"])
      hosts = list(spec["cluster"]["worker"])
      index = int(spec["task"]["index"])
      if spec["task"].get("type", "worker") != "worker":
        raise ValueError("task type %r is not 'worker'" % spec["task"]["type"])
    except (ValueError, KeyError, TypeError) as e:
      raise config_lib.ConfigError([
          "TF_CONFIG is not a worker cluster (%s): set it to "
          '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": '
          '"worker", "index": i}} or pass --worker_hosts and --task_index'
          % str(e).splitlines()[0]]) from None
  else:
    if task_index is not None:
      raise config_lib.ConfigError([
          "--task_index=%d without --worker_hosts: pass the workers' "
          "host:port list too" % task_index])
    return None
  bad = [h for h in hosts if not _is_address(h)]
  if bad:
    raise config_lib.ConfigError([
        "%s: %r is not host:port: list every worker as host:port, e.g. "
        "--worker_hosts=10.0.0.1:2222,10.0.0.2:2222" % (source, bad[0])])
  if not hosts or not 0 <= index < len(hosts):
    raise config_lib.ConfigError([
        "%s: task index %s is not a worker of the %d listed: use 0..%d" % (
            source, index, len(hosts), max(len(hosts) - 1, 0))])
  seen = {}
  for i, h in enumerate(hosts):
    if h in seen:
      raise config_lib.ConfigError([
          "%s lists %s twice (tasks %d and %d): every worker needs its own "
          "host:port" % (source, h, seen[h], i)])
    seen[h] = i
  return Workers(hosts, int(index), source)


def _is_address(host):
  name, _, port = host.rpartition(":")
  return bool(name) and port.isdigit()


def problems(config, mesh_layout, workers, mode):
  """One-line problems of running config (with its MeshLayout) as `mode`
  on these workers (none for one process): the backend, the mesh's split
  over the workers and the mode."""
  if workers is None or workers.num_workers == 1:
    return []
  out = []
  n = workers.num_workers
  if mode not in MODES:
    out.append("--mode=%s runs in one process (it reads the layout-free "
               "checkpoint); multi-worker runs do %s: drop --worker_hosts / "
               "TF_CONFIG" % (mode, " and ".join(MODES)))
  if config.backend != "simd":
    out.append("backend=%r cannot span %d worker processes: use "
               "--backend=simd" % (config.backend, n))
  size = mesh_layout.size
  if size % n:
    out.append("mesh_shape %r has %d processors, which %d workers cannot "
               "share equally: use a mesh whose size is a multiple of %d" % (
                   config.mesh_shape, size, n, n))
  return [line + workers.origin() for line in out]


def start(mesh_layout, workers, peer_timeout_seconds=None,
          register_timeout_seconds=None):
  """Joins the cluster (before any other TensorFlow work in the process)
  and returns the mesh's devices, worker-major. peer_timeout_seconds: a
  worker whose heartbeats stop for this long (its process ended or is
  stopped, its host unreachable) fails every other worker's collectives;
  register_timeout_seconds: how long TensorFlow waits for every worker
  to join (the rendezvous before it already met them all)."""
  import meshtf as mtf
  from meshtf.lowering import cluster
  size = mesh_layout.size
  os.environ["TF_CONFIG"] = cluster.tf_config(workers.hosts, workers.index)
  info = mtf.start_multi_worker(
      num_virtual_cpus=size // workers.num_workers,
      heartbeat_timeout_seconds=peer_timeout_seconds,
      register_timeout_seconds=register_timeout_seconds)
  return info.devices


__all__ = ["Workers", "from_flags", "problems", "start", "MODES"]
