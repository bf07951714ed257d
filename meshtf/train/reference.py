"""The training binary's flags and config fields as markdown, from the code
itself: docs/config-fields.md is this module's output (tests/test_docs.py
checks that it is), so the reference cannot drift from the binary.

  python -m meshtf.train.reference > docs/config-fields.md

Each config field gets its default (default_config()), what it may take
(preflight.RANGES for numbers, the schema's tuples of choices for strings)
and the comment beside it in meshtf/train/config.py; each flag its help.

Example:
  >>> rows = config_field_rows()
  >>> rows[0][:2]
  ('model_type', '"lm"')
"""
import inspect
import re
import sys

from absl import flags

from meshtf.train import config as config_lib
from meshtf.train import preflight

# Fields whose values are one of a tuple of the schema.
_CHOICES = {
    "model_type": config_lib.MODEL_TYPES,
    "backend": config_lib.BACKENDS,
    "activation_dtype": config_lib.ACTIVATION_DTYPES,
    "jit_compile": config_lib.JIT_COMPILE,
    "communication_hint": config_lib.COMMUNICATION_HINTS,
    "optimizer": config_lib.OPTIMIZERS,
    "schedule": config_lib.SCHEDULES,
    "moe.gating": config_lib.GATINGS,
    "decode_method": config_lib.DECODE_METHODS,
    "decode_strategy": config_lib.DECODE_STRATEGIES,
    "task.data_format": config_lib.DATA_FORMATS,
    "task.objective": config_lib.TASK_OBJECTIVES,
}
_FIELD = re.compile(r"^  c\.([a-z0-9_.]+) = ")
_CONTINUED = re.compile(r"^  #\s{10,}(.*)$")   # an aligned comment line


def _comments():
  """{key: the comment beside `c.key = ...` and its aligned lines}."""
  out, key = {}, None
  for line in inspect.getsource(config_lib.default_config).splitlines():
    match = _FIELD.match(line)
    if match:
      key = match.group(1)
      code = line.split("  # ", 1)
      out[key] = code[1].strip() if len(code) == 2 else ""
      continue
    more = _CONTINUED.match(line)
    if more and key is not None:
      out[key] = (out[key] + " " + more.group(1).strip()).strip()
    elif line.strip() and not line.strip().startswith(('"', "'", "#")):
      key = None   # a line of code ends the comment (a value's own lines
      #              are strings)
  return out


def _flat(config, prefix=""):
  for key in config.keys():
    value = config[key]
    if hasattr(value, "keys"):
      yield from _flat(value, prefix + key + ".")
    else:
      yield prefix + key, value


def _show(value):
  if isinstance(value, str):
    return '"%s"' % value
  return repr(value)


def config_field_rows():
  """(key, default, allowed, comment) for every config field, in the
  schema's order."""
  ranges = {key: allowed.text() for key, allowed, _ in preflight.RANGES}
  comments = _comments()
  rows = []
  # In the schema's order (config.py's lines), which groups the fields.
  order = list(comments)
  fields = sorted(_flat(config_lib.default_config()), key=lambda kv: (
      order.index(kv[0]) if kv[0] in order else len(order), kv[0]))
  for key, value in fields:
    allowed = ranges.get(key, "")
    if key in _CHOICES:
      allowed = "one of " + ", ".join('"%s"' % c for c in _CHOICES[key])
    rows.append((key, _show(value), allowed, comments.get(key, "")))
  return rows


def flag_rows():
  """(flag, help) for every flag of the binary."""
  flag_values = flags.FlagValues()
  from meshtf.train import main   # pylint: disable=import-outside-toplevel
  main.define_flags(flag_values, ["meshtf.train"])
  return [("--" + name, " ".join(flag_values[name].help.split()))
          for name in flag_values]


def _cell(text):
  return text.replace("|", "\\|")


def markdown():
  """docs/config-fields.md."""
  lines = [
      "# Every flag and config field of the training binary",
      "",
      "After this page you can set any of the binary's flags and config",
      "fields knowing its default and what it may take. It is generated",
      "from the code (`python -m meshtf.train.reference >",
      "docs/config-fields.md`; `tests/test_docs.py` checks it is current).",
      "How to use them: [the training binary](training-binary.md).",
      "",
      "## Flags",
      "",
      "Flags win over the config file's fields. Any field below is also a",
      "flag, `--config.<field>=value`.",
      "",
      "| flag | what it does |",
      "|---|---|",
  ]
  lines += ["| `%s` | %s |" % (name, _cell(text)) for name, text in flag_rows()]
  lines += [
      "",
      "## Config fields",
      "",
      "Numbers outside their range are refused before TensorFlow starts, in",
      "one line naming the field, the range and a fix",
      "(`meshtf/train/preflight.py`).",
      "",
      "| field | default | may be | what it is |",
      "|---|---|---|---|",
  ]
  lines += ["| `%s` | `%s` | %s | %s |" % (key, _cell(default), _cell(allowed),
                                         _cell(comment))
            for key, default, allowed, comment in config_field_rows()]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.stdout.write(markdown())
