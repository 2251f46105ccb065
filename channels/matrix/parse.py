"""Matrix events -> what roost handles: chat keys, who is addressed, the text the model reads.

Pure functions over raw event dicts (the JSON of the client-server API, decrypted when the room
is encrypted): no clock, store or network. The door (`channels.matrix.channel`) reads each event
with `read_event`; the intake's worker builds the `Inbound` with `message_text` and
`context_lines` (and channels/wording.py's `edit_text`, the same words on every platform).

Chat keys: a person's own chat (a room whose only other member is that person) is
`matrix:@alice:example.org`, so the person keeps one conversation whichever of their direct
rooms they write from; any other room is a group, `matrix:!roomid:example.org`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from channels.wording import reply_line
from daemon.core.approval import Choice

CHAT_PREFIX = "matrix:"
VOICE_FLAG = "org.matrix.msc3245.voice"  # MSC3245: an m.audio recorded as a voice message
MEDIA_TYPES = ("m.image", "m.file", "m.audio", "m.video")
TEXT_TYPES = ("m.text", "m.notice", "m.emote")

# Typed answers to an approval question, and reactions to it.
_TYPED = {"yes": Choice.ONCE, "y": Choice.ONCE, "allow": Choice.ONCE, "ok": Choice.ONCE,
          "always": Choice.ALWAYS, "a": Choice.ALWAYS,
          "no": Choice.DENY, "n": Choice.DENY, "deny": Choice.DENY}
_REACTED = {"👍": Choice.ONCE, "✅": Choice.ONCE, "👎": Choice.DENY, "❌": Choice.DENY}
_USER_ID = re.compile(r"@[^:\s]+:\S+")


@dataclass(frozen=True)
class Incoming:
    """What roost needs of one timeline event."""

    kind: str  # "message", "edit", "redaction", "reaction", "undecryptable"
    event_id: str
    sender: str
    content: Mapping[str, Any] = field(default_factory=dict)  # the new content of an edit
    target: str | None = None  # the event an edit, reaction or redaction is about
    reply_to: str | None = None  # m.in_reply_to

    @property
    def msgtype(self) -> str:
        value = self.content.get("msgtype")
        return value if isinstance(value, str) else ""

    @property
    def body(self) -> str:
        value = self.content.get("body")
        return value if isinstance(value, str) else ""


def person_key(user_id: str) -> str:
    return f"{CHAT_PREFIX}{user_id}"


def room_key(room_id: str) -> str:
    return f"{CHAT_PREFIX}{room_id}"


def is_user_id(text: str) -> bool:
    return _USER_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class Address:
    """Where a chat key points: a person (their direct room is looked up) or a room."""

    user: str | None = None
    room: str | None = None


def address_of(key: str) -> Address:
    """`matrix:@alice:example.org` -> the person; `matrix:!abc:example.org` -> the room."""
    rest = key.removeprefix(CHAT_PREFIX)
    if key.startswith(CHAT_PREFIX) and is_user_id(rest):
        return Address(user=rest)
    # Room ids of room version 12 have no server part ("!opaque"); older ones do.
    if key.startswith(CHAT_PREFIX) and rest.startswith("!") and len(rest) > 1:
        return Address(room=rest)
    raise ValueError(f"not a Matrix chat key: {key!r}")


def direct_partner(members: Collection[str], bot: str) -> str | None:
    """The person a room is the direct chat with: the one member besides the bot (joined or
    invited), None for a room of more (or fewer) people."""
    others = {m for m in members if m != bot}
    return next(iter(others)) if len(others) == 1 and bot in members else None


def read_event(event: Mapping[str, Any]) -> Incoming | None:
    """The event as roost reads it; None for kinds roost does not handle (state, calls...)."""
    event_id, sender = event.get("event_id"), event.get("sender")
    content = event.get("content")
    if not isinstance(event_id, str) or not isinstance(sender, str) \
            or not isinstance(content, Mapping):
        return None
    kind = event.get("type")
    relates = content.get("m.relates_to")
    relates = relates if isinstance(relates, Mapping) else {}
    target = relates.get("event_id") if isinstance(relates.get("event_id"), str) else None
    if kind == "m.room.encrypted":
        return Incoming("undecryptable", event_id, sender)
    if kind == "m.room.redaction":
        redacts = event.get("redacts") or content.get("redacts")
        return Incoming("redaction", event_id, sender,
                        target=redacts if isinstance(redacts, str) else None)
    if kind == "m.reaction":
        if relates.get("rel_type") != "m.annotation" or target is None:
            return None
        return Incoming("reaction", event_id, sender, content=relates, target=target)
    if kind != "m.room.message":
        return None
    if relates.get("rel_type") == "m.replace" and target is not None:
        new = content.get("m.new_content")
        return Incoming("edit", event_id, sender,
                        content=new if isinstance(new, Mapping) else content, target=target)
    reply = relates.get("m.in_reply_to")
    reply_to = reply.get("event_id") if isinstance(reply, Mapping) else None
    return Incoming("message", event_id, sender, content=content,
                    reply_to=reply_to if isinstance(reply_to, str) else None)


def addressed(content: Mapping[str, Any], bot: str, name: str, replied_to_bot: bool) -> bool:
    """In a group: the bot is mentioned (`m.mentions`, a pill, its id or display name in the
    text) or the message replies to one of the bot's."""
    if replied_to_bot:
        return True
    mentions = content.get("m.mentions")
    if isinstance(mentions, Mapping) and bot in (mentions.get("user_ids") or ()):
        return True
    formatted = content.get("formatted_body")
    if isinstance(formatted, str) and f"matrix.to/#/{bot}" in formatted:
        return True
    body = content.get("body")
    return isinstance(body, str) and _mention(bot, name).search(_without_fallback(body)) \
        is not None


def message_text(content: Mapping[str, Any], bot: str, name: str) -> str:
    """What the user wrote: the body without a reply's quoted fallback and without the bot's
    mention (which only addressed it: "roost: /new" is the command /new)."""
    body = content.get("body")
    if not isinstance(body, str):
        return ""
    text = _without_fallback(body)
    text = _mention(bot, name).sub("", text, count=1) if _leading(bot, name).match(text) \
        else text
    return text.lstrip(" :,").strip()


def context_lines(*, group: bool, sender: str, sender_name: str,
                  reply_author: str | None, reply_text: str | None) -> list[str]:
    """What the model needs besides the words: in a group who is speaking, and what a reply
    answers (clipped). Fixed wording, a function of the message alone (it is stored)."""
    lines: list[str] = []
    if group:
        lines.append(f"[From {sender_name} ({sender})]" if sender_name and sender_name != sender
                     else f"[From {sender}]")
    if reply_author is not None:
        lines.append(reply_line(reply_author, reply_text or ""))
    return lines






def fallback_author(body: str) -> str | None:
    """The user id a reply's quoted fallback names (`> <@bob:example.org> ...`), if any."""
    match = re.match(r"> <(@[^>\s]+)>", body)
    return match.group(1) if match else None


def typed_choice(text: str) -> Choice | None:
    """A typed answer to an approval question ("yes", "always", "no"...), else None."""
    return _TYPED.get(text.strip().strip(".!").lower())


def reaction_choice(key: str) -> Choice | None:
    """A reaction as an answer to an approval question: 👍 allows once, 👎 denies."""
    return _REACTED.get(key.replace("\ufe0f", "").strip())


def is_voice(content: Mapping[str, Any]) -> bool:
    """An m.audio recorded with the client's voice button (MSC3245), not a file of sound."""
    return content.get("msgtype") == "m.audio" and VOICE_FLAG in content


def _without_fallback(body: str) -> str:
    """A reply's body without the quoted lines clients put before it (`> <@bob:...> ...`)."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> <"):
        return body
    index = 0
    while index < len(lines) and lines[index].startswith(">"):
        index += 1
    return "\n".join(lines[index:]).lstrip("\n")


def _mention(bot: str, name: str) -> re.Pattern[str]:
    names = [re.escape(bot)] + ([re.escape(name)] if name else [])
    return re.compile(rf"(?<![\w@])(?:{'|'.join(names)})(?![\w])", re.IGNORECASE)


def _leading(bot: str, name: str) -> re.Pattern[str]:
    names = [re.escape(bot)] + ([re.escape(name)] if name else [])
    return re.compile(rf"\s*(?:{'|'.join(names)})(?![\w])", re.IGNORECASE)

