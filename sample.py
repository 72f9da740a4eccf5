"""``python sample.py ...`` = ``jaxwm-sample ...``: see :mod:`jaxwm.cli.sample`."""
from jaxwm.cli.sample import main
if __name__ == "__main__":
  raise SystemExit(main())
