"""The training binary's errors and their exit codes.

Every error the binary expects is printed as ONE line on stderr,
"meshtf.train: error: <what, the sizes, the fix>", with no traceback:

  exit 2  bad input: flags, config, data or prompt files, model_dir (a
          file, a symlink loop, not writable, in use by another run,
          trained with another model, no intact checkpoint), a mesh too
          large for virtual CPUs, a step too large for this machine's
          memory; raised before anything is written. Also a model_dir
          whose disk fills during training (DiskFullError): the last
          checkpoint stays intact
  exit 1  training diverged (a loss, gradient norm or variable that is not
          finite): nothing is saved after the last good checkpoint
  exit 3  a multi-worker run lost a worker (its process ended, stopped
          answering, or its host is unreachable), or the workers did not
          all start within the deadline (ClusterError): the line names the
          worker, the step and the newest checkpoint; restarting every
          worker with the same command resumes from it
          (meshtf/train/peers.py, rendezvous.py)
  exit 130 / 143  stopped by SIGINT / SIGTERM (meshtf/train/stopping.py)

Example:
  >>> raise UsageError("--model_dir=/etc/passwd is a file: pass a directory")
"""

EXIT_USAGE = 2
EXIT_DIVERGED = 1
EXIT_CLUSTER = 3


class ConfigError(ValueError):
  """A bad config or flag. str(e) is one line per problem, each with a fix;
  exit code 2. Raised by the preflight (meshtf/train/config.py's validate,
  preflight.py) before TensorFlow starts; meshtf.train.config re-exports it.

  Attributes:
    problems: the list of one-line problem descriptions.

  Example:
    >>> raise ConfigError(["optimizer='adma' is unknown: use "
    ...                    "--config.optimizer=adam"])
  """

  def __init__(self, problems):
    self.problems = list(problems)
    super().__init__("\n".join(self.problems))


class UsageError(ValueError):
  """Bad input found at run time (model_dir, data, checkpoint): one line,
  exit code 2."""


class DataError(UsageError):
  """Missing or unusable training data -- files, their contents, a
  vocabulary, a TFDS dataset: one line naming the file (and line) and the
  fix, exit code 2. meshtf.train.text_data re-exports it."""


class DivergedError(RuntimeError):
  """Training produced a non-finite loss, gradient norm or variable: one
  line naming the step and the likely causes, exit code 1."""


class DiskFullError(UsageError):
  """The disk of model_dir filled while training wrote to it: one line
  naming what was being written and the checkpoint that stays intact,
  exit code 2."""


class ClusterError(RuntimeError):
  """A multi-worker run cannot go on: a worker was lost or stopped
  answering, or the workers did not all start in time. One line naming the
  worker (task and host:port), what was running and what model_dir keeps;
  exit code 3 (a launcher or scheduler may restart the group: nothing
  saved is lost).

  Example:
    >>> raise ClusterError("worker task 2 (10.0.0.3:2222) stopped answering "
    ...                    "during step 16: ... keeps ckpt-10 ...")
  """


def is_disk_full(error):
  """True for the errors a full disk (or an exhausted quota) raises: an
  OSError ENOSPC / EDQUOT, or TensorFlow's ResourceExhaustedError "No
  space left on device" (checkpoint bundles, summary event files).

  Example:
    >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    True
  """
  import errno
  if isinstance(error, OSError):
    return error.errno in (errno.ENOSPC, errno.EDQUOT)
  text = str(error)
  return type(error).__name__ == "ResourceExhaustedError" and (
      "No space left on device" in text or "Disk quota exceeded" in text)


__all__ = ["ConfigError", "UsageError", "DataError", "DivergedError",
           "DiskFullError", "ClusterError", "is_disk_full", "EXIT_USAGE",
           "EXIT_DIVERGED", "EXIT_CLUSTER"]
