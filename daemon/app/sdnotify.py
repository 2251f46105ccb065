"""systemd's notify protocol: readiness, stopping and the watchdog (no-ops outside systemd).

Each message is one datagram to $NOTIFY_SOCKET. The watchdog ping is sent from a task on the
event loop itself, so a loop that is stuck (a blocking call, a busy coroutine) stops pinging and
systemd restarts the service after `WatchdogSec`.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping


def sd_notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1") to systemd; False when not run by systemd."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(state.encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of `WatchdogSec`), or None when none is wanted."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    # WATCHDOG_PID names the process meant; a child that inherited the variable must stay quiet.
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 1_000_000 / 2


async def watchdog(interval: float, env: Mapping[str, str] | None = None) -> None:
    """Ping systemd every `interval` seconds until cancelled."""
    while True:
        sd_notify("WATCHDOG=1", env)
        await asyncio.sleep(interval)
