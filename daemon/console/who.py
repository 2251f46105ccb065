"""Who may talk to roost, as the gate (daemon/intake/gate.py) decides it, for the People page.

A sender may write when they are on their platform's allow list (`telegram.allow` and the
like) or approved by pairing; an empty allow list lets nobody in by itself. The terminal
(`console:local`, `roost chat`) is the owner's, since whoever runs roost on the machine owns it;
an `[identities]` entry that links it names the owner's other chats. A person is one card:
an identity's chats together, else one chat alone. Pure: settings, the approved senders and
the names in, cards out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from daemon.core.config import Settings
from daemon.core.platforms import CONSOLE_CHAT, ChatKey, installed
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

    name: str | None  # the [identities] name, else what pairing called them; None: unknown
    chats: tuple[Chat, ...]
    role: str


@dataclass(frozen=True)
class Door:
    """How one platform lets people in, in a sentence for the owner."""

    where: str
    text: str


def role_of(chats: Collection[str]) -> str:
    """Today the owner, and everyone else who may talk a member. Issue 45's roles (owner,
    member, guest) replace this one function."""
    return "owner" if CONSOLE_CHAT in chats else "member"


def who_may_talk(settings: Settings, approved: Iterable[Approved],
                 names: Mapping[str, str]) -> list[Talker]:
    """Everyone who may talk: the owner first, then the identities as the config lists them,
    then each other chat (allow lists in platform order, then pairing by approval)."""
    let_in = _let_in(settings, approved)
    talkers: list[Talker] = []
    linked: set[str] = set()
    for name, chats in settings.identities.items():
        linked.update(chats)
        if any(chat in let_in for chat in chats):
            talkers.append(_talker(name, chats, let_in, settings))
    for chat in let_in:
        if chat not in linked:
            talkers.append(_talker(names.get(chat), (chat,), let_in, settings))
    talkers.sort(key=lambda talker: talker.role != "owner")  # stable: the rest keep their order
    return talkers


def doors(settings: Settings) -> list[Door]:
    """What each platform's allow list and `[access]` mean for a sender writing now."""
    stranger = ("a stranger who writes privately gets a pairing code to approve here"
                if settings.access.unknown_senders == "pair" else
                'a stranger is ignored (access.unknown_senders = "ignore")')
    found = []
    for platform in installed().values():
        table = platform.of(settings.platforms)
        allow = _allow_list(table)
        if not table.enabled:
            text = f"off ({platform.name}.enabled = false): nobody writes to roost there."
        elif allow:
            text = (f"{len(allow)} on the allow list ({platform.name}.allow), and those approved "
                    f"by pairing; {stranger}.")
        else:
            text = (f"the allow list ({platform.name}.allow) is empty, so it lets nobody in: "
                    f"only those approved by pairing may write; {stranger}.")
        found.append(Door(platform.title, text))
    return found


def _let_in(settings: Settings, approved: Iterable[Approved]) -> dict[str, list[str]]:
    """Chat key -> what lets it in, in the order of `who_may_talk`'s docstring."""
    let_in: dict[str, list[str]] = {CONSOLE_CHAT: ["owner"]}
    for platform in installed().values():
        for sender in _allow_list(platform.of(settings.platforms)):
            let_in.setdefault(f"{platform.name}:{sender}", []).append("allow list")
    for a in sorted(approved, key=lambda a: a.approved):
        day = datetime.fromtimestamp(a.approved, settings.daemon.tz).strftime("%Y-%m-%d")
        let_in.setdefault(f"{a.channel}:{a.sender}", []).append(f"pairing, approved {day}")
    return let_in


def _allow_list(table: object) -> tuple[str, ...]:
    # Every platform's settings name their allow list `allow`, as each channel hands it to its
    # Gate, which compares senders as strings (Telegram's are integers in the config).
    return tuple(str(sender) for sender in getattr(table, "allow", ()))


def _talker(name: str | None, chats: tuple[str, ...], let_in: Mapping[str, list[str]],
            settings: Settings) -> Talker:
    return Talker(name, tuple(_chat(key, let_in, settings) for key in chats), role_of(chats))


def _chat(key: str, let_in: Mapping[str, list[str]], settings: Settings) -> Chat:
    how = tuple(let_in.get(key, ()))
    if key == CONSOLE_CHAT:
        return Chat(key, TERMINAL, how, off=False)
    kind = ChatKey.of(key).kind
    platform = installed().get(kind)
    if platform is None:  # approved on a platform roost no longer has
        return Chat(key, kind, how, off=True)
    return Chat(key, platform.title, how, off=not platform.of(settings.platforms).enabled)
