"""Whose conversations a conversation's recall tools may read.

Each person's data is theirs: `memory_search`, `memory_get`, `conversation_read` and
`file_read` see only the conversations (and their attachments) that `recall_scope` names, and
answer anything else exactly as they answer what does not exist.

* A person's (or a group's) conversation recalls the conversations of that person's chats.
  Without a linked identity that is the one chat key (`telegram:<id>`, `whatsapp:<wa_id>`,
  `console:local`); a group, and each forum topic, is a chat of its own. `person_chats` is the
  one place a link of identities (one person on several channels) widens it.
* An automation's run recalls its single owner's chats, when it has one: exactly one target in
  `deliver` besides `log` (a person or a group, who gets every report anyway). It does not
  recall its earlier runs: those may hold what an earlier owner's chats said (`deliver` can be
  changed), so a run sees its own conversation and nothing else of the automation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from daemon.core.config import AutomationSettings
from daemon.core.conversations import Conversation

AUTOMATION_PREFIX = "automation:"


@dataclass(frozen=True)
class RecallScope:
    """The chats whose conversations may be recalled, and single conversations besides."""

    chat_keys: frozenset[str]
    conversation_ids: frozenset[str] = frozenset()

    def covers(self, conversation: Conversation) -> bool:
        return (conversation.chat_key in self.chat_keys
                or conversation.id in self.conversation_ids)


def person_chats(chat_key: str) -> frozenset[str]:
    """Every chat of the person (or group) that `chat_key` belongs to: today its own. This is
    where a link of identities across channels will add the person's other chat keys."""
    return frozenset({chat_key})


def automation_owner(name: str, automations: Sequence[AutomationSettings]) -> str | None:
    """The one chat an automation reports to, or None (several, none, only `log`, or an
    automation no longer configured)."""
    for automation in automations:
        if automation.name == name:
            targets = {t for t in automation.deliver if t != "log"}
            if len(targets) == 1:
                (target,) = targets
                return None if target.startswith(AUTOMATION_PREFIX) else target
            return None
    return None


def recall_scope(conversation: Conversation,
                 automations: Sequence[AutomationSettings]) -> RecallScope:
    """What `conversation`'s tools may recall; see the module docstring."""
    own = frozenset({conversation.id})
    if conversation.chat_key.startswith(AUTOMATION_PREFIX):
        owner = automation_owner(conversation.chat_key.removeprefix(AUTOMATION_PREFIX),
                                 automations)
        return RecallScope(person_chats(owner) if owner else frozenset(), own)
    return RecallScope(person_chats(conversation.chat_key), own)
