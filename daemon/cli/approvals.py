"""`roost approvals list|revoke`: the tools each person said "Always for this tool" to."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from daemon.store.approvals import ApprovalBook


def approvals_command(book: ApprovalBook, action: str, person: str | None = None,
                      tool: str | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: stdout may have been redirected since import
    if action == "list":
        standing = book.standing()
        if not standing:
            out.write("No standing approvals: every tool that asks, asks.\n")
        for s in standing:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.granted))
            out.write(f"{s.person} {s.tool} (since {when})\n")
        return 0
    gone = book.revoke(person, tool)
    if not gone:
        out.write("No standing approval matches; nothing revoked.\n")
        return 1
    for s in gone:
        out.write(f"revoked: {s.person} {s.tool}; it asks again\n")
    return 0
