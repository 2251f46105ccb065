"""Private by default: what roost creates is readable by its own user only, whatever the umask.

The process umask is set to 077 before anything is written, so every file (0600) and folder
(0700) the store, the debug snapshots and the attachments create is private, also outside
systemd's `UMask=`. A state directory made earlier by someone else's umask is not changed
behind its owner's back: start-up warns and `roost doctor` fails, with the command to fix it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077


def make_private() -> None:
    """Give this process the umask that keeps new files and folders to their owner."""
    os.umask(PRIVATE_UMASK)


def exposure(path: Path) -> str | None:
    """Why `path` is readable by others ("readable by others (mode 0755)"), or None if private
    or absent."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None
    if mode & 0o077:
        who = "others" if mode & 0o007 else "its group"
        return f"readable by {who} (mode {mode:04o}); fix with: chmod 700 {path}"
    return None
