"""bench/results/README.md's index, read: each saved run's bench, labels and
the files that cite and read it; the newest labelled run of a bench.

Example:
  >>> newest_labelled_run("papers").name
  'cpu2_papers_main_5981377_2026-11-27.jsonl'
"""
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

Entry = collections.namedtuple("Entry", ["path", "bench", "labels",
                                         "cited_by", "read_by"])


def _paths(cell):
  """The repository files a cell names ('docs/a.md, tests/b.py (why)')."""
  return [ROOT / w.strip(",") for w in cell.split()
          if "/" in w and (ROOT / w.strip(",")).is_file()]


def entries():
  """The index's rows, in its order (oldest to newest within a bench)."""
  out = []
  for line in (RESULTS / "README.md").read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 5 or cells[0] in ("file", "---"):
      continue
    labels = [] if cells[2] == "-" else [l.strip() for l in
                                         cells[2].split(",")]
    out.append(Entry(RESULTS / cells[0], cells[1], labels,
                     _paths(cells[3]), _paths(cells[4])))
  return out


def newest_labelled_run(bench):
  """The path of the last labelled run of `bench` in the index."""
  return [e.path for e in entries() if e.bench == bench and e.labels][-1]
