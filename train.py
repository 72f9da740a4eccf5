"""Train a jaxwm world model.

  python train.py                                   # configs/tiny.py on procedural scenes (CPU is fine)
  python train.py --config configs/tiny.py --config.optim.lr=3e-4 --workdir runs/exp1
  python train.py --config configs/small.py --config.mesh.fsdp=4

Resumes from the newest checkpoint in ``<workdir>/checkpoints`` when there is one.
"""

import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from jaxwm.training.config_utils import check_overrides

_FLAGS = {}


def _define_flags():
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", "configs/tiny.py", "ml-collections config file.",
                                                     lock_config=True)
  _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Output directory (default: config.train.workdir).")


def main(argv):
  del argv
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  config = _FLAGS["config"].value
  workdir = _FLAGS["workdir"].value or config.train.workdir
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and grain are chatty at INFO
  _, history = run(config, workdir)
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
  path, _, arg = path.partition(":")  # ml-collections' `file.py:arg`
  spec = importlib.util.spec_from_file_location("_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  try:
    check_overrides(argv, mod.get_config(arg) if arg else mod.get_config())
  except ValueError as e:
    sys.exit(f"train.py: {e}")


if __name__ == "__main__":
  _check_cli(sys.argv[1:])
  _define_flags()
  app.run(main)
