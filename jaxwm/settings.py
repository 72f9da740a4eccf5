"""Config blocks as frozen dataclasses: defaults, checks and resume rules in one place per block.

A block (``optim``, ``train``, ``recipe``, ``data``, ``mesh``, ``sample``, ``distill``) is a frozen dataclass
:class:`Block` living next to the code that uses it (``jaxwm.training.optim.OptimConfig``, ...). Each field
is a :func:`setting`: its default (the default model's), its check (:class:`Int`, :class:`Float`, :class:`Bool`,
:class:`Str`, :class:`Choice`, whose choices come from the module that implements them), whether a resume may
change it (``resume``: ``refused`` / ``logged`` / ``free``) and, for keys added after checkpoints were written
without them, what their absence meant (``absent``). :meth:`Block.from_dict` refuses unknown keys with
suggestions and checks every field, raising :class:`ConfigError` (one line: ``<key>=<value>: <allowed>``);
:func:`defaults` gives the nested dict that ``configs/tiny.py`` starts from, so configs list overrides only.
Checks that span blocks stay in :mod:`jaxwm.config_checks`.
"""

import dataclasses
import difflib
import math
from typing import Any

RESUME = ("refused", "logged", "free")
_NO_ABSENT = object()


class ConfigError(ValueError):
  """A refused config value: ``str(e)`` is ``<key>=<value>: <allowed>``, one line."""

  def __init__(self, key, value, allowed):
    self.key, self.value, self.allowed = key, value, allowed
    super().__init__(f"{key}={show(value)}: {allowed}")


def show(value):
  """A value as the user would type it (strings quoted, tuples as lists)."""
  if isinstance(value, str):
    return repr(value)
  if isinstance(value, (list, tuple)):
    return "[" + ",".join(show(v) for v in value) + "]"
  if hasattr(value, "items"):  # a block: its keys, on one line
    return "{" + ",".join(map(str, value.keys())) + "}"
  return str(value)


def range_text(lo, hi, kind="number"):
  if lo is not None and hi is not None:
    return f"must be an {kind} in [{lo}, {hi}]" if kind == "integer" else f"must lie in [{lo}, {hi}]"
  if lo is not None:
    return f"must be an {kind} >= {lo}" if kind == "integer" else f"must be >= {lo}"
  return f"must be an {kind} <= {hi}" if kind == "integer" else f"must be <= {hi}"


@dataclasses.dataclass(frozen=True)
class Int:
  """An integer (not a bool) in ``[lo, hi]``."""
  lo: Any = None
  hi: Any = None
  allowed: Any = None

  def __call__(self, key, v):
    if isinstance(v, bool) or not isinstance(v, int):
      raise ConfigError(key, v, self.allowed or "must be an integer")
    if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
      raise ConfigError(key, v, self.allowed or range_text(self.lo, self.hi, "integer"))
    return v


@dataclasses.dataclass(frozen=True)
class Float:
  """A finite number with optional open (``gt``, ``lt``) or closed (``ge``, ``le``) bounds."""
  gt: Any = None
  ge: Any = None
  lt: Any = None
  le: Any = None
  allowed: Any = None

  def _bounds(self):
    parts = [f"> {self.gt}" if self.gt is not None else f">= {self.ge}" if self.ge is not None else None,
             f"< {self.lt}" if self.lt is not None else f"<= {self.le}" if self.le is not None else None]
    return " and ".join(p for p in parts if p)

  def __call__(self, key, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      raise ConfigError(key, v, self.allowed or " ".join(filter(None, ("must be a finite number", self._bounds()))))
    gt, ge, lt, le = self.gt, self.ge, self.lt, self.le
    if ((gt is not None and not v > gt) or (ge is not None and not v >= ge) or (lt is not None and not v < lt) or
        (le is not None and not v <= le)):
      raise ConfigError(key, v, self.allowed or f"must be {self._bounds()}")
    return v


@dataclasses.dataclass(frozen=True)
class Bool:

  def __call__(self, key, v):
    if not isinstance(v, bool):
      raise ConfigError(key, v, "must be True or False")
    return v


@dataclasses.dataclass(frozen=True)
class Str:
  nonempty: bool = False

  def __call__(self, key, v):
    if not isinstance(v, str) or (self.nonempty and not v):
      raise ConfigError(key, v, "must be a non-empty string" if self.nonempty else "must be a string")
    return v


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of ``choices``: a tuple, or a function returning one (read when checked: registries may grow)."""
  choices: Any

  def __call__(self, key, v):
    choices = tuple(self.choices() if callable(self.choices) else self.choices)
    if v not in choices:
      raise ConfigError(key, v, f"must be one of {', '.join(map(repr, choices))}")
    return v


def setting(default, check=None, *, resume="logged", absent=_NO_ABSENT):
  """A block field: ``default``, ``check(key, value)`` (raises :class:`ConfigError`), the ``resume`` rule
  (:data:`RESUME`) and what a saved config without the key meant (``absent``; default: ``default``)."""
  if resume not in RESUME:
    raise ValueError(f"resume must be one of {RESUME}; got {resume!r}")
  meta = {"check": check, "resume": resume}
  if absent is not _NO_ABSENT:
    meta["absent"] = absent
  if dataclasses.is_dataclass(default):
    return dataclasses.field(default_factory=lambda: default, metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def _suggest(key, names):
  close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
  return (f"did you mean {' or '.join(map(repr, close))}? " if close else "") + f"keys: {', '.join(sorted(names))}"


class Block:
  """Mixin of the config-block dataclasses: ``PREFIX`` (the block's key in a config) and the methods below."""

  PREFIX = ""

  @classmethod
  def from_dict(cls, d, prefix=None, *, legacy=False):
    """The block of ``d`` (a dict or ``ConfigDict``): unknown keys refused with suggestions, every field checked
    (its :func:`setting` check, then :meth:`check`), missing fields filled with their defaults (checked too: a
    required field, whose default fails its check, is refused) or, with ``legacy``, with what their absence meant
    in configs saved before they existed (not checked)."""
    prefix = cls.PREFIX if prefix is None else prefix
    d = dict(d.items()) if hasattr(d, "items") else {}
    names = [f.name for f in dataclasses.fields(cls)]
    for k in d:
      if k not in names:
        raise ConfigError(f"{prefix}.{k}", d[k], f"no such key in {prefix}; {_suggest(k, names)}")
    values = {}
    for f in dataclasses.fields(cls):
      key = f"{prefix}.{f.name}"
      default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
      if f.name not in d:
        if legacy and "absent" in f.metadata:
          values[f.name] = f.metadata["absent"]
        elif dataclasses.is_dataclass(default):
          values[f.name] = type(default).from_dict({}, key, legacy=legacy)
        elif f.metadata.get("check") is not None and not legacy:
          values[f.name] = f.metadata["check"](key, default)  # a required field's default fails its check
        else:
          values[f.name] = default
        continue
      v = d[f.name]
      if dataclasses.is_dataclass(default):
        if not hasattr(v, "items"):
          raise ConfigError(key, v, f"must be a block of {', '.join(x.name for x in dataclasses.fields(default))}")
        values[f.name] = type(default).from_dict(v, key, legacy=legacy)
        continue
      check = f.metadata.get("check")
      values[f.name] = check(key, v) if check is not None else v
    block = cls(**values)
    block.check(prefix)
    return block

  def check(self, prefix):
    """Checks across this block's fields (override); raises :class:`ConfigError`."""

  def to_dict(self):
    return {f.name: (getattr(self, f.name).to_dict() if isinstance(getattr(self, f.name), Block)
                     else getattr(self, f.name)) for f in dataclasses.fields(self)}


def defaults(cls):
  """The defaults of block ``cls`` as a nested dict: what config files start from."""
  out = {}
  for f in dataclasses.fields(cls):
    v = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    out[f.name] = defaults(type(v)) if dataclasses.is_dataclass(v) else v
  return out


def absent_filled(cls, saved):
  """``saved`` (a dict of block ``cls`` as a checkpoint saved it) with every field it lacks set to what the field's
  absence meant (its ``absent``, else its default; nested blocks likewise), values unchecked: the saved side of a
  resume comparison, for keys added since the checkpoint was written."""
  out = dict(saved)
  for f in dataclasses.fields(cls):
    v = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if dataclasses.is_dataclass(v):
      out[f.name] = absent_filled(type(v), out.get(f.name) or {})
    elif f.name not in out:
      out[f.name] = f.metadata.get("absent", v)
  return out


def resume_rules(cls, prefix=None):
  """``{dotted key: resume rule}`` of every field of block ``cls`` (nested blocks flattened)."""
  prefix = cls.PREFIX if prefix is None else prefix
  out = {}
  for f in dataclasses.fields(cls):
    v = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    key = f"{prefix}.{f.name}"
    if dataclasses.is_dataclass(v):
      out.update(resume_rules(type(v), key))
    else:
      out[key] = f.metadata.get("resume", "refused")
  return out
