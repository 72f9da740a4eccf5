"""What the command-line tools share: one-line refusals (exit code 2), strict JSON, atomic writes."""

import argparse
import json
import math
import os
import pathlib
import sys

MAX_SEED = 2**31 - 1


class Refusal(Exception):
  """A user error: printed as one line ``<prog>: <message>``, exit code 2, nothing written."""


class Parser(argparse.ArgumentParser):
  """``argparse`` whose errors are :class:`Refusal` (one line) instead of usage text and exit."""

  def error(self, message):
    raise Refusal(message)


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
