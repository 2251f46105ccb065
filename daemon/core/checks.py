"""One line of `roost doctor`: what was checked, whether it is fine, what it found, the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def network_reason(error: BaseException) -> str:
    """What went wrong on the network, in words: python-telegram-bot's message without the
    exception class it quotes ("httpx.ConnectError: All connection attempts failed")."""
    text = re.sub(r"^([A-Za-z_][\w.]*(Error|Exception|Timeout)\b:?\s*)+", "", str(error))
    return text.strip().rstrip(".").lower() or "no answer"
