"""Who is who in the config: `[identities]` (one person's chats on several channels) and
`[people.NAME]` (a person's chats and their role). A chat belongs to one person at most, across
both tables, and a name is in one of them only."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from daemon.core.config.values import _TOML_TYPES, Convert, _array, _at_least, _Bad, _like, _one_of
from daemon.core.errors import ConfigError
from daemon.core.platforms import CONSOLE_CHAT, person_chat_pattern

_IDENTITY_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,39}")
_NAME_RULE = "the name must be lowercase letters, digits, '-' and '_' (at most 40)"

OWNER, MEMBER, GUEST = "owner", "member", "guest"
ROLES = (OWNER, MEMBER, GUEST)
GUEST_DAILY_MESSAGES = 30  # a guest's model turns a day when `daily_messages` is not given

Read = Callable[[Any, str, Mapping[str, Convert]], dict[str, Any]]
Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class PersonSettings:
    """One `[people.NAME]`: their own chats, their role, and a guest's daily model turns."""

    chats: tuple[str, ...]
    role: str = MEMBER
    daily_messages: int | None = None  # a guest's only (GUEST_DAILY_MESSAGES unless given)


def _person_chats() -> Convert:
    # A person's own chat on a platform, or the terminal. Groups and forum topics are nobody's,
    # so they cannot be linked.
    pattern, forms = person_chat_pattern()
    return _array(_like(pattern, f"a person's chat ({forms})"))


def _identities(raw: Any, fail: Fail) -> Mapping[str, tuple[str, ...]]:
    """`[identities]`: name = [chat keys]; a chat belongs to one identity at most."""
    if not isinstance(raw, dict):
        raise fail("identities", "expected a table, got "
                   f"{_TOML_TYPES.get(type(raw), 'date/time')}")
    person_chats = _person_chats()
    identities: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for name, chats in raw.items():
        if not _IDENTITY_NAME.fullmatch(name):
            raise fail(f"identities.{name}", _NAME_RULE)
        try:
            keys = person_chats(chats)
        except _Bad as bad:
            raise fail(f"identities.{name}{bad.where}", str(bad)) from None
        if not keys:
            raise fail(f"identities.{name}", "must name at least one chat")
        for key in keys:
            if key in owner:
                raise fail(f"identities.{name}", f"{key} is already in identity {owner[key]!r}")
            owner[key] = name
        identities[name] = tuple(dict.fromkeys(keys))
    return MappingProxyType(identities)


def _person_spec() -> dict[str, Convert]:
    """The keys of a `[people.NAME]` table (made per load: `chats` asks the platforms
    installed then)."""
    return {"chats": _person_chats(), "role": _one_of(*ROLES), "daily_messages": _at_least(1)}


def _people(raw: Any, read: Read, fail: Fail, identities: Mapping[str, tuple[str, ...]]
            ) -> Mapping[str, PersonSettings]:
    """`[people.NAME]` tables, checked against each other and against `[identities]`."""
    if not isinstance(raw, dict):
        raise fail("people", "expected [people.NAME] tables, got "
                   f"{_TOML_TYPES.get(type(raw), 'date/time')}")
    spec = _person_spec()
    whose = {chat: f"[identities] {name}" for name, chats in identities.items()
             for chat in chats}
    people: dict[str, PersonSettings] = {}
    for name, table in raw.items():
        where = f"people.{name}"
        if not _IDENTITY_NAME.fullmatch(name):
            raise fail(where, _NAME_RULE)
        if name in identities:
            raise fail(where, f"{name!r} is also in [identities]: a person is named in one "
                       f"place; move their chats to [people.{name}] and take {name} out of "
                       "[identities]")
        if not isinstance(table, dict):
            raise fail(where, f"expected a table [people.{name}] with chats and role, got "
                       f"{_TOML_TYPES.get(type(table), 'date/time')}")
        values = read(table, where, spec)
        people[name] = _person(name, values, whose, fail)
    return MappingProxyType(people)


def _person(name: str, values: dict[str, Any], whose: dict[str, str], fail: Fail
            ) -> PersonSettings:
    where = f"people.{name}"
    chats = tuple(dict.fromkeys(values.get("chats", ())))
    if not chats:
        raise fail(f"{where}.chats", "must name at least one of their chats")
    role = values.get("role", MEMBER)
    for chat in chats:
        if chat in whose:
            raise fail(f"{where}.chats", f"{chat} is already a chat of {whose[chat]}: a chat "
                       "belongs to one person")
        if chat == CONSOLE_CHAT and role != OWNER:
            raise fail(f"{where}.chats", f"{CONSOLE_CHAT} is the terminal, the owner's: only a "
                       f'person with role = "owner" may list it')
        whose[chat] = f"[people.{name}]"
    daily = values.get("daily_messages")
    if daily is not None and role != GUEST:
        raise fail(f"{where}.daily_messages", f"only a guest has a daily limit; {name}'s role "
                   f"is {role!r} (set role = \"guest\", or remove daily_messages)")
    if role == GUEST and daily is None:
        daily = GUEST_DAILY_MESSAGES
    return PersonSettings(chats, role, daily)
