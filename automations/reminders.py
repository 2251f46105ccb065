"""Reminders: one-shot messages to a chat at a time, set by the model or by the command line.

Delivered exactly once: the reminder's outbox id is `reminder.<id>`, which `Engine.deliver`
queues at most once (and not at all once sent), and the reminder is recorded as done only
after that. A crash in between delivers nothing twice; it finishes the bookkeeping at the next
start. A reminder that came due while roost was down is delivered at start marked late when it
is less than `LATE_LIMIT` late, and otherwise reported to the chat as missed instead.

The model's tools (`schedule_reminder`, `list_reminders`, `cancel_reminder`) are one capability,
in `automations/reminder_tools.py`; one asked for in a group goes to the private chat of who
asked, when roost can write to them there (the record keeps the group as `set_in`). They are
registered with the others, before the engine that delivers the reminders exists: so the book
here takes no outlet; the scheduler hands it one when a reminder fires, and hears of each one
added through `added`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from automations.state import AutomationState
from daemon.core.ids import new_id
from daemon.core.logs import automation_log as log
from daemon.core.messages import Outbound

if TYPE_CHECKING:
    from automations.runner import Outlet

LATE_LIMIT = 24 * 3600.0
LATE_AFTER = 60.0  # delivered more than this after its time: say so
MAX_TEXT = 1000


def new_reminder(chat_key: str, due: float, text: str, now: float, by: str,
                 set_in: str | None = None) -> dict[str, Any]:
    """A pending reminder's record; `set_in` is the group it was asked for in, when it goes to
    the private chat of who asked (`chat_key`) instead."""
    return {"id": new_id(now)[-10:].lower(), "chat_key": chat_key, "due": due,
            "text": text.strip()[:MAX_TEXT], "created": now, "by": by,
            **({"set_in": set_in} if set_in else {})}


def when_text(moment: float, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(moment, tz).strftime("%a %Y-%m-%d %H:%M")


class Reminders:
    """The pending reminders, and their delivery; see the module docstring."""

    def __init__(self, tz: ZoneInfo, state: AutomationState, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.clock = clock
        self.tz = tz
        # Each reminder added, for the scheduler to put on its timer (a daemon's scheduler
        # takes them; in a command nobody does, and the daemon arms them from disk at start).
        self.added: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._firing: dict[str, asyncio.Event] = {}  # reminder id -> set once it is handled

    async def add(self, chat_key: str, due: float, text: str, by: str,
                  set_in: str | None = None) -> dict[str, Any]:
        doc = new_reminder(chat_key, due, text, self.clock(), by, set_in)
        await asyncio.to_thread(self.state.add_reminder, doc)
        self.added.put_nowait(doc)
        log.info("reminder %s for %s at %s", doc["id"], chat_key, when_text(due, self.tz))
        return doc

    async def pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        """The pending reminders (of one chat: those it gets, and those set in it for
        someone's private chat)."""
        docs = await asyncio.to_thread(self.state.pending_reminders)
        return [d for d in docs if chat_key is None or chat_key in (d["chat_key"],
                                                                    d.get("set_in"))]

    async def cancel(self, reminder_id: str, chat_key: str | None = None) -> bool:
        for doc in await self.pending(chat_key):
            if doc["id"] == reminder_id.strip().lower():
                await asyncio.to_thread(self.state.finish_reminder, doc, "cancelled",
                                        self.clock())
                return True
        return False

    async def fire(self, reminder_id: str, outlet: Outlet) -> None:
        """Deliver one reminder through `outlet` (the scheduler calls this at its time, and at
        start for the ones that came due while roost was down)."""
        if (running := self._firing.get(reminder_id)) is not None:
            # Fired twice at once (its timer and a scan): one delivers, and both return only
            # once it is handled.
            await running.wait()
            return
        self._firing[reminder_id] = done = asyncio.Event()
        try:
            docs = [d for d in await self.pending() if d["id"] == reminder_id]
            if docs:
                await self._deliver(docs[0], outlet)
        finally:
            del self._firing[reminder_id]
            done.set()

    async def _deliver(self, doc: dict[str, Any], outlet: Outlet) -> None:
        now = self.clock()
        late = now - doc["due"]
        if late > LATE_LIMIT:
            text = (f"While roost was not running, a reminder came due on "
                    f"{when_text(doc['due'], self.tz)}, more than a day ago, so it is not sent "
                    f"as a reminder now. It said: {doc['text']}")
            status = "missed"
        elif late > LATE_AFTER:
            text = f"⏰ Reminder (late: it was due {when_text(doc['due'], self.tz)}): {doc['text']}"
            status = "late"
        else:
            text = f"⏰ Reminder: {doc['text']}"
            status = "delivered"
        outbound = Outbound(chat_key=doc["chat_key"], text=text, created=now, kind="notice",
                            id=f"reminder.{doc['id']}")
        await outlet.deliver(outbound)
        await asyncio.to_thread(self.state.finish_reminder, doc, status, now)
        log.info("reminder %s for %s: %s", doc["id"], doc["chat_key"], status)
