"""The platforms roost talks on, each described once, and the chat keys that name their chats.

A platform (`channels/<name>/platform.py`) describes itself in one `Platform`: its config table
and secrets, which chat keys are a person's own chat and which are groups, the note the prompt
carries about its formatting, what it can send, and the module that runs it. The composition
roots install the list in `channels/installed.py` here at start; the core asks this registry
and never names a platform.

A chat key is `<platform>:<id>`: `telegram:1111111`, `whatsapp:972544401243`,
`matrix:@dana:example.org`. Two kinds are roost's own: `console:local` (the terminal and the
console) and `automation:<name>` (an automation's conversations).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from daemon.core.setup import InitFlag

Convert = Callable[[Any], Any]
S = TypeVar("S")

CONSOLE = "console"
CONSOLE_CHAT = "console:local"
AUTOMATION = "automation"
AUTOMATION_PREFIX = f"{AUTOMATION}:"


@dataclass(frozen=True)
class ChatKey:
    """A chat key taken apart: `telegram:-100:7` is kind "telegram", id "-100:7"."""

    kind: str
    id: str

    @classmethod
    def of(cls, text: str) -> ChatKey:
        """Any text taken apart; one without a colon is a kind with an empty id."""
        kind, _, rest = text.partition(":")
        return cls(kind, rest)

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


def automation_key(name: str) -> str:
    """The chat key of an automation's conversations."""
    return AUTOMATION_PREFIX + name


def automation_name(chat_key: str) -> str | None:
    """The automation a chat key belongs to, or None for a chat."""
    return chat_key.removeprefix(AUTOMATION_PREFIX) if chat_key.startswith(
        AUTOMATION_PREFIX) else None


def _no_problems(settings: Any) -> Iterable[tuple[str, str]]:
    return ()


def _as_is(table: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Platform(Generic[S]):
    """One platform, described once. `person` and `group` are patterns of the id part of its
    chat keys: a person's own chat (which `[identities]` may link and whose tools see that
    person's data) and any other chat roost may deliver to."""

    name: str  # the config table, the chat keys' kind, the label in logs and metrics
    title: str  # as a sentence names it: "Telegram"
    settings: type[S]  # a frozen dataclass with `enabled`, built from the table and secrets
    spec: Mapping[str, Convert]  # the table's keys, each with its converter
    secrets: Mapping[str, str]  # settings field -> environment variable and credential file
    required_secrets: tuple[str, ...]  # the fields `enabled` cannot go without
    person: str
    group: str
    forms: str  # the chat keys, as an error message lists them
    person_forms: str
    note: str  # the prompt's line on how the user reads the replies
    runtime: str  # the module whose `RUNTIME` runs it (daemon/intake/platforms.py)
    sends: frozenset[str] = frozenset()  # "voice" notes, "drafts", "buttons", "templates"
    webhooks: tuple[str, ...] = ()  # the HTTP paths it may serve
    # Fills defaults that depend on other keys of the table (given only when the file has it).
    prepare: Callable[[dict[str, Any]], None] = _as_is
    # (key, problem) for values wrong only together with others; asked only when enabled.
    check: Callable[[S], Iterable[tuple[str, str]]] = _no_problems
    # Whether a sender id is on the table's allow list.
    allowed: Callable[[S, str], bool] = field(default=lambda settings, sender: False)
    # The environment variables still needed when the secrets are not simply all required (one
    # of two will do); None: those of `required_secrets` that are unset.
    unset_secrets: Callable[[S], list[str]] | None = None
    # The flags it adds to `roost init` (its questions and checks are its runtime's `setup`).
    init_flags: tuple[InitFlag, ...] = ()

    def of(self, platforms: Mapping[str, Any]) -> S:
        """This platform's settings out of `Settings.platforms`."""
        found: S = platforms[self.name]
        return found

    def missing_secrets(self, settings: S) -> list[str]:
        if self.unset_secrets is not None:
            return self.unset_secrets(settings)
        return [self.secrets[key] for key in self.required_secrets
                if not getattr(settings, key)]

    def is_person(self, chat_id: str) -> bool:
        return re.fullmatch(self.person, chat_id) is not None

    def is_chat(self, chat_id: str) -> bool:
        return self.is_person(chat_id) or re.fullmatch(self.group, chat_id) is not None


_INSTALLED: dict[str, Platform[Any]] = {}


def install(platforms: Iterable[Platform[Any]]) -> None:
    """Make these the platforms roost knows (channels/installed.py calls it)."""
    _INSTALLED.clear()
    _INSTALLED.update((platform.name, platform) for platform in platforms)


def installed() -> Mapping[str, Platform[Any]]:
    if not _INSTALLED:
        raise RuntimeError("no platform is installed: the entry point imports channels.installed "
                           "first")
    return _INSTALLED


def platform_of(chat_key: str) -> Platform[Any] | None:
    return installed().get(ChatKey.of(chat_key).kind)


def is_person_chat(chat_key: str) -> bool:
    """A chat with one person: a platform's own pattern, or the terminal. Groups, forum topics
    and automations are nobody's."""
    if chat_key == CONSOLE_CHAT:
        return True
    platform = platform_of(chat_key)
    return platform is not None and platform.is_person(ChatKey.of(chat_key).id)


def is_platform_chat(chat_key: str) -> bool:
    """A chat some installed platform can deliver to."""
    platform = platform_of(chat_key)
    return platform is not None and platform.is_chat(ChatKey.of(chat_key).id)


def known_kind(chat_key: str) -> bool:
    """A chat key of a platform, of the terminal or of an automation."""
    kind = ChatKey.of(chat_key).kind
    return kind in installed() or kind in (CONSOLE, AUTOMATION)


def person_chat_pattern() -> tuple[str, str]:
    """(regex, description) of a person's chat key on any platform or the terminal."""
    forms = [f"{re.escape(p.name)}:(?:{p.person})" for p in installed().values()]
    words = [p.person_forms for p in installed().values()]
    return "|".join([*forms, re.escape(CONSOLE_CHAT)]), ", ".join([*words, f"'{CONSOLE_CHAT}'"])


def chat_pattern() -> tuple[str, str]:
    """(regex, description) of any chat key a platform or the terminal can deliver to."""
    forms = [f"{re.escape(p.name)}:(?:{p.person}|{p.group})" for p in installed().values()]
    words = [p.forms for p in installed().values()]
    return "|".join([*forms, re.escape(CONSOLE_CHAT)]), ", ".join([*words, f"'{CONSOLE_CHAT}'"])
