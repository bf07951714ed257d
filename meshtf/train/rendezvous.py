"""Before a multi-worker run starts TensorFlow: the cluster's addresses
are checked and the workers meet.

TensorFlow's own start of a cluster reports badly what goes wrong on a real
one: a port in use is a long traceback naming 0.0.0.0:PORT, and a worker
that never starts is a silent wait that neither Ctrl-C nor SIGTERM ends
(the join waits in C++ holding the interpreter, so no signal handler runs).
So the binary first

1. checks the addresses (`check_addresses`, before any TensorFlow work):
   every host:port once, also after resolving names (localhost:2222 and
   127.0.0.1:2222 are one address); this worker's own name resolving to an
   address of this machine; its port free, bound as given (host:port) and
   on every interface (0.0.0.0:port, where TensorFlow's gRPC server will
   listen);
2. meets the other workers (`meet`) over plain TCP on the same ports: each
   listens on its own host:port, and worker i connects to every worker
   j > i; on each connection the two exchange a greeting (task index, the
   worker list, the mode and the whole config, flattened). It returns once
   it has exchanged greetings with every other worker; each of those has
   then heard from it too, so its port is free for TensorFlow's server.
   While it waits it says for whom (every WAIT_REPORT_SECONDS), Ctrl-C and
   SIGTERM stop it (this is Python, not a C++ wait), and after the deadline
   (config.worker_start_timeout_seconds) it raises ClusterError: one line
   naming each worker not heard from and why (nothing listens there, its
   name does not resolve, no answer, something else answers);
3. compares the greetings (`differences`): the configs, the mode and the
   worker lists must be the same on every worker, else one line on every
   worker names the fields and each task's value, before anything is
   written to model_dir.

Example:
  >>> w = workers.Workers(["127.0.0.1:2222", "127.0.0.1:2223"], 0)
  >>> check_addresses(w)                 # [] or one-line problems
  []
  >>> met = meet(w, greeting(w, config, "train"), 300, print)
  >>> differences(met, w)                # [] when all run the same thing
  []
"""
import errno
import json
import os
import select
import socket
import time

from meshtf.train import errors

PROTOCOL = "meshtf-rendezvous-1"
WAIT_REPORT_SECONDS = 10.0
_RETRY_SECONDS = 0.5       # between two attempts to reach one worker
_EXCHANGE_SECONDS = 10.0   # a connection's greeting, once connected
_MAX_GREETING = 1 << 20


def _split(address):
  name, _, port = address.rpartition(":")
  return name.strip("[]"), int(port)


def _task_flag(workers):
  return ("--task_index=%d" % workers.index if not workers.from_environment
          else "TF_CONFIG's task index %d" % workers.index)


def _resolve(address):
  """The (family, sockaddr) pairs a host:port resolves to; raises
  socket.gaierror / UnicodeError when the name does not resolve."""
  name, port = _split(address)
  out = []
  for family, _, _, _, sockaddr in socket.getaddrinfo(
      name, port, type=socket.SOCK_STREAM):
    if (family, sockaddr[:2]) not in [(f, a[:2]) for f, a in out]:
      out.append((family, sockaddr))
  return out


def _bound(family, sockaddr):
  """A socket bound to sockaddr (SO_REUSEADDR, as gRPC's: a port that a
  previous run's connections keep in TIME_WAIT is free)."""
  sock = socket.socket(family, socket.SOCK_STREAM)
  try:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(sockaddr)
  except BaseException:
    sock.close()
    raise
  return sock


def check_addresses(workers):
  """One-line problems of the worker list for this worker (none for one
  process): an address listed twice once names are resolved, this
  worker's own name not resolving or not an address of this machine, its
  port in use (as given, or on another interface).

  Example:
    >>> check_addresses(Workers(["127.0.0.1:2222", "localhost:2222"], 0))
    ['--worker_hosts: 127.0.0.1:2222 (task 0) and localhost:2222 (task 1)
    are the same address: every worker needs its own host:port']
  """
  if workers is None or workers.num_workers == 1:
    return []
  origin = workers.origin()
  owners = {}
  for i, host in enumerate(workers.hosts):
    try:
      resolved = _resolve(host)
    except (socket.gaierror, UnicodeError, ValueError) as e:
      if i == workers.index:
        return ["this worker's address %s (task %d) does not resolve (%s): "
                "fix the name in %s, or use an IP address%s" % (
                    host, i, _reason(e), workers.source, origin)]
      continue   # a peer's name may resolve only once it is up (Kubernetes)
    for family, sockaddr in resolved:
      owners.setdefault((family, sockaddr[:2]), set()).add(i)
  for tasks in sorted({tuple(sorted(t)) for t in owners.values()
                       if len(t) > 1}):
    return ["%s: %s are the same address: every worker needs its own "
            "host:port%s" % (workers.source, " and ".join(
                "%s (task %d)" % (workers.hosts[t], t) for t in tasks),
                             origin)]
  problem = _own_port_problem(workers)
  return [problem + origin] if problem else []


def _own_port_problem(workers):
  address = workers.address
  _, port = _split(address)
  family, sockaddr = _resolve(address)[0]
  try:
    _bound(family, sockaddr).close()
  except OSError as e:
    return _bind_problem(workers, e, sockaddr)
  if family == socket.AF_INET and sockaddr[0] != "0.0.0.0":
    try:
      _bound(socket.AF_INET, ("0.0.0.0", port)).close()
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        return ("port %d of this worker's address %s (task %d) is in use on "
                "another address of this machine (TensorFlow's gRPC server "
                "listens on every interface, 0.0.0.0:%d): stop what listens "
                "there (ss -ltnp | grep :%d), or give this worker another "
                "port in %s" % (port, address, workers.index, port, port,
                                workers.source))
  return None


def _bind_problem(workers, error, sockaddr):
  address, index = workers.address, workers.index
  _, port = _split(address)
  if error.errno == errno.EADDRINUSE:
    return ("this worker's address %s (task %d) is in use by another "
            "process: stop it (ss -ltnp | grep :%d shows it), or give this "
            "worker another port in %s (the same list on every worker)" % (
                address, index, port, workers.source))
  if error.errno == errno.EADDRNOTAVAIL:
    return ("this worker's address %s (task %d; %s) is not an address of "
            "this machine: run task %d on that host, or fix %s" % (
                address, index, sockaddr[0], index, _task_flag(workers)))
  if error.errno == errno.EACCES:
    return ("this worker's address %s (task %d) needs privileges to bind "
            "(port %d < 1024): use a port of 1024 or more" % (address, index,
                                                             port))
  return "this worker's address %s (task %d) cannot be bound: %s" % (
      address, index, error.strerror or error)


def _reason(error):
  if isinstance(error, socket.gaierror):
    return error.strerror or str(error)
  return str(error) or type(error).__name__


# --- the greeting -------------------------------------------------------------
def greeting(workers, config, mode):
  """What this worker tells the others: its task, the worker list, the
  mode and the config (flattened to dotted keys).

  Example:
    >>> greeting(w, config, "train")["config"]["d_model"]
    32
  """
  return {"protocol": PROTOCOL, "task": workers.index,
          "hosts": list(workers.hosts), "mode": mode,
          "config": _flatten(json.loads(config.to_json())),
          "host": socket.gethostname(), "pid": os.getpid()}


def _flatten(tree, prefix=""):
  out = {}
  for key, value in sorted(tree.items()):
    if isinstance(value, dict):
      out.update(_flatten(value, prefix + key + "."))
    else:
      out[prefix + key] = value
  return out


def differences(greetings, workers):
  """One-line problems when the workers do not run the same thing: a
  worker answering as another task, different worker lists, modes or
  configs (each differing field with every task's value).

  Example:
    >>> differences({0: g0, 1: g1}, w)
    ['the workers were started with different configs: d_model 32 on task
    0, 64 on task 1: ...']
  """
  tasks = sorted(greetings)
  out = []
  for t in tasks:
    if greetings[t].get("task") != t:
      out.append("the worker at %s answered as task %s, not task %d: each "
                 "worker needs its own task index, its place in the list" % (
                     workers.hosts[t], greetings[t].get("task"), t))
  fields = {"worker list": lambda g: g.get("hosts"),
            "mode": lambda g: g.get("mode")}
  for name, get in fields.items():
    by_value = _group(tasks, lambda t: get(greetings[t]))
    if len(by_value) > 1:
      out.append("the workers were started with different %ss: %s: start "
                 "every worker with the same command (only its task index "
                 "differs)" % (name, _values(by_value)))
  keys = sorted(set().union(*[greetings[t].get("config", {}) for t in tasks]))
  differing = []
  for key in keys:
    by_value = _group(tasks, lambda t: greetings[t].get("config", {}).get(
        key, "(missing)"))
    if len(by_value) > 1:
      differing.append("%s %s" % (key, _values(by_value)))
  if differing:
    out.append("the workers were started with different configs: %s: start "
               "every worker with the same --config and flags (only its "
               "task index differs)" % "; ".join(differing))
  return out


def _group(tasks, value_of):
  """[(json value, [tasks])] in the order first seen."""
  groups = []
  for t in tasks:
    value = json.dumps(value_of(t), sort_keys=True)
    for v, members in groups:
      if v == value:
        members.append(t)
        break
    else:
      groups.append((value, [t]))
  return groups


def _values(groups):
  def text(v):
    v = json.loads(v)
    return v if isinstance(v, str) else json.dumps(v)
  return ", ".join("%s on task%s %s" % (
      text(v), "s" if len(m) > 1 else "", ", ".join(str(t) for t in m))
                   for v, m in groups)


# --- meeting ------------------------------------------------------------------
class _Exchange(object):
  """One connection's greeting exchange (non-blocking)."""

  def __init__(self, sock, task, outgoing, data):
    self.sock = sock
    self.task = task          # the peer (None: an incoming one, not read)
    self.outgoing = outgoing  # this worker connected
    self.connected = not outgoing
    self.data = data          # what is left to send
    self.received = b""
    self.started = time.monotonic()

  def close(self):
    try:
      self.sock.close()
    except OSError:
      pass


def meet(workers, mine, timeout_seconds, log, now=time.monotonic):
  """Meets every other worker (see the module docstring); returns
  {task: greeting}, this worker's included. Raises ConfigError when its
  own address cannot be bound, errors.ClusterError when a worker has not
  been heard from after timeout_seconds.

  Example:
    >>> sorted(meet(w, greeting(w, config, "train"), 300, print))
    [0, 1]
  """
  n, me = workers.num_workers, workers.index
  got = {me: mine}
  if n == 1:
    return got
  data = (json.dumps(mine, sort_keys=True) + "\n").encode()
  family, sockaddr = _resolve(workers.address)[0]
  try:
    listener = _bound(family, sockaddr)
  except OSError as e:
    raise errors.ConfigError([_bind_problem(workers, e, sockaddr) +
                              workers.origin()]) from None
  listener.listen(max(n, 8))
  listener.setblocking(False)
  start = now()
  deadline = start + timeout_seconds
  why = {t: "not heard from yet" for t in range(n) if t != me}
  tried = {}
  open_exchanges = []
  log("workers: this is task %d (%s) of %d%s; meeting the others ..." % (
      me, workers.address, n, " (from TF_CONFIG in the environment)"
      if workers.from_environment else ""))
  next_report = start + min(WAIT_REPORT_SECONDS, 3.0)
  try:
    while len(got) < n:
      t = now()
      if t >= deadline:
        raise errors.ClusterError(_not_met_message(
            workers, why, got, timeout_seconds))
      if t >= next_report:
        log("workers: waiting for the others to start (%.0f s of %.0f s, "
            "worker_start_timeout_seconds; Ctrl-C stops): %s" % (
                t - start, timeout_seconds, _missing(workers, why, got)))
        next_report = t + WAIT_REPORT_SECONDS
      for j in range(n):
        busy = any(x.task == j for x in open_exchanges)
        if j == me or j in got or busy or t - tried.get(j, -1e9) < \
            _RETRY_SECONDS:
          continue
        tried[j] = t
        exchange = _connect(workers, j, data if j > me else b"", why)
        if exchange is not None:
          open_exchanges.append(exchange)
      readable = [listener] + [x.sock for x in open_exchanges
                               if x.connected]
      writable = [x.sock for x in open_exchanges if not x.connected]
      r, w, _ = select.select(readable, writable, [],
                              max(0.0, min(0.2, deadline - now())))
      if listener in r:
        try:
          sock, _ = listener.accept()
          sock.setblocking(False)
          open_exchanges.append(_Exchange(sock, None, False, data))
        except (BlockingIOError, InterruptedError):
          pass
      for x in list(open_exchanges):
        done = _step(x, x.sock in r, x.sock in w, got, why, workers, me)
        if done or now() - x.started > _EXCHANGE_SECONDS:
          if not done and x.task is not None and x.task not in got:
            why[x.task] = (
                "something answers at %s but says nothing (not a meshtf "
                "worker of this run?)" % workers.hosts[x.task]
                if x.connected else "no answer (the connection attempt "
                "timed out: its host is down, or a firewall drops the port)")
          x.close()
          open_exchanges.remove(x)
  finally:
    for x in open_exchanges:
      x.close()
    listener.close()
  return got


def _connect(workers, j, data, why):
  """A non-blocking connection to worker j (greeting it when data, else a
  probe that only learns whether it listens), or None with why[j] set."""
  try:
    family, sockaddr = _resolve(workers.hosts[j])[0]
  except (socket.gaierror, UnicodeError, ValueError) as e:
    why[j] = "the name does not resolve (%s)" % _reason(e)
    return None
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setblocking(False)
  code = sock.connect_ex(sockaddr)
  if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
    sock.close()
    why[j] = _connect_reason(code)
    return None
  return _Exchange(sock, j, True, data)


def _connect_reason(code):
  if code == errno.ECONNREFUSED:
    return "nothing listens there (not started yet, or it failed: see its " \
           "output)"
  if code in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
    return "no answer (%s: its host is down, or a firewall drops the " \
           "port)" % os.strerror(code)
  return os.strerror(code)


def _step(x, readable, writable, got, why, workers, me):
  """Advances one exchange; True when it is finished (either way)."""
  if x.outgoing and not x.connected:
    if not writable:
      return False
    code = x.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
      why[x.task] = _connect_reason(code)
      return True
    x.connected = True
    if not x.data:   # a probe of a lower task: it connects to us
      why[x.task] = "listening, but it has not connected to this worker " \
                    "yet"
      return True
    return not _send(x)
  if not readable:
    return False
  try:
    chunk = x.sock.recv(65536)
  except (BlockingIOError, InterruptedError):
    return False
  except OSError:
    chunk = b""
  x.received += chunk
  if not chunk or b"\n" in x.received or len(x.received) > _MAX_GREETING:
    peer = _parse(x.received)
    if peer is None:
      if x.task is not None:
        why[x.task] = ("something else answers at %s (not a meshtf worker "
                       "of this run)" % workers.hosts[x.task])
      return True
    task = peer.get("task") if x.task is None else x.task
    if not isinstance(task, int) or not 0 <= task < workers.num_workers \
        or task == me:
      return True
    got[task] = peer
    if not x.outgoing:
      _send(x)
    return True
  return False


def _send(x):
  """Sends the greeting (a few KB: blocking, bounded); False on failure."""
  try:
    x.sock.settimeout(_EXCHANGE_SECONDS)
    x.sock.sendall(x.data)
    x.sock.setblocking(False)
    return True
  except OSError:
    return False


def _parse(raw):
  try:
    peer = json.loads(raw.split(b"\n", 1)[0].decode("utf-8"))
  except (ValueError, UnicodeError):
    return None
  if not isinstance(peer, dict) or peer.get("protocol") != PROTOCOL:
    return None
  return peer


def _missing(workers, why, got):
  return "; ".join("%s: %s" % (workers.describe(t), why[t])
                   for t in sorted(why) if t not in got)


def _not_met_message(workers, why, got, timeout_seconds):
  missing = [t for t in sorted(why) if t not in got]
  return ("%s did not join within %.0f s (worker_start_timeout_seconds): "
          "%s. Start the same command on every worker, each with its own "
          "task index; nothing was written to model_dir%s" % (
              "worker " + workers.describe(missing[0]) if len(missing) == 1
              else "%d workers" % len(missing), timeout_seconds,
              _missing(workers, why, got), workers.origin()))


__all__ = ["check_addresses", "meet", "greeting", "differences", "PROTOCOL",
           "WAIT_REPORT_SECONDS"]
