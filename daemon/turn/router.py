"""Which conversation a chat's next message belongs to, and idle rotation.

A chat has at most one active conversation. One idle for `idle_rotation` is archived (by the
engine's timer, or at the latest when the next message arrives) and the next message starts a
fresh one, marked `after_idle` so its first reply can say so; the old one stays searchable.
"""

from __future__ import annotations

from collections.abc import Callable

from daemon.core.conversations import Conversation
from daemon.core.logs import turn_log as log
from daemon.store import Store


class Router:
    """Maps chat keys to active conversations. Synchronous: call it from a worker thread."""

    def __init__(self, store: Store, idle_rotation: float,
                 start_ratio: Callable[[str], float] = lambda chat_key: 1.0) -> None:
        """`start_ratio` is a chat's first token ratio (from its model's card: what roost's
        estimate was off by there), used until Ollama's counts calibrate the chat."""
        self.store = store
        self.idle_rotation = idle_rotation
        self.start_ratio = start_ratio

    def conversation_for(self, chat_key: str, now: float) -> Conversation:
        """The chat's active conversation, rotating it first when it has been idle too long."""
        current = self.store.active_conversation(chat_key)
        if current is not None and not current.is_idle(now, self.idle_rotation):
            return current
        if current is not None:
            self._archive(current, "idle")
        return self._start(chat_key, now)

    def rotate(self, chat_key: str, now: float) -> Conversation:
        """Archive the chat's active conversation (if any) and start a new one: `/new`."""
        current = self.store.active_conversation(chat_key)
        if current is not None:
            self._archive(current, "new")
        return self._start(chat_key, now)

    def _start(self, chat_key: str, now: float) -> Conversation:
        """A new conversation, marked when its predecessor went idle. It starts from the
        previous conversation's token ratio: same model, same tokenizer, so the first request
        is estimated as well as the last one was; a chat's first from its model's card."""
        last = self.store.newest_conversation(chat_key)
        return self.store.create_conversation(
            chat_key, now,
            after_idle=last is not None and last.archived_reason == "idle",
            token_ratio=last.token_ratio if last is not None else self.start_ratio(chat_key),
        )

    def rotate_idle(self, now: float, busy: set[str]) -> list[Conversation]:
        """Archive every active conversation idle for `idle_rotation` (the timer's sweep).

        Chats in `busy` (a turn running or messages waiting) are left alone. Automation
        conversations rotate too, but their runs never make a chat's conversation active.
        """
        archived = []
        for conversation in self.store.list_conversations(status="active"):
            if conversation.chat_key in busy or not conversation.is_idle(now, self.idle_rotation):
                continue
            self._archive(conversation, "idle")
            archived.append(conversation)
        return archived

    def _archive(self, conversation: Conversation, reason: str) -> None:
        self.store.save_conversation(conversation.archived(reason))
        log.info("conversation %s of %s archived (%s)", conversation.id, conversation.chat_key,
                 "idle" if reason == "idle" else "on request")
