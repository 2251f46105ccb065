"""The engine's work beside the chats: the sweep that archives idle conversations, the memory
index catching up with the store, and, at the stop, the folds and the index closing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from daemon.core.logs import turn_log as log
from daemon.turn.parts import TurnParts


class Upkeep:
    """See the module docstring; `busy` names the chats whose conversation must stay."""

    def __init__(self, parts: TurnParts, busy: Callable[[], set[str]]) -> None:
        self.parts = parts
        self.busy = busy
        self._rotation: asyncio.Task[None] | None = None
        self._indexing: asyncio.Task[int] | None = None

    def start(self) -> None:
        self._rotation = asyncio.create_task(self._rotation_loop(), name="roost-rotation")
        # Catch the search index up with the store (everything, the first time) in the
        # background; a search before it is done syncs what it needs itself.
        self._indexing = asyncio.create_task(
            asyncio.to_thread(self.parts.index.sync, self.parts.store), name="roost-index")

    async def rotate_idle(self) -> list[str]:
        """Archive conversations idle for `daemon.idle_rotation` (the sweep calls this)."""
        now = self.parts.clock()
        archived = await asyncio.to_thread(self.parts.router.rotate_idle, now, self.busy())
        for conversation in archived:
            idle_for = (now - conversation.last_active) / 3600
            await asyncio.to_thread(self.parts.records.event, now, "rotation", conversation.id,
                                    f"{conversation.chat_key} idle for {idle_for:.1f} h; archived")
        return [c.id for c in archived]

    async def _rotation_loop(self) -> None:
        interval = min(60.0, max(self.parts.settings.daemon.idle_rotation / 10, 1.0))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.rotate_idle()
            except Exception:
                log.exception("idle rotation sweep failed; trying again in %.0fs", interval)

    async def stop_sweep(self, unwind: float) -> None:
        if self._rotation is not None:
            self._rotation.cancel()
            await bounded("the rotation sweep", [self._rotation], unwind)

    async def stop(self, unwind: float) -> None:
        """After the chats stopped: the folds, then the index (each step within `unwind`)."""
        await self.parts.folder.stop(unwind)
        # Closing first makes a first full build stop at its next conversation; a long one
        # keeps the index busy (and its lock held), so both are bounded like the steps above.
        closing = asyncio.create_task(asyncio.to_thread(self.parts.index.close))
        await bounded("index steps (closing, syncing)",
                      [closing, *([self._indexing] if self._indexing is not None else [])],
                      unwind)


async def bounded(what: str, tasks: list[asyncio.Task[Any]], seconds: float) -> None:
    """Wait up to `seconds` for cancelled tasks to finish; log the ones that do not."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(seconds, 0.0))
    if pending:
        log.warning("%d %s did not stop within %.1fs of being cancelled; leaving them",
                    len(pending), what, seconds)
