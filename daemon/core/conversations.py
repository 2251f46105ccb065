"""Conversation and message records.

Records are plain frozen dataclasses with `to_doc()` / `from_doc()` so the store can keep them as
JSON. Which conversation a chat's next message belongs to is the router's (daemon/turn/router.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from daemon.core.ids import new_id
from daemon.core.platforms import ChatKey, known_kind

Role = Literal["system", "user", "assistant", "tool"]
Kind = str  # a platform's name (daemon/core/platforms.py), "console" or "automation"
Status = Literal["active", "archived"]


def kind_of(chat_key: str) -> Kind:
    """The channel kind of a chat key such as `telegram:1111111` or `console:local`."""
    if not known_kind(chat_key):
        raise ValueError(f"unknown chat key kind: {chat_key!r}")
    return ChatKey.of(chat_key).kind


@dataclass(frozen=True)
class Message:
    """One message of a conversation, stored byte for byte and never rewritten."""

    id: str
    seq: int
    role: Role
    content: str
    created: float
    channel_message_ids: tuple[str, ...] = ()
    attachments: tuple[Mapping[str, Any], ...] = ()
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    tool_name: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["channel_message_ids"] = list(self.channel_message_ids)
        doc["attachments"] = [dict(a) for a in self.attachments]
        doc["tool_calls"] = [dict(c) for c in self.tool_calls]
        doc["meta"] = dict(self.meta)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Message:
        return cls(
            id=doc["id"],
            seq=doc["seq"],
            role=doc["role"],
            content=doc["content"],
            created=doc["created"],
            channel_message_ids=tuple(doc.get("channel_message_ids", ())),
            attachments=tuple(doc.get("attachments", ())),
            tool_calls=tuple(doc.get("tool_calls", ())),
            tool_name=doc.get("tool_name"),
            meta=doc.get("meta", {}),
        )


@dataclass(frozen=True)
class SummaryState:
    """The rolling summary of a conversation's folded history (filled in by the fold)."""

    summary: str = ""
    user_notes: str = ""
    through_seq: int = 0
    through_id: str | None = None
    fold_count: int = 0
    folded_at: float | None = None
    first_folded_at: float | None = None  # when it was first made (the day's memory map)

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SummaryState:
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)


@dataclass(frozen=True)
class Conversation:
    """A conversation: one chat's messages between two rotations."""

    id: str
    chat_key: str
    kind: Kind
    created: float
    last_active: float
    status: Status = "active"
    token_ratio: float = 1.0
    summary: SummaryState = field(default_factory=SummaryState)
    archived_reason: str | None = None  # "idle" or "new" (the /new command)
    after_idle: bool = False  # started because the chat's previous conversation went idle
    active_tools: tuple[str, ...] = ()  # capabilities loaded with tool_activate
    # Messages replayed as their handle (daemon/context/handles.py): Ollama refused a request
    # that carried them whole, so they cost more than their estimate.
    handled: tuple[int, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["summary"] = self.summary.to_doc()
        doc["active_tools"] = list(self.active_tools)
        doc["handled"] = list(self.handled)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Conversation:
        return cls(
            id=doc["id"],
            chat_key=doc["chat_key"],
            kind=doc["kind"],
            created=doc["created"],
            last_active=doc["last_active"],
            status=doc.get("status", "active"),
            token_ratio=doc.get("token_ratio", 1.0),
            summary=SummaryState.from_doc(doc.get("summary", {})),
            archived_reason=doc.get("archived_reason"),
            after_idle=doc.get("after_idle", False),
            active_tools=tuple(doc.get("active_tools", ())),
            handled=tuple(doc.get("handled", ())),
        )

    @classmethod
    def start(
        cls, chat_key: str, now: float, *, after_idle: bool = False, token_ratio: float = 1.0
    ) -> Conversation:
        return cls(id=new_id(now), chat_key=chat_key, kind=kind_of(chat_key), created=now,
                   last_active=now, after_idle=after_idle, token_ratio=token_ratio)

    def touched(self, now: float) -> Conversation:
        return replace(self, last_active=now)

    def archived(self, reason: str) -> Conversation:
        return replace(self, status="archived", archived_reason=reason)

    def is_idle(self, now: float, idle_rotation: float) -> bool:
        return now - self.last_active >= idle_rotation
