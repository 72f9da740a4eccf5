"""``python train.py ...`` = ``jaxwm-train ...``: see :mod:`jaxwm.cli.train`."""
if __name__ == "__main__":  # before jax is imported: restart once with huge pages (jaxwm.utils.hugepages)
  from jaxwm.utils import hugepages
  hugepages.reexec()
from jaxwm.cli.train import cli, main  # noqa: E402,F401  (``train.cli(argv)``: in this process, for tests)
if __name__ == "__main__":
  raise SystemExit(main())
