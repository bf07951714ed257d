"""bench/results/README.md indexes every saved run: each file once, with
the labels it carries and the docs and tests that name it."""
import json

import results_index


def test_every_saved_run_is_indexed_once():
  indexed = [e.path.name for e in results_index.entries()]
  saved = sorted(p.name for p in results_index.RESULTS.iterdir()
                 if p.name != "README.md")
  assert sorted(indexed) == saved
  assert len(set(indexed)) == len(indexed)


def test_the_index_says_who_cites_and_reads_each_run():
  for e in results_index.entries():
    # A test reads a bench's newest labelled run through the index.
    newest = e.labels and (
        e.path == results_index.newest_labelled_run(e.bench))
    through_index = 'newest_labelled_run("%s")' % e.bench
    for path in e.cited_by + e.read_by:
      text = path.read_text()
      assert e.path.name in text or (
          newest and path in e.read_by and through_index in text), (
              e.path.name, path)
    if e.path.suffix == ".jsonl":
      rows = [json.loads(l) for l in e.path.read_text().splitlines()
              if l.strip()]
      labels = sorted({r["label"] for r in rows if r.get("label")})
      assert labels == sorted(e.labels), e.path.name
      # A run's note and summary lines name their bench too
      # (first_step_note).
      benches = {r["bench"] for r in rows if "bench" in r}
      assert all(b.split("_note")[0].split("_summary")[0] == e.bench
                 for b in benches), (e.path.name, benches)
