"""How far each reply's delivery got, kept in memory as well as on its outbox item.

A reply goes out in parts, and after each part its progress (`parts_sent`, the platform's ids)
is written to the outbox. When the disk refuses that write after the platform took the part,
the engine tries the delivery again later; without the memory here that retry would send the
part a second time, and again at every retry while the disk stays full.

Delivery is at least once: neither Telegram nor WhatsApp can tell a repeated send from a new
one, so a crash after the platform took a part and before its record is on disk sends that
part again after the restart. The record is therefore the very next thing after the platform's
answer (no other await before it), and skips the folder's fsync (`Store.outbox_update`), which
leaves that window at the time one file write and its fsync take. So that the duplicates can
be counted, the part about to go out is written down first (`attempting`, in the same write as
the previous part's record): a part found in flight that way by a later process, and sent
again, is reported to `on_resent`, and so is a part sent again in this process after a send
whose answer was lost (`answer_lost`).

A part Telegram refuses whole goes out in smaller pieces (channels.telegram); each piece gets
its own record (`pieces_sent`, `record_piece`) the same way, so a failure or a crash on one
piece resumes with the next piece instead of sending the earlier ones again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from daemon.core.messages import Outbound
from daemon.store import Store

REMEMBERED = 1000  # replies in flight at once are far fewer; older ones are on disk anyway


class Progress:
    def __init__(self, store: Store, on_resent: Callable[[], None] | None = None) -> None:
        """`on_resent` is told of each part sent again (the daemon's /metrics count them)."""
        self.store = store
        # id -> (parts sent, pieces sent of the next part, platform ids)
        self._sent: OrderedDict[str, tuple[int, int, tuple[str, ...]]] = OrderedDict()
        # The `attempting` on disk of each reply being sent (refreshed by `start` from the
        # outbox item, then kept by the writes here), so that no write repeats it.
        self._attempting: OrderedDict[str, int | None] = OrderedDict()
        # Replies an earlier process left with a part in flight: id -> that part's index.
        self._inherited: dict[str, int] = {}
        self.resent = 0  # parts sent again after a restart (see the module docstring)
        self.on_resent = on_resent

    def start(self, outbound: Outbound) -> tuple[int, list[str]]:
        """Parts already delivered and their ids: the outbox item's, or what this process
        delivered since, whichever got further."""
        if (outbound.attempting is not None and outbound.id not in self._attempting
                and outbound.id not in self._sent):
            # Written down by a process that died before the platform's answer was recorded:
            # that part may have reached the chat already.
            self._inherited[outbound.id] = outbound.attempting
        self._remember_attempt(outbound.id, outbound.attempting)
        parts, _, ids = self._furthest(outbound)
        return parts, list(ids)

    def pieces_sent(self, outbound: Outbound, index: int) -> int:
        """How many smaller pieces of part `index` are delivered (0: none, or sent whole)."""
        parts, pieces, _ = self._furthest(outbound)
        return pieces if parts == index else 0

    def _furthest(self, outbound: Outbound) -> tuple[int, int, tuple[str, ...]]:
        on_disk = (outbound.parts_sent, outbound.pieces_sent, outbound.platform_ids)
        remembered = self._sent.get(outbound.id, (0, 0, ()))
        return on_disk if on_disk[:2] >= remembered[:2] else remembered

    async def attempt(self, outbound: Outbound, index: int) -> None:
        """Write down that part `index` is about to go out (unless it is already)."""
        if self._attempting.get(outbound.id) == index:
            return  # the previous part's record wrote it, or an earlier try
        # A hint for counting, like the record: a power cut may undo it (see `record`).
        await asyncio.to_thread(self.store.outbox_update, outbound.id, attempting=index,
                                durable_rename=False)
        self._remember_attempt(outbound.id, index)

    async def record(self, outbound: Outbound, parts_sent: int, ids: list[str],
                     more: bool) -> None:
        """The platform took part `parts_sent - 1`: remember, then write (a StoreError from
        the write still reaches the engine). Called first thing after the platform's answer;
        `more` says another part follows, which this write marks as about to go out."""
        self._remember_sent(outbound.id, parts_sent, 0, ids)
        self._count_resent(outbound.id, parts_sent - 1)
        following = parts_sent if more else None
        await asyncio.to_thread(self.store.outbox_update, outbound.id, parts_sent=parts_sent,
                                pieces_sent=0, platform_ids=ids, attempting=following,
                                durable_rename=False)
        self._remember_attempt(outbound.id, following)

    async def record_piece(self, outbound: Outbound, index: int, pieces_sent: int,
                           ids: list[str]) -> None:
        """The platform took piece `pieces_sent - 1` of part `index`, and more pieces follow
        (the last one is recorded by `record`, as the whole part): like `record`, first thing
        after the answer. The part stays the one in flight."""
        self._remember_sent(outbound.id, index, pieces_sent, ids)
        # After a restart, the first thing recorded is the unit that was in flight.
        self._count_resent(outbound.id, index)
        await asyncio.to_thread(self.store.outbox_update, outbound.id, parts_sent=index,
                                pieces_sent=pieces_sent, platform_ids=ids, attempting=index,
                                durable_rename=False)
        self._remember_attempt(outbound.id, index)

    def answer_lost(self, outbound: Outbound, index: int) -> None:
        """The send of part `index` may have reached the chat, but its answer was lost (the
        connection dropped after the request left): if it is sent again, that is counted."""
        self._inherited[outbound.id] = index

    def in_doubt(self, outbound: Outbound, index: int) -> bool:
        """Whether part `index` may have reached the chat already: an earlier process wrote
        it down as in flight, or its send's answer was lost (see `answer_lost`)."""
        return self._inherited.get(outbound.id) == index

    def recognised(self, outbound: Outbound, index: int) -> None:
        """The platform confirmed, another way, that it took part `index` (WhatsApp's status
        echo): its record follows, and it is no part sent again."""
        if self._inherited.get(outbound.id) == index:
            del self._inherited[outbound.id]

    def _remember_sent(self, outbound_id: str, parts: int, pieces: int, ids: list[str]) -> None:
        self._sent[outbound_id] = (parts, pieces, tuple(ids))
        self._sent.move_to_end(outbound_id)
        while len(self._sent) > REMEMBERED:
            self._sent.popitem(last=False)

    def _count_resent(self, outbound_id: str, index: int) -> None:
        if self._inherited.get(outbound_id) == index:
            del self._inherited[outbound_id]
            self.resent += 1
            if self.on_resent is not None:
                self.on_resent()

    def _remember_attempt(self, outbound_id: str, index: int | None) -> None:
        self._attempting[outbound_id] = index
        self._attempting.move_to_end(outbound_id)
        while len(self._attempting) > REMEMBERED:
            self._attempting.popitem(last=False)
