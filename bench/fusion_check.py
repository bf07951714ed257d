r"""The plan's XLA fusion model (meshtf/plan/fusion.py) against XLA's own
kernels of the same training step: memory traffic, kernel by kernel.

One Transformer LM training step (forward, backward, Adafactor update) on
one CPU device runs under tf.function(jit_compile=True) (the SPMD
backend's jit_compile="program") with XLA's HLO dump on; the HLO after
XLA's optimizations is the program XLA runs: each top-level instruction
is a kernel (a fusion, a dot, a copy, ...) that reads its operands and
writes its output. The plan's kernels of the same meshtf graph
(fusion.kernels) say what it charges. Printed as JSON lines, one per side
("xla_cpu", "plan") and one comparison:

  bytes_other    memory traffic of every kernel but the matmuls (the
                 elementwise / reduction kernels the fusion model prices)
  bytes_dot      the matmuls' operands and outputs
  kernels_other  how many such kernels
  peak_bytes     XLA's own peak of live buffers (its buffer assignment's
                 heap simulation: arguments and temporaries) and the plan's
                 peak per device, for a rematerialization's effect
  attention_passes
                 traffic on tensors of attention's [batch, heads, length,
                 memory_length] size, in units of that tensor's float32
                 size (a kernel that reads the logits and writes the
                 probabilities: 2 passes)

The model is sized so attention's logits dominate (length 256 against
d_model 64): the rule the plan still lacks on XLA hardware, if any, shows
there first. XLA's CPU backend is the XLA here; TPU's fusion rules are
not public (its backend adds fusions into matmuls, which the CPU backend
does not do: every dot stands alone in the dump).

With remat, the backward pass copies the forward ops onto
depend(input, output gradients); XLA ignores control dependencies and
merges identical computations, so without the optimization barrier the
SPMD backend now puts there (ops/passthrough.py) the copies were merged
back into the forward pass and nothing was recomputed (--barrier=off
shows it: the step's bytes and peak are those of remat none).

On a GPU (a session lent one, after bench/gpu_bootstrap.sh),
--device=/gpu:0 compares the plan with XLA's GPU kernels, whose GEMMs are
cuBLAS custom calls or Triton fusions around a dot (both count as
matmuls); its peak shows whether XLA's GPU pipeline schedules with the
barriers, as JAX's remat relies on (not yet run on a GPU).

Usage:
  python bench/fusion_check.py                 # remat none, dropout 0.1
  python bench/fusion_check.py --remat=full --num_layers=4
  python bench/fusion_check.py --remat=full --num_layers=4 --barrier=off
"""
import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile

_DUMP = tempfile.mkdtemp(prefix="meshtf_fusion_check_")
# Before TensorFlow starts: XLA reads its flags once.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_dump_to=%s --xla_dump_hlo_as_text" % _DUMP)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
          "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
          "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(%s)\[([0-9,]*)\]" % "|".join(_BYTES))
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([\w\-]+)\((.*)$")
# Instructions that move no data of their own.
_NOT_KERNELS = frozenset([
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast",
    "after-all", "while", "call", "conditional", "partition-id",
    "replica-id", "opt-barrier", "add-dependency"])


def array_sizes(type_text):
  """[(elements, bytes)] of each array in an HLO type ("f32[2,3]{1,0}" or
  a tuple of them).

  Example:
    >>> array_sizes("(f32[2,3]{1,0}, s32[])")
    [(6, 24), (1, 4)]
  """
  out = []
  for dtype, dims in _ARRAY.findall(type_text):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    out.append((n, n * _BYTES[dtype]))
  return out


def _is_matmul_call(rest):
  """Whether a custom call's text names a matrix multiply: oneDNN's
  matmul on CPU, cuBLAS / cuBLASLt GEMMs and cuDNN convolutions on GPU."""
  target = re.search(r'custom_call_target="([^"]*)"', rest)
  name = (target.group(1) if target else rest).lower()
  return any(k in name for k in ("matmul", "gemm", "cublas", "cudnn$conv"))


def _computations(text):
  """{name: [instruction line]} of an HLO module's text, and the entry's
  name."""
  comps, entry, current = {}, None, None
  for line in text.splitlines():
    head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if head and not line.startswith(" "):
      current = head.group(2)
      comps[current] = []
      if head.group(1):
        entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    if current is not None:
      comps[current].append(line)
  return comps, entry


def hlo_kernels(text):
  """[{name, opcode, kind, reads: [(elements, bytes)], writes: [...]}]
  of the kernels an optimized HLO module runs: the top-level instructions
  of its entry and of the loops / calls it makes (fused computations are
  inside their kernel). kind: "dot" (a dot, a convolution, a matmul
  custom call, or a fusion around one), "copy" (copies and transposes
  XLA inserts for layouts), else "other".

  Example:
    >>> ks = hlo_kernels(open(dump).read())
    >>> sum(sum(b for _, b in k["reads"] + k["writes"]) for k in ks)
  """
  comps, entry = _computations(text)
  parsed = {}
  for name, lines in comps.items():
    rows = []
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m:
        rows.append(m.groups())
    parsed[name] = rows
  types = {}
  for rows in parsed.values():
    for name, type_text, _, _ in rows:
      types[name] = type_text
  has_dot = {name: any(op in ("dot", "convolution") or
                       (op == "custom-call" and _is_matmul_call(rest))
                       for _, _, op, rest in rows)
             for name, rows in parsed.items()}
  top, todo = [], [entry]
  while todo:
    comp = todo.pop()
    if comp in top or comp not in parsed:
      continue
    top.append(comp)
    for _, _, op, rest in parsed[comp]:
      if op in ("while", "call", "conditional"):
        todo += re.findall(r"(?:body|condition|to_apply|"
                           r"branch_computations|true_computation|"
                           r"false_computation)=\{?%?([\w.\-]+)", rest)
        todo += re.findall(r"branch_computations=\{([^}]*)\}", rest)
  kernels = []
  for comp in top:
    for name, type_text, op, rest in parsed[comp]:
      if op in _NOT_KERNELS:
        continue
      operand_text = rest.split(")", 1)[0]
      operands = list(dict.fromkeys(re.findall(r"%([\w.\-]+)",
                                               operand_text)))
      called = re.findall(r"calls=%?([\w.\-]+)", rest)
      if op in ("dot", "convolution") or (
          op == "custom-call" and _is_matmul_call(rest)) or any(
              has_dot.get(c) for c in called):
        kind = "dot"
      elif op in ("copy", "transpose") or (
          op == "fusion" and "copy" in name and not called):
        kind = "copy"
      else:
        kind = "other"
      reads = [s for o in operands for s in array_sizes(types.get(o, ""))]
      kernels.append({"name": name, "opcode": op, "kind": kind,
                      "reads": reads, "writes": array_sizes(type_text)})
  return kernels


def summarize(kernels, attention_elements):
  """The comparison's numbers (module docstring) of [kernel dicts]."""
  out = collections.Counter()
  for k in kernels:
    moved = sum(b for _, b in k["reads"] + k["writes"])
    if k["kind"] == "dot":
      out["bytes_dot"] += moved
    else:
      out["bytes_" + ("copy" if k["kind"] == "copy" else "other")] += moved
      out["kernels_" + k["kind"]] += 1 if moved else 0
    out["attention_passes"] += sum(
        1 for n, _ in k["reads"] + k["writes"] if n == attention_elements)
    if k["kind"] != "dot":
      out["attention_passes_other"] += sum(
          1 for n, _ in k["reads"] + k["writes"] if n == attention_elements)
  return dict(out)


def plan_kernels(graph, mesh_layout, hw):
  """The plan's kernels of graph as hlo_kernels' dicts."""
  from meshtf.lowering import lowering as lowering_lib  # pylint: disable=g-import-not-at-top
  from meshtf.plan import fusion  # pylint: disable=g-import-not-at-top
  graph_layout = mesh_layout.assign(
      lowering_lib.all_operations(graph.operations))
  out = []
  for k in fusion.kernels(graph.operations, graph_layout, hw):
    if k.kind == "free":
      continue
    def sizes(tensors):
      # One device: a tensor's slice is all of it.
      return [(t.shape.size, b) for t, b in tensors.items()]
    out.append({"name": k.ops[0].name, "opcode": type(k.ops[0]).__name__,
                "kind": "dot" if k.kind == "einsum" else "other",
                "reads": sizes(k.reads), "writes": sizes(k.writes)})
  return out


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--length", type=int, default=256)
  p.add_argument("--d_model", type=int, default=64)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--d_kv", type=int, default=16)
  p.add_argument("--d_ff", type=int, default=128)
  p.add_argument("--num_layers", type=int, default=1)
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--remat", default="none")
  p.add_argument("--activation_dtype", default="float32",
                 help="XLA's CPU backend computes bfloat16 dots in float32 "
                 "(it converts their operands), so compare float32")
  p.add_argument("--device", default="/cpu:0",
                 help="the device the step runs on (/gpu:0: XLA's GPU "
                 "kernels)")
  p.add_argument("--barrier", default="on", choices=("on", "off"),
                 help="off: lower depend without XLA's optimization barrier "
                 "(what the SPMD backend did before)")
  p.add_argument("--kernels", action="store_true",
                 help="also print each side's kernels on attention tensors")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import meshtf as mtf  # pylint: disable=g-import-not-at-top
  from meshtf.models import dtypes  # pylint: disable=g-import-not-at-top
  from meshtf.models import optimize  # pylint: disable=g-import-not-at-top
  from meshtf.models import transformer  # pylint: disable=g-import-not-at-top
  from meshtf.plan import hardware  # pylint: disable=g-import-not-at-top
  vocab = 64
  lm = transformer.make_unitransformer(
      vocab_size=vocab, d_model=args.d_model, num_layers=args.num_layers,
      num_heads=args.num_heads, d_kv=args.d_kv, d_ff=args.d_ff,
      max_length=args.length, vocab_divisor=1, dropout_rate=args.dropout,
      remat=args.remat)
  vdt = dtypes.VariableDType(tf.float32, tf.float32,
                             tf.as_dtype(args.activation_dtype))
  impl_class = mtf.SimdMeshImpl
  if args.barrier == "off":
    class _NoBarrier(mtf.SimdMeshImpl):
      compiled_by_xla = False
    impl_class = _NoBarrier
  impl = impl_class("all:1", "", [args.device])
  step = mtf.training.TrainStep(
      transformer.loss_fn(lm, variable_dtype=vdt), impl,
      optimize.AdafactorOptimizer(), jit_compile="program")
  ids = np.random.RandomState(0).randint(
      1, vocab, size=(args.batch, args.length)).astype(np.int32)
  loss = float(step({"inputs": ids, "targets": ids})["loss"])
  dumps = glob.glob(os.path.join(_DUMP, "*program*after_optimizations.txt"))
  if not dumps:
    print("fusion_check: XLA wrote no optimized HLO of the step under %s"
          % _DUMP, file=sys.stderr)
    return 1
  dump = max(dumps, key=os.path.getsize)   # the step (not an initializer)
  text = open(dump).read()
  xla_peak = None
  assignment = dump.replace(".txt", "-buffer-assignment.txt")
  if os.path.exists(assignment):
    found = re.search(r"breakdown for peak usage: ([0-9 ]+) bytes",
                      open(assignment).read())
    xla_peak = int(found.group(1).replace(" ", "")) if found else None
  config = dict(vars(args), loss=round(loss, 4))
  config.pop("kernels")
  attention = args.batch * args.num_heads * args.length * args.length
  xla_side = "xla_gpu" if "gpu" in args.device.lower() else "xla_cpu"
  sides = {xla_side: hlo_kernels(text),
           "plan": plan_kernels(step.graph, mtf.MeshLayout("all:1", ""),
                                hardware.get("tpuv3"))}
  from meshtf.plan import report as report_lib  # pylint: disable=g-import-not-at-top
  plan_peak = report_lib.plan(step.graph, mtf.MeshLayout("all:1", ""), "cpu",
                              trace=False).summary()[
                                  "memory_bytes_per_device"]["peak"]
  rows = {}
  for side, kernels in sides.items():
    rows[side] = summarize(kernels, attention)
    rows[side]["peak_bytes"] = xla_peak if side == xla_side else plan_peak
    print(json.dumps(dict({"bench": "fusion_check", "side": side},
                          **rows[side], config=config)))
    if args.kernels:
      for k in kernels:
        n = sum(1 for e, _ in k["reads"] + k["writes"] if e == attention)
        if n:
          print("  %s %-6s %-30s reads %d writes %d (attention-size: %d)" % (
              side, k["kind"], k["opcode"] + ":" + k["name"][:40],
              sum(b for _, b in k["reads"]), sum(b for _, b in k["writes"]),
              n))
  x, p = rows[xla_side], rows["plan"]
  print(json.dumps({
      "bench": "fusion_check", "side": "plan / " + xla_side,
      "bytes_other": round(p.get("bytes_other", 0) /
                           max(x.get("bytes_other", 1), 1), 3),
      "bytes_dot": round(p.get("bytes_dot", 0) /
                         max(x.get("bytes_dot", 1), 1), 3),
      "peak_bytes": round(p["peak_bytes"] / x["peak_bytes"], 3)
                    if x.get("peak_bytes") else None,
      "attention_passes_other": "%d / %d" % (
          p.get("attention_passes_other", 0),
          x.get("attention_passes_other", 0)),
      "config": config}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
