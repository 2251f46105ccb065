"""The reply as it is written: one message in the room, edited (`m.replace`) as it grows.

Matrix has no ephemeral drafts, so the preview is a real message: sent once there is text,
then replaced at most every `interval` seconds with the reply so far (its first part, as the
reply itself will be cut) and the line about the work in progress ("thinking…"). It is not the
reply's record: the reply still goes out through the outbox. When the turn saved a reply, its
delivery makes the preview message its first part with one last edit (so the room shows one
message, not a preview and a copy), and sends the rest; when it saved none, the preview is
redacted. A crash mid-stream leaves the preview's id in a chat flag; the next start redacts it
unless a reply's delivery recorded it (`MatrixChannel.clear_orphans`).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from channels.formatting import split_matrix
from channels.matrix.platform import log

# (body, html) -> event id, None: refused
Send = Callable[[str, str], Coroutine[Any, Any, str | None]]
Edit = Callable[[str, str, str], Awaitable[None]]  # (event id, body, html)


class EditStream:
    """One turn's preview in one room (a `ReplySink`); see the module docstring."""

    def __init__(self, send: Send, edit: Edit, *, interval: float, name: str) -> None:
        self.send = send
        self.edit = edit
        self.interval = interval
        self.name = name
        self.event_id: str | None = None
        self._text = ""
        self._line = ""
        self._shown: tuple[str, str] | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._first: asyncio.Task[str | None] | None = None
        self._task: asyncio.Task[None] | None = None

    def write(self, delta: str) -> None:
        self._text += delta
        self._line = ""
        self._wake.set()

    def status(self, line: str) -> None:
        self._line = line
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"roost-matrix-stream-{self.name}")

    async def close(self) -> None:
        """No more edits; the first send, if on its way, is waited for (cut off, it could
        land unrecorded and stay in the room as a stray copy of the reply)."""
        self._closing.set()
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        if self._first is not None:
            await asyncio.wait([self._first])
            if not self._first.cancelled() and self._first.exception() is None:
                self.event_id = self._first.result()
        for ended in (task, self._first):
            if ended is not None and not ended.cancelled() and ended.exception() is not None:
                log.error("the preview in %s failed", self.name, exc_info=ended.exception())

    def preview(self) -> tuple[str, str] | None:
        parts = split_matrix(self._text) if self._text.strip() else []
        body, shown = parts[0] if parts else ("", "")
        if self._line:
            body = f"{body}\n\n{self._line}" if body else self._line
            line = f"<em>{html.escape(self._line, quote=False)}</em>"
            shown = f"{shown}<br/>\n{line}" if shown else line
        return (body, shown) if body else None

    async def _run(self) -> None:
        while not self._closing.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self._closing.is_set():
                return
            shown = self.preview()
            if shown is not None and shown != self._shown:
                if self.event_id is None:
                    if self._first is None:  # shielded: see close()
                        self._first = asyncio.create_task(self.send(*shown))
                    self.event_id = await asyncio.shield(self._first)
                    if self.event_id is None:
                        return  # refused: the reply's delivery will say why
                else:
                    await self.edit(self.event_id, *shown)
                self._shown = shown
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._closing.wait()
