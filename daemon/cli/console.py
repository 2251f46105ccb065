"""`roost console [--revoke-all]`: a sign-in link to the web console for the owner."""

from __future__ import annotations

import time

from daemon.core.config import Settings
from daemon.store.console_keys import OWNER, ConsoleKeys, console_url


def console_command(settings: Settings, revoke_all: bool) -> int:
    keys = ConsoleKeys(settings.daemon.state_dir)
    if revoke_all:
        count = keys.revoke_all()
        print(f"signed out everywhere: {count} sessions and unused links ended")
        return 0
    if not settings.console.enabled:
        print("roost: the console is off (console.enabled = false in the config)")
        return 1
    settings.daemon.state_dir.mkdir(parents=True, exist_ok=True)
    token = keys.issue_link((OWNER,), time.time())
    print("Open this link within 10 minutes (it works once; you see everyone's data):")
    print(f"{console_url(settings)}/login?t={token}")
    return 0
