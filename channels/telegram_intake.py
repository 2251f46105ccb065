"""From a Telegram update to the engine's inbox, losing nothing on the way.

`accept()` is what the webhook route (and the polling handler) call before Telegram gets its
answer: it claims the update id (a redelivery is dropped, also after a restart) and writes the
raw update to the store's update inbox. Processing comes after, in one worker per chat so a
chat's messages keep their order: the gate (`admit`), then translation (text, media downloads)
into one `Inbound`, `engine.submit`, and only then is the raw update marked done. Photos sent as
an album share a `media_group_id` and arrive as separate updates; the worker collects them for
`album_window` seconds into one Inbound.

A crash between the 200 and the end of processing leaves the raw update in the store, and
`resume()` processes it again at the next start. The Inbound's id is derived from the update, so
when the crash came after `submit` (the message is already in the inbox or the conversation),
the second pass sees that and does not submit it twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from telegram import Message, Update

from channels.base import Inbound
from channels.telegram_media import UNSUPPORTED, MediaFetcher
from channels.telegram_updates import (
    BotIdentity,
    NotAnUpdate,
    Verdict,
    admit,
    chat_key,
    chat_key_of,
    chat_of,
    context_lines,
    edit_text,
    inbound_id,
    media_group_of,
    message_of,
    message_text,
    parse_update,
    with_context,
)
from daemon.access import Access
from daemon.errors import StoreError
from daemon.logs import telegram_log as log
from daemon.store import Store

CHANNEL = "telegram"
STORE_RETRIES = 5  # then the update waits, stored, for the next start
STORE_RETRY_DELAY = 1.0  # seconds, doubled per retry


class Submitter(Protocol):
    """What the intake needs of the engine."""

    async def submit(self, inbound: Inbound) -> bool: ...

    async def notify(self, chat_key: str, text: str) -> None: ...


@dataclass(frozen=True)
class _Pending:
    key: str  # "telegram:update:<update_id>", the dedupe and update-inbox key
    update: Update
    received: float
    resumed: bool  # stored by an earlier run: may already have been submitted


def update_key(update_id: int) -> str:
    return f"telegram:update:{update_id}"


class Intake:
    """Accepts updates, persists them, and feeds them to the engine in order per chat."""

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
    ) -> None:
        self.store = store
        self.engine = engine
        self.media = media
        self.identity = identity
        self.allow = frozenset(allow)
        self.album_window = album_window
        self.clock = clock
        self.access = access  # pairing and pacing (daemon.access); None: the allow list only
        self._queues: dict[int, asyncio.Queue[_Pending]] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}

    async def accept(self, payload: Mapping[str, Any], update: Update) -> bool:
        """Claim and persist one update before the platform is answered; False for a
        redelivery (already claimed) or a kind roost does not handle."""
        chat = chat_of(update)
        if chat is None:
            log.debug("update %d is of a kind roost does not handle", update.update_id)
            return False
        key = update_key(update.update_id)
        now = self.clock()
        if not await asyncio.to_thread(self.store.updates_accept, CHANNEL, key, payload, now):
            log.info("update %d for %s delivered again; dropped", update.update_id,
                     chat_key(chat))
            return False
        self._enqueue(chat, _Pending(key, update, now, resumed=False))
        return True

    async def resume(self) -> int:
        """Queue the updates an earlier run accepted but did not finish; returns how many."""
        pending = await asyncio.to_thread(self.store.updates_pending, CHANNEL)
        for doc in pending:
            try:
                update = parse_update(doc["payload"])
            except NotAnUpdate as exc:  # it passed the same check when it was accepted
                log.error("stored update %s cannot be read (%s); dropped", doc["key"], exc)
                await asyncio.to_thread(self.store.updates_done, doc["key"])
                continue
            chat = chat_of(update)
            if chat is None:
                await asyncio.to_thread(self.store.updates_done, doc["key"])
                continue
            self._enqueue(chat, _Pending(doc["key"], update, doc["received"], resumed=True))
        if pending:
            log.info("resuming %d Telegram updates received before the last stop", len(pending))
        return len(pending)

    async def stop(self) -> None:
        """Cancel the workers; what they had not finished stays stored for `resume()`."""
        for task in self._workers.values():
            task.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
        self._workers.clear()
        self._queues.clear()

    async def idle(self) -> None:
        """Wait until every queued update has been processed (for tests and shutdown)."""
        await asyncio.gather(*(queue.join() for queue in self._queues.values()))

    # ---- the per-chat worker ---------------------------------------------------------------

    def _enqueue(self, chat: int, item: _Pending) -> None:
        queue = self._queues.setdefault(chat, asyncio.Queue())
        queue.put_nowait(item)
        task = self._workers.get(chat)
        if task is None or task.done():
            self._workers[chat] = asyncio.create_task(self._worker(chat, queue),
                                                      name=f"roost-telegram-{chat}")

    async def _worker(self, chat: int, queue: asyncio.Queue[_Pending]) -> None:
        carry: _Pending | None = None
        # A worker lives while its chat has updates queued, so chats that wrote once (a
        # stranger, say) leave no task behind.
        while carry is not None or not queue.empty():
            item = carry or queue.get_nowait()
            carry = None
            batch = [item]
            group = media_group_of(item.update)
            # An album arrives as one update per photo, close together: wait for the rest.
            while group is not None:
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
                    # cancellation that stop() sends.
                    async with asyncio.timeout(self.album_window):
                        following = await queue.get()
                except TimeoutError:
                    break
                if media_group_of(following.update) != group:
                    carry = following
                    break
                batch.append(following)
            try:
                await self._process(batch)
            finally:
                # task_done once per item taken from the queue; the carried one is not done yet.
                for _ in batch:
                    queue.task_done()
        # No await between the emptiness check and here: nothing can be queued in between.
        self._workers.pop(chat, None)
        self._queues.pop(chat, None)

    async def _process(self, batch: list[_Pending]) -> None:
        keys = [item.key for item in batch]
        for attempt in range(STORE_RETRIES):
            try:
                handled = await self._handle(batch)
            except StoreError as exc:
                # A full or failing disk: the update stays pending (retried here, and at the
                # next start at the latest) rather than being lost after Telegram's 200.
                log.error("cannot store Telegram updates %s (%s); retry %d of %d",
                          ", ".join(keys), exc, attempt + 1, STORE_RETRIES)
                await asyncio.sleep(STORE_RETRY_DELAY * 2**attempt)
                continue
            except Exception:
                # The boundary of one update's processing: a bug must not kill the chat's
                # worker, nor make the update fail again at every start.
                log.exception("processing Telegram updates %s failed", ", ".join(keys))
                handled = True
            if handled:
                for key in keys:
                    await asyncio.to_thread(self.store.updates_done, key)
            return

    async def _handle(self, batch: list[_Pending]) -> bool:
        """Gate, translate, submit; False when the engine is stopping (the updates stay)."""
        found = message_of(batch[0].update)
        assert found is not None  # updates without a message are never queued
        message, edited = found
        key = chat_key_of(message)
        verdict = admit(message, self.identity, self.allow)
        user = message.from_user.id if message.from_user else None
        if not verdict.admitted and verdict.reason == "unknown sender" and self.access:
            if self.access.approved(CHANNEL, str(user)):
                verdict = Verdict(True)  # approved by the owner with `roost pairing approve`
            elif self.access.pairs:
                assert message.from_user is not None
                notice = self.access.stranger(CHANNEL, str(user), key,
                                              message.from_user.full_name)
                if notice:
                    await self.engine.notify(key, notice)
                return True
        if not verdict.admitted:
            if verdict.reason == "unknown sender":
                log.warning("ignored a message from unknown Telegram user %s in %s (not in "
                            "telegram.allow)", user, key)
            else:
                log.debug("ignored a message in %s from %s: %s", key, user, verdict.reason)
            return True
        if self.access is not None:  # a flood waits here, stored, and is answered later
            await self.access.pace(f"{CHANNEL}:{user}",
                                   lambda text: self.engine.notify(key, text))
        first = batch[0]
        item_id = inbound_id(first.received, first.key)
        # Checked before any download, so a resumed update does not fetch its media twice.
        if first.resumed and await asyncio.to_thread(self.store.inbox_known, item_id):
            log.info("update %s was submitted before the last stop; not again", first.key)
            return True
        if edited and not await self._seen(key, message.message_id):
            # The model never read the original (sent before roost ran, or not meant for the
            # bot until the edit): to it, this is a new message.
            edited = False
        texts: list[str] = []
        attachments: list[dict[str, Any]] = []
        for item in batch:
            part = message_of(item.update)
            assert part is not None
            if text := message_text(part[0], self.identity):
                texts.append(text)
            if edited:
                continue  # an edit changes the words; its media was handled the first time
            fetched = await self.media.fetch(part[0])
            attachments.extend(fetched.attachments)
            for problem in fetched.problems:
                await self.engine.notify(key, problem)
            if fetched.unsupported and not text:
                await self.engine.notify(key, UNSUPPORTED)
        text = "\n".join(texts)
        if not text and not attachments:
            return True
        meta: dict[str, Any] = {}
        if edited:
            text = edit_text(message.message_id, text)
            meta["edit_of"] = str(message.message_id)
        else:
            text = with_context(text, context_lines(message, self.identity))
        if len(batch) > 1:
            meta["album"] = [str(m.message_id) for i in batch if (m := _message(i))]
        assert message.from_user is not None  # admit() checked
        inbound = Inbound(
            chat_key=key, text=text, received=first.received, id=item_id,
            platform_id=str(message.message_id), sender=str(message.from_user.id),
            attachments=tuple(attachments), meta=meta,
        )
        await self._unblock(key)
        return await self.engine.submit(inbound)

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


def _message(item: _Pending) -> Message | None:
    found = message_of(item.update)
    return found[0] if found else None
