"""A guest's day: at most `daily_messages` model turns (`[people.NAME] role = "guest"`).

Counted per person (all their chats together) per day in the daemon's zone, in a chat flag of
each chat (`guest_turns`: the day and its count), so a restart keeps the count. Past the cap, the
guest's message is kept in their conversation like any other, and they get one short line
saying when the day resets; the model is not called. In a group, a turn counts for each guest
who spoke in it (their day is theirs, wherever they write), and is declined only when everyone
who spoke is a guest past the cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from daemon.core.config import GUEST, Settings
from daemon.core.messages import Inbound
from daemon.core.platforms import is_person_chat
from daemon.intake.household import Household, Person
from daemon.store import Store

FLAG = "guest_turns"


def speakers_of(chat_key: str, items: Sequence[Inbound]) -> list[str]:
    """The private chats of who spoke in a turn: the chat itself, or in a group each sender's
    own chat on the group's platform (`telegram:<user id>`)."""
    if is_person_chat(chat_key):
        return [chat_key]
    platform = chat_key.partition(":")[0]
    return sorted({f"{platform}:{item.sender}" for item in items if item.sender})


class GuestDays:
    def __init__(self, settings: Settings, store: Store, clock: Callable[[], float],
                 household: Household | None = None) -> None:
        self.tz = settings.daemon.tz
        self.store = store
        self.clock = clock
        self.household = household or Household.of(settings)

    async def refusal(self, speakers: Sequence[str]) -> str | None:
        """The line a guest past today's cap gets instead of an answer; None: answer.
        `speakers`: the private chats of who spoke in the turn (the chat itself, unless a
        group)."""
        guests = [await self._guest(chat) for chat in speakers]
        capped = [g for g in guests if g is not None and g.daily_messages is not None
                  and await asyncio.to_thread(self._used, g) >= g.daily_messages]
        if not speakers or len(capped) < len(speakers):
            return None
        guest = capped[0]
        assert guest.daily_messages is not None
        now = datetime.fromtimestamp(self.clock(), self.tz)
        tomorrow = (now + timedelta(days=1)).strftime("%a")
        return (f"That was all {guest.daily_messages} of today's messages I can answer for "
                f"you. Your message is kept; I answer again from 00:00 ({tomorrow}, "
                f"{self.tz.key}).")

    async def count(self, speakers: Sequence[str]) -> None:
        """One more answered turn for the day of each guest who spoke."""
        for chat_key in speakers:
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
