"""Whose conversations a conversation's recall tools may read.

Each person's data is theirs: `memory_search`, `memory_get`, `conversation_read` and
`file_read` see only the conversations (and their attachments) that `recall_scope` names, and
answer anything else exactly as they answer what does not exist.

* A person's (or a group's) conversation recalls the conversations of that person's chats.
  Without a linked identity that is the one chat key (`telegram:<id>`, `whatsapp:<wa_id>`,
  `console:local`); a group, and each forum topic, is a chat of its own. `person_chats` is the
  one place a link of names (`[people]` or `[identities]`: one person on several channels)
  widens it.
* The facts roost keeps (`person_of`) are a person's: the chats of an identity share them, a
  group has none, and an automation's run uses those of the person it reports to.
* An automation's run recalls its single owner's chats, when it has one: exactly one target in
  `deliver` besides `log` (a person or a group, who gets every report anyway; `person:NAME` is
  that person, named by the first of their chats). It does not recall its earlier runs: those
  may hold what an earlier owner's chats said (`deliver` can be changed), so a run sees its own
  conversation and nothing else of the automation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from daemon.core.config import AutomationSettings, Settings, target_person
from daemon.core.conversations import Conversation
from daemon.core.platforms import AUTOMATION_PREFIX, is_person_chat
from daemon.store.facts import Person

Identities = Mapping[str, tuple[str, ...]]
NO_IDENTITIES: Identities = MappingProxyType({})


@dataclass(frozen=True)
class RecallScope:
    """The chats whose conversations may be recalled, and single conversations besides."""

    chat_keys: frozenset[str]
    conversation_ids: frozenset[str] = frozenset()

    def covers(self, conversation: Conversation) -> bool:
        return (conversation.chat_key in self.chat_keys
                or conversation.id in self.conversation_ids)


def person_chats(chat_key: str, identities: Identities = NO_IDENTITIES) -> frozenset[str]:
    """Every chat of the person (or group) that `chat_key` belongs to: its own, and the other
    chats of its name when `[people]` or `[identities]` links it to some."""
    for chats in identities.values():
        if chat_key in chats:
            return frozenset(chats)
    return frozenset({chat_key})


def person_of(chat_key: str, settings: Settings) -> Person | None:
    """Whose facts a conversation of `chat_key` uses: the person of a private chat (with the
    chats of their identity), the person an automation reports to, None for a group (and an
    automation that reports to a group, to several chats or to none)."""
    if chat_key.startswith(AUTOMATION_PREFIX):
        owner = automation_owner(chat_key.removeprefix(AUTOMATION_PREFIX), settings.automations,
                                 settings.linked)
        return person_of(owner, settings) if owner else None
    if not is_person_chat(chat_key):
        return None
    for name, chats in settings.linked.items():
        if chat_key in chats:
            return Person(name, chats)
    return Person(chat_key, (chat_key,))


def people_with_facts(stems: Sequence[str], settings: Settings) -> list[Person]:
    """Every identity, then the person of each other facts file (FactsBook.people's names:
    `telegram_1111111` is the chat `telegram:1111111`) not linked to an identity."""
    people = [Person(n, chats) for n, chats in settings.linked.items()]
    linked = {chat for person in people for chat in person.chats}
    for stem in stems:
        if stem.startswith("identity_"):
            continue
        kind, _, rest = stem.partition("_")
        chat = f"{kind}:{rest}"
        if chat not in linked and (person := named_person(chat, settings)) is not None:
            people.append(person)
    return people


def named_person(name: str, settings: Settings) -> Person | None:
    """The person `roost memory --person NAME` means: an identity's name or a person's chat."""
    if name in settings.linked:
        return Person(name, settings.linked[name])
    return person_of(name, settings) if ":" in name and not name.startswith(
        AUTOMATION_PREFIX) else None


def automation_owner(name: str, automations: Sequence[AutomationSettings],
                     linked: Identities = NO_IDENTITIES) -> str | None:
    """The one chat an automation reports to, or None (several, none, only `log`, or an
    automation no longer configured). For `person:NAME` it is the first of their chats in
    `linked` (`Settings.linked`), which stands for them all."""
    for automation in automations:
        if automation.name == name:
            targets = {t for t in automation.deliver if t != "log"}
            if len(targets) == 1:
                (target,) = targets
                if (person := target_person(target)) is not None:
                    return next(iter(linked.get(person, ())), None)
                return None if target.startswith(AUTOMATION_PREFIX) else target
            return None
    return None


def recall_scope(conversation: Conversation, automations: Sequence[AutomationSettings],
                 identities: Identities = NO_IDENTITIES) -> RecallScope:
    """What `conversation`'s tools may recall; see the module docstring."""
    own = frozenset({conversation.id})
    if conversation.chat_key.startswith(AUTOMATION_PREFIX):
        owner = automation_owner(conversation.chat_key.removeprefix(AUTOMATION_PREFIX),
                                 automations, identities)
        return RecallScope(person_chats(owner, identities) if owner else frozenset(), own)
    return RecallScope(person_chats(conversation.chat_key, identities), own)
