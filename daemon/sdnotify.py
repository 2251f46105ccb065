"""systemd's readiness protocol: one datagram to $NOTIFY_SOCKET (a no-op outside systemd)."""

from __future__ import annotations

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
