import sys

from dra_driver.agent.cli import main

sys.exit(main())
