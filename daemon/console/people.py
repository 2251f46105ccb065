"""People and access: who may talk (who.py), pairing requests to approve or refuse, standing
"Always" grants to revoke, and each person's facts to read, add to or forget.

The owner sees and changes everyone's (at the terminal, or from a chat of theirs: signin.py);
a member's or a guest's session sees themselves (their own chats, facts and grants) and nothing
of the pairing book (a code is the owner's to approve).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from aiohttp import web

from daemon.console.names import chat_names
from daemon.console.signin import given_for
from daemon.console.who import Talker, doors, who_may_talk
from daemon.core.config import GUEST, Settings
from daemon.intake.household import Household
from daemon.intake.pairing import PairingBook
from daemon.store.approvals import ApprovalBook, Standing
from daemon.store.console_keys import ConsoleSession
from daemon.store.facts import HOUSEHOLD, Fact, FactError, FactsBook, Person
from daemon.tools.roles import keeps_household
from daemon.tools.scope import named_person, people_with_facts, person_of


@dataclass(frozen=True)
class PersonFacts:
    person: Person
    facts: tuple[Fact, ...]


class People:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        state_dir = settings.daemon.state_dir
        self.settings = settings
        self.clock = clock
        self.pairing = PairingBook(state_dir)
        self.household = Household.of(settings, self.pairing)
        self.approvals = ApprovalBook(state_dir)
        self.facts = FactsBook.at(state_dir)

    # ---- what a session may see -------------------------------------------------------

    def people(self, session: ConsoleSession) -> list[Person]:
        """Whose facts the session shows: the household's and everyone with a facts file or an
        approved chat for the owner; the session's own person otherwise (and the household's
        for a member)."""
        if not session.is_owner:
            found = [person_of(chat, self.settings) for chat in session.scope]
            shared = any(keeps_household(chat, self.household) for chat in session.scope)
            return _unique([*([HOUSEHOLD] if shared else []), *(p for p in found if p)])
        approved = [named_person(f"{a.channel}:{a.sender}", self.settings)
                    for a in self.pairing.approved()]
        return _unique([HOUSEHOLD, *people_with_facts(self.facts.people(), self.settings),
                        *(p for p in approved if p is not None)])

    def grants(self, session: ConsoleSession) -> list[Standing]:
        return [s for s in self.approvals.standing() if session.covers(s.person)]

    def talkers(self, session: ConsoleSession) -> list[Talker]:
        """Who may talk: everyone for the owner; for a person, themselves with only the chats
        their session covers (an identity changed since the link names no one else's)."""
        names = chat_names(self.settings.linked, self.pairing)
        found = who_may_talk(self.settings, self.pairing.approved(), names,
                             self.household.roster(), at_terminal=not given_for(session))
        if session.is_owner:
            return found
        own = [replace(t, chats=tuple(c for c in t.chats if session.covers(c.key)))
               for t in found]
        return [t for t in own if t.chats]

    def view(self, session: ConsoleSession) -> dict[str, Any]:
        now = self.clock()
        return {
            "talkers": self.talkers(session),
            "doors": doors(self.settings) if session.is_owner else [],
            "pending": self.pairing.pending(now) if session.is_owner else [],
            "grants": self.grants(session),
            "people": [PersonFacts(p, tuple(self.facts.facts(p))) for p in self.people(session)],
            "day": lambda ts: datetime.fromtimestamp(ts, self.settings.daemon.tz).strftime(
                "%Y-%m-%d %H:%M"),
        }

    # ---- what a form changes ------------------------------------------------------------

    def decide(self, session: ConsoleSession, code: str, approve: bool) -> str:
        """Approve (as a guest, as `roost pairing approve` does by default) or refuse a code."""
        if not session.is_owner:
            raise web.HTTPForbidden(text="Only the owner approves pairing codes.")
        book, now = self.pairing, self.clock()
        found = book.approve(code, now, GUEST) if approve else book.deny(code, now)
        if found is None:
            return f"No code {code} is waiting (used or expired)."
        who = f"{found.channel} user {found.sender} ({found.name or 'no name'})"
        return (f"Approved {who} as a guest; their next message is answered." if approve
                else f"Refused {who}; their code no longer works.")

    def revoke(self, session: ConsoleSession, person: str, tool: str) -> str:
        if not session.covers(person):
            raise web.HTTPNotFound(text="No such grant.")
        gone = self.approvals.revoke(person, tool)
        return f"{tool} asks again before each call." if gone else "No such grant."

    def forget(self, session: ConsoleSession, name: str, text: str) -> str:
        """Forget the fact shown with these words (not a position: a fact added or forgotten
        meanwhile, or a second tap, must not take another one)."""
        person = self._person(session, name)
        try:
            fact = self.facts.remove_text(person, text)
        except FactError as exc:
            return f"Nothing forgotten: {exc}."
        return f"Forgotten: {fact.text}"

    def remember(self, session: ConsoleSession, name: str, text: str) -> str:
        person = self._person(session, name)
        day = datetime.fromtimestamp(self.clock(), self.settings.daemon.tz).date().isoformat()
        try:
            fact, new = self.facts.add(person, text, day)
        except FactError as exc:
            return f"Not kept: {exc}."
        return f"Noted: {fact.text}" if new else f"Already kept: {fact.text}"

    def _person(self, session: ConsoleSession, name: str) -> Person:
        for person in self.people(session):
            if person.name == name:
                return person
        raise web.HTTPNotFound(text="No such person.")


def _unique(people: list[Person]) -> list[Person]:
    seen: dict[str, Person] = {}
    for person in people:
        seen.setdefault(person.name, person)
    return list(seen.values())
