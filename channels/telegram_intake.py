"""Telegram's side of the shared intake (`daemon.intake`): route, admit, translate.

The webhook route and the polling loop call `TelegramIntake.accept(payload)` before Telegram
gets its answer. It reads the update as far as needed to know its chat, and lets only what roost
handles into the store: an update PTB cannot read, of a kind roost does not handle, nested
absurdly deep, or from someone not allowed to talk (`admit`) is logged and dropped, costing no
state. The rest goes to `daemon.intake.Intake`, which persists it (group commit), dedupes by
update id, and feeds it back here, in order per chat, to `process`: translation (text, media
downloads) into one `Inbound` and `engine.submit`. Photos sent as an album share a
`media_group_id` and arrive as separate updates; the intake groups them for `album_window`
seconds into one Inbound.

A crash between the 200 and the end of processing leaves the raw update stored, and the intake
resumes it at the next start. The Inbound's id is derived from the update, so when the crash
came after `submit`, the second pass sees that and does not submit it twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from telegram import Message, Update

from channels.base import Inbound, inbound_id
from channels.telegram_media import UNSUPPORTED, MediaFetcher
from channels.telegram_updates import (
    BotIdentity,
    NotAnUpdate,
    admit,
    chat_key_of,
    context_lines,
    edit_text,
    media_group_of,
    message_of,
    message_text,
    parse_update,
    routable_message,
    with_context,
)
from daemon.intake import Intake, Outcome, Pending, Submitter
from daemon.logs import telegram_log as log
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
    ) -> None:
        self.store = store
        self.engine = engine
        self.media = media
        self.identity = identity
        self.allow = frozenset(allow)
        self.intake = Intake(store=store, channel=CHANNEL, handler=self,
                             group_window=album_window, clock=clock)
        # Updates read at the door, until their worker is done with them (not read twice).
        self._parsed: dict[str, Update] = {}

    async def accept(self, payload: Mapping[str, Any]) -> bool:
        """Persist one update before Telegram is answered, if roost handles it; False for a
        redelivery or an update that is dropped. Raises when it could not be stored."""
        try:
            update = parse_update(payload)
        except NotAnUpdate as exc:
            log.warning("update %s cannot be read (%s); dropped", payload.get("update_id"), exc)
            return False
        message = routable_message(update)
        if message is None:
            log.debug("update %d is of a kind roost does not handle", update.update_id)
            return False
        verdict = admit(message, self.identity, self.allow)
        if not verdict.admitted:
            self._log_refused(message, verdict.reason)
            return False
        key = update_key(update.update_id)
        self._parsed[key] = update
        try:
            accepted = await self.intake.accept(key, chat_key_of(message), payload)
        except BaseException:
            self._parsed.pop(key, None)
            raise
        if not accepted:
            self._parsed.pop(key, None)
        return accepted

    async def resume(self) -> int:
        return await self.intake.resume()

    async def idle(self) -> None:
        await self.intake.idle()

    async def stop(self) -> None:
        await self.intake.stop()

    # ---- the intake's Handler --------------------------------------------------------------

    def route(self, payload: Mapping[str, Any]) -> str | None:
        message = routable_message(parse_update(payload))
        return chat_key_of(message) if message is not None else None

    def group(self, item: Pending) -> str | None:
        return media_group_of(self._update(item))

    async def process(self, batch: list[Pending]) -> Outcome:
        """Gate, translate, submit; LATER when the engine is stopping (the updates stay)."""
        try:
            return await self._process([self._update(item) for item in batch], batch)
        finally:
            for item in batch:
                self._parsed.pop(item.key, None)

    def _update(self, item: Pending) -> Update:
        update = self._parsed.get(item.key)
        return update if update is not None else parse_update(item.payload)

    async def _process(self, updates: list[Update], batch: list[Pending]) -> Outcome:
        message = routable_message(updates[0])
        if message is None:
            return Outcome.DROPPED
        edited = message_of(updates[0]) == (message, True)
        key = chat_key_of(message)
        verdict = admit(message, self.identity, self.allow)  # again: the allow list may change
        if not verdict.admitted:
            self._log_refused(message, verdict.reason)
            return Outcome.DROPPED
        first = batch[0]
        item_id = inbound_id(first.received, first.key)
        # Checked before any download, so a resumed update does not fetch its media twice.
        if first.resumed and await asyncio.to_thread(self.store.inbox_known, item_id):
            log.info("update %s was submitted before the last stop; not again", first.key)
            return Outcome.DONE
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
            chat_key=key, text=text, received=first.received, id=item_id,
            platform_id=str(message.message_id), sender=str(message.from_user.id),
            attachments=tuple(attachments), meta=meta,
        )
        await self._unblock(key)
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

    async def _unblock(self, key: str) -> None:
        """A user who blocked the bot and writes again has unblocked it."""
        flags = await asyncio.to_thread(self.store.chat_flags, key)
        if "undeliverable" in flags:
            await asyncio.to_thread(self.store.set_chat_flag, key, "undeliverable", None)
            log.info("%s writes again: no longer marked as blocked", key)

    @staticmethod
    def _log_refused(message: Message, reason: str) -> None:
        user = message.from_user.id if message.from_user else None
        key = chat_key_of(message)
        if reason == "unknown sender":
            # Pairing (access.unknown_senders = "pair") is not built yet: ignored either way.
            log.warning("ignored a message from unknown Telegram user %s in %s (not in "
                        "telegram.allow)", user, key)
        else:
            log.debug("ignored a message in %s from %s: %s", key, user, reason)

