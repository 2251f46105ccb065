"""`roost pairing list | approve CODE [--role guest|member] | deny CODE | revoke
CHANNEL:SENDER`: safe while the daemon runs (see pairing)."""

from __future__ import annotations

import sys
import time
from zoneinfo import ZoneInfo

from daemon.cli.times import local
from daemon.core.config import GUEST
from daemon.core.logs import outside
from daemon.intake.household import paired_person
from daemon.intake.pairing import CODE_TTL, PairingBook


def pairing_command(book: PairingBook, action: str, code: str | None, tz: ZoneInfo,
                    role: str = GUEST) -> int:
    """Run one pairing action; 1 when the code is not waiting (unknown, used or expired).
    `list` shows its times in `tz`, the daemon's zone, and each approved sender's role;
    `approve` lets the sender in as a `role` ("guest" or "member")."""
    now = time.time()
    if action == "list":
        _list(book, now, tz)
        return 0
    assert code is not None
    if action == "revoke":
        return _revoke(book, code)
    found = book.approve(code, now, role) if action == "approve" else book.deny(code, now)
    if found is None:
        print(f"roost: no pairing code {code.upper()!r} is waiting (unknown, used or expired; "
              "see `roost pairing list`)", file=sys.stderr)
        return 1
    if action == "approve":
        print(f"approved {found.channel} user {found.sender} ({_name(found.name, 'no name')}) "
              f"as a {role}; their next message is answered")
    else:
        print(f"denied {found.channel} user {found.sender}; their code no longer works")
    return 0


def _list(book: PairingBook, now: float, tz: ZoneInfo) -> None:
    """A header, the codes waiting, then the approved senders, each with their role (a code's
    sender has none yet)."""
    pending = book.pending(now)
    approved = book.approved()
    when = f"WHEN ({tz.key})"
    width = max(len(when), len("since 2026-01-01 00:00"))
    if pending or approved:
        print(f"{'CODE':<8}  {'SENDER':<25} {'NAME':<24} {when:<{width}}  ROLE")
    for p in pending:
        left = max(0, int((p.created + CODE_TTL - now) // 60))
        print(f"{p.code:<8}  {p.channel + ':' + p.sender:<25} {_name(p.name, '-'):<24} "
              f"{f'expires in {left} min':<{width}}  -")
    for a in approved:
        print(f"{'approved':<8}  {a.chat_key:<25} {_name(a.name, '-'):<24} "
              f"{f'since {local(a.approved, tz)}':<{width}}  {paired_person(a).role}")


def _name(name: str, none: str) -> str:
    """A sender's name as they chose it, quoted and escaped (`logs.outside`) when it holds a line
    break, a bidi control or anything else that could fake a row of this list."""
    if not name:
        return none
    return name if name.isprintable() else outside(name)


def _revoke(book: PairingBook, who: str) -> int:
    """Remove an approved sender; 1 when `who` is not approved."""
    channel, _, sender = who.partition(":")
    if book.revoke(channel, sender) is None:
        print(f"roost: {who!r} is not an approved sender (see `roost pairing list`)",
              file=sys.stderr)
        return 1
    print(f"revoked {channel} user {sender}; their next message gets a pairing code")
    return 0
