"""What the command-line tools share: one-line refusals (exit code 2), flag checks in the config blocks' style,
strict JSON, atomic writes.

Every tool checks its flags the way the config blocks check their keys (:mod:`jaxwm.settings`): a flag's
``check=`` (``Int``, ``Float``, ``Choice``, ``Str`` or :class:`IsFile` / :class:`IsDir` / :class:`CommaList`
below) runs when the flags are parsed, before anything is built, and a refusal reads
``<tool>: --<flag>=<value>: <allowed>``. Checks across flags stay in each tool, in the same words.
"""

import argparse
import json
import math
import os
import pathlib
import sys

from jaxwm.settings import ConfigError, Int

MAX_SEED = 2**31 - 1
SEED = Int(0, MAX_SEED)


class Refusal(Exception):
  """A user error: printed as one line ``<prog>: <message>``, exit code 2, nothing written."""


class Parser(argparse.ArgumentParser):
  """``argparse`` whose errors are :class:`Refusal` (one line) instead of usage text and exit, and whose
  ``add_argument`` takes ``check=``: a :mod:`jaxwm.settings` check run on the parsed value (``None``, an unset
  optional flag, is not checked)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._checks = []

  def add_argument(self, *args, check=None, **kwargs):
    action = super().add_argument(*args, **kwargs)
    if check is not None:
      self._checks.append((action, check))
    return action

  def parse_args(self, args=None, namespace=None):
    ns = super().parse_args(args, namespace)
    for action, check in self._checks:
      value = getattr(ns, action.dest)
      if value is not None:
        try:
          setattr(ns, action.dest, check(action.option_strings[-1] if action.option_strings else action.dest, value))
        except ConfigError as e:
          raise Refusal(str(e)) from None
    return ns

  def error(self, message):
    raise Refusal(message)


def refuse(flag, value, allowed):
  """A :class:`Refusal` worded as a flag check's: ``<flag>=<value>: <allowed>``."""
  return Refusal(str(ConfigError(flag, value, allowed)))


class IsFile:
  """A path to an existing file."""

  def __call__(self, key, v):
    if not pathlib.Path(v).is_file():
      raise ConfigError(key, v, "no such file")
    return v


class IsDir:
  """A path to an existing directory; ``what`` says what it should be."""

  def __init__(self, what=""):
    self.what = what

  def __call__(self, key, v):
    if not pathlib.Path(v).is_dir():
      raise ConfigError(key, v, "no such directory" + (f" ({self.what})" if self.what else ""))
    return v


class CommaList:
  """``a,b,c`` -> a list, each item cast by ``cast`` and checked by ``each``; an empty string -> None."""

  def __init__(self, each, cast=str):
    self.each, self.cast = each, cast

  def __call__(self, key, v):
    if not v.strip():
      return None  # an empty flag: as if not given
    try:
      items = [self.cast(x.strip()) for x in v.split(",")]
    except ValueError:
      raise ConfigError(key, v, f"must be a comma list of {self.cast.__name__}s") from None
    return [self.each(key, x) for x in items]


def run_dir(path):
  """The training workdir of ``path`` (a workdir, its ``checkpoints/`` or one step's directory)."""
  p = pathlib.Path(path).absolute()
  if p.name.isdigit():
    p = p.parent
  if p.name == "checkpoints":
    p = p.parent
  return p


def strict(x):
  """Non-finite floats -> None, recursively (strict JSON has no Infinity or NaN)."""
  if isinstance(x, dict):
    return {k: strict(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [strict(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def write_text(path, text):
  """Writes ``text`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


def write_json(path, obj):
  """:func:`write_text` of ``obj`` as strict JSON (non-finite floats become null)."""
  write_text(path, json.dumps(strict(obj), indent=1, allow_nan=False))


def run(main, argv, prog):
  """``main(argv)``'s exit code; a :class:`Refusal` prints ``<prog>: <message>`` on one line and gives 2."""
  try:
    return main(argv)
  except Refusal as e:
    print(f"{prog}: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
