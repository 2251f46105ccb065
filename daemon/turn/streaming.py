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


def not_streamed(chat_key: str) -> AbstractAsyncContextManager[ReplySink]:
    """The sink of a turn nobody watches (an automation's run)."""
    return contextlib.nullcontext(UNSEEN)
