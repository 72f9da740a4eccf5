"""Config helpers: reject unknown ``--config.*`` overrides, naming the closest valid keys."""

import difflib


def flat_keys(config, prefix=""):
  """Dotted names of every leaf of an ml-collections ``ConfigDict`` (nested dicts included)."""
  out = []
  for k, v in config.items():
    name = f"{prefix}{k}"
    if hasattr(v, "items"):
      out += flat_keys(v, name + ".")
    out.append(name)
  return out


def check_overrides(argv, config, flag="config"):
  """Raises ``ValueError`` for ``--config.a.b=...`` arguments whose key the config lacks."""
  valid = flat_keys(config)
  for arg in argv:
    if not arg.startswith(f"--{flag}."):
      continue
    key = arg[len(flag) + 3:].split("=", 1)[0]
    if key not in valid:
      close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
      hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
      raise ValueError(f"unknown config key {key!r} in {arg!r}{hint}")
