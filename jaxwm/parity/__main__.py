"""``python -m jaxwm.parity`` = ``jaxwm-parity``."""

import sys

from jaxwm.cli.parity import main

sys.exit(main())
