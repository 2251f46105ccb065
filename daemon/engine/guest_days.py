"""A guest's day: at most `daily_messages` model turns (`[people.NAME] role = "guest"`).

Counted per person (all their chats together) per day in the daemon's zone, in a chat flag of
each chat (`guest_turns`: the day and its count), so a restart keeps the count. Past the cap, the
guest's message is kept in their conversation like any other, and they get one short line
saying when the day resets; the model is not called.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from daemon.core.config import GUEST, Settings
from daemon.intake.household import Household, Person
from daemon.store import Store

FLAG = "guest_turns"


class GuestDays:
    def __init__(self, settings: Settings, store: Store, clock: Callable[[], float],
                 household: Household | None = None) -> None:
        self.tz = settings.daemon.tz
        self.store = store
        self.clock = clock
        self.household = household or Household.of(settings)

    async def refusal(self, chat_key: str) -> str | None:
        """The line a guest past today's cap gets instead of an answer; None: answer."""
        guest = await self._guest(chat_key)
        if guest is None or guest.daily_messages is None:
            return None
        if await asyncio.to_thread(self._used, guest) < guest.daily_messages:
            return None
        now = datetime.fromtimestamp(self.clock(), self.tz)
        tomorrow = (now + timedelta(days=1)).strftime("%a")
        return (f"That was all {guest.daily_messages} of today's messages I can answer for "
                f"you. Your message is kept; I answer again from 00:00 ({tomorrow}, "
                f"{self.tz.key}).")

    async def count(self, chat_key: str) -> None:
        """One more answered turn for a guest's day."""
        if await self._guest(chat_key) is not None:
            await asyncio.to_thread(self._add, chat_key)

    async def _guest(self, chat_key: str) -> Person | None:
        person = await asyncio.to_thread(self.household.person, chat_key)
        return person if person is not None and person.role == GUEST else None

    def _today(self) -> str:
        return datetime.fromtimestamp(self.clock(), self.tz).date().isoformat()

    def _used(self, guest: Person) -> int:
        today = self._today()
        return sum(flag.get("count", 0) for chat in guest.chats
                   if isinstance(flag := self.store.chat_flags(chat).get(FLAG), dict)
                   and flag.get("day") == today)

    def _add(self, chat_key: str) -> None:
        today = self._today()
        flag = self.store.chat_flags(chat_key).get(FLAG)
        count = flag.get("count", 0) if isinstance(flag, dict) and flag.get("day") == today else 0
        self.store.set_chat_flag(chat_key, FLAG, {"day": today, "count": count + 1})
