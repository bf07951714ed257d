"""The training binary's errors and their exit codes.

Every error the binary expects is printed as ONE line on stderr,
"meshtf.train: error: <what, the sizes, the fix>", with no traceback:

  exit 2  bad input: flags, config, data or prompt files, model_dir (a
          file, not writable, in use by another run, trained with another
          model, no intact checkpoint), a mesh too large for virtual CPUs;
          raised before anything is written
  exit 1  training diverged (a loss, gradient norm or variable that is not
          finite): nothing is saved after the last good checkpoint

Example:
  >>> raise UsageError("--model_dir=/etc/passwd is a file: pass a directory")
"""

EXIT_USAGE = 2
EXIT_DIVERGED = 1


class UsageError(ValueError):
  """Bad input found at run time (model_dir, data, checkpoint): one line,
  exit code 2."""


class DivergedError(RuntimeError):
  """Training produced a non-finite loss, gradient norm or variable: one
  line naming the step and the likely causes, exit code 1."""


__all__ = ["UsageError", "DivergedError", "EXIT_USAGE", "EXIT_DIVERGED"]
