"""`python -m daemon` behaves as the `roost` command."""

import sys

from daemon.cli.main import main

sys.exit(main())
