"""The README Quickstart and CI stay in sync."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
  text = (ROOT / "README.md").read_text()
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
