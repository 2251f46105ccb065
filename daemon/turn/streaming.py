"""What a turn tells the channel while it runs: the reply as it is written, and one line about
the work that is not writing (thinking, a tool), so the user sees work, not silence.

The channel supplies the sink (`ReplySink`, daemon/core/messages.py) for the whole turn; the
turn only writes to it and never learns what a Telegram draft is. Nothing here is a record:
the reply is delivered by the outbox once saved, and a sink that fails shows nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from daemon.core.messages import UNSEEN, ReplySink

# The channel's sink for one turn of a chat (see Channel.streaming).
Streaming = Callable[[str], AbstractAsyncContextManager[ReplySink]]

THINKING = "thinking…"
STOPPED_MARK = "(stopped)"
# One short line per tool the user would recognise; any other tool is named as it is.
_TOOL_LINES = {
    "memory_search": "searching your conversations…",
    "memory_get": "reading an earlier message…",
    "conversation_read": "reading an earlier conversation…",
    "tool_search": "looking for the right tool…",
    "tool_activate": "getting a tool ready…",
    "file_read": "reading your file…",
    "web_search": "searching the web…",
    "web_fetch": "reading a web page…",
    "schedule_reminder": "setting a reminder…",
}


def tool_line(name: str) -> str:
    """The progress line shown while the tool `name` runs."""
    return _TOOL_LINES.get(name) or f"using {name.replace('_', ' ')}…"


def not_streamed(chat_key: str) -> AbstractAsyncContextManager[ReplySink]:
    """The sink of a turn nobody watches (an automation's run)."""
    return contextlib.nullcontext(UNSEEN)
