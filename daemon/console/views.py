"""What the console's pages show, read from the store: plain values for the templates.

Synchronous (the web handlers call it through `asyncio.to_thread`). Scope is checked by the
caller with the session; a conversation outside it is answered exactly as one that does not
exist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from daemon.context.replay import stubbed_seqs
from daemon.core.conversations import Conversation, Message
from daemon.store import Store
from daemon.store.event_log import Records

PAGE = 50  # conversations a page of the list shows
MODEL_FLAG = "model"  # the chat flag `/model NAME` sets (daemon.engine.model_choice)


@dataclass(frozen=True)
class ConversationRow:
    id: str
    chat_key: str
    kind: str
    status: str
    started: str
    last_active: str
    messages: int
    folds: int
    model: str


@dataclass(frozen=True)
class AttachmentView:
    name: str
    kind: str
    note: str
    index: int


@dataclass(frozen=True)
class MessageView:
    seq: int
    role: str
    when: str
    content: str
    tool_name: str | None
    tool_calls: tuple[str, ...]
    attachments: tuple[AttachmentView, ...]
    folded: bool  # the model sees the summary instead of this message
    stubbed: bool  # the model sees a one-line stub instead of this tool result


@dataclass(frozen=True)
class RequestPoint:
    """One turn's first model call as Ollama reported it."""

    seq: int
    when: str
    prompt_tokens: int
    cached_tokens: int | None
    window: int | None
    turn_tokens: int  # every call of the turn (tool rounds, continuations)


def local_time(ts: float, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M")


def conversation_rows(store: Store, covers: Callable[[str], bool], default_model: str,
                      tz: ZoneInfo, page: int = 0) -> tuple[list[ConversationRow], bool]:
    """One page of the conversations the session covers, the most recently active first, and
    whether older ones follow. Only the page's conversations are read whole (their summaries
    live in files of their own), so a page costs the same after a year."""
    listed = sorted((c for c in store.list_conversations() if covers(c.chat_key)),
                    key=lambda c: c.last_active, reverse=True)
    shown = listed[page * PAGE:(page + 1) * PAGE]
    found = [whole for c in shown if (whole := store.get_conversation(c.id)) is not None]
    models = {key: store.chat_flags(key).get(MODEL_FLAG) or default_model
              for key in {c.chat_key for c in found}}
    rows = [ConversationRow(c.id, c.chat_key, c.kind, c.status, local_time(c.created, tz),
                            local_time(c.last_active, tz), store.message_count(c.id),
                            c.summary.fold_count, models[c.chat_key]) for c in found]
    return rows, len(listed) > (page + 1) * PAGE


def message_views(messages: Sequence[Message], conversation: Conversation,
                  tz: ZoneInfo) -> list[MessageView]:
    through = conversation.summary.through_seq
    stubs = stubbed_seqs(messages, conversation.summary)
    return [MessageView(
        m.seq, m.role, local_time(m.created, tz), m.content, m.tool_name,
        tuple(_call_line(c) for c in m.tool_calls),
        tuple(AttachmentView(str(a.get("name") or a.get("kind", "file")), str(a.get("kind", "")),
                             str(a.get("note") or a.get("detail") or ""), i)
              for i, a in enumerate(m.attachments)),
        folded=0 < m.seq <= through, stubbed=m.seq in stubs) for m in messages]


def request_points(messages: Sequence[Message], tz: ZoneInfo) -> list[RequestPoint]:
    """The requests of a conversation's turns, from what each reply recorded of Ollama's
    answer (a reply stored before these counts existed has none and is left out)."""
    points = []
    for m in messages:
        meta: Mapping[str, Any] = m.meta
        if m.role != "assistant" or not meta.get("prompt_eval_count"):
            continue
        points.append(RequestPoint(m.seq, local_time(m.created, tz),
                                   int(meta["prompt_eval_count"]),
                                   meta.get("prompt_eval_cached_count"), meta.get("num_ctx"),
                                   int(meta.get("prompt_tokens") or meta["prompt_eval_count"])))
    return points


def _call_line(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    return f"{function.get('name', '?')}({function.get('arguments', {})})"


EVENT_DAYS = 31  # days of the event log a conversation page reads, newest first


def conversation_events(records: Records, conversation: Conversation) -> list[str]:
    """What roost noted about this conversation in its daily event log (folds, overflow
    retries, silent cuts, compactions, safety-net passes), oldest first, from the days it was
    active (at most the last EVENT_DAYS of them)."""
    first = datetime.fromtimestamp(conversation.created, records.tz).date()
    last = datetime.fromtimestamp(conversation.last_active, records.tz).date()
    days = [last - timedelta(days=n) for n in range(min((last - first).days + 1, EVENT_DAYS))]
    marker = f"`{conversation.id}`"
    return [line.removeprefix("- ").replace(f" {marker}", "")
            for day in reversed(days) for line in records.events(day.isoformat())
            if marker in line]
