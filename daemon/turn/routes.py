"""Which Ollama host a conversation's calls go to: its route in the pool (daemon/llm/pool.py),
the same for its turns and its folds.

A chat's conversation is its own route (a new conversation after a rotation is a new route);
its fold count is the route's `fold`, so that a conversation a failure moved goes back to its
host only once a fold changed its prompt. An automation's runs share one route, its chat key
(`automation:NAME`), so its byte-stable prefix keeps hitting one host's cache; each run is a
fresh conversation (a rotation), so the run's start is its `fold`. The hint is the host of the
conversation's last reply (its meta `host`): after a restart, the route goes back there.
"""

from __future__ import annotations

from collections.abc import Sequence

from daemon.core.conversations import Conversation, Message
from daemon.core.platforms import automation_name
from daemon.llm.pool import Route


def route_of(conversation: Conversation, history: Sequence[Message]) -> Route:
    """The route of `conversation`'s calls, from it and its messages."""
    hint = next((str(m.meta["host"]) for m in reversed(history)
                 if m.role == "assistant" and m.meta.get("host")), None)
    if automation_name(conversation.chat_key) is not None:
        return Route(conversation.chat_key, int(conversation.created), hint)
    return Route(conversation.id, conversation.summary.fold_count, hint)
