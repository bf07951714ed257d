"""The SPMD backend's program options -- the collectives'
communication_hint, XLA (jit_compile) and Grappler -- as one frozen value,
checked once when it is made: SimdMeshImpl takes it (the impl's own
options), MeshFunction and SimdMeshImpl.program_options take it (overrides
for their traces), and the training binary makes one from its config.

Example:
  >>> options = ProgramOptions(jit_compile=True)
  >>> options.jit_compile, options.communication_hint
  ('program', None)
  >>> ProgramOptions(grappler="fast")
  Traceback (most recent call last):
  ValueError: ProgramOptions: grappler='fast' is not one of 'default', ...
"""
import dataclasses

from meshtf.lowering import grappler as grappler_lib
from meshtf.lowering import simd_collectives

_WHERE = "ProgramOptions"


@dataclasses.dataclass(frozen=True)
class ProgramOptions(object):
  """communication_hint: "nccl" | "ring" | "auto"; jit_compile: "" (off) |
  "segments" | "program" (False / True are read as "" / "program");
  grappler: "default" | "off". None: not given (the impl's, or chosen from
  the devices; see SimdMeshImpl). A bad value is a ValueError naming the
  option and the fix, raised here, before anything is traced."""
  communication_hint: object = None
  jit_compile: object = None
  grappler: object = None

  def __post_init__(self):
    for name, check in (
        ("communication_hint", simd_collectives.check_communication_hint),
        ("jit_compile", simd_collectives.check_jit_compile),
        ("grappler", grappler_lib.check_grappler)):
      object.__setattr__(self, name, check(getattr(self, name), _WHERE))

  @classmethod
  def checked(cls, where, communication_hint=None, jit_compile=None,
              grappler=None):
    """ProgramOptions whose error, for a bad value, names `where` (the
    caller given the options as keywords) instead of ProgramOptions.

    Example:
      >>> ProgramOptions.checked("MeshFunction", jit_compile="segments")
      ProgramOptions(communication_hint=None, jit_compile='segments', ...)
    """
    try:
      return cls(communication_hint, jit_compile, grappler)
    except ValueError as e:
      raise ValueError(str(e).replace(_WHERE, where, 1)) from None

  @property
  def given(self):
    """Whether any option is set (not None)."""
    return any(v is not None for v in dataclasses.astuple(self))

  def as_dict(self):
    """{option name: value (None: not given)}."""
    return dataclasses.asdict(self)


__all__ = ["ProgramOptions"]
