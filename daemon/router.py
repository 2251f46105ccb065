"""Which conversation a chat's next message belongs to.

A chat has at most one active conversation. One idle for `idle_rotation` is archived and the next
message starts a fresh one; the old one stays on disk and searchable.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.conversations import Conversation
from daemon.logs import turn_log as log
from daemon.store import Store


@dataclass(frozen=True)
class Routed:
    conversation: Conversation
    rotated_from: Conversation | None  # the conversation archived to make room, if any


class Router:
    """Maps chat keys to active conversations. Synchronous: call it from a worker thread."""

    def __init__(self, store: Store, idle_rotation: float) -> None:
        self.store = store
        self.idle_rotation = idle_rotation

    def conversation_for(self, chat_key: str, now: float) -> Routed:
        """The chat's active conversation, rotating it first when it has been idle too long."""
        current = self.store.active_conversation(chat_key)
        if current is not None and not current.is_idle(now, self.idle_rotation):
            return Routed(current, None)
        if current is not None:
            self.store.save_conversation(current.archived())
            log.info("conversation %s of %s archived after idle rotation", current.id, chat_key)
        return Routed(self.store.create_conversation(chat_key, now), current)

    def rotate(self, chat_key: str, now: float) -> Conversation:
        """Archive the chat's active conversation (if any) and start a new one: `/new`."""
        current = self.store.active_conversation(chat_key)
        if current is not None:
            self.store.save_conversation(current.archived())
            log.info("conversation %s of %s archived on request", current.id, chat_key)
        return self.store.create_conversation(chat_key, now)
