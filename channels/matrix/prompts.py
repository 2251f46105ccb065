"""Approval questions in Matrix rooms, and their answers typed or reacted.

Matrix has no buttons a bot can offer everywhere, so a question (an Outbound with buttons,
`daemon.core.approval`) goes out as text with one line saying how to answer: reply "yes",
"always" or "no", or react 👍 or 👎 to the question. The channel remembers the question's event
(in this process only: after a restart the question is asked again, as on every platform) and
the door hands an answer to the approver before anything is stored: a reaction to the
question, a reply to it, or a bare "yes"/"no" in the chat while its question waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.core.approval import Button, Choice, parse


@dataclass(frozen=True)
class Question:
    approval_id: str
    chat_key: str
    event_id: str


def hint(buttons: tuple[Button, ...]) -> str:
    """How to answer, for the line under the question."""
    choices = {parsed[1] for b in buttons if (parsed := parse(b.id)) is not None}
    words = "yes, always or no" if Choice.ALWAYS in choices else "yes or no"
    return f"Reply {words} to this message, or react 👍 or 👎."


def approval_of(buttons: tuple[Button, ...]) -> str | None:
    return next((parsed[0] for b in buttons if (parsed := parse(b.id)) is not None), None)


class Questions:
    """The questions sent in this process: by event, and the newest per chat."""

    def __init__(self) -> None:
        self._by_event: dict[str, Question] = {}
        self._by_chat: dict[str, Question] = {}

    def asked(self, question: Question) -> None:
        self._by_event[question.event_id] = question
        self._by_chat[question.chat_key] = question

    def about(self, event_id: str | None) -> Question | None:
        return self._by_event.get(event_id) if event_id else None

    def waiting_in(self, chat_key: str) -> Question | None:
        return self._by_chat.get(chat_key)

    def settled(self, question: Question) -> None:
        self._by_event.pop(question.event_id, None)
        if self._by_chat.get(question.chat_key) == question:
            del self._by_chat[question.chat_key]
