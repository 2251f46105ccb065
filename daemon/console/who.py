"""Who may talk to roost, as the gate (daemon/intake/gate.py) decides it, for the People page.

A sender may write when they are on their platform's allow list (`telegram.allow` and the
like), listed in `[people]`, or approved by pairing; an empty allow list lets nobody in by
itself. The terminal (`console:local`, `roost chat`) is the owner's, since whoever runs roost on
the machine owns it. A person is one card: the chats of a `[people]` or `[identities]` entry
together, else one chat alone. Roles come from the household's roster (owner, member, guest);
a chat only an allow list lets in is a member's. Pure: settings, the approved senders, the names
and the roster in, cards out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from daemon.core.config import MEMBER, OWNER, Settings
from daemon.core.platforms import CONSOLE_CHAT, ChatKey, installed
from daemon.intake.household import CONFIG, Roster
from daemon.intake.pairing import Approved

TERMINAL = "Terminal (roost chat)"


@dataclass(frozen=True)
class Chat:
    """One chat of a person, and what lets it in."""

    key: str  # telegram:1111111
    where: str  # the platform's title, "Telegram"
    how: tuple[str, ...]  # "allow list", "pairing, approved 2026-12-01"; empty: not let in
    off: bool  # its platform is off in the config: nobody writes there now


@dataclass(frozen=True)
class Talker:
    """A person who may talk: an identity, or a chat no identity links."""

    name: str | None  # the [people] or [identities] name, else what pairing called them
    chats: tuple[Chat, ...]
    role: str  # owner | member | guest


@dataclass(frozen=True)
class Door:
    """How one platform lets people in, in a sentence for the owner."""

    where: str
    text: str


def who_may_talk(settings: Settings, approved: Iterable[Approved],
                 names: Mapping[str, str], roster: Roster, *,
                 at_terminal: bool = True) -> list[Talker]:
    """Everyone who may talk: the owners first, then `[people]` and `[identities]` as the
    config lists them, then each other chat (allow lists in platform order, then pairing by
    approval). The terminal no entry lists is "You" to whoever is `at_terminal` (`roost
    console`'s view), "Terminal" to an owner reading from a chat of theirs."""
    let_in = _let_in(settings, approved, roster)
    talkers: list[Talker] = []
    linked: set[str] = set()
    for person in roster.everyone():
        if not person.configured:
            continue
        linked.update(person.chats)
        if any(chat in let_in for chat in person.chats):
            talkers.append(_talker(person.name, person.chats, person.role, let_in, settings))
    for chat in let_in:
        if chat not in linked:
            # The terminal alone is whoever runs roost on the box: the owner, unnamed.
            terminal = "You" if at_terminal else "Terminal"
            name = names.get(chat) or (terminal if chat == CONSOLE_CHAT else None)
            talkers.append(_talker(name, (chat,), roster.role_of(chat) or MEMBER, let_in,
                                   settings))
    talkers.sort(key=lambda talker: talker.role != OWNER)  # stable: the rest keep their order
    return talkers


def doors(settings: Settings) -> list[Door]:
    """What each platform's allow list and `[access]` mean for a sender writing now."""
    stranger = ("a stranger who writes privately gets a pairing code to approve here"
                if settings.access.unknown_senders == "pair" else
                'a stranger is ignored (access.unknown_senders = "ignore")')
    others = ("those listed in [people] and those approved by pairing" if settings.people
              else "those approved by pairing")
    found = []
    for platform in installed().values():
        table = platform.of(settings.platforms)
        allow = _allow_list(table)
        if not table.enabled:
            text = f"off ({platform.name}.enabled = false): nobody writes to roost there."
        elif allow:
            text = (f"{len(allow)} on the allow list ({platform.name}.allow), and {others}; "
                    f"{stranger}.")
        else:
            text = (f"the allow list ({platform.name}.allow) is empty, so it lets nobody in: "
                    f"only {others} may write; {stranger}.")
        found.append(Door(platform.title, text))
    return found


def _let_in(settings: Settings, approved: Iterable[Approved], roster: Roster
            ) -> dict[str, list[str]]:
    """Chat key -> what lets it in, in the order of `who_may_talk`'s docstring."""
    let_in: dict[str, list[str]] = {CONSOLE_CHAT: [OWNER]}
    for platform in installed().values():
        for sender in _allow_list(platform.of(settings.platforms)):
            let_in.setdefault(f"{platform.name}:{sender}", []).append("allow list")
    for person in roster.everyone():
        if person.source == CONFIG:  # [people]: let in on their chats, whatever the allow list
            for chat in person.chats:
                if chat != CONSOLE_CHAT:
                    let_in.setdefault(chat, []).append(f"[people.{person.name}]")
    for a in sorted(approved, key=lambda a: a.approved):
        day = datetime.fromtimestamp(a.approved, settings.daemon.tz).strftime("%Y-%m-%d")
        let_in.setdefault(f"{a.channel}:{a.sender}", []).append(f"pairing, approved {day}")
    return let_in


def _allow_list(table: object) -> tuple[str, ...]:
    # Every platform's settings name their allow list `allow`, as each channel hands it to its
    # Gate, which compares senders as strings (Telegram's are integers in the config).
    return tuple(str(sender) for sender in getattr(table, "allow", ()))


def _talker(name: str | None, chats: tuple[str, ...], role: str,
            let_in: Mapping[str, list[str]], settings: Settings) -> Talker:
    return Talker(name, tuple(_chat(key, let_in, settings) for key in chats), role)


def _chat(key: str, let_in: Mapping[str, list[str]], settings: Settings) -> Chat:
    how = tuple(let_in.get(key, ()))
    if key == CONSOLE_CHAT:
        return Chat(key, TERMINAL, how, off=False)
    kind = ChatKey.of(key).kind
    platform = installed().get(kind)
    if platform is None:  # approved on a platform roost no longer has
        return Chat(key, kind, how, off=True)
    return Chat(key, platform.title, how, off=not platform.of(settings.platforms).enabled)
