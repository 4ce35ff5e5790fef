import sys

from rose_cli.main import main

sys.exit(main())
