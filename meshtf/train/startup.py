"""A quiet TensorFlow start for the command-line programs.

Loading TensorFlow and creating its devices writes ~9 lines from C++ to
stderr (oneDNN and CPU-feature notes, "Could not find cuda drivers", an
"E ... failed call to cuInit" line on machines without a GPU). They come
before absl's logging is initialised, so TF_CPP_MIN_LOG_LEVEL does not
silence them all, and they would push every one-line error of the binary
down to line 10. So `python -m meshtf.train` and `python -m
meshtf.examples.two_layer` send file descriptor 2 to a temporary file from
before TensorFlow loads until their devices exist (`devices_ready`), while
Python's own sys.stderr keeps writing to the terminal; then the known
start-up lines are dropped and anything else that was written is passed
on. TF_CPP_MIN_LOG_LEVEL defaults to 2 (errors only) for the rest of the
run (a value the user set is kept). `--verbosity=<n>` (or -v) keeps
TensorFlow's output as it is.

meshtf/train/__main__.py and meshtf/examples/two_layer.py call
`quiet_if_command_line()` before anything imports TensorFlow (the meshtf
package face is lazy: importing it loads no TensorFlow).

Example:
  >>> quiet_if_command_line()   # in meshtf/train/__main__.py, before TF loads
  >>> devices = mtf.virtual_cpu_devices(8)
  >>> devices_ready()           # stderr is the terminal again
"""
import atexit
import io
import os
import re
import sys
import tempfile

PROGRAMS = ("meshtf.train", "meshtf.train.__main__",
            "meshtf.examples.two_layer")

# The lines TensorFlow writes while it loads and creates devices.
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|To enable the following instructions"
    r"|[IWE]\d{4} [\d:.]+\s+\d+ (port|cudart_stub|cpu_feature_guard|"
    r"cuda_platform|cuda_executor|cuda_dnn|cuda_fft|cuda_blas|"
    r"computation_placer|gpu_device|cuda_diagnostics)\.cc:\d+\])")

_state = {}   # "fd": the real stderr's duplicate, "capture": the temp file


def program_name(argv=None):
  """The meshtf command-line program this interpreter was started as
  (`python -m <name>`), or None."""
  argv = list(getattr(sys, "orig_argv", None) or []) if argv is None else argv
  for i, arg in enumerate(argv[:-1]):
    if arg == "-m":
      return argv[i + 1] if argv[i + 1] in PROGRAMS else None
  return None


def wants_tensorflow_output(argv):
  """True when the command line asks for logging (--verbosity=<n>, -v)."""
  return any(a == "-v" or a.startswith(("--verbosity", "-v=")) for a in argv)


def quiet_if_command_line():
  """Starts the quiet window when this process is one of PROGRAMS and the
  user did not ask for TensorFlow's output; a no-op otherwise (imports of
  meshtf as a library, tests)."""
  argv = list(getattr(sys, "orig_argv", None) or [])
  if program_name(argv) is None or wants_tensorflow_output(argv):
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  start_quiet()


def start_quiet():
  """Points file descriptor 2 at a temporary file; sys.stderr keeps
  writing to the real stderr."""
  if _state:
    return
  sys.stderr.flush()
  real = os.dup(2)
  capture = tempfile.TemporaryFile()
  os.dup2(capture.fileno(), 2)
  _state.update(fd=real, capture=capture, stderr=sys.stderr)
  sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(real), "wb", buffering=0),
                                write_through=True,
                                errors="backslashreplace")
  atexit.register(devices_ready)


def tensorflow_output_to(path):
  """Ends the quiet window with file descriptor 2 (TensorFlow's C++
  messages) appending to `path` for the rest of the run, instead of the
  terminal; what the window captured, less the known start-up lines, goes
  there first. Python's sys.stderr keeps writing to the terminal. A
  multi-worker run calls it once its cluster is up: a lost worker's gRPC
  errors are ~130 lines per survivor. A no-op outside the quiet window
  (a library import, --verbosity).

  Example:
    >>> tensorflow_output_to("/tmp/m/tensorflow-task1.log")
  """
  if not _state:
    return
  sys.stderr.flush()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  capture = _state["capture"]
  capture.seek(0)
  text = capture.read().decode("utf-8", "backslashreplace")
  capture.close()
  kept = [l for l in text.splitlines() if l.strip() and not _NOISE.match(l)]
  if kept:
    os.write(fd, ("\n".join(kept) + "\n").encode("utf-8"))
  os.dup2(fd, 2)
  os.close(fd)
  os.close(_state["fd"])
  # sys.stderr stays the stand-in on the terminal (its own descriptor).
  _state.clear()


def devices_ready():
  """Ends the quiet window (idempotent): file descriptor 2 is the real
  stderr again, and whatever was captured that is not a known start-up
  line is written there."""
  if not _state:
    return
  sys.stderr.flush()
  os.dup2(_state["fd"], 2)
  os.close(_state["fd"])
  capture = _state["capture"]
  capture.seek(0)
  text = capture.read().decode("utf-8", "backslashreplace")
  capture.close()
  # The stand-in stays open: a logging handler made during the window may
  # hold it (it writes to the real stderr too).
  sys.stderr = _state["stderr"]
  _state.clear()
  kept = [l for l in text.splitlines() if l.strip() and not _NOISE.match(l)]
  if kept:
    sys.stderr.write("\n".join(kept) + "\n")
    sys.stderr.flush()


__all__ = ["quiet_if_command_line", "start_quiet", "devices_ready",
           "tensorflow_output_to",
           "program_name", "wants_tensorflow_output"]
