"""``python -m jaxwm.play``: the same as ``jaxwm-play``."""

import sys

from jaxwm.play.server import main

sys.exit(main())
