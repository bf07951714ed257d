"""Multi-worker runs of the training binary: several processes, one mesh.

Start the same command on every host with its own --task_index:

  python -m meshtf.train --worker_hosts=10.0.0.1:2222,10.0.0.2:2222 \\
      --task_index=0 --mesh_shape=data:4;model:2 ...

(or set TF_CONFIG, as for tf.distribute, and leave the flags out). Each
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


class Workers(collections.namedtuple("Workers", ["hosts", "index"])):
  """The cluster: worker addresses (host:port) and this process's index."""

  @property
  def num_workers(self):
    return len(self.hosts)

  @property
  def is_chief(self):
    return self.index == 0


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
  return Workers(hosts, int(index))


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
  return out


def start(mesh_layout, workers):
  """Joins the cluster (before any other TensorFlow work in the process)
  and returns the mesh's devices, worker-major."""
  import meshtf as mtf
  from meshtf.lowering import cluster
  size = mesh_layout.size
  os.environ["TF_CONFIG"] = cluster.tf_config(workers.hosts, workers.index)
  info = mtf.start_multi_worker(num_virtual_cpus=size // workers.num_workers)
  return info.devices


__all__ = ["Workers", "from_flags", "problems", "start", "MODES"]
