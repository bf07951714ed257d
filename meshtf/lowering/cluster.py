"""Multi-worker meshes: several processes (hosts) form one mesh.

Every worker process runs the same program. `start_multi_worker` joins the
cluster described by TF_CONFIG (or a cluster resolver), starts TensorFlow's
collective runtime, and returns the device names of the whole mesh in
worker-major order. Give them to SimdMeshImpl: each worker then launches the
per-device program on its own devices only, and collectives cross processes.

Example (run in each worker process, TF_CONFIG set per worker):
  >>> worker = mtf.start_multi_worker(num_virtual_cpus=4)
  >>> impl = mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
  ...                         worker.devices)
"""
import collections
import copy
import json
import os

import tensorflow as tf

WorkerInfo = collections.namedtuple(
    "WorkerInfo", ["task_id", "num_workers", "devices", "local_devices"])

_LOCAL_JOB_TASK = [None]


def local_job_and_task():
  """(job, task) of this process once start_multi_worker ran, else None."""
  return _LOCAL_JOB_TASK[0]


def start_multi_worker(cluster_resolver=None, num_virtual_cpus=None,
                       device_type="CPU", job_name="worker",
                       heartbeat_timeout_seconds=None,
                       register_timeout_seconds=None):
  """Joins the cluster and enables cross-process collectives.

  Must run before any other TensorFlow work in the process.

  Args:
    cluster_resolver: a tf.distribute.cluster_resolver.ClusterResolver;
      default reads TF_CONFIG ({"cluster": {"worker": [...]}, "task":
      {"type": "worker", "index": i}}).
    num_virtual_cpus: split this host's CPU into that many devices (tests).
    device_type: "CPU" or "GPU": the per-worker devices of the mesh.
    heartbeat_timeout_seconds: a worker whose heartbeats to the
      coordination service (on task 0) stop for this long is declared
      lost, and every other worker's collectives fail with UNAVAILABLE
      (None: TensorFlow's default, 10 s). A worker that exits closes its
      connections and fails its peers' collectives at once; this bound is
      for a stopped process or an unreachable host.
    register_timeout_seconds: how long joining waits for every worker to
      join (None: TensorFlow's default, an hour).
  Returns:
    WorkerInfo(task_id, num_workers, devices (the whole mesh, worker-major),
    local_devices).
  """
  from tensorflow.core.protobuf import tensorflow_server_pb2
  from tensorflow.python.eager import context
  try:
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
  except ImportError:  # older layouts of the TensorFlow package
    from tensorflow.tsl.protobuf import coordination_config_pb2

  if cluster_resolver is None:
    if "TF_CONFIG" not in os.environ:
      raise ValueError("start_multi_worker needs TF_CONFIG (or a "
                       "cluster_resolver) describing the workers")
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  spec = cluster_resolver.cluster_spec()
  task_type = cluster_resolver.task_type or job_name
  task_id = int(cluster_resolver.task_id or 0)
  num_workers = spec.num_tasks(task_type)
  leader = "/job:%s/replica:0/task:0" % task_type

  if num_virtual_cpus:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_virtual_cpus)
    tf.config.threading.set_inter_op_parallelism_threads(
        max(16, 4 * num_virtual_cpus))
  ctx = context.context()
  ctx.configure_collective_ops(
      collective_leader=leader,
      device_filters=("/job:%s/task:%d" % (task_type, task_id),))
  ctx.configure_coordination_service(
      service_type="standalone", service_leader=leader,
      heartbeat_timeout_in_ms=int(1000 * (heartbeat_timeout_seconds or 0)),
      cluster_register_timeout_in_ms=int(
          1000 * (register_timeout_seconds or 0)),
      coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
          name=task_type, num_tasks=num_workers)])
  if register_timeout_seconds:
    # Without the barrier a missing worker is waited for forever (the
    # timeout alone did not end the wait, measured on TF 2.21): with it
    # the join fails with DeadlineExceeded after the timeout.
    ctx.coordination_service.cluster_register_with_barrier = True
  config = copy.deepcopy(ctx.config)
  # The group leader resolves collective groups that span workers; the
  # device filter keeps each worker from waiting on the others' devices.
  config.experimental.collective_group_leader = leader
  del config.device_filters[:]
  config.device_filters.append("/job:%s/task:%d" % (task_type, task_id))
  address = spec.task_address(task_type, task_id)
  server_def = tensorflow_server_pb2.ServerDef(
      cluster=spec.as_cluster_def(), default_session_config=config,
      job_name=task_type, task_index=task_id, protocol="grpc",
      port=int(address.rsplit(":", 1)[1]))
  ctx.enable_collective_ops(server_def)
  ctx.ensure_initialized()
  _LOCAL_JOB_TASK[0] = (task_type, task_id)
  local = [d.name for d in tf.config.list_logical_devices(device_type)
           if tf.DeviceSpec.from_string(d.name).task == task_id
           and tf.DeviceSpec.from_string(d.name).job == task_type]
  per_worker = len(local)
  devices = ["/job:%s/replica:0/task:%d/device:%s:%d" % (task_type, t,
                                                         device_type, i)
             for t in range(num_workers) for i in range(per_worker)]
  return WorkerInfo(task_id, num_workers, devices, local)


def tf_config(worker_addresses, index):
  """The TF_CONFIG string for worker `index` of a worker-only cluster.

  Example:
    >>> tf_config(["127.0.0.1:2222", "127.0.0.1:2223"], 1)[:30]
    '{"cluster": {"worker": ["127.0'
  """
  return json.dumps({"cluster": {"worker": list(worker_addresses)},
                     "task": {"type": "worker", "index": index}})
