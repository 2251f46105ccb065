"""Telegram updates -> what roost handles: parsing, the gate, and the text of an `Inbound`.

Pure functions over python-telegram-bot's objects: no clock, store or network. The intake
(`channels.telegram.intake`) runs them in its worker, in this order: `parse_update` (an update
PTB cannot read is quarantined), `admit` before any handling (who may talk, and whether a group
message is meant for the bot), then `message_text` and `context_lines` (with channels/wording.py,
the same words on every platform) to build what the model reads.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from telegram import (
    Message,
    MessageOriginChannel,
    MessageOriginChat,
    MessageOriginHiddenUser,
    MessageOriginUser,
    Update,
)
from telegram.constants import ChatType

from channels.webhooks import too_deep
from channels.wording import reply_line
from daemon.core.errors import ChannelError

MAX_DEPTH = 40  # JSON nesting roost accepts in an update (real ones nest about ten levels)
# The update kinds roost handles, given to setWebhook / getUpdates as `allowed_updates`.
UPDATE_KINDS = ("message", "edited_message", "callback_query")  # taps: telegram.callbacks
CHAT_PREFIX = "telegram:"

# Fields that hold a User object. Telegram has sent `is_bot` on every user since Bot API 3.0 and
# PTB 22 refuses a user without it; older recorded updates (the fixtures in tests/fixtures) lack it,
# and some clients send it as a string.
_USER_FIELDS = frozenset({"from", "forward_from", "via_bot", "user", "left_chat_member",
                          "new_chat_members", "sender_business_bot"})
_GROUPS = (ChatType.GROUP, ChatType.SUPERGROUP)  # a tuple: `in` compares, so a plain str works


class NotAnUpdate(ChannelError, ValueError):
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
    data = copy.deepcopy(payload)  # de_json and the defaults must not touch what we store
    _fill_defaults(data)
    try:
        return Update.de_json(data, None)
    except (TypeError, KeyError, ValueError, AttributeError, RecursionError) as exc:
        raise NotAnUpdate(f"not a Telegram Update: {exc!r}") from exc


def is_bot_flag(value: object) -> bool:
    """A user's `is_bot` read tolerantly: some clients send it as a string ("False", "true")
    or a number, and a person must not be taken for a bot (and ignored) for that."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _fill_defaults(value: Any) -> None:
    """What PTB requires and recorded or old-client updates lack: `is_bot` on a user (absent
    before Bot API 3.0, sometimes a string), `file_unique_id` on a file (absent before Bot API
    4.5; its file_id names the same file, which is all roost uses it for)."""
    if isinstance(value, dict):
        if isinstance(value.get("file_id"), str) and "file_unique_id" not in value:
            value["file_unique_id"] = value["file_id"]
        for key, inner in value.items():
            if key in _USER_FIELDS:
                for user in inner if isinstance(inner, list) else [inner]:
                    if isinstance(user, dict):
                        user["is_bot"] = is_bot_flag(user.get("is_bot", False))
            _fill_defaults(inner)
    elif isinstance(value, list):
        for inner in value:
            _fill_defaults(inner)


def message_of(update: Update) -> tuple[Message, bool] | None:
    """The message an update carries and whether it is an edit; None for other kinds."""
    if update.message is not None:
        return update.message, False
    if update.edited_message is not None:
        return update.edited_message, True
    return None


def chat_key(chat_id: int, topic: int | None = None) -> str:
    """Each Telegram chat (private or group), and each topic of a forum, has its own
    conversation: `telegram:<chat>` or `telegram:<chat>:<topic>`."""
    return f"{CHAT_PREFIX}{chat_id}" + (f":{topic}" if topic else "")


def chat_key_of(message: Message) -> str:
    """The conversation a message belongs to; a forum topic's thread id keeps the topics apart
    and sends the replies there (the General topic has none)."""
    topic = message.message_thread_id if message.is_topic_message else None
    return chat_key(message.chat.id, topic)


def address_of(key: str) -> tuple[int, int | None]:
    """`telegram:-1001:42` -> (-1001, 42): the chat id (negative for groups) and the topic."""
    if not key.startswith(CHAT_PREFIX):
        raise ValueError(f"not a Telegram chat key: {key!r}")
    chat, _, topic = key.removeprefix(CHAT_PREFIX).partition(":")
    return int(chat), int(topic) if topic else None


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


def context_lines(message: Message, identity: BotIdentity) -> list[str]:
    """What the model needs besides the words to read a message as the user meant it: in a
    group who is speaking, where a forward comes from, what a reply answers (clipped).

    This becomes part of the stored message and so of replayed history: the wording is fixed
    and depends on the message alone, never on the time or on other state.
    """
    lines: list[str] = []
    user = message.from_user
    if message.chat.type in _GROUPS and user is not None:
        lines.append(f"[From {_person(user.full_name, user.username)}]")
    if (origin := message.forward_origin) is not None:
        lines.append(f"[Forwarded from {_origin_name(origin)}]")
    reply = message.reply_to_message
    if reply is not None or message.quote is not None:
        if reply is not None and reply.from_user is not None:
            author = ("you" if reply.from_user.id == identity.id
                      else _person(reply.from_user.full_name, reply.from_user.username))
        else:
            author = "an earlier message"
        quoted = (message.quote.text if message.quote is not None
                  else (reply.text or reply.caption or "") if reply is not None else "")
        lines.append(reply_line(author, quoted))
    return lines




def _person(name: str, username: str | None) -> str:
    return f"{name} (@{username})" if username else name


def _origin_name(origin: object) -> str:
    if isinstance(origin, MessageOriginUser):
        user = origin.sender_user
        return _person(user.full_name, user.username)
    if isinstance(origin, MessageOriginHiddenUser):
        return origin.sender_user_name
    if isinstance(origin, MessageOriginChat):
        return origin.sender_chat.title or "a chat"
    if isinstance(origin, MessageOriginChannel):
        return origin.chat.title or "a channel"
    return "someone"






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


def _mention(identity: BotIdentity) -> re.Pattern[str]:
    # Usernames are [A-Za-z0-9_] and case-insensitive; \b stops @roost_bot matching @roost_bot2.
    return re.compile(rf"@{re.escape(identity.username)}\b", re.IGNORECASE)
