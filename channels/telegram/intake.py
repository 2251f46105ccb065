"""Telegram's side of the shared intake (`daemon.intake`): route, admit, translate.

The webhook route and the polling loop call `TelegramIntake.accept(payload)` before Telegram
gets its answer. It reads the raw JSON only as far as needed (`envelope_of`: chat, sender,
album), and lets only what roost may handle into the store: an update of a kind roost does not
handle, without a usable chat, nested absurdly deep, or from someone not on the allow list is
logged and dropped, costing no state. The rest goes to `intake.durable.Intake`, which persists it
(group commit), dedupes by update id, and feeds it back here, in order per chat, to `process`:
python-telegram-bot reads it, `admit` decides in full (groups, mentions), `engine.release` hears
that the user wrote again, then translation (text, media downloads) into one `Inbound` and
`engine.submit`. An update PTB cannot read fails there, and the intake quarantines it after a
second try. Photos sent as an album share a `media_group_id` and arrive as separate updates; the
intake groups them for `album_window` seconds into one Inbound.

A crash between the 200 and the end of processing leaves the raw update stored, and the intake
resumes it at the next start. The Inbound's id is derived from the update, so when the crash
came after `submit`, the second pass sees that and does not submit it twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from telegram import Update

from channels.telegram.callbacks import Callbacks
from channels.telegram.media import UNSUPPORTED, MediaFetcher
from channels.telegram.parse import (
    MAX_DEPTH,
    UPDATE_KINDS,
    BotIdentity,
    admit,
    chat_key,
    chat_key_of,
    context_lines,
    is_bot_flag,
    message_of,
    message_text,
    parse_update,
    routable_message,
)
from channels.telegram.platform import log
from channels.webhooks import too_deep
from channels.wording import edit_text, with_context
from daemon.core.messages import Inbound
from daemon.intake.durable import Intake, Outcome, Pending, Submitter
from daemon.intake.gate import Access, Gate
from daemon.intake.quarantine import UNREADABLE
from daemon.store import Store

CHANNEL = "telegram"


def update_key(update_id: int) -> str:
    return f"telegram:update:{update_id}"


class TelegramIntake:
    """Telegram updates into the shared intake; see the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        engine: Submitter,
        media: MediaFetcher,
        identity: BotIdentity,
        allow: Collection[int],
        album_window: float,
        clock: Callable[[], float] = time.time,
        access: Access | None = None,
        callbacks: Callbacks | None = None,
    ) -> None:
        self.callbacks = callbacks
        self.store = store
        self.engine = engine
        self.media = media
        self.identity = identity
        self.allow = frozenset(allow)
        # Pairing and pacing (daemon.intake.gate); access None: the allow list only.
        self.gate = Gate(CHANNEL, "Telegram", allow, access, engine.notify, log)
        self.intake = Intake(store=store, channel=CHANNEL, handler=self,
                             group_window=album_window, clock=clock)

    async def accept(self, payload: Mapping[str, Any]) -> bool:
        """Persist one update before Telegram is answered, if roost may handle it; False for a
        redelivery or an update that is dropped. Raises when it could not be stored.

        The door reads only the few fields it needs from the JSON (python-telegram-bot takes
        ten times longer, and the worker reads the update in full anyway); an update it lets
        in that PTB cannot read fails in the worker and is quarantined.
        """
        if too_deep(payload, MAX_DEPTH):
            log.warning("update %s is nested more than %d levels deep; dropped",
                        payload.get("update_id"), MAX_DEPTH)
            return False
        if isinstance(payload.get("callback_query"), dict):  # a tap on a button: no message
            if self.callbacks is not None:
                await self.callbacks.handle(payload["callback_query"])
            return False
        envelope = envelope_of(payload)
        if envelope is None:
            log.debug("update %s is of a kind roost does not handle", payload.get("update_id"))
            return False
        if envelope.sender is None:
            _log_refused(None, envelope.key, "no sender (a channel post or an anonymous group "
                         "admin)")
            return False
        # Pairing codes only in a private chat (a positive id), never in a group's chatter.
        if not await self.gate.door(str(envelope.sender), envelope.key, envelope.name,
                                    private=envelope.chat > 0):
            return False
        return await self.intake.accept(update_key(payload["update_id"]), envelope.key, payload)

    async def resume(self) -> int:
        return await self.intake.resume()

    async def idle(self) -> None:
        await self.intake.idle()

    async def stop(self) -> None:
        await self.intake.stop()

    # ---- the intake's Handler --------------------------------------------------------------

    def route(self, payload: Mapping[str, Any]) -> str | None:
        envelope = envelope_of(payload)
        return envelope.key if envelope is not None else None

    def group(self, item: Pending) -> str | None:
        envelope = envelope_of(item.payload)
        return envelope.album if envelope is not None else None

    async def unreadable(self, batch: list[Pending]) -> None:
        """An update PTB (or roost) could not read was set aside: its sender is told, in a
        private chat only (in a group it may not have been meant for roost at all, and a poll
        there would make roost chatter) and only when they may talk."""
        envelope = envelope_of(batch[0].payload)
        if envelope is None or envelope.sender is None or envelope.chat <= 0:
            return
        if await self.gate.may_talk(str(envelope.sender)):
            await self.engine.notify(envelope.key, UNREADABLE)

    async def process(self, batch: list[Pending]) -> Outcome:
        """Gate, translate, submit; LATER when the engine is stopping (the updates stay)."""
        return await self._process([parse_update(item.payload) for item in batch], batch)

    async def _process(self, updates: list[Update], batch: list[Pending]) -> Outcome:
        message = routable_message(updates[0])
        if message is None:
            return Outcome.DROPPED
        edited = message_of(updates[0]) == (message, True)
        key = chat_key_of(message)
        user = message.from_user.id if message.from_user else None
        approved = {user} if user is not None and await self.gate.may_talk(str(user)) else set()
        verdict = admit(message, self.identity, self.allow | approved)  # groups, bots, mentions
        if not verdict.admitted:
            _log_refused(user, key, verdict.reason)
            return Outcome.DROPPED
        await self.gate.pace(str(user), key)
        first = batch[0]
        if await first.submitted_before(self.store):
            return Outcome.DONE
        # Also when this update starts no turn (an unsupported kind of message).
        if released := await self.engine.release(key):
            log.info("%s wrote again: %d held replies go out", key, released)
        if edited and not await self._seen(key, message.message_id):
            # The model never read the original (sent before roost ran, or not meant for the
            # bot until the edit): to it, this is a new message.
            edited = False
        texts: list[str] = []
        attachments: list[dict[str, Any]] = []
        parts = [m for u in updates if (m := routable_message(u)) is not None]
        for part in parts:
            if text := message_text(part, self.identity):
                texts.append(text)
            if edited:
                continue  # an edit changes the words; its media was handled the first time
            fetched = await self.media.fetch(part)
            attachments.extend(fetched.attachments)
            for problem in fetched.problems:
                await self.engine.notify(key, problem)
            if fetched.unsupported and not text:
                await self.engine.notify(key, UNSUPPORTED)
        text = "\n".join(texts)
        if not text and not attachments:
            return Outcome.DONE
        meta: dict[str, Any] = {}
        if edited:
            text = edit_text(message.message_id, text)
            meta["edit_of"] = str(message.message_id)
        else:
            text = with_context(text, context_lines(message, self.identity))
        if len(parts) > 1:
            meta["album"] = [str(m.message_id) for m in parts]
        assert message.from_user is not None  # admit() checked
        inbound = Inbound(
            chat_key=key, text=text, received=first.received, id=first.inbound_id,
            platform_id=str(message.message_id), sender=str(message.from_user.id),
            attachments=tuple(attachments), meta=meta,
        )
        return Outcome.DONE if await self.engine.submit(inbound) else Outcome.LATER

    async def _seen(self, key: str, message_id: int) -> bool:
        """Whether the chat's current conversation (or its inbox) holds that message."""
        wanted = str(message_id)

        def look() -> bool:
            if any(doc.get("platform_id") == wanted or wanted in doc.get("meta", {}).get(
                    "album", ()) for doc in self.store.inbox_pending(key)):
                return True
            conversation = self.store.active_conversation(key)
            if conversation is None:
                return False
            return any(wanted in m.channel_message_ids or wanted in m.meta.get("album", ())
                       for m in self.store.messages(conversation.id) if m.role == "user")

        return await asyncio.to_thread(look)

@dataclass(frozen=True)
class Envelope:
    """What the door needs of an update, read from the raw JSON."""

    chat: int
    sender: int | None  # None: no sender, or a bot
    album: str | None
    topic: int | None = None  # a forum topic's thread id: its own conversation
    name: str = ""  # the sender's name, for a pairing request

    @property
    def key(self) -> str:
        return chat_key(self.chat, self.topic)


def envelope_of(payload: Mapping[str, Any]) -> Envelope | None:
    """The chat, sender and album of a message or edit; None for other kinds and for a message
    without a chat whose id is an integer (nothing to answer to)."""
    message = next((payload[k] for k in UPDATE_KINDS if isinstance(payload.get(k), dict)), None)
    if message is None:
        return None
    chat = message.get("chat")
    if not isinstance(chat, dict) or type(chat.get("id")) is not int:
        return None
    sender = message.get("from")
    person = isinstance(sender, dict) and type(sender.get("id")) is int and not is_bot_flag(
        sender.get("is_bot"))
    album = message.get("media_group_id")
    thread = message.get("message_thread_id")
    topic = thread if message.get("is_topic_message") is True and type(thread) is int else None
    names = (sender.get(k) for k in ("first_name", "last_name")) if person else ()  # type: ignore[union-attr]
    return Envelope(chat=chat["id"], sender=sender["id"] if person else None,  # type: ignore[index]
                    album=album if isinstance(album, str) else None, topic=topic,
                    name=" ".join(n for n in names if isinstance(n, str)))


def _log_refused(user: int | None, key: str, reason: str) -> None:
    if reason == "unknown sender":
        # Pairing (access.unknown_senders = "pair") is not built yet: ignored either way.
        log.warning("ignored a message from unknown Telegram user %s in %s (not in "
                    "telegram.allow)", user, key)
    else:
        log.debug("ignored a message in %s from %s: %s", key, user, reason)
