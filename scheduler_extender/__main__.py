"""``python -m scheduler_extender``."""

import sys

from scheduler_extender.cli import main

sys.exit(main())
