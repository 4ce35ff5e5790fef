"""``python -m elastic_controller``."""

import sys

from elastic_controller.cli import main

sys.exit(main())
