"""The README's and the guides' (docs/*.md) commands and snippets work as
written, and the README Quickstart and CI stay in sync."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _doc(name):
  """The text of a guide, docs/<name>."""
  return (ROOT / "docs" / name).read_text()


def quickstart_commands():
  text = (ROOT / "README.md").read_text()
  section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  return [l.strip() for l in section.splitlines() if l.startswith("    ")]


def test_quickstart_has_exactly_two_commands():
  cmds = quickstart_commands()
  assert len(cmds) == 2, cmds
  assert cmds[0].startswith("pip install") and "python -m" in cmds[0]
  assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
  ci = (ROOT / ".ci" / "run").read_text()
  assert quickstart_commands()[1] in ci.splitlines()
  assert re.search(r'"\$rc" -eq 5', ci)


def test_dsl_example_runs():
  import subprocess
  import sys
  text = (ROOT / "README.md").read_text()
  section = text.split("## The DSL in one example", 1)[1]
  code = section.split("```python", 1)[1].split("```", 1)[0]
  r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                     text=True, timeout=300, cwd=str(ROOT))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "allreduce_sum" in r.stdout


def test_layout_snippets_show_what_they_return():
  """The MeshLayout snippets under "How layouts work": every expression
  line's trailing comment is the repr of its value."""
  import ast
  import meshtf as mtf
  text = _doc("layouts.md")
  checked = 0
  for title in ("### Uneven splits", "### The layout object"):
    section = text.split(title, 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    lines = code.splitlines()
    env = {"mtf": mtf}
    for stmt in ast.parse(code).body:
      source = ast.get_source_segment(code, stmt)
      if isinstance(stmt, ast.Expr):
        value = eval(compile(ast.Expression(stmt.value), "README", "eval"),
                     env)
        comment = lines[stmt.end_lineno - 1].split("# ", 1)[1].strip()
        assert repr(value) == comment, (source, value)
        checked += 1
      else:
        exec(compile(ast.Module([stmt], []), "README", "exec"), env)
  assert checked == 4


# --- the training binary's commands, as written -------------------------------
def _binary_section():
  text = _doc("training-binary.md")
  return text.split("## The training binary and config files", 1)[1].split(
      "\n## ", 1)[0]


def binary_commands():
  """The section's first indented block: one argv list per command
  (continuation lines joined, comments dropped)."""
  import shlex
  block = []
  for line in _binary_section().splitlines():
    if line.startswith("    "):
      block.append(line.strip())
    elif block and line.strip():
      break
  commands, pending = [], ""
  for line in block:
    pending += line
    if pending.endswith("\\"):
      pending = pending[:-1] + " "
      continue
    commands.append(shlex.split(pending, comments=True))
    pending = ""
  return commands


def test_the_readme_shows_six_binary_commands():
  cmds = binary_commands()
  assert len(cmds) == 6, cmds
  assert cmds[0][3:] == ["--config=t2t_configs/lm_tiny.py",
                         "--model_dir=/tmp/lm"]
  assert "--config.decode_prompts_file=t2t_configs/lm_tiny_prompts.txt" in \
      cmds[4]
  # The prompt file shown is the one shipped.
  shown = _binary_section().split("for text data, a line of text:", 1)[1]
  shown = shown.split("\n\n")[1]
  assert [l.strip() for l in shown.splitlines()] == (
      ROOT / "t2t_configs" / "lm_tiny_prompts.txt").read_text().splitlines()


def _in_tmp(argv, tmp):
  return [a.replace("/tmp/", str(tmp) + "/") for a in argv]


def _model_dir_of(argv):
  return [a.split("=", 1)[1] for a in argv if a.startswith("--model_dir=")][0]


def _run_binary_in_process(argv, tmp_path):
  import io
  from meshtf.train import main
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + _in_tmp(argv, tmp_path)[3:],
                          out=out, err=err)
  assert code == 0 and err.getvalue() == "", (argv, err.getvalue())
  assert out.getvalue().strip(), argv


# One model_dir trained by the first command serves the eval, decode and
# export commands and the snippet: ~380 s on a 2-core machine at load ~10
# (issue 32); the limit leaves room for a machine twice as slow.
@pytest.mark.timeout(1200)
def test_binary_commands_and_savedmodel_snippet_work_as_written(
    tmp_path, monkeypatch):
  """Every command of the README's binary section on model_dir /tmp/lm from
  the repository root, /tmp/ meaning this test's directory: the first in a
  fresh process (its first screen is the header, no TensorFlow start-up
  lines), the others through the binary's main in this process (a TF
  start-up each would cost seconds). Then the README's SavedModel snippet on
  the export. (The commands on other model_dirs: the next test.)"""
  import os
  import subprocess
  import sys
  cmds = [c for c in binary_commands() if _model_dir_of(c) == "/tmp/lm"]
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  first = subprocess.run([sys.executable] + _in_tmp(cmds[0], tmp_path)[1:],
                         cwd=str(ROOT), env=env, capture_output=True,
                         text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  assert first.stderr == "", first.stderr[-3000:]
  head = first.stdout.splitlines()
  assert head[0] == "=" * 72 and head[1].startswith("meshtf.train: lm, "), head
  assert "final eval accuracy" in first.stdout and "REACHED" in first.stdout
  monkeypatch.chdir(str(ROOT))
  for argv in cmds[1:]:
    _run_binary_in_process(argv, tmp_path)
  decodes = tmp_path / "lm" / ("decodes-%d.txt" % _trained_step(
      tmp_path / "lm"))
  prompts = (ROOT / "t2t_configs" / "lm_tiny_prompts.txt").read_text()
  assert decodes.read_text() == prompts   # lm_tiny copies its prompts
  snippet = _binary_section().split("```python", 1)[1].split("```", 1)[0]
  snippet = snippet.replace("/tmp/", str(tmp_path) + "/")
  r = subprocess.run([sys.executable, "-c", snippet], capture_output=True,
                     text=True, timeout=300, cwd=str(tmp_path), env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  # The decoded rows printed are the ones the comment shows (numpy's
  # spacing aside): each prompt, its copy and EOS (1).
  import re
  want = snippet.split("[:, :8])", 1)[1].split("# ", 1)[1].splitlines()[0]
  printed = " ".join(r.stdout.splitlines()[:2])
  assert re.findall(r"\d+", printed) == re.findall(r"\d+", want), (
      printed, want)


def test_binary_commands_on_other_model_dirs_work_as_written(tmp_path,
                                                           monkeypatch):
  """The binary section's commands with a model_dir of their own (lm_tiny
  under another layout), through the binary's main in this process."""
  cmds = [c for c in binary_commands() if _model_dir_of(c) != "/tmp/lm"]
  assert cmds and all(c[3].startswith("--config=") for c in cmds), cmds
  monkeypatch.chdir(str(ROOT))
  for argv in cmds:
    _run_binary_in_process(argv, tmp_path)


def _trained_step(model_dir):
  import json
  with open(model_dir / "checkpoint.json") as f:
    return int(json.load(f)["latest"].split("-")[1])


# The default job and the example in two fresh processes: ~235 s on a
# 2-core machine at load ~10 (issue 32); room for one twice as slow.
@pytest.mark.timeout(1200)
def test_quickstart_and_example_commands_in_fresh_processes(tmp_path):
  """`python -m meshtf.train` (the Quickstart's, with the temp dir in
  tmp_path) and `python -m meshtf.examples.two_layer` as written: exit 0,
  nothing on stderr, the four layouts compared."""
  import os
  import subprocess
  import sys
  text = (ROOT / "README.md").read_text()
  quickstart = quickstart_commands()[0].split(" && ", 1)[1]
  example = text.split("collective counts is\n`", 1)[1].split("`", 1)[0]
  assert (quickstart, example) == ("python -m meshtf.train",
                                   "python -m meshtf.examples.two_layer")
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  env["TMPDIR"] = str(tmp_path)   # the default model_dir goes there
  procs = [subprocess.Popen([sys.executable] + cmd.split()[1:],
                            cwd=str(tmp_path), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for cmd in (quickstart, example)]
  (q_out, q_err), (e_out, e_err) = [p.communicate(timeout=600)
                                    for p in procs]
  assert [p.returncode for p in procs] == [0, 0], (q_err[-2000:],
                                                   e_err[-2000:])
  assert q_err == "" and e_err == "", (q_err[-2000:], e_err[-2000:])
  assert "final eval accuracy" in q_out and "REACHED" in q_out, q_out[-2000:]
  assert (tmp_path / "meshtf_train" / "default" / "config.json").exists()
  assert e_out.count("\n== ") + e_out.startswith("== ") == 4, e_out
  assert "every layout: the same 20 losses up to" in e_out, e_out


# --- the plan report and the other sections' binary commands ------------------
def _plan_section():
  text = _doc("planning.md")
  return text.split("## What a layout costs before running it", 1)[1].split(
      "\n## ", 1)[0]


def test_plan_snippet_prints_what_the_readme_shows():
  """The plan section's snippet in a fresh process: each line the README
  shows is printed ("..." standing for what was left out of a line; a line
  of only "..." for lines left out)."""
  import os
  import subprocess
  import sys
  section = _plan_section()
  code = section.split("```python", 1)[1].split("```", 1)[0]
  shown = section.split("prints (abridged", 1)[1].split("\n\n", 1)[1]
  shown = [l[4:].rstrip() for l in shown.split("\n\n", 1)[0].splitlines()
           if l.strip() != "..."]
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                     text=True, timeout=300, cwd=str(ROOT), env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  printed = [l.rstrip() for l in r.stdout.splitlines()]
  assert len(shown) == 7
  for line in shown:
    pattern = ".*".join(re.escape(p) for p in line.split("...")) + "$"
    assert any(re.match(pattern, p) for p in printed), (line, printed)


def other_binary_commands():
  """`python -m meshtf.train ...` commands the README and the guides show
  outside the Quickstart and the binary section (those are tested
  above)."""
  import shlex
  # docs/t5.md's commands: t5_commands() and its tests, below.
  texts = [(ROOT / "README.md").read_text()] + [
      p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))
      if p.name != "t5.md"]
  commands = []
  for text in texts:
    for skipped in ("## Quickstart",
                    "## The training binary and config files"):
      if skipped in text:
        head, rest = text.split(skipped, 1)
        after = rest.split("\n## ", 1)
        text = head + ("\n## " + after[1] if len(after) == 2 else "")
    commands += [shlex.split(l.strip()) for l in text.splitlines()
                 if l.startswith("    python -m meshtf.train")]
  return commands


# What each of those commands is (the start of an argument that tells it
# apart) and what its run must show. Each runs as its own test: together
# they outgrew one test's time limit on a loaded machine (issue 32).
OTHER_COMMANDS = {
    "weight_update_sharding": "--config.variable_layout=d_model:data",
    "plan_64b": "--config=t2t_configs/gspmd_dense.py:",
    "sweep": "--mode=sweep",
    "auto_layout": "--layout=auto",
    "pipeline": "--config.pipeline_stages=2",
    "text_lm": "--config.task.data_files=",
    "text_lm_export": "--mode=export",
}


def _is(name, argv):
  return any(a.startswith(OTHER_COMMANDS[name]) for a in argv)


def _other_command(name):
  argv, = [c for c in other_binary_commands() if _is(name, c)]
  return argv


def test_other_binary_commands_are_the_ones_checked():
  """Weight-update sharding's training command, the plan, sweep and
  automatic-layout commands and the pipelined run: each is checked below,
  and no other command is shown untested."""
  cmds = other_binary_commands()
  assert len(cmds) == len(OTHER_COMMANDS), cmds
  for name in OTHER_COMMANDS:
    assert len([c for c in cmds if _is(name, c)]) == 1, (name, cmds)
  assert all(c[:3] == ["python", "-m", "meshtf.train"] for c in cmds), cmds


def _run_other(name, tmp_path, monkeypatch):
  """The command from the repository root, /tmp/ meaning tmp_path; its
  stdout."""
  import io
  from meshtf.train import main
  argv = _other_command(name)
  monkeypatch.chdir(str(ROOT))
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + _in_tmp(argv, tmp_path)[3:],
                          out=out, err=err)
  assert code == 0 and err.getvalue() == "", (argv, err.getvalue())
  return out.getvalue()


def test_weight_update_sharding_command_works_as_written(tmp_path,
                                                         monkeypatch):
  out = _run_other("weight_update_sharding", tmp_path, monkeypatch)
  assert "REACHED" in out, out[-2000:]


# Plans a 512-processor mesh: 281 s on a 2-core machine at load ~17 when
# the plan traced the program (issue 32), 8 s since it estimates where XLA
# compiles (plan(trace="auto")); the timeout still allows a traced plan.
@pytest.mark.timeout(1200)
def test_plan_command_gives_the_readme_table_row(tmp_path, monkeypatch):
  """The plan's JSON holds the numbers of the README's GSPMD table row it
  names."""
  import json
  _run_other("plan_64b", tmp_path, monkeypatch)
  report = json.load(open(tmp_path / "plan_64b" / "plan.json"))
  memory = report["memory_bytes_per_device"]
  row = [l for l in _plan_section().splitlines()
         if l.startswith("| attempt1")][0].split("|")
  assert row[2].strip() == "%d GB" % round(memory["activations_saved"] / 1e9)
  assert row[3].strip() == "%d GB" % round(memory["peak"] / 1e9)
  assert row[4].strip() == "%d GB" % round(
      report["collective_bytes_per_device"] / 1e9)
  assert row[5].strip() == "%.1f s" % report["step_seconds"]


def test_sweep_command_works_as_written(tmp_path, monkeypatch):
  """Four entries, the fourth invalid and listed."""
  out = _run_other("sweep", tmp_path, monkeypatch)
  sweep = (tmp_path / "sweep_lm" / "sweep.csv").read_text().splitlines()
  assert len(sweep) == 5 and sweep[4].startswith("4,x:3,batch:x;d_ff:x,,,"
                                                 "False,")
  assert "invalid entry 4 (x:3 @ batch:x;d_ff:x)" in out


def test_auto_layout_command_works_as_written(tmp_path, monkeypatch):
  """The automatic layout: its choice is what was planned."""
  import json
  out = _run_other("auto_layout", tmp_path, monkeypatch)
  auto = json.load(open(tmp_path / "lm_auto" / "plan.json"))
  assert auto["layout"] == auto["layout_search"]["layout"]
  assert "using layout %s" % auto["layout"] in out


def test_pipeline_command_works_as_written(tmp_path, monkeypatch):
  """The pipelined lm_tiny: the schedule in the header, 99% reached."""
  out = _run_other("pipeline", tmp_path, monkeypatch)
  assert "pipeline: 2 stages x 1 layers each, 4 microbatches" in out
  assert "bubble fraction 0.200 (analytic)" in out
  assert "final eval accuracy" in out and "REACHED" in out, out[-2000:]


# --- pipeline parallelism -----------------------------------------------------
def _pipeline_section():
  text = _doc("pipeline.md")
  return text.split("## Pipeline parallelism", 1)[1].split("\n## ", 1)[0]


def test_pipeline_schedules_drawn_are_the_schedules_run():
  """The README's two tables are Schedule(4, 4) and Schedule(2, 4, 2)."""
  from meshtf.models import pipeline
  tables = []
  for block in _pipeline_section().split("\n\n"):
    lines = block.splitlines()
    if lines and lines[0].strip().startswith("iteration"):
      tables.append([l.split()[1:] for l in lines[1:]])
  assert tables == [pipeline.Schedule(4, 4).table(),
                    pipeline.Schedule(2, 4, 2).table()]


def test_pipeline_snippet_runs_and_shows_the_bubble():
  """The snippet builds its model, mesh and training step (no step is
  run: the harness tests cover the numbers); its bubble is as shown."""
  import meshtf as mtf
  code = _pipeline_section().split("```python", 1)[1].split("```", 1)[0]
  env = {"mtf": mtf}
  exec(compile(code, "README", "exec"), env)
  assert env["lm"].layer_stack.pipeline.schedule.num_iterations == 9
  shown = code.split("bubble_fraction(2, 4, 2)", 1)[1].split("# ", 1)[1]
  assert shown.startswith("0.111") and str(
      mtf.pipeline.bubble_fraction(2, 4, 2)).startswith("0.111")


# --- text data ------------------------------------------------------------------
def test_text_data_commands_and_snippet_work_as_written(tmp_path,
                                                        monkeypatch):
  """The guide's text LM on the repository's docs trains, exports, and its
  decode_text snippet prints one string per prompt in a fresh process."""
  import os
  import subprocess
  import sys
  out = _run_other("text_lm", tmp_path, monkeypatch)
  assert "task: README.md,docs/*.md;" in out, out[-2000:]
  assert (tmp_path / "text_lm" / "vocab.model").is_file()
  _run_other("text_lm_export", tmp_path, monkeypatch)
  text = _doc("training-binary.md").split("## Text data at corpus scale",
                                          1)[1]
  snippet = text.split("```python", 1)[1].split("```", 1)[0]
  snippet = snippet.replace("/tmp/", str(tmp_path) + "/")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  r = subprocess.run([sys.executable, "-c", snippet], capture_output=True,
                     text=True, timeout=300, cwd=str(tmp_path), env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  # Two byte strings (numpy writes one with a ' in it as b"...").
  import ast
  printed = ast.literal_eval(",".join(r.stdout.strip()[1:-1].split("\n")))
  assert len(printed) == 2 and all(isinstance(p, bytes) for p in printed), (
      r.stdout)


# --- docs/t5.md: a Mesh TF checkpoint fine-tuned, as written ------------------
def t5_commands():
  """The indented commands of docs/t5.md, as argv lists (its header excerpt
  and other indented text are not commands)."""
  import shlex
  return [shlex.split(l.strip()) for l in _doc("t5.md").splitlines()
          if l.startswith("    python -m meshtf.train")]


@pytest.mark.timeout(1500)
def test_t5_guide_commands_work_as_written(tmp_path, monkeypatch):
  """docs/t5.md's fine-tuning walk-through from the repository root, /tmp/
  meaning this test's directory, through the binary's main in this process:
  a stand-in release written in Mesh TF's format, fine-tuned on the shipped
  TSV (the header shows the restore block the guide quotes), evaluated,
  decoded, exported twice. (The guide's --mode=plan of t5.1.1_xxl: the next
  test.)"""
  import io
  from meshtf.train import main
  cmds = t5_commands()
  assert len(cmds) == 8 and "--mode=plan" in cmds[-1], cmds
  monkeypatch.chdir(str(ROOT))
  outs = []
  for argv in cmds[:-1]:
    out, err = io.StringIO(), io.StringIO()
    code = main.run_command(["meshtf.train"] + _in_tmp(argv, tmp_path)[3:],
                            out=out, err=err)
    assert code == 0 and err.getvalue() == "", (argv, err.getvalue())
    outs.append(out.getvalue().replace(str(tmp_path) + "/", "/tmp/"))
  quoted = _doc("t5.md").split("traced:\n\n", 1)[1].split("\n\n", 1)[0]
  for line in quoted.splitlines():
    assert line[4:] in outs[2].splitlines(), (line, outs[2][-3000:])
  assert (tmp_path / "t5_ft" / "mesh_tf" / "model.ckpt-50.index").exists()
  assert (tmp_path / "t5_ft" / "export" / "saved_model.pb").exists()


@pytest.mark.timeout(1200)
def test_t5_guide_plan_command_works_as_written(tmp_path, monkeypatch):
  """docs/t5.md's plan of T5.1.1 xxl: its training step fits 16 GiB TPU v3
  cores on the mesh the guide names."""
  import io
  import json
  from meshtf.train import main
  argv = t5_commands()[-1]
  monkeypatch.chdir(str(ROOT))
  out, err = io.StringIO(), io.StringIO()
  code = main.run_command(["meshtf.train"] + _in_tmp(argv, tmp_path)[3:],
                          out=out, err=err)
  assert code == 0 and err.getvalue() == "", err.getvalue()
  assert "DOES NOT FIT" not in out.getvalue(), out.getvalue()[:2000]
  plan = json.loads((tmp_path / "t5_xxl_plan" / "plan.json").read_text())
  assert plan["mesh"] == "data:16;model:16" and plan["fits_in_memory"]
  memory = plan["memory_bytes_per_device"]
  said = "a peak of %.1f GB per core (%.1f GB of weights, %.1f GB of\n" \
      "activations kept), a step of %.2f s on the plan's TPU v3 model (%d%% of " \
      "peak\nflops)" % (memory["peak"] / 1e9, memory["parameters"] / 1e9,
                        memory["activations_saved"] / 1e9,
                        plan["step_seconds"],
                        round(100 * plan["flops_utilization"]))
  assert said in _doc("t5.md"), said
