"""``python train.py ...`` = ``jaxwm-train ...``: see :mod:`jaxwm.cli.train`."""
from jaxwm.cli.train import cli, main  # noqa: F401  (``train.cli(argv)``: in this process, for tests)
if __name__ == "__main__":
  raise SystemExit(main())
