"""What the model sees of a conversation: the prefix, then as much recent history as fits.

Originals are never touched: this builds a new list of chat messages from the stored ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from daemon.context.budget import estimate_messages
from daemon.conversations import Message

ChatMessage = dict[str, str]


class DoesNotFit(ValueError):
    """The messages that must be sent are larger than the budget on their own."""

    def __init__(self, needed: int, budget: int) -> None:
        self.needed = needed
        self.budget = budget
        super().__init__(f"the newest messages need {needed} tokens; the budget is {budget}")


@dataclass(frozen=True)
class Request:
    """Chat messages ready for Ollama, with what the fit cost."""

    messages: list[ChatMessage]
    estimated_tokens: int
    omitted: int


def as_chat(message: Message) -> ChatMessage:
    return {"role": message.role, "content": message.content}


def build_request(
    prefix: str, history: Sequence[Message], budget: int, ratio: float = 1.0
) -> Request:
    """The prefix and the newest whole messages of `history` that fit in `budget` tokens.

    The messages after the last assistant reply (this turn's user messages) are always kept;
    older ones are dropped oldest first, and the kept history starts on a user message.
    """
    system = {"role": "system", "content": prefix}
    chat = [as_chat(m) for m in history]
    last_reply = max((i for i, m in enumerate(chat) if m["role"] == "assistant"), default=-1)
    protected = chat[last_reply + 1:]
    needed = estimate_messages([system, *protected], ratio)
    if needed > budget:
        raise DoesNotFit(needed, budget)
    start = last_reply + 1
    used = needed
    # Walk back over older messages while they fit.
    while start > 0:
        cost = estimate_messages([chat[start - 1]], ratio)
        if used + cost > budget:
            break
        start -= 1
        used += cost
    while start < len(chat) and chat[start]["role"] != "user":
        used -= estimate_messages([chat[start]], ratio)
        start += 1
    kept = chat[start:]
    return Request(messages=[system, *kept], estimated_tokens=used, omitted=start)
