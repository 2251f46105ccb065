"""`roost run` with one addition, for test_service's watchdog test: SIGUSR1 blocks the event loop.

    python stuck_loop_child.py SECONDS run --config PATH

A Python signal handler runs in the main thread, which is the one running the event loop, so
while the handler sleeps nothing on the loop runs: a stuck loop, as a blocking call in a
coroutine would make it. The handler sends `X-ROOST-TEST=blocked` before and
`X-ROOST-TEST=unblocked` after to $NOTIFY_SOCKET, so the parent reads one ordered stream and
sees whether any watchdog ping was sent while the loop was stuck.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

from daemon.app.sdnotify import sd_notify
from daemon.cli.main import main


def _block_loop(signum: int, frame: FrameType | None) -> None:
    sd_notify("X-ROOST-TEST=blocked")
    time.sleep(float(sys.argv[1]))
    sd_notify("X-ROOST-TEST=unblocked")


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _block_loop)
    sys.exit(main(sys.argv[2:]))
