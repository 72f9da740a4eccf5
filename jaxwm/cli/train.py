"""Train a jaxwm world model (``python train.py`` in a checkout, ``jaxwm-train`` once installed: the same).

  python train.py                                   # configs/tiny.py on procedural scenes (CPU is fine)
  python train.py --config configs/tiny.py --config.optim.lr=3e-4 --workdir runs/exp1
  python train.py --config configs/small.py --config.mesh.fsdp=4
  python train.py --config configs/tiny.py --compile_only train --topology v5e:2x2   # AOT for a TPU topology

Resumes from the newest checkpoint in ``<workdir>/checkpoints`` when there is one. SIGTERM or SIGINT (a
preemption, Ctrl-C) stops it at the next step, checkpointed, with one line and exit code 75; the same command
resumes it. Every config value is
checked first (``jaxwm.config_checks``): a bad one is refused in one line ``train.py: <key>=<value>: <allowed>``
with exit code 2, before any directory, dataset or compilation. ``data.batch_size=0`` (the default) is
``data.per_device_batch_size`` x the devices the batch is split over; the global batch is printed.
``--compile_only train|sample --topology <gen>:<shape>`` compiles for abstract TPU devices (libtpu, no TPU)
and prints per-device memory, FLOPs and a roofline bound (``jaxwm.training.compile_only``); it writes nothing.
``--config`` is a config file, or, when no such file exists, a config shipped with the package: ``tiny``,
``configs/tiny.py`` and ``tiny.py`` all name ``configs/tiny.py`` of the installed ``configs`` package (so
``jaxwm-train --config configs/small.py`` works outside a checkout); ``file.py:arg`` passes ``arg`` to ``get_config``.
"""

import importlib.util
import pathlib
import signal
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from jaxwm.training.config_utils import check_overrides
from jaxwm.utils import hugepages

_FLAGS = {}
DEFAULT_CONFIG = "configs/tiny.py"
_HELP = ("-h", "--help", "-help", "-?", "--helpshort", "-helpshort")


def _define_flags(flag_values=flags.FLAGS, argv=None):
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", resolve_config(DEFAULT_CONFIG), "ml-collections config file "
                                                     "(or a packaged name: tiny, small, ...).",
                                                     flag_values=flag_values, lock_config=True, sys_argv=argv)
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Output directory (default: config.train.workdir).",
                                          flag_values=flag_values)
  _FLAGS["compile_only"] = flags.DEFINE_enum("compile_only", None, ["train", "sample"],
                                             "Only compile (for --topology) and report memory, FLOPs, roofline.",
                                             flag_values=flag_values)
  _FLAGS["topology"] = flags.DEFINE_string("topology", None, "TPU topology for --compile_only, e.g. v5p:4x4x4.",
                                           flag_values=flag_values)
  _FLAGS["frame_size"] = flags.DEFINE_string(
      "frame_size", None, "HxW video frames for --compile_only on a records config before any video is ingested "
      "(the batch's shapes from the config and this size; a stand-in dataset in a temporary folder, never read).",
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
  from jaxwm.training.workdir import maybe_initialize_distributed  # pylint: disable=g-import-not-at-top
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
    if _FLAGS["frame_size"].value is not None:
      _stand_in_data(config, _FLAGS["frame_size"].value)
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
      from jaxwm.training.sharding import resolve_batch_size  # pylint: disable=g-import-not-at-top
      notes.append(resolve_batch_size(config, n, procs))
    return notes if procs == 1 or jax.process_index() == 0 else []
  except ValueError as e:  # ConfigError, and the model's own checks (they name the key)
    _refuse(e)


def _stand_in_data(config, frame_size):
  """``--frame_size HxW``: points ``data.data_dir`` at a stand-in of the dataset ingestion would write
  (``jaxwm.training.compile_only.stand_in_dataset``, removed at exit), after checking it is asked for where it
  applies."""
  import atexit  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  from jaxwm.config_checks import ConfigError  # pylint: disable=g-import-not-at-top
  from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
  from jaxwm.training import compile_only  # pylint: disable=g-import-not-at-top
  if not _FLAGS["compile_only"].value:
    raise ConfigError("--frame_size", frame_size, "only with --compile_only train|sample (training reads the "
                                                  "ingested dataset's own size)")
  if config.data.get("source") != "records":
    raise ConfigError("--frame_size", frame_size, "only with data.source='records' (rendered frames are "
                                                  "data.image_size)")
  m = re.fullmatch(r"(\d+)x(\d+)", frame_size.strip())
  if not m:
    raise ConfigError("--frame_size", frame_size, "must be HxW in pixels, e.g. 480x832")
  if config.data.get("data_dir") and (read_manifest(pathlib.Path(config.data.data_dir).expanduser()) or {}).get(
      "latent_shape"):
    raise ConfigError("--frame_size", frame_size, f"data.data_dir={config.data.data_dir!r} holds an ingested "
                                                  "dataset, whose manifest gives the frame size: drop --frame_size")
  tmp = tempfile.mkdtemp(prefix="jaxwm_compile_only_")
  atexit.register(shutil.rmtree, tmp, True)
  try:
    config.data.data_dir = compile_only.stand_in_dataset(tmp, config.data, (int(m.group(1)), int(m.group(2))),
                                                         int(config.model.text_dim))
  except ValueError as e:
    if not str(e).startswith("--frame_size"):  # data.vae's own refusal, as it words it
      raise
    raise ConfigError("--frame_size", frame_size, str(e).split(": ", 1)[-1]) from None


def _main(argv):
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
  from jaxwm import tasks  # pylint: disable=g-import-not-at-top
  from jaxwm.training.runner import STOPPED_EXIT_CODE, StopRequested  # pylint: disable=g-import-not-at-top
  from jaxwm.training.workdir import RunRefusedError  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and grain are chatty at INFO
  try:
    _, history = tasks.run(config, workdir)  # train.task: diffusion (with its probes and samples) | distill
  except RunRefusedError as e:  # locked workdir, another model's checkpoint, no intact checkpoint
    _refuse(e)
  except StopRequested as e:  # SIGTERM / SIGINT: the step it stopped at is checkpointed
    for name in ("SIGTERM", "SIGINT"):  # on the way out: a further signal during shutdown must not change the code
      signal.signal(getattr(signal, name), signal.SIG_IGN)
    print(f"train.py: {e}", file=sys.stderr)
    sys.exit(STOPPED_EXIT_CODE)
  if history:
    k = max(1, len(history) // 10)
    print(f"loss: first {k} steps {sum(history[:k]) / k:.4f} -> last {k} steps {sum(history[-k:]) / k:.4f}")
  if tasks.task_name(config) == "distill":
    print(f"adapter in {workdir}/adapter; stream with it: python sample.py --workdir {config.distill.teacher} "
          f"--adapter {workdir}")
  else:
    print(f"checkpoints and samples in {workdir}; stream a loop with: python sample.py --workdir {workdir} "
          "(installed: jaxwm-sample)")


def packaged_configs():
  """The names of the configs shipped in the ``configs`` package (``tiny``, ``small``, ...), sorted."""
  folder = _configs_folder()
  return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")) if folder else []


def _configs_folder():
  """The folder of the importable ``configs`` package (the checkout's, or the installed one), or None."""
  try:
    spec = importlib.util.find_spec("configs")
  except (ImportError, ValueError):
    return None
  locations = list(spec.submodule_search_locations or []) if spec else []
  return pathlib.Path(locations[0]) if locations else None


def resolve_config(path):
  """``--config``'s value as ml-collections loads it: ``path`` itself when that file exists; otherwise, for a
  packaged name (``tiny``, ``tiny.py``, ``configs/tiny.py``), that file of the importable ``configs`` package;
  else ``path`` unchanged (refused later as no such file). A ``:arg`` suffix is kept."""
  file, colon, arg = path.partition(":")  # ml-collections' `file.py:arg`
  if pathlib.Path(file).exists():
    return path
  parts = pathlib.PurePath(file).parts
  if len(parts) == 1 or (len(parts) == 2 and parts[0] == "configs"):
    name = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
    folder = _configs_folder()
    if folder is not None and name.isidentifier() and (folder / f"{name}.py").is_file():
      return f"{folder / f'{name}.py'}{colon}{arg}"
  return path


def _config_arg(argv):
  """``(index, value)`` of the last ``--config`` in ``argv`` (``index`` of the item holding the value), or None."""
  found = None
  for i, a in enumerate(argv):
    for name in ("--config", "-config"):
      if a.startswith(name + "="):
        found = (i, a.split("=", 1)[1])
      elif a == name and i + 1 < len(argv):
        found = (i + 1, argv[i + 1])
  return found


def resolve_argv(argv):
  """``argv`` with its ``--config`` value resolved (:func:`resolve_config`); the rest unchanged."""
  argv = list(argv)
  found = _config_arg(argv)
  if found:
    i, value = found
    resolved = resolve_config(value)
    argv[i] = argv[i][:len(argv[i]) - len(value)] + resolved
  return argv


def _check_cli(argv):
  """Rejects unknown --config.* keys with the closest valid names (before absl parses them)."""
  found = _config_arg(argv)
  path = found[1] if found else DEFAULT_CONFIG
  resolved = resolve_config(path)
  file, _, arg = resolved.partition(":")  # ml-collections' `file.py:arg`
  if not pathlib.Path(file).exists():
    names = ", ".join(packaged_configs()) or "none found"
    _refuse(f"--config={path!r}: no such file, and not a config of the configs package ({names})")
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


def _usage():
  """The module docstring and the flags (the same for ``python train.py`` and ``jaxwm-train``)."""
  flag_values = flags.FlagValues()
  _define_flags(flag_values, ["train.py"])
  return f"{__doc__}\nflags:\n{flag_values.get_help(include_special_flags=False).rstrip()}\n"


def cli(argv):
  """``python train.py ARGV`` in this process (tests, notebooks): returns the exit code."""
  argv = ["train.py", *resolve_argv(argv)]
  try:
    if any(a in _HELP for a in argv[1:]):
      print(_usage())
      return 0
    _check_cli(argv[1:])
    flag_values = flags.FlagValues()
    _define_flags(flag_values, argv)
    _main(_parse_flags(argv, flag_values))
  except SystemExit as e:
    if isinstance(e.code, str):
      print(e.code, file=sys.stderr)
      return 1
    return e.code or 0
  return 0


def main(argv=None):
  """``python train.py`` / ``jaxwm-train``. ``argv`` (without the program name) runs in this process and returns
  the exit code (:func:`cli`, repeatable: a notebook can call it); ``None`` reads ``sys.argv`` and runs under
  ``absl.app`` (its logging and flags), exiting with the code, after restarting once with huge pages for XLA:CPU's
  buffers (:func:`jaxwm.utils.hugepages.reexec`)."""
  if argv is not None:
    return cli(argv)
  hugepages.reexec()  # a program, not a call
  argv = resolve_argv(sys.argv[1:])
  if any(a in _HELP for a in argv):
    print(_usage())
    return 0
  _check_cli(argv)
  argv = [sys.argv[0], *argv]
  _define_flags(flags.FLAGS, argv)
  app.run(_main, argv=argv, flags_parser=_parse_flags)
  return 0  # not reached: app.run exits


if __name__ == "__main__":
  sys.exit(main())
