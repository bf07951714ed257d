"""bench/papers.py's tables: the README's reproduction tables are what
the generator prints from the saved run, and the generator's cells."""
import json
import pathlib

from conftest import load_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "cpu2_papers_2026-11-27.jsonl"


def _block(text, name):
  return text.split("<!-- %s:begin -->\n" % name, 1)[1].split(
      "<!-- %s:end -->" % name, 1)[0]


def test_readme_tables_are_the_saved_runs():
  bench = load_file("bench/papers.py", "papers")
  lines = [json.loads(l) for l in RESULTS.read_text().splitlines() if l]
  readme = (ROOT / "README.md").read_text()
  after = [r for r in lines if r.get("label") == "after"]
  assert _block(readme, "papers") == bench.markdown_table(after)
  assert _block(readme, "papers-compare") == bench.compare_table(
      lines, "before", "after")


def test_cells_read_paper_plan_and_ratio():
  bench = load_file("bench/papers.py", "papers")
  rows = [bench._row("T", "r", "step_seconds", 2.0, 3.0, unit="s"),
          bench._row("T", "r", "parameters_2^30", 10, None, unit="2^30",
                     note="no model")]
  table = bench.markdown_table(rows)
  assert table.splitlines()[0] == "| T | step | parameters (x 2^30) |"
  assert table.splitlines()[2] == ("| r | 2 s / 3 s (1.50) | "
                                   "10 / -- (no model) |")
