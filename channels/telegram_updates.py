"""Telegram updates -> what roost handles: parsing, the gate, and the text of an `Inbound`.

Pure functions over python-telegram-bot's objects: no clock, store or network. The intake
(`channels.telegram_intake`) runs them in its worker, in this order: `parse_update` (an update
PTB cannot read is quarantined), `admit` before any handling (who may talk, and whether a group
message is meant for the bot), then `message_text`/`edit_text` to build what the model reads.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from telegram import Message, Update
from telegram.constants import ChatType

MAX_DEPTH = 40  # JSON nesting roost accepts in an update (real ones nest about ten levels)
# The update kinds roost handles, given to setWebhook / getUpdates as `allowed_updates`.
UPDATE_KINDS = ("message", "edited_message")
CHAT_PREFIX = "telegram:"

# Fields that hold a User object. Telegram has sent `is_bot` on every user since Bot API 3.0 and
# PTB 22 refuses a user without it; older recorded updates (the fixtures in tests/fixtures) lack it.
_USER_FIELDS = frozenset({"from", "forward_from", "via_bot", "user", "left_chat_member",
                          "new_chat_members", "sender_business_bot"})
_GROUPS = (ChatType.GROUP, ChatType.SUPERGROUP)  # a tuple: `in` compares, so a plain str works
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the alphabet of daemon.conversations.new_id


class NotAnUpdate(ValueError):
    """A webhook body (or a stored payload) that is valid JSON but not a Telegram Update."""


@dataclass(frozen=True)
class BotIdentity:
    """Who the bot is (from getMe at start): to notice mentions and replies in groups."""

    id: int
    username: str


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one message; `reason` says why it was not admitted (for logs)."""

    admitted: bool
    reason: str = ""


def parse_update(payload: object) -> Update:
    """A raw update (JSON-decoded) as PTB's `Update`; `NotAnUpdate` when it is not one, or
    not one PTB can read (a field missing that it requires, a value of the wrong type)."""
    if not isinstance(payload, dict):
        raise NotAnUpdate("the body is not a JSON object")
    update_id = payload.get("update_id")
    if type(update_id) is not int:  # not isinstance(): True is no update id
        raise NotAnUpdate("update_id is missing or not an integer")
    if too_deep(payload, MAX_DEPTH):
        # Real updates nest about ten levels; copying or reading one nested hundreds deep
        # would exhaust Python's recursion limit (and crash every start, as it once did).
        raise NotAnUpdate(f"nested more than {MAX_DEPTH} levels deep")
    data = copy.deepcopy(payload)  # de_json and the is_bot default must not touch what we store
    _default_is_bot(data)
    try:
        return Update.de_json(data, None)
    except (TypeError, KeyError, ValueError, AttributeError, RecursionError) as exc:
        raise NotAnUpdate(f"not a Telegram Update: {exc!r}") from exc


def too_deep(value: object, limit: int) -> bool:
    """Whether a JSON value nests deeper than `limit` (checked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(current, dict):
            stack.extend((v, depth + 1) for v in current.values())
        elif isinstance(current, list):
            stack.extend((v, depth + 1) for v in current)
    return False


def _default_is_bot(value: Any) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in _USER_FIELDS:
                for user in inner if isinstance(inner, list) else [inner]:
                    if isinstance(user, dict):
                        user.setdefault("is_bot", False)
            _default_is_bot(inner)
    elif isinstance(value, list):
        for inner in value:
            _default_is_bot(inner)


def message_of(update: Update) -> tuple[Message, bool] | None:
    """The message an update carries and whether it is an edit; None for other kinds."""
    if update.message is not None:
        return update.message, False
    if update.edited_message is not None:
        return update.edited_message, True
    return None


def chat_key(chat_id: int) -> str:
    """Each Telegram chat (private or group) has its own conversation."""
    return f"{CHAT_PREFIX}{chat_id}"


def chat_id_of(key: str) -> int:
    """`telegram:1111111` -> 1111111 (group ids are negative)."""
    if not key.startswith(CHAT_PREFIX):
        raise ValueError(f"not a Telegram chat key: {key!r}")
    return int(key.removeprefix(CHAT_PREFIX))


def admit(message: Message, identity: BotIdentity, allow: Collection[int]) -> Verdict:
    """Whether roost should handle the message: the gate, decided before any handling.

    Groups first, so that ordinary chatter among the group's members is not logged as strangers
    knocking; then the sender must be a person on the allow list.
    """
    if message.chat.type in _GROUPS and not addressed(message, identity):
        return Verdict(False, "a group message not addressed to the bot")
    user = message.from_user
    if user is None:
        return Verdict(False, "no sender (a channel post or an anonymous group admin)")
    if user.is_bot:
        return Verdict(False, "sent by a bot")
    if user.id not in allow:
        return Verdict(False, "unknown sender")
    return Verdict(True)


def addressed(message: Message, identity: BotIdentity) -> bool:
    """In a group: the bot is @mentioned (also `/cmd@bot`) or the message replies to the bot."""
    if _mention(identity).search(message.text or message.caption or ""):
        return True
    reply = message.reply_to_message
    return bool(reply and reply.from_user and reply.from_user.id == identity.id)


def message_text(message: Message, identity: BotIdentity) -> str:
    """What the user wrote (text, or a media caption), without the bot's @mention: in a group
    the mention only addressed the bot, and `/new@bot` becomes the command `/new`."""
    text = message.text or message.caption or ""
    return _mention(identity).sub("", text).strip()


def edit_text(original_id: int, new_text: str) -> str:
    """The text of an edited message as the model reads it: what changed, and the new words
    quoted, so that the earlier message is neither ignored nor silently contradicted."""
    quoted = "\n".join(f"> {line}" for line in new_text.splitlines()) or ">"
    return f"[The user edited their earlier message (id {original_id}); it now reads:]\n{quoted}"


def media_group_of(update: Update) -> str | None:
    """The album an update belongs to (photos sent together share a media_group_id)."""
    found = message_of(update)
    return found[0].media_group_id if found else None


def routable_message(update: Update) -> Message | None:
    """The message roost would handle: a message or edit with a chat whose id is an integer.
    None for other kinds, and for a message without a usable chat (nothing to answer to)."""
    found = message_of(update)
    if found is None:
        return None
    chat = getattr(found[0], "chat", None)
    if chat is None or type(chat.id) is not int:
        return None
    return found[0]


def inbound_id(received: float, update_key: str) -> str:
    """A ULID-shaped id fixed by the update: processing the same stored update again after a
    crash makes the same inbox id, so roost can tell it was already submitted."""
    millis = int(received * 1000)
    entropy = int.from_bytes(hashlib.sha256(update_key.encode()).digest()[:10], "big")
    value = (millis << 80) | entropy
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def _mention(identity: BotIdentity) -> re.Pattern[str]:
    # Usernames are [A-Za-z0-9_] and case-insensitive; \b stops @roost_bot matching @roost_bot2.
    return re.compile(rf"@{re.escape(identity.username)}\b", re.IGNORECASE)
