"""Train a jaxwm world model.

  python train.py                                   # configs/tiny.py on procedural scenes (CPU is fine)
  python train.py --config configs/tiny.py --config.optim.lr=3e-4 --workdir runs/exp1
  python train.py --config configs/small.py --config.mesh.fsdp=4
  python train.py --config configs/tiny.py --compile_only train --topology v5e:2x2   # AOT for a TPU topology

Resumes from the newest checkpoint in ``<workdir>/checkpoints`` when there is one. Every config value is
checked first (``jaxwm.config_checks``): a bad one is refused in one line ``train.py: <key>=<value>: <allowed>``
with exit code 2, before any directory, dataset or compilation. ``data.batch_size=0`` (the default) is
``data.per_device_batch_size`` x the devices the batch is split over; the global batch is printed.
``--compile_only train|sample --topology <gen>:<shape>`` compiles for abstract TPU devices (libtpu, no TPU)
and prints per-device memory, FLOPs and a roofline bound (``jaxwm.training.compile_only``); it writes nothing.
"""

import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from jaxwm.training.config_utils import check_overrides

_FLAGS = {}


def _define_flags(flag_values=flags.FLAGS, argv=None):
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", "configs/tiny.py", "ml-collections config file.",
                                                     flag_values=flag_values, lock_config=True, sys_argv=argv)
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Output directory (default: config.train.workdir).",
                                          flag_values=flag_values)
  _FLAGS["compile_only"] = flags.DEFINE_enum("compile_only", None, ["train", "sample"],
                                             "Only compile (for --topology) and report memory, FLOPs, roofline.",
                                             flag_values=flag_values)
  _FLAGS["topology"] = flags.DEFINE_string("topology", None, "TPU topology for --compile_only, e.g. v5p:4x4x4.",
                                           flag_values=flag_values)


def _refuse(message):
  """A user error: one line on stderr, exit code 2, no traceback."""
  print(f"train.py: {' '.join(str(message).split())}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv, flag_values=flags.FLAGS):
  """absl's flag parsing with a one-line refusal (exit 2) instead of its usage text (exit 1)."""
  try:
    return flag_values(argv)
  except flags.Error as e:
    _refuse(e)


def _init_distributed(config):
  """Multi-process runs: ``jax.distributed`` before the device count is read (``run`` then finds it done)."""
  from jaxwm.training.loop import maybe_initialize_distributed  # pylint: disable=g-import-not-at-top
  maybe_initialize_distributed(config)


def _check_config(config, workdir):
  """Every config value, the mesh and the global batch (set when ``data.batch_size`` is 0), before anything is
  created or compiled; a refusal is one line and exit code 2. Returns the notes to print."""
  from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
  try:
    if not workdir:
      raise config_checks.ConfigError("--workdir", workdir, "must be a non-empty path")
    if _FLAGS["topology"].value and not _FLAGS["compile_only"].value:
      raise config_checks.ConfigError("--topology", _FLAGS["topology"].value, "only with --compile_only train|sample")
    notes = config_checks.validate(config, workdir=workdir)  # no device touched yet
    if _FLAGS["compile_only"].value:  # the abstract devices of --topology
      from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
      topology = _FLAGS["topology"].value
      n, procs = (compile_only.parse_topology(topology)[2] if topology else None), 1
    else:
      _init_distributed(config)
      import jax  # pylint: disable=g-import-not-at-top
      n, procs = jax.device_count(), jax.process_count()
    if n is not None:
      notes.append(config_checks.resolve_batch_size(config, n, procs))
    return notes if procs == 1 or jax.process_index() == 0 else []
  except ValueError as e:  # ConfigError, and the model's own checks (they name the key)
    _refuse(e)


def main(argv):
  if len(argv) > 1:
    _refuse(f"unexpected argument {argv[1]!r} (flags are --name=value)")
  config = _FLAGS["config"].value
  workdir = _FLAGS["workdir"].value or config.train.workdir
  for note in _check_config(config, workdir):
    print(f"train.py: {note}")
  if _FLAGS["compile_only"].value:
    from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
    try:
      _, fits = compile_only.run(config, _FLAGS["topology"].value, _FLAGS["compile_only"].value)
    except ValueError as e:
      _refuse(e)
    sys.exit(0 if fits else 1)
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and grain are chatty at INFO
  from jaxwm.training.loop import RunRefusedError  # pylint: disable=g-import-not-at-top
  try:
    _, history = run(config, workdir)
  except RunRefusedError as e:  # locked workdir, another model's checkpoint, no intact checkpoint
    _refuse(e)
  if history:
    k = max(1, len(history) // 10)
    print(f"loss: first {k} steps {sum(history[:k]) / k:.4f} -> last {k} steps {sum(history[-k:]) / k:.4f}")
  print(f"checkpoints and samples in {workdir}; stream a loop with: python sample.py --workdir {workdir}")


def _check_cli(argv):
  """Rejects unknown --config.* keys with the closest valid names (before absl parses them)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = "configs/tiny.py"
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      path = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      path = argv[i + 1]
  file, _, arg = path.partition(":")  # ml-collections' `file.py:arg`
  try:
    spec = importlib.util.spec_from_file_location("_cfg", file)
    if spec is None:
      raise FileNotFoundError("not a .py file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  except (OSError, SyntaxError, ImportError) as e:
    _refuse(f"--config={path!r}: cannot load the config file ({e})")
  try:
    check_overrides(argv, mod.get_config(arg) if arg else mod.get_config())
  except ValueError as e:
    _refuse(e)


def cli(argv):
  """``python train.py ARGV`` in this process (tests): returns the exit code."""
  argv = ["train.py", *argv]
  try:
    _check_cli(argv[1:])
    flag_values = flags.FlagValues()
    _define_flags(flag_values, argv)
    main(_parse_flags(argv, flag_values))
  except SystemExit as e:
    if isinstance(e.code, str):
      print(e.code, file=sys.stderr)
      return 1
    return e.code or 0
  return 0


if __name__ == "__main__":
  _check_cli(sys.argv[1:])
  _define_flags()
  app.run(main, flags_parser=_parse_flags)
