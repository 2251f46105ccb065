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

from daemon.console.chart import Bar
from daemon.console.names import ChatName, name_of
from daemon.context.replay import stubbed_seqs
from daemon.core.conversations import Conversation, Message
from daemon.core.messages import TEMPLATE_FLAG
from daemon.store import Store
from daemon.store.event_log import Records

PAGE = 50  # conversations a page of the list shows
MODEL_FLAG = "model"  # the chat flag `/model NAME` sets (daemon.engine.model_choice)


@dataclass(frozen=True)
class ConversationRow:
    id: str
    chat: ChatName
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
    shown_as: str  # "image" (a thumbnail), "audio" (a player) or "file" (a link)
    width: int | None = None  # an image's, so the page does not jump as it loads
    height: int | None = None


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
    first_whole: bool = False  # the fold line: the first message the model sees whole
    held: str = ""  # why this reply waits to be delivered, in words ("": it does not)


@dataclass(frozen=True)
class RequestPoint:
    """One turn's first model call: what roost estimated, what Ollama counted, and what
    happened to it on the way."""

    number: int  # the conversation's request number, from 1
    seq: int  # the reply's message
    when: str
    prompt_tokens: int  # as Ollama counted it
    cached_tokens: int | None
    window: int | None
    turn_tokens: int  # every call of the turn (tool rounds, continuations)
    estimate: int | None = None  # roost's, before sending (older replies kept none)
    budget: int | None = None
    folds: int | None = None  # folds of the conversation when it was built
    refused: int = 0
    cut: int = 0
    redone: bool = False

    @property
    def retried(self) -> bool:
        return bool(self.refused or self.cut)

    @property
    def happened(self) -> str:
        """What happened to the request, in words."""
        said = []
        if self.refused:
            times = "once" if self.refused == 1 else f"{self.refused} times"
            said.append(f"refused as too large {times}, made smaller and sent again")
        if self.cut:
            said.append("cut by Ollama without saying so: the answer was discarded and the "
                        "request sent again, smaller")
        elif self.redone:
            said.append("the answer shown while it was written was replaced")
        return "; ".join(said).capitalize() + "." if said else "Sent once, whole."

    @property
    def error(self) -> str:
        """roost's estimate against Ollama's count, signed ("+3%": it counted more)."""
        if not self.estimate:
            return ""
        return f"{(self.prompt_tokens - self.estimate) / self.estimate:+.0%}"


@dataclass(frozen=True)
class Neighbours:
    """The chat's conversations before and after this one (rotations)."""

    before: str | None
    after: str | None


def local_time(ts: float, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M")


def conversation_rows(store: Store, covers: Callable[[str], bool], default_model: str,
                      tz: ZoneInfo, page: int = 0, names: Mapping[str, str] | None = None
                      ) -> tuple[list[ConversationRow], bool]:
    """One page of the conversations the session covers, the most recently active first, and
    whether older ones follow. Only the page's conversations are read whole (their summaries
    live in files of their own), so a page costs the same after a year."""
    listed = sorted((c for c in store.list_conversations() if covers(c.chat_key)),
                    key=lambda c: c.last_active, reverse=True)
    shown = listed[page * PAGE:(page + 1) * PAGE]
    found = [whole for c in shown if (whole := store.get_conversation(c.id)) is not None]
    models = {key: store.chat_flags(key).get(MODEL_FLAG) or default_model
              for key in {c.chat_key for c in found}}
    rows = [ConversationRow(c.id, name_of(c.chat_key, names or {}), c.kind, c.status,
                            local_time(c.created, tz), local_time(c.last_active, tz),
                            store.message_count(c.id), c.summary.fold_count,
                            models[c.chat_key]) for c in found]
    return rows, len(listed) > (page + 1) * PAGE


def message_views(messages: Sequence[Message], conversation: Conversation, tz: ZoneInfo,
                  start: int = 0, end: int | None = None,
                  deliveries: Sequence[Mapping[str, Any]] = (),
                  held: Mapping[str, str] | None = None) -> list[MessageView]:
    """The messages `start:end` of the whole conversation `messages` (the stubs and the fold
    line are judged over all of them), each with the voice notes sent for it (`deliveries`)
    and why it waits, if it does (`held`, by message id)."""
    through = conversation.summary.through_seq
    stubs = stubbed_seqs(messages, conversation.summary)
    fold_seq = next((m.seq for m in messages if m.seq > through), None) if through else None
    return [MessageView(
        m.seq, m.role, local_time(m.created, tz), m.content, m.tool_name,
        tuple(_call_line(c) for c in m.tool_calls),
        tuple(attachment_view(a, i) for i, a in enumerate(files_of(m, deliveries))),
        folded=0 < m.seq <= through, stubbed=m.seq in stubs, first_whole=m.seq == fold_seq,
        held=(held or {}).get(m.id, ""))
        for m in messages[start:end]]


def files_of(message: Message, deliveries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A message's files as the console numbers them: what came with it, then the voice notes
    roost sent for it."""
    sent = {str(d.get("path")): d for d in deliveries
            if d.get("message_id") == message.id and d.get("kind") == "voice"}
    return [*message.attachments, *sent.values()]


@dataclass(frozen=True)
class Held:
    """Replies to this chat that wait for the person to write again (the platform takes them
    only then): by the message they answer, and the rest (an automation's report, a reminder)
    for the chat's active conversation to show."""

    by_message: Mapping[str, str]
    waiting: tuple[str, ...] = ()


def held_of(store: Store, conversation: Conversation, tz: ZoneInfo) -> Held:
    pending = [d for d in store.outbox_pending(conversation.chat_key) if d.get("held")]
    if not pending:
        return Held({})
    return held_replies(pending, conversation,
                        store.chat_flags(conversation.chat_key).get(TEMPLATE_FLAG), tz)


def held_replies(pending: Sequence[Mapping[str, Any]], conversation: Conversation,
                 invitation: Mapping[str, Any] | None, tz: ZoneInfo) -> Held:
    """Why each held item waits, in words, with the invitation sent to ask the person to
    write, when one was."""
    asked = ""
    if invitation and isinstance(invitation.get("last"), int | float):
        count = invitation.get("count") or 1
        asked = (f" A template message asking them to write was sent "
                 f"{local_time(invitation['last'], tz)} ({count} so far).")
    ours = {str(d["message_id"]): d for d in pending
            if d.get("message_id") and d.get("conversation_id") == conversation.id}
    others = [d for d in pending if d not in ours.values()]
    return Held(
        {key: f"Not delivered yet: {d['held']}. It goes out when the person writes "
              f"again.{asked}" for key, d in ours.items()},
        tuple(f"{local_time(d['created'], tz)}: \u201c{_first_words(str(d.get('text', '')))}"
              f"\u201d, not delivered yet: {d['held']}.{asked}" for d in others)
        if conversation.status == "active" else ())


def reminder_lines(pending: Sequence[Mapping[str, Any]], tz: ZoneInfo) -> list[str]:
    """A chat's pending reminders, soonest first: when, and what roost will say."""
    return [f"{local_time(d['due'], tz)}: {_first_words(str(d.get('text', '')), 200)}"
            for d in sorted(pending, key=lambda d: d["due"])]


def _first_words(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit].rstrip() + "\u2026"


# What a browser may show inline from roost's origin: re-encoded pictures and sound. Never
# HTML, SVG or anything else that runs: those are downloads (web.py's `download`).
INLINE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif",
                          "audio/ogg", "audio/opus", "audio/mpeg", "audio/mp4", "audio/aac",
                          "audio/wav", "audio/x-wav", "audio/webm", "audio/flac"})


def attachment_view(doc: Mapping[str, Any], index: int) -> AttachmentView:
    """How one stored attachment shows: a picture as a thumbnail, a voice note or other sound
    as a player, anything else as a link named by its file name."""
    kind, mime = str(doc.get("kind", "")), str(doc.get("mime", ""))
    if mime not in INLINE_TYPES:
        shown_as = "file"
    else:
        shown_as = "image" if mime.startswith("image/") else "audio"
    default = {"image": "picture", "voice": "voice note"}.get(kind, kind or "file")
    seconds = doc.get("seconds")
    said = f"{seconds:.0f} s" if isinstance(seconds, int | float) and seconds else ""
    width, height = doc.get("width"), doc.get("height")
    return AttachmentView(
        str(doc.get("name") or default), kind,
        str(doc.get("note") or doc.get("detail") or said),
        index, shown_as, width if isinstance(width, int) else None,
        height if isinstance(height, int) else None)


def request_points(messages: Sequence[Message], tz: ZoneInfo) -> list[RequestPoint]:
    """The requests of a conversation's turns, from what each reply recorded of Ollama's
    answer and of roost's estimate (a reply stored before these existed has none and is left
    out, or shows Ollama's side only)."""
    points: list[RequestPoint] = []
    for m in messages:
        meta: Mapping[str, Any] = m.meta
        if m.role != "assistant" or not meta.get("prompt_eval_count"):
            continue
        points.append(RequestPoint(
            len(points) + 1, m.seq, local_time(m.created, tz), int(meta["prompt_eval_count"]),
            meta.get("prompt_eval_cached_count"), meta.get("num_ctx"),
            int(meta.get("prompt_tokens") or meta["prompt_eval_count"]),
            estimate=_count(meta.get("estimate")), budget=_count(meta.get("budget")),
            folds=_count(meta.get("folds")), refused=_count(meta.get("refused")) or 0,
            cut=_count(meta.get("cut")) or 0, redone=bool(meta.get("redone"))))
    return points


def chart_bars(points: Sequence[RequestPoint]) -> list[Bar]:
    return [Bar(p.prompt_tokens, p.cached_tokens, p.estimate, p.folds, p.retried)
            for p in points]


def neighbours(store: Store, conversation: Conversation) -> Neighbours:
    """The conversation of the same chat just before this one and just after it."""
    chat = sorted((c for c in store.list_conversations() if c.chat_key == conversation.chat_key),
                  key=lambda c: c.created)
    ids = [c.id for c in chat]
    at = ids.index(conversation.id) if conversation.id in ids else -1
    if at < 0:
        return Neighbours(None, None)
    return Neighbours(ids[at - 1] if at > 0 else None,
                      ids[at + 1] if at + 1 < len(ids) else None)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
