"""`roost approvals list|revoke`: the tools each person said "Always for this tool" to, and
those an owner said it to for them (a shared tool; it lets that person's calls run alone)."""

from __future__ import annotations

import sys
from typing import TextIO
from zoneinfo import ZoneInfo

from daemon.cli.times import local, zone_line
from daemon.store.approvals import ApprovalBook


def approvals_command(book: ApprovalBook, action: str, person: str | None = None,
                      tool: str | None = None, out: TextIO | None = None, *,
                      tz: ZoneInfo) -> int:
    """Run one approvals action; `list` shows its times in `tz`, the daemon's zone."""
    out = out or sys.stdout  # looked up now: stdout may have been redirected since import
    if action == "list":
        standing = book.standing()
        if not standing:
            out.write("No standing approvals: every tool that asks, asks.\n")
        else:
            out.write(zone_line(tz) + "\n")
        for s in standing:
            given = f", given by the owner {s.by}" if s.by is not None else ""
            out.write(f"{s.person} {s.tool} (since {local(s.granted, tz)}{given})\n")
        return 0
    gone = book.revoke(person, tool)
    if not gone:
        out.write("No standing approval matches; nothing revoked.\n")
        return 1
    for s in gone:
        out.write(f"revoked: {s.person} {s.tool}; it asks again\n")
    return 0
