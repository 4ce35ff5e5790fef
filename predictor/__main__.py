"""``python -m predictor``."""

import sys

from predictor.cli import main

sys.exit(main())
