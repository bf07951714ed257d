"""The README is a front door and the guides in docs/ are navigable: the
README is short and links every guide, each guide says what its reader can
do after it, every relative link (file and #anchor) resolves, and the
config field reference is what the code generates. (The commands and
snippets of both are run by tests/test_readme.py.)"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250
GENERATED = {"config-fields.md"}   # python -m meshtf.train.reference


def _guides():
  return sorted(DOCS.glob("*.md"))


def _outside_code(text):
  """The text with fenced and indented code blocks blanked."""
  out, fence = [], False
  for line in text.splitlines():
    if line.startswith("```"):
      fence = not fence
      out.append("")
    elif fence or line.startswith("    "):
      out.append("")
    else:
      out.append(line)
  return "\n".join(out)


def _slug(heading):
  """GitHub's anchor of a heading."""
  heading = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return heading.replace(" ", "-")


def _anchors(path):
  text = _outside_code(path.read_text())
  return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def _links(path):
  """(target, anchor) of every relative markdown link in path."""
  text = _outside_code(path.read_text())
  text = re.sub(r"`[^`]*`", "", text)   # code spans are not links
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"^[a-z]+:", target):
      continue   # http(s), mailto
    file, _, anchor = target.partition("#")
    yield file, anchor


def test_the_readme_is_a_short_front_door():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= README_MAX_LINES
  headings = re.findall(r"^## (.*)$", _outside_code(text), re.M)
  assert headings[:2] == ["Quickstart", "The DSL in one example"], headings
  assert "Guides" in headings


def test_the_readme_links_every_guide_and_each_says_what_it_teaches():
  readme = (ROOT / "README.md").read_text()
  for guide in _guides():
    assert "(docs/%s)" % guide.name in readme, guide.name
    lines = guide.read_text().splitlines()
    assert lines[0].startswith("# "), guide.name
    assert lines[2].startswith("After this "), (guide.name, lines[2])


def test_every_relative_link_and_anchor_resolves():
  checked = 0
  for page in [ROOT / "README.md"] + _guides():
    for file, anchor in _links(page):
      target = (page.parent / file).resolve() if file else page
      assert target.exists(), (page.name, file)
      if anchor:
        assert anchor in _anchors(target), (page.name, file, anchor)
      checked += 1
  assert checked >= 20


def test_the_config_field_reference_is_current():
  """docs/config-fields.md is `python -m meshtf.train.reference`'s output,
  and it lists every flag and config field."""
  from meshtf.train import config as config_lib
  from meshtf.train import reference
  text = (DOCS / "config-fields.md").read_text()
  assert text == reference.markdown(), (
      "regenerate: python -m meshtf.train.reference > docs/config-fields.md")
  fields = [k for k, _, _, _ in reference.config_field_rows()]

  def leaves(config, prefix=""):
    for key in config.keys():
      if hasattr(config[key], "keys"):
        yield from leaves(config[key], prefix + key + ".")
      else:
        yield prefix + key
  assert sorted(fields) == sorted(leaves(config_lib.default_config()))
  assert len(fields) > 80
  for flag in ("--config", "--model_dir", "--mode", "--layout", "--seed"):
    assert "| `%s` |" % flag in text, flag
  assert GENERATED <= {p.name for p in _guides()}
