"""The chat commands of the facts roost keeps: /remember TEXT, /forget N, /memory.

They are the user speaking for themselves, so no check of where the words come from is needed
(compare `daemon.tools.facts`). A group has no personal facts: there they only say so. A
change shows in the conversation from the next message on (`daemon.turn.runner`) and in the
system message from the next conversation (or fold).

`/memory household [TEXT]` lists (or keeps) the household's facts and `/forget household N`
forgets one: an owner's or a member's, in their own chat (`daemon.tools.roles`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from daemon.core.config import Settings
from daemon.core.errors import StoreError
from daemon.store.facts import HOUSEHOLD, FactError, FactsBook, Person
from daemon.tools.roles import NoRoles, Roles, keeps_household
from daemon.tools.scope import person_of

NOT_PERSONAL = ("Facts are personal, so a group has none: tell me in a private chat what to "
                "remember.")
NOT_A_MEMBER = "Household facts are kept by the household's owner and members."


class FactsCommands:
    """Runs /remember, /forget and /memory for a chat and returns the text to send back."""

    names = frozenset({"remember", "forget", "memory"})

    def __init__(self, *, settings: Settings, facts: FactsBook,
                 clock: Callable[[], float], roles: Roles | None = None) -> None:
        self.settings = settings
        self.facts = facts
        self.clock = clock
        self.roles = roles or NoRoles()

    async def run(self, name: str, text: str, chat_key: str) -> str:
        """`text` is the whole message, command included."""
        person = person_of(chat_key, self.settings)
        if person is None:
            return NOT_PERSONAL
        argument = text.split(maxsplit=1)[1].strip() if len(text.split(maxsplit=1)) > 1 else ""
        words = argument.split(maxsplit=1)
        household = name != "remember" and bool(words) and words[0].casefold() == "household"
        if household and not keeps_household(chat_key, self.roles):
            return NOT_A_MEMBER
        try:
            if household:
                return await self._household(name, words[1] if len(words) > 1 else "")
            if name == "remember":
                return await self._remember(person, argument)
            if name == "forget":
                return await self._forget(person, argument)
            return await self._list(person)
        except FactError as exc:
            return f"Not changed: {exc}."
        except StoreError as exc:  # a full disk, a folder it cannot use: nothing changed
            if name == "memory":
                return f"The facts cannot be read right now ({exc})."
            return f"Not changed: the facts file cannot be written ({exc})."

    async def _household(self, name: str, argument: str) -> str:
        if name == "forget":
            return await self._forget(HOUSEHOLD, argument, "/forget household N")
        if argument:
            return await self._remember(HOUSEHOLD, argument)
        return await self._list(HOUSEHOLD)

    async def _remember(self, person: Person, argument: str) -> str:
        if not argument:
            return "Usage: /remember TEXT, for example /remember my locker code is 4417"
        day = datetime.fromtimestamp(self.clock(), self.settings.daemon.tz).date().isoformat()
        fact, new = await asyncio.to_thread(self.facts.add, person, argument, day)
        if not new:
            return f"Already kept since {fact.added}: {fact.text}"
        return f"Noted{' for the household' if person.household else ''}: {fact.text}"

    async def _forget(self, person: Person, argument: str, usage: str = "/forget N") -> str:
        if not argument.isdigit():
            return f"Usage: {usage}, with N the fact's number in /memory" + (
                " household" if person.household else "")
        fact = await asyncio.to_thread(self.facts.remove, person, int(argument))
        return f"Forgotten{' by the household' if person.household else ''}: {fact.text}"

    async def _list(self, person: Person) -> str:
        facts = await asyncio.to_thread(self.facts.facts, person)
        lines = [f"{n}. {f.text} ({f.added})" for n, f in enumerate(facts, start=1)]
        if person.household:
            if not facts:
                return ("The household has no facts kept yet. /memory household TEXT keeps "
                        "one for everyone in it.")
            return "\n".join(["The household's facts (/forget household N forgets one):",
                              *lines])
        if not facts:
            return "I keep no facts about you yet. /remember TEXT keeps one."
        return "\n".join(["What I keep about you (/forget N forgets one):", *lines])
