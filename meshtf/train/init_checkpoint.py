"""--config.init_checkpoint: start a run from another model's checkpoint (a
released T5 / Mesh TF `model.ckpt-N`, or a meshtf checkpoint), loudly.

What model and checkpoint share is restored: the weights, the step, and
with init_optimizer the optimizer's slots. Everything else is said, never
left silent (Mesh TF only logged it, and users trained from random weights
without noticing): the header prints a block with how many weights, slots
and the step were restored, every weight of the model the checkpoint lacks
(initialized fresh), every checkpoint entry left unused (optimizer slots
counted, not listed, when init_optimizer is off) and each dtype conversion.
A shape mismatch, a path that holds no checkpoint, or a checkpoint sharing
no weight with the model is one line, raised before any TF device work and
before model_dir is written.

The two kinds are told apart by content: a Mesh TF checkpoint is a TF1
tensor bundle (`<prefix>.index`, or a folder whose `checkpoint` file names
one); a meshtf one is a `ckpt-N` folder with meta.json (or a model_dir
holding them). Each processor reads only its slice
(mesh_tf_checkpoint.SliceSource).

Example:
  >>> plan = plan_restore(config, graph, model, "/ckpts/t5_small")
  >>> print("\n".join(plan.lines()))
  init_checkpoint: /ckpts/t5_small/model.ckpt-1000000 (Mesh TF), step 1000000
  ...
  >>> plan.restore_into(store)
"""
import collections
import json
import os

import numpy as np

from meshtf.train import mesh_tf_checkpoint as mtf_ckpt
from meshtf.train.errors import UsageError

MESH_TF, MESHTF = "Mesh TF", "meshtf"


def locate(path):
  """(kind, bundle prefix, step or None) of the checkpoint at path; raises
  UsageError when path holds none.

  Example:
    >>> locate("/ckpts/t5_small")
    ('Mesh TF', '/ckpts/t5_small/model.ckpt-1000000', None)
  """
  full = os.path.abspath(os.path.expanduser(path))
  ckpt_dir = _meshtf_checkpoint_dir(full)
  if ckpt_dir is not None:
    with open(os.path.join(ckpt_dir, "meta.json"), encoding="utf-8") as f:
      step = json.load(f).get("step")
    return MESHTF, os.path.join(ckpt_dir, "variables"), step
  prefix = mtf_ckpt.resolve(full)
  if prefix is not None:
    return MESH_TF, prefix, None
  what = ("does not exist" if not os.path.exists(full) else
          "is a file that is not a checkpoint" if os.path.isfile(full) else
          "is a folder with no checkpoint in it")
  raise UsageError(
      "init_checkpoint %s %s: give a Mesh TF checkpoint prefix (the path of "
      "model.ckpt-N without .index), a folder holding model.ckpt-N files, or "
      "a meshtf ckpt-N folder / model_dir" % (path, what))


def _meshtf_checkpoint_dir(path):
  """path itself if it is a meshtf ckpt-N folder, else a model_dir's newest
  one, else None."""
  if os.path.isfile(os.path.join(path, "meta.json")) and os.path.isfile(
      os.path.join(path, "variables.index")):
    return path
  if os.path.isdir(path):
    from meshtf.train import checkpoint  # pylint: disable=g-import-not-at-top
    found = checkpoint.CheckpointManager(path).checkpoints()
    if found:
      return found[-1][1]
  return None


class RestorePlan(object):
  """What an init_checkpoint restores into a model's variables, and what
  it does not (made by plan_restore; see the module docstring)."""

  def __init__(self, path, kind, prefix, step):
    self.path, self.kind, self.prefix, self.step = path, kind, prefix, step
    self.sources = {}            # meshtf variable -> SliceSource
    self.shapes = {"global_step": []}   # meshtf variable -> its shape
    self.weights = [0, 0]        # restored, of the model's
    self.slots = [0, 0]          # restored, of the optimizer's
    self.missing = []            # weights initialized fresh
    self.missing_slots = []
    self.unused = []             # checkpoint entries no variable took
    self.unused_slots = 0
    self.conversions = collections.Counter()   # (from, to) -> entries

  def restore_into(self, store):
    """Hands the slice sources to a VariableStore (read when created)."""
    store.restore_sources(self.sources)

  def full_values(self):
    """{name: full numpy value} of every restored variable (to write the
    checkpoint in another format)."""
    return {n: src(np.zeros(len(self.shapes[n]), np.int64), self.shapes[n])
            for n, src in self.sources.items()}

  def lines(self):
    """The header's restore block."""
    out = ["init_checkpoint: %s (%s), step %s" % (
        self.prefix if self.kind == MESH_TF else os.path.dirname(self.prefix),
        self.kind, "none" if self.step is None else self.step)]
    out.append("  restored %d of %d weights, %s, %s" % (
        self.weights[0], self.weights[1],
        ("%d of %d optimizer slots" % tuple(self.slots)) if self.slots[1]
        else "no optimizer slots (init_optimizer=False: fresh)",
        "the step" if self.step is not None else "no step (starts at 0)"))
    for name in self.missing:
      out.append("  initialized fresh (not in the checkpoint): %s" % name)
    for name in self.missing_slots:
      out.append("  initialized fresh (slot not in the checkpoint): %s"
                 % name)
    for name in self.unused:
      out.append("  unused checkpoint entry: %s" % name)
    if self.unused_slots:
      out.append("  unused: %d optimizer slot entries (init_optimizer=True "
                 "restores them)" % self.unused_slots)
    for (src, dst), n in sorted(self.conversions.items()):
      out.append("  converted %s -> %s: %d entries" % (src, dst, n))
    return out


def _is_slot_entry(name):
  return any(name.endswith(s) for table in mtf_ckpt.SLOT_SUFFIXES.values()
             for s in table.values()) or "/slot_" in name


def plan_restore(config, graph, model, path=None):
  """The RestorePlan of config.init_checkpoint (or path) for the model's
  symbolic training graph `graph`; raises UsageError (one line) on a path
  that is no checkpoint, a shape mismatch, or a checkpoint that shares no
  weight with the model.

  Example:
    >>> plan = plan_restore(config, graph, model)
    >>> plan.weights
    [131, 131]
  """
  path = path or config.init_checkpoint
  kind, prefix, step = locate(path)
  try:
    entries = mtf_ckpt.read_entries(prefix)
  except Exception as e:  # TF raises DataLossError, NotFoundError, ...
    raise UsageError("init_checkpoint %s does not read as a checkpoint (%s): "
                     "give an intact one" % (path, str(e).splitlines()[0])) \
        from None
  if kind == MESH_TF:
    step = mtf_ckpt.read_step(prefix, entries)
  plan = RestorePlan(path, kind, prefix, step)
  names = mtf_ckpt.NameMap(model, config.optimizer) if kind == MESH_TF \
      else None
  used = {mtf_ckpt.STEP} if step is not None else set()
  trainable = set(graph.trainable_variables)
  for v in graph.all_variables:
    if v.name == "global_step":
      continue
    is_slot = v not in trainable
    if is_slot and not config.init_optimizer:
      continue
    counts = plan.slots if is_slot else plan.weights
    counts[1] += 1
    candidates = names.candidates(v.name) if names else [v.name]
    hit = next((c for c in candidates if c in entries), None)
    if hit is None:
      (plan.missing_slots if is_slot else plan.missing).append(v.name)
      continue
    dims = [(d.name, d.size) for d in v.shape.dims]
    want = mtf_ckpt.mesh_tf_shape(dims) if names else [s for _, s in dims]
    shape, dtype = entries[hit]
    if shape != want:
      raise UsageError(
          "init_checkpoint %s: entry %r has shape %s but the model's %s %r "
          "%s needs %s%s: use the config of the model that saved it (its "
          "d_model, heads, d_kv, d_ff, vocab_size) or a checkpoint of this "
          "one%s" % (
              path, hit, shape, "slot" if is_slot else "variable", v.name,
              v.shape, want, " (heads*d_kv combined, as Mesh TF stores it)"
              if len(want) < len(dims) else "",
              "; for slots, init_optimizer=False starts them fresh"
              if is_slot else ""))
    counts[0] += 1
    used.add(hit)
    if dtype != v.dtype:
      plan.conversions[(dtype.name, v.dtype.name)] += 1
    plan.sources[v.name] = mtf_ckpt.SliceSource(prefix, hit, shape, dtype,
                                                dims, v.dtype)
    plan.shapes[v.name] = [s for _, s in dims]
  if step is not None:
    plan.sources["global_step"] = lambda begin, sizes: np.asarray(
        step, np.int64)
  if not plan.weights[0]:
    model_names = [names.to_mesh_tf(v.name) if names else v.name
                   for v in graph.trainable_variables]
    theirs = sorted(n for n in entries
                    if not _is_slot_entry(n) and n != mtf_ckpt.STEP)
    raise UsageError(
        "init_checkpoint %s is of another architecture: none of the model's "
        "%d weights is in it (its entries: %s; this config's model looks "
        "for: %s): pick the config that matches the checkpoint (e.g. "
        "t2t_configs/t5.py:<size>)" % (
            path, len(model_names), _some(theirs), _some(model_names)))
  for name in sorted(set(entries) - used):
    if _is_slot_entry(name) and not config.init_optimizer:
      plan.unused_slots += 1
    else:
      plan.unused.append(name)
  return plan


def finetune_target(config, plan=None):
  """init_checkpoint's step + finetune_steps: the last step of a fine-tune
  (T5's released steps differ: 1,000,000 for T5.1.0 small, 999,900 for
  base, ...). plan: the RestorePlan, when made already.

  Example:
    >>> finetune_target(config)      # init step 1000000, finetune_steps 5000
    1005000
  """
  step = plan.step if plan is not None else None
  if plan is None:
    kind, prefix, step = locate(config.init_checkpoint)
    if kind == MESH_TF:
      step = mtf_ckpt.read_step(prefix)
  if step is None:
    raise UsageError(
        "finetune_steps=%d counts from init_checkpoint's step, but %s has no "
        "step (global_step): set --config.finetune_steps=0 and "
        "--config.train_steps to the last step" % (
            config.finetune_steps, config.init_checkpoint))
  return int(step) + int(config.finetune_steps)


def _some(names, n=4):
  return ", ".join(names[:n]) + (", ... (%d)" % len(names)
                                 if len(names) > n else "")


__all__ = ["locate", "plan_restore", "finetune_target", "RestorePlan", "MESH_TF", "MESHTF"]
