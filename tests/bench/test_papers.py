"""bench/papers.py's tables: the reproduction tables of docs/papers.md are
what the generator prints from the saved run, and the generator's
cells."""
import json
import pathlib

import results_index
from conftest import load_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The run before the sharding completion (labels "before": the model at
# f8fd043, "after": the interconnect, fusion and overlap models), the run
# with it (label "completion"), the run with rematerialization, the
# papers' capacity and the pipeline loop (label "main_2b23abb") and the
# newest labelled run (the guide's table; main_5981377: XLA's duplication
# of the mask add and the loops' sums priced).
BEFORE = ROOT / "bench" / "results" / "cpu2_papers_2026-11-27.jsonl"
COMPLETION = (ROOT / "bench" / "results" /
              "cpu2_papers_completion_2026-11-27.jsonl")
REMAT = (ROOT / "bench" / "results" /
         "cpu2_papers_main_2b23abb_2026-11-27.jsonl")
RESULTS = results_index.newest_labelled_run("papers")
LABEL = json.loads(RESULTS.read_text().splitlines()[0])["label"]
COMPARE = ("before=f8fd043", "after=without completion",
           "completion=with completion",
           "main_2b23abb=with remat and the pipeline loop",
           "main_5981377=with the mask add recomputed and the loops' sums")


def _block(text, name):
  return text.split("<!-- %s:begin -->\n" % name, 1)[1].split(
      "<!-- %s:end -->" % name, 1)[0]


def test_readme_tables_are_the_saved_runs():
  bench = load_file("bench/papers.py", "papers")
  lines = bench.read_runs("%s,%s,%s,%s" % (BEFORE, COMPLETION, REMAT,
                                            RESULTS))
  readme = (ROOT / "docs" / "papers.md").read_text()
  now = [r for r in lines if r.get("label") == LABEL]
  assert _block(readme, "papers") == bench.markdown_table(now)
  assert _block(readme, "papers-compare") == bench.compare_table(
      lines, *COMPARE)
  # The commands the guide shows print them.
  assert ("--table=bench/results/%s --label=%s" % (RESULTS.name, LABEL)
          in readme)
  assert ("--table=bench/results/%s,bench/results/%s,bench/results/%s,"
          "bench/results/%s" % (BEFORE.name, COMPLETION.name, REMAT.name,
                                RESULTS.name) in readme)
  assert '--compare="%s"' % ",".join(COMPARE) in readme


def test_compare_heads_each_run():
  bench = load_file("bench/papers.py", "papers")
  rows = [dict(bench._row("T", "r", "step_seconds", 2.0, plan, unit="s"),
               label=label) for label, plan in (("a", 4.0), ("b", 3.0))]
  table = bench.compare_table(rows, "a=old model", "b")
  assert table.splitlines()[0] == ("| table | row | paper | plan old model "
                                   "| plan b |")
  assert table.splitlines()[2] == "| T | r | 2 s | 4 s (2.00) | 3 s (1.50) |"


def test_cells_read_paper_plan_and_ratio():
  bench = load_file("bench/papers.py", "papers")
  rows = [bench._row("T", "r", "step_seconds", 2.0, 3.0, unit="s"),
          bench._row("T", "r", "parameters_2^30", 10, None, unit="2^30",
                     note="no model")]
  table = bench.markdown_table(rows)
  assert table.splitlines()[0] == "| T | step | parameters (x 2^30) |"
  assert table.splitlines()[2] == ("| r | 2 s / 3 s (1.50) | "
                                   "10 / -- (no model) |")
