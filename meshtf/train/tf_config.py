"""`python -m meshtf.train.tf_config`: the TF_CONFIG of this task of a
scheduler's job, for multi-worker runs of the binary (docs/backends.md has
the Slurm and Kubernetes recipes that use it).

  python -m meshtf.train.tf_config slurm --port=2222
  python -m meshtf.train.tf_config kubernetes --job=lm --service=lm \\
      --workers=4 --port=2222

slurm       the workers are the job step's tasks: its node list
            (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, in Slurm's
            compressed form, e.g. node[01-04]) with SLURM_NTASKS tasks
            spread evenly over the nodes in block order (Slurm's default:
            consecutive ranks on one node, each on its own port from
            --port on); this task is SLURM_PROCID.
kubernetes  an Indexed Job whose pods have the headless Service --service
            as their subdomain: pod i is <job>-<i>.<service>; this task is
            JOB_COMPLETION_INDEX.

It prints one line of JSON, or one error line naming the missing variable
(exit 2).

Example:
  >>> slurm({"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_PROCID": "1",
  ...        "SLURM_NTASKS": "2"}, 2222)[:50]
  '{"cluster": {"worker": ["node01:2222", "node02:2222'
"""
import argparse
import json
import os
import re
import sys

from meshtf.train import errors


def expand_hostlist(text):
  """Slurm's compressed host list as names: 'node[01-03,07],gpu5' ->
  ['node01', 'node02', 'node03', 'node07', 'gpu5'] (zero padding kept;
  several bracket groups in one name expand as a product).

  Example:
    >>> expand_hostlist("rack[1-2]-n[1,3]")
    ['rack1-n1', 'rack1-n3', 'rack2-n1', 'rack2-n3']
  """
  out = []
  for item in _top_level_split(text.strip()):
    out.extend(_expand_one(item))
  return out


def _top_level_split(text):
  items, depth, current = [], 0, ""
  for ch in text:
    if ch == "," and depth == 0:
      items.append(current)
      current = ""
      continue
    depth += {"[": 1, "]": -1}.get(ch, 0)
    if depth < 0:
      raise ValueError("unbalanced ']' in host list %r" % text)
    current += ch
  if depth:
    raise ValueError("unbalanced '[' in host list %r" % text)
  items.append(current)
  return [i for i in (x.strip() for x in items) if i]


def _expand_one(item):
  m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
  if not m:
    return [item]
  prefix, ranges, rest = m.groups()
  names = []
  for part in ranges.split(","):
    part = part.strip()
    if "-" in part:
      low, high = part.split("-", 1)
      if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
        raise ValueError("bad range %r in host list %r" % (part, item))
      width = len(low)
      names.extend("%0*d" % (width, v) for v in range(int(low),
                                                      int(high) + 1))
    elif part.isdigit():
      names.append(part)
    else:
      raise ValueError("bad entry %r in host list %r" % (part, item))
  return [prefix + n + tail for n in names for tail in _expand_one(rest)]


def _dump(hosts, index):
  return json.dumps({"cluster": {"worker": hosts},
                     "task": {"type": "worker", "index": index}})


def _need(environ, name, what):
  value = environ.get(name)
  if value is None or not str(value).strip():
    raise errors.UsageError("%s is not set: run this inside %s" % (name,
                                                                   what))
  return str(value).strip()


def slurm(environ, port):
  """TF_CONFIG (a JSON string) of this Slurm task (see the module
  docstring)."""
  where = "a Slurm job step (srun)"
  nodelist = environ.get("SLURM_STEP_NODELIST") or _need(
      environ, "SLURM_JOB_NODELIST", where)
  try:
    nodes = expand_hostlist(nodelist)
  except ValueError as e:
    raise errors.UsageError("SLURM_JOB_NODELIST=%s: %s" % (nodelist, e))
  procid = int(_need(environ, "SLURM_PROCID", where))
  ntasks = int(environ.get("SLURM_NTASKS") or len(nodes))
  if ntasks % len(nodes):
    raise errors.UsageError(
        "SLURM_NTASKS=%d tasks cannot spread evenly over the %d nodes of "
        "%s: ask for the same number of tasks on every node "
        "(--ntasks-per-node)" % (ntasks, len(nodes), nodelist))
  per_node = ntasks // len(nodes)
  hosts = ["%s:%d" % (n, port + j) for n in nodes for j in range(per_node)]
  return _dump(hosts, procid)


def kubernetes(environ, job, service, workers, port):
  """TF_CONFIG (a JSON string) of this pod of an Indexed Job (see the
  module docstring)."""
  index = int(_need(environ, "JOB_COMPLETION_INDEX",
                    "a pod of an Indexed Job (completionMode: Indexed)"))
  hosts = ["%s-%d.%s:%d" % (job, i, service, port) for i in range(workers)]
  return _dump(hosts, index)


def main(argv=None, environ=None, out=None, err=None):
  """Prints this task's TF_CONFIG; returns the exit code."""
  argv = sys.argv[1:] if argv is None else argv
  environ = os.environ if environ is None else environ
  out, err = out or sys.stdout, err or sys.stderr
  parser = argparse.ArgumentParser(prog="python -m meshtf.train.tf_config")
  sub = parser.add_subparsers(dest="scheduler", required=True)
  s = sub.add_parser("slurm")
  s.add_argument("--port", type=int, default=2222)
  k = sub.add_parser("kubernetes")
  k.add_argument("--job", required=True)
  k.add_argument("--service", required=True)
  k.add_argument("--workers", type=int, required=True)
  k.add_argument("--port", type=int, default=2222)
  args = parser.parse_args(argv)
  try:
    if args.scheduler == "slurm":
      text = slurm(environ, args.port)
    else:
      text = kubernetes(environ, args.job, args.service, args.workers,
                        args.port)
  except (errors.UsageError, ValueError) as e:
    err.write("meshtf.train.tf_config: error: %s\n" % e)
    return errors.EXIT_USAGE
  out.write(text + "\n")
  return 0


__all__ = ["slurm", "kubernetes", "expand_hostlist", "main"]


if __name__ == "__main__":
  sys.exit(main())
