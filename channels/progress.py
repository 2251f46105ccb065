"""How far each reply's delivery got, kept in memory as well as on its outbox item.

A reply goes out in parts, and after each part its progress (`parts_sent`, the platform's ids)
is written to the outbox. When the disk refuses that write after the platform took the part,
the engine tries the delivery again later; without the memory here that retry would send the
part a second time, and again at every retry while the disk stays full.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from channels.base import Outbound
from daemon.store import Store

REMEMBERED = 1000  # replies in flight at once are far fewer; older ones are on disk anyway


class Progress:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._sent: OrderedDict[str, tuple[int, tuple[str, ...]]] = OrderedDict()

    def start(self, outbound: Outbound) -> tuple[int, list[str]]:
        """Parts already delivered and their ids: the outbox item's, or what this process
        delivered since, whichever got further."""
        parts, ids = self._sent.get(outbound.id, (0, ()))
        if outbound.parts_sent >= parts:
            return outbound.parts_sent, list(outbound.platform_ids)
        return parts, list(ids)

    async def record(self, outbound: Outbound, parts_sent: int, ids: list[str]) -> None:
        """Remember, then write (a StoreError from the write still reaches the engine)."""
        self._sent[outbound.id] = (parts_sent, tuple(ids))
        self._sent.move_to_end(outbound.id)
        while len(self._sent) > REMEMBERED:
            self._sent.popitem(last=False)
        await asyncio.to_thread(self.store.outbox_update, outbound.id, parts_sent=parts_sent,
                                platform_ids=ids)
