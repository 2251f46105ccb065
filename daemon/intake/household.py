"""Who is who: every person roost knows, with their role, in one place.

Three places name people, and a chat belongs to one person, found in this order:

    [people.NAME]   (config)      their chats and role: owner, member or guest
    [identities]    (identities)  linked chats; a member (the owner when they link the terminal)
    pairing.json    (pairing)     an approved sender: their chat, the role their entry holds
                                  (member for an entry older than roles), named by the chat key

The terminal (`console:local`) is always the owner's; when no config entry lists it, it is a
person of its own (source "terminal"). A config person may talk on their chats without pairing
and without an allow list (`may_talk`); an `[identities]` entry names people but lets nobody in.

A `Roster` is the household at one moment: pure, no I/O. `Household` makes one from the settings
and the pairing book each time it is asked, re-reading the book only when its file changed, so
that `roost pairing approve` and `roost people set-role|remove` reach a running daemon at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from daemon.core.config import (
    GUEST,
    GUEST_DAILY_MESSAGES,
    MEMBER,
    OWNER,
    PersonSettings,
    Settings,
)
from daemon.core.platforms import CONSOLE_CHAT
from daemon.intake.pairing import PAIRED_ROLES, Approvals, Approved, PairingBook

CONFIG, IDENTITIES, PAIRING, TERMINAL = "config", "identities", "pairing", "terminal"


@dataclass(frozen=True)
class Person:
    """One person of the household."""

    name: str  # the config's name; a chat key for a paired sender or the lone terminal
    chats: tuple[str, ...]
    role: str  # owner | member | guest
    source: str  # config | identities | pairing | terminal
    daily_messages: int | None = None  # a guest's model turns a day; None: no cap
    since: float | None = None  # when pairing approved them
    called: str = ""  # what their platform calls a paired sender

    @property
    def configured(self) -> bool:
        """Whether the config file names them (changed there, not by a command)."""
        return self.source in (CONFIG, IDENTITIES)


def paired_person(entry: Approved) -> Person:
    """A sender approved by pairing, as a person. A role the file holds that pairing cannot
    give (a hand edit) counts as the least one, guest."""
    role = entry.role if entry.role in PAIRED_ROLES else GUEST
    return Person(entry.chat_key, (entry.chat_key,), role, PAIRING,
                  GUEST_DAILY_MESSAGES if role == GUEST else None, entry.approved, entry.name)


class Roster:
    """The household at one moment; see the module docstring. Pure."""

    def __init__(self, people: Mapping[str, PersonSettings],
                 identities: Mapping[str, tuple[str, ...]], approved: Iterable[Approved]) -> None:
        approved = tuple(approved)
        found = [Person(name, p.chats, p.role, CONFIG, p.daily_messages)
                 for name, p in people.items()]
        found += [Person(name, chats, OWNER if CONSOLE_CHAT in chats else MEMBER, IDENTITIES)
                  for name, chats in identities.items()]
        by_chat = {chat: person for person in found for chat in person.chats}
        if CONSOLE_CHAT not in by_chat:
            found.insert(0, by_chat.setdefault(
                CONSOLE_CHAT, Person(CONSOLE_CHAT, (CONSOLE_CHAT,), OWNER, TERMINAL)))
        self.admitted = frozenset(chat for p in people.values() for chat in p.chats)
        self.paired = frozenset(a.chat_key for a in approved)
        for entry in sorted(approved, key=lambda a: a.approved):
            if entry.chat_key not in by_chat:  # a config entry covers the chat: it wins
                by_chat[entry.chat_key] = paired_person(entry)
                found.append(by_chat[entry.chat_key])
        self._by_chat = MappingProxyType(by_chat)
        self._by_name = MappingProxyType({p.name: p for p in found})
        self._everyone = tuple(found)

    def person(self, chat_key: str) -> Person | None:
        """The person whose own chat this is; None for anyone roost does not list."""
        return self._by_chat.get(chat_key)

    def role_of(self, chat_key: str) -> str | None:
        """owner, member or guest; None: not a listed person (a sender let in only by an allow
        list, a stranger, a group)."""
        person = self.person(chat_key)
        return person.role if person is not None else None

    def find(self, name_or_chat: str) -> Person | None:
        """A person by the name `roost people list` shows, or by one of their chats."""
        return self._by_name.get(name_or_chat) or self.person(name_or_chat)

    def everyone(self) -> Sequence[Person]:
        """The terminal (unless the config lists it), `[people]` and `[identities]` in the
        config's order, then the paired senders by approval."""
        return self._everyone

    def may_talk(self, chat_key: str) -> bool:
        """Listed in `[people]`, or approved by pairing (allow lists are the channels')."""
        return chat_key in self.admitted or chat_key in self.paired

    def owner_chats(self) -> tuple[str, ...]:
        """The owners' chats: `[people]` owners, then `[identities]` owners, each in the
        config's order, the terminal last (pairing makes no owner)."""
        listed = [chat for p in self._everyone if p.role == OWNER for chat in p.chats
                  if chat != CONSOLE_CHAT]
        return (*listed, CONSOLE_CHAT)


class Household:
    """Who is who, as of now: the settings' people and the pairing book's approved senders."""

    def __init__(self, book: PairingBook, people: Mapping[str, PersonSettings] | None = None,
                 identities: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.book = book
        self.people = people or MappingProxyType({})
        self.identities = identities or MappingProxyType({})
        self._admitted = frozenset(chat for p in self.people.values() for chat in p.chats)
        self._made: tuple[Approvals | None, Roster | None] = (None, None)

    @classmethod
    def of(cls, settings: Settings, book: PairingBook | None = None) -> Household:
        return cls(book or PairingBook(settings.daemon.state_dir), settings.people,
                   settings.identities)

    def roster(self) -> Roster:
        """The household now (the pairing file is re-read only when it changed)."""
        approvals = self.book.approvals()
        seen, roster = self._made
        if roster is None or approvals is not seen:
            roster = Roster(self.people, self.identities, approvals.values())
            self._made = (approvals, roster)
        return roster

    def person(self, chat_key: str) -> Person | None:
        return self.roster().person(chat_key)

    def role_of(self, chat_key: str) -> str | None:
        return self.roster().role_of(chat_key)

    def everyone(self) -> Sequence[Person]:
        return self.roster().everyone()

    def owner_chats(self) -> tuple[str, ...]:
        return self.roster().owner_chats()

    def may_talk(self, chat_key: str) -> bool:
        """As `Roster.may_talk`; a `[people]` chat without reading the pairing file, so that
        one that cannot be read shuts out no one the config lists."""
        return chat_key in self._admitted or self.roster().may_talk(chat_key)
