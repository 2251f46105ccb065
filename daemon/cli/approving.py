"""`roost chat`'s side of approvals: while a turn runs, a question waiting in the terminal's
chat is answered with y (allow once), a (always for this tool) or n (deny) on the next line."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from daemon.core.approval import KEYS, Answer, Choice
from daemon.engine.workers import Engine

PROMPT = "allow? [y]es once / [a]lways / [n]o: "

ReadLine = Callable[[str | None], Awaitable[str | None]]


async def wait_answering(engine: Engine, chat_key: str, read_line: ReadLine,
                         interactive: bool) -> None:
    """Until the chat is idle; each approval question that waits meanwhile is answered from
    the next line typed (end of input answers Deny)."""
    approvals = engine.parts.approvals
    idle = asyncio.create_task(engine.wait_idle(chat_key))
    try:
        while not idle.done():
            waiting = approvals.waiting_in(chat_key)
            if waiting:
                line = await read_line(PROMPT if interactive else None)
                choice = Choice.DENY if line is None else KEYS.get(line.strip().lower()[:1])
                if choice is not None:
                    await approvals.answer(Answer(waiting[0], choice, chat_key, chat_key))
                continue
            changed = asyncio.create_task(approvals.changed.wait())
            await asyncio.wait({idle, changed}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
    finally:
        idle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await idle
