"""``python -m timeslice``: the same as ``rose timeslice``."""

import sys

from timeslice.cli import main

sys.exit(main())
