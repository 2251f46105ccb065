"""`python -m daemon` behaves as the `roost` command."""

import sys

from daemon.cli import main

sys.exit(main())
