"""--mode=sweep: plan several (mesh_shape, layout) candidates of one config
side by side, and with --sweep_run also train a few steps of each where
this process has the devices, so a layout is chosen from numbers rather
than guessed. Writes model_dir/sweep.csv (one row per entry) and
model_dir/sweep.png (predicted step time, peak memory and bytes sent per
device, per entry; measured step time beside the predicted one).

The candidates are config.sweep: entries separated by "|" or newlines,
each "mesh_shape @ layout [@ variable_layout [@ activation_layout]]":

  python -m meshtf.train --config=t2t_configs/lm_tiny.py --mode=sweep \\
      --config.sweep="data:8 @ batch:data | data:4;model:2 @ \\
batch:data;d_ff:model;heads:model;vocab:model" --model_dir=/tmp/sweep

An entry that is invalid (a malformed mesh, a layout that splits one
tensor's two dims over one axis, ...) is reported with its reason in one
line, and the sweep goes on; it stops with an error only when no entry is
valid.

Example:
  >>> rows = run_sweep(config, "/tmp/sweep", print)["rows"]
  >>> [r["valid"] for r in rows]
  [True, True, False]
"""
import copy
import csv
import os
import statistics
import time

CSV_FILE = "sweep.csv"
PICTURE_FILE = "sweep.png"
RUNS_DIR = "sweep_runs"
COLUMNS = ("entry", "mesh_shape", "layout", "variable_layout",
           "activation_layout", "valid", "problem", "processors",
           "step_seconds", "compute_seconds", "collective_seconds",
           "peak_bytes", "fits_in_memory", "collective_bytes",
           "measured_step_seconds", "run_note")


def parse_entries(text):
  """config.sweep as [dict(entry, mesh_shape, layout, variable_layout,
  activation_layout)] (entry counts from 1); an entry with a wrong number
  of parts keeps its text and a "problem".

  Example:
    >>> parse_entries("x:8 @ batch:x | x:2;y:4 @ batch:x @ d_model:y")[1]
    {'entry': 2, 'mesh_shape': 'x:2;y:4', 'layout': 'batch:x',
     'variable_layout': 'd_model:y', 'activation_layout': ''}
  """
  pieces = [p.strip() for line in str(text).splitlines()
            for p in line.split("|")]
  entries = []
  for piece in (p for p in pieces if p):
    parts = [p.strip() for p in piece.split("@")]
    entry = {"entry": len(entries) + 1, "mesh_shape": parts[0],
             "layout": parts[1] if len(parts) > 1 else "",
             "variable_layout": parts[2] if len(parts) > 2 else "",
             "activation_layout": parts[3] if len(parts) > 3 else ""}
    if not 2 <= len(parts) <= 4 or not parts[0]:
      entry["problem"] = (
          "%r is not 'mesh_shape @ layout [@ variable_layout [@ "
          "activation_layout]]'" % piece)
    entries.append(entry)
  return entries


def _entry_text(entry):
  """'mesh @ layout [@ variable_layout [@ activation_layout]]'."""
  parts = [entry["mesh_shape"], entry["layout"], entry["variable_layout"],
           entry["activation_layout"]]
  while len(parts) > 2 and not parts[-1]:
    parts.pop()
  return " @ ".join(parts)


def _entry_config(config, entry):
  c = copy.deepcopy(config)
  for key in ("mesh_shape", "layout", "variable_layout", "activation_layout"):
    c[key] = entry[key]
  c.sweep = ""
  return c


def _entry_experiment(config, entry, run_experiment=None):
  """The entry's experiment.Experiment with its training graph built and
  its layouts checked once (validate's check_layout, on the graph the plan
  reads): run_experiment (the sweep run's own, from its preflight) where
  the entry's config has its values (config.sweep aside), else a new one.
  Raises ConfigError / LayoutError / ValueError for an invalid entry."""
  from meshtf.train import config as config_lib
  from meshtf.train import experiment
  c = _entry_config(config, entry)
  if run_experiment is not None and run_experiment.same_config(
      c, ignore=("sweep",)):
    return run_experiment
  layout = config_lib.validate(c, check_layout=False, check_data=False)
  entry_experiment = experiment.Experiment(c, layout)
  _, _, problem = config_lib.checked_training_graph(c, layout,
                                                    entry_experiment)
  if problem:
    raise config_lib.ConfigError([problem])
  return entry_experiment


def _plan_entry(config, entry, run_experiment=None):
  """The entry's row: its plan (as --mode=plan's: traced where TF's
  executor runs the program, plan(trace="auto")), or why it is invalid."""
  from meshtf.layouts import LayoutError
  from meshtf.train import config as config_lib
  row = dict(entry, valid=False)
  if "problem" in entry:
    return row
  try:
    entry_experiment = _entry_experiment(config, entry, run_experiment)
    layout = entry_experiment.mesh_layout
    summary = entry_experiment.plan(trace="auto").summary()
  except (config_lib.ConfigError, LayoutError, ValueError) as e:
    row["problem"] = " ".join(str(e).split())
    return row
  row.update(
      valid=True, processors=layout.size,
      step_seconds=summary["step_seconds"],
      compute_seconds=summary["compute_seconds"],
      collective_seconds=summary["collective_seconds"],
      peak_bytes=summary["memory_bytes_per_device"]["peak"],
      fits_in_memory=summary["fits_in_memory"],
      collective_bytes=summary["collective_bytes_per_device"])
  return row


def _run_entries(config, rows, model_dir, log, devices, train_entry):
  """Trains config.sweep_steps steps of each valid entry that this
  process has the devices for, with train_entry (the binary's runner.run);
  sets measured_step_seconds (the median step after the first, which
  traces) or run_note (why not run)."""
  valid = [r for r in rows if r["valid"]]
  steps = max(2, int(config.sweep_steps))
  for row in valid:
    if row["processors"] > len(devices):
      row["run_note"] = ("not run: %d processors, this process has %d "
                         "devices" % (row["processors"], len(devices)))
      continue
    # A run of its own: its config (train_steps, the schedule's length)
    # makes another training graph than the entry's plan read.
    c = _entry_config(config, row)
    c.train_steps, c.eval_every, c.eval_steps = steps, 0, 1
    c.checkpoint_every, c.stop_at_target = steps, False
    run_dir = os.path.join(model_dir, RUNS_DIR, "entry-%d" % row["entry"])
    lines = []
    result = train_entry(c, "train", run_dir,
                         devices=devices[:row["processors"]],
                         out=_Lines(lines), err=_Lines(lines))
    seconds = [r["step_seconds"] for r in result["history"][1:]]
    row["measured_step_seconds"] = statistics.median(seconds)
    row["run_note"] = "median of %d steps after the first (in %s)" % (
        len(seconds), run_dir)
    log("  entry %d: measured %.4g s per step (predicted %.4g s)" % (
        row["entry"], row["measured_step_seconds"], row["step_seconds"]))


def _virtual_devices(config, entries):
  """Virtual CPU devices for the largest entry mesh of at most
  config.num_virtual_cpus (default the binary's limit) processors."""
  import meshtf as mtf
  from meshtf.train import preflight
  from meshtf.train import startup
  limit = config.num_virtual_cpus or preflight.MAX_VIRTUAL_CPUS
  sizes = []
  for e in entries:
    try:
      sizes.append(mtf.MeshLayout(e["mesh_shape"]).size)
    except Exception:  # pylint: disable=broad-except
      continue   # planning reports the entry as invalid
  wanted = max([n for n in sizes if n <= limit] or [0])
  try:
    devices = mtf.virtual_cpu_devices(wanted) if wanted else []
  except RuntimeError:
    # TensorFlow already started (the binary used as a library): the
    # devices it has; larger entries are planned, not run.
    import tensorflow as tf
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  startup.devices_ready()
  return devices


class _Lines(object):
  """A file-like sink collecting what an entry's run prints."""

  def __init__(self, lines):
    self._lines = lines

  def write(self, text):
    self._lines.append(text)

  def flush(self):
    pass


def _write_csv(rows, path):
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: row.get(k, "") for k in COLUMNS})
  os.replace(tmp, path)


def draw_sweep(rows, path, hardware):
  """Writes a PNG with three panels -- step time (predicted, and measured
  where run), peak memory and bytes sent per device -- one bar per valid
  entry, labelled by its number (the legend lists the layouts). Returns
  the entries drawn.

  Example:
    >>> draw_sweep(rows, "/tmp/sweep.png", "cpu")
    [1, 2]
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  valid = [r for r in rows if r["valid"]]
  labels = ["#%d" % r["entry"] for r in valid]
  # The legend of layouts sits under the panels, a 0.13-inch line each.
  legend_inches = 0.6 + 0.13 * len(valid)
  height = 3.4 + legend_inches
  fig = Figure(figsize=(13, height), dpi=100)
  FigureCanvasAgg(fig)
  panels = [
      ("step time (s)", "step_seconds", "measured_step_seconds"),
      ("peak memory per device (MB)", "peak_bytes", None),
      ("sent per device per step (MB)", "collective_bytes", None)]
  positions = list(range(len(valid)))
  for i, (title, key, measured_key) in enumerate(panels):
    ax = fig.add_subplot(1, 3, i + 1)
    scale = 1.0 if key == "step_seconds" else 1e-6
    predicted = [r[key] * scale for r in valid]
    measured = [r.get(measured_key) for r in valid] if measured_key else []
    if any(m is not None for m in measured):
      width = 0.4
      ax.bar([p - width / 2 for p in positions], predicted, width,
             label="predicted (%s)" % hardware, color="tab:blue")
      ax.bar([p + width / 2 for p in positions],
             [m or 0.0 for m in measured], width, label="measured here",
             color="tab:orange")
      ax.legend(fontsize=7)
    else:
      ax.bar(positions, predicted, 0.6, color=[
          "tab:blue" if r["fits_in_memory"] else "tab:red" for r in valid])
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
  fig.suptitle("layout sweep on %s (red: does not fit in memory)" % hardware,
               fontsize=10)
  legend = "\n".join("#%d  %s" % (r["entry"], _entry_text(r))
                     for r in valid)
  fig.text(0.01, 0.01, legend, fontsize=7, family="monospace", va="bottom")
  fig.subplots_adjust(bottom=legend_inches / height, top=1 - 0.5 / height,
                      left=0.05, right=0.98, wspace=0.25)
  fig.savefig(path, format="png")
  return [r["entry"] for r in valid]


def run_sweep(config, model_dir, log, devices=None, train_entry=None,
              experiment=None):
  """Plans every entry of config.sweep (and, given train_entry, trains a
  few steps of each: train_entry(config, mode, model_dir, devices=, out=,
  err=) is the binary's runner.run, handed in); logs a table; writes
  model_dir/sweep.csv and sweep.png (atomically). Returns {"rows", "csv",
  "picture"}. Raises ConfigError (one line) when config.sweep is empty or
  no entry is valid. experiment: the run's experiment.Experiment (of
  config's own mesh and layout), planned for an entry of the same values
  instead of building its graph again.

  Example:
    >>> result = run_sweep(config, "/tmp/sweep", print)
    >>> result["rows"][0]["step_seconds"]
    0.0123
  """
  from meshtf.train import config as config_lib
  t0 = time.time()
  entries = parse_entries(config.sweep)
  if not entries:
    raise config_lib.ConfigError([
        "--mode=sweep needs candidates: --config.sweep=\"mesh_shape @ layout"
        " | mesh_shape @ layout ...\" (e.g. \"data:8 @ batch:data | "
        "data:4;model:2 @ batch:data;d_ff:model\")"])
  run = train_entry is not None
  if run and devices is None:
    # Virtual CPUs are configured before TensorFlow's first op (planning
    # traces), as many as the largest entry this process may start.
    devices = _virtual_devices(config, entries)
  rows = [_plan_entry(config, e, experiment) for e in entries]
  valid = [r for r in rows if r["valid"]]
  if not valid:
    raise config_lib.ConfigError([
        "--mode=sweep: none of the %d entries of config.sweep is valid: %s"
        % (len(rows), "; ".join("#%d %s" % (r["entry"], r["problem"])
                                for r in rows))])
  hardware = config.plan_hardware
  log("layout sweep: %d entries planned on %s (%d valid) in %.1f s" % (
      len(rows), hardware, len(valid), time.time() - t0))
  if run:
    log("running %d steps of each valid entry:" % max(2, config.sweep_steps))
    _run_entries(config, rows, model_dir, log, devices, train_entry)
  log("  #  mesh / layout                                       step s     "
      "peak MB    sent MB  measured s")
  best = min(valid, key=lambda r: r["step_seconds"])
  for r in valid:
    name = _entry_text(r)
    measured = r.get("measured_step_seconds")
    log("%3d  %-50s %9.4g %10.4g %10.4g  %s%s" % (
        r["entry"], name[:50], r["step_seconds"], r["peak_bytes"] / 1e6,
        r["collective_bytes"] / 1e6,
        "%.4g" % measured if measured is not None else "-",
        "  fastest predicted" if r is best else ""))
  invalid = [r for r in rows if not r["valid"]]
  for r in invalid:
    log("invalid entry %d (%s): %s" % (r["entry"], _entry_text(r),
                                       r["problem"]))
  os.makedirs(model_dir, exist_ok=True)
  csv_path = os.path.join(model_dir, CSV_FILE)
  _write_csv(rows, csv_path)
  picture = os.path.join(model_dir, PICTURE_FILE)
  draw_sweep(rows, picture + ".tmp", hardware)
  os.replace(picture + ".tmp", picture)
  log("sweep written to %s and %s (%.1f s)" % (csv_path, picture,
                                               time.time() - t0))
  return {"rows": rows, "csv": csv_path, "picture": picture}
