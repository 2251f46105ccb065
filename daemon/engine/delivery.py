"""Delivery: how a chat's outbox reaches its channel, and what happens when it cannot.

Only the chat's worker sends (`send`), in order, so replies and notices never race. A platform
that takes a reply only after the user writes again (WhatsApp's 24 hours) makes it wait, held,
until `release`; one that refuses a chat for good (a blocked bot) marks it undeliverable; a
reply it refuses outright is given up (it stays in the conversation) and the user is told.
A report to a person (`person:NAME`) goes to the first of their chats that can take it: queued
for the first whose channel runs and that has not refused roost, and passed on to the next
(`Outbound.fallbacks`) when that one takes it only after the user writes; the last of them
treats it as any item of its own (held, or sent to the platform's fallback chat).
Listeners (`DeliveryHooks`) hear of each item the platform took and each one given up.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.core.config import Settings, target_person
from daemon.core.conversations import kind_of
from daemon.core.errors import DeliveryError
from daemon.core.ids import inbound_id
from daemon.core.logs import turn_log as log
from daemon.core.messages import Channel, Outbound
from daemon.engine.voice_replies import VoiceReplies
from daemon.store import Store
from daemon.store.event_log import Records

DELIVERY_RETRY_MAX = 300.0
HELD_MAX = 20  # replies kept per chat while the platform waits for the user to write
HELD_MAX_AGE = 7 * 86400.0  # seconds a reply may wait for that
UNDELIVERABLE = ("the platform refused this chat earlier (the user blocked the bot or removed "
                 "it); nothing is sent to it until the user writes again")

Sent = Callable[[Outbound], Awaitable[None]]
Refused = Callable[[Outbound, str], Awaitable[None]]


@dataclass
class DeliveryHooks:
    """The listeners of the outbox, given to the engine at construction and filled by the app
    before anything is sent (the automations, built on the engine, add theirs to it).

    `sent` is told of each item the platform took while the item (with what the channel
    recorded on it, e.g. `platform_ids`) is still in the outbox: a crash before it is forgotten
    tells again. `refused` is told of each item given up (refused, or held too long), with the
    reason: a run's report refused is on its record, not a success."""

    sent: list[Sent] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


class Delivery:
    """Sends, holds, reroutes and gives up outbox items; see the module docstring."""

    def __init__(self, *, settings: Settings, store: Store, records: Records,
                 channels: Mapping[str, Channel], clock: Callable[[], float],
                 wake: Callable[[str], None], hooks: DeliveryHooks | None = None,
                 voice: VoiceReplies | None = None) -> None:
        self.voice = voice  # speaks replies: queues and synthesises their voice notes
        self.settings = settings
        self.store = store
        self.records = records
        self.channels = channels
        self.clock = clock
        self.wake = wake  # the chat's worker sends what was queued
        self.hooks = hooks or DeliveryHooks()
        self._failures: dict[str, int] = {}
        # Chats with held replies, so that a user's message costs no store read to find none.
        self._held: set[str] = set()
        self._unmarked: set[str] = set()  # chats known not to be marked undeliverable

    def resumed(self, docs: Iterable[Mapping[str, Any]]) -> None:
        """The outbox a previous run left (read once at the start)."""
        self._held |= {str(d["chat_key"]) for d in docs if d.get("held")}

    async def queue(self, outbound: Outbound) -> bool:
        """Queue a message that answers nothing the chat sent (an automation's report, a
        reminder, a reply the platform wants held) and wake the chat's worker; one for
        `person:NAME` goes to a chat of theirs (`_addressed`). Idempotent by the outbound's
        id: one already queued or sent is not queued again (False)."""
        if target_person(outbound.chat_key) is not None:
            addressed = await asyncio.to_thread(self._addressed, outbound)
            if addressed is None:
                return False
            outbound = addressed
        if outbound.held and outbound.fallbacks:
            # Taken and then refused by the platform (WhatsApp's 24 hours, reported late):
            # the person's next chat, as `_hold` does for a refusal at once.
            outbound = rerouted(outbound, outbound.fallbacks[0], f"({outbound.held}.)")

        def add() -> bool:
            queued = any(d["id"] == outbound.id for chat in (outbound.chat_key,
                                                              *outbound.fallbacks)
                         for d in self.store.outbox_pending(chat))
            if queued or self.store.was_sent(outbound.id):
                return False
            self.store.outbox_add(outbound.to_doc())
            return True

        added = await asyncio.to_thread(add)
        if outbound.held:
            self._held.add(outbound.chat_key)
            if added:
                await self._drop_stale_held(outbound.chat_key)
        self.wake(outbound.chat_key)
        return added

    def _addressed(self, outbound: Outbound) -> Outbound | None:
        """An item for `person:NAME` (on a worker thread): for the first of their chats, in
        the config's order, whose channel runs and that has not refused roost (the user
        blocked the bot), with the later such chats as its fallbacks. When none is, their
        first chat takes it, to wait or be given up as that chat's items are. None: the name
        is no longer in the config."""
        name = target_person(outbound.chat_key)
        chats = self.settings.linked.get(name or "", ())
        if not chats:
            log.warning("a %s for %s is dropped: [people] and [identities] no longer name %s",
                        outbound.kind, outbound.chat_key, name)
            return None
        open_now = [chat for chat in chats if kind_of(chat) in self.channels
                    and "undeliverable" not in self.store.chat_flags(chat)]
        order = open_now or list(chats)
        return dataclasses.replace(outbound, chat_key=order[0], fallbacks=tuple(order[1:]))

    async def release(self, chat_key: str) -> int:
        """The user wrote again, on whatever platform: a chat marked undeliverable (they had
        blocked the bot) is unmarked, and the replies held for that go out. Returns how many.
        The one place both happen, so every channel calls this and nothing else for it."""
        await self._unblock(chat_key)
        if chat_key not in self._held:
            return 0

        def clear() -> int:
            held = [d for d in self.store.outbox_pending(chat_key) if d.get("held")]
            for doc in held:
                self.store.outbox_update(doc["id"], held=None)
            return len(held)

        self._held.discard(chat_key)  # before the read: a reply held meanwhile marks it again
        released = await asyncio.to_thread(clear)
        self.wake(chat_key)
        return released

    async def _unblock(self, chat_key: str) -> None:
        """Read the chat's mark once per process (only `_give_up` sets it later, and it
        forgets the chat here): a message then costs no store call."""
        if chat_key in self._unmarked:
            return
        if "undeliverable" in await asyncio.to_thread(self.store.chat_flags, chat_key):
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, "undeliverable", None)
            log.info("%s writes again: no longer marked as blocked", chat_key)
        self._unmarked.add(chat_key)

    def delay(self, chat_key: str) -> float:
        """How long the worker waits before trying a failed delivery again."""
        failures = self._failures.get(chat_key, 1)
        return min(self.settings.model.retry_backoff * 2 ** (failures - 1), DELIVERY_RETRY_MAX)

    def forget(self, chat_key: str) -> None:
        self._failures.pop(chat_key, None)

    async def send(self, chat_key: str, sending: Callable[[dict[str, Any]], None]) -> bool:
        """Send the chat's outbox in order (`sending` is told of each item before it goes);
        False when a delivery failed and must wait."""
        docs = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        channel = self.channels.get(kind_of(chat_key))
        if docs and channel is None:
            log.warning("%d replies for %s wait: its channel is not enabled", len(docs), chat_key)
            return True
        if docs and "undeliverable" in await asyncio.to_thread(self.store.chat_flags, chat_key):
            # The platform refused this chat for good (the user blocked the bot); the replies
            # stay in the conversation. `release` clears the mark when the user writes again.
            log.info("dropping %d replies for %s: the chat is marked undeliverable",
                     len(docs), chat_key)
            for doc in docs:
                await asyncio.to_thread(self.store.outbox_done, doc["id"])
                await self._tell_refused(Outbound.from_doc(doc), UNDELIVERABLE)
            return True
        for doc in docs:
            if doc.get("held"):
                continue  # waits for the user to write again (see release)
            sending(doc)
            outbound = Outbound.from_doc(doc)
            if await asyncio.to_thread(self.store.was_sent, outbound.id):
                await asyncio.to_thread(self.store.outbox_done, outbound.id)  # crash after send
                continue
            if self.voice is not None:
                spoken = await self.voice.ready(outbound)
                if spoken is None:  # not spoken: the line that says so is queued
                    continue
                outbound = spoken
            try:
                assert channel is not None
                await channel.send(outbound)
            except DeliveryError as exc:
                if exc.window_closed:
                    await self._hold(outbound, exc)
                    continue
                if exc.permanent:
                    await self._give_up(outbound, exc)
                    continue
                failures = self._failures.get(chat_key, 0) + 1
                self._failures[chat_key] = failures
                log.warning("delivery to %s failed (%d in a row): %s", chat_key, failures, exc)
                return False
            self._failures.pop(chat_key, None)
            await self._tell_sent(outbound)
            if outbound.kind == "voice":  # the console plays it beside its reply
                await asyncio.to_thread(self._note_voice, outbound)
            await asyncio.to_thread(self.store.mark_sent, outbound.id, self.clock())
        return True

    def _note_voice(self, outbound: Outbound) -> None:
        if outbound.conversation_id is None or outbound.audio is None:
            return
        audio = Path(outbound.audio)
        if not audio.is_relative_to(self.store.state_dir):
            return  # not a file of roost's: nothing the console may serve
        self.store.note_delivery(outbound.conversation_id, {
            "id": outbound.id, "kind": "voice", "message_id": outbound.message_id,
            # relative to the state dir, as a message's attachments are kept
            "path": audio.relative_to(self.store.state_dir).as_posix(), "mime": "audio/ogg",
            "name": "voice reply",
            "seconds": outbound.seconds, "sent": self.clock()})

    async def _tell_sent(self, outbound: Outbound) -> None:
        for listener in self.hooks.sent:
            try:
                await listener(outbound)
            except Exception:  # a listener's bookkeeping: never a reason to send a message again
                log.exception("recording the delivery of %s to %s failed", outbound.id,
                              outbound.chat_key)

    async def _tell_refused(self, outbound: Outbound, reason: str) -> None:
        for listener in self.hooks.refused:
            try:
                await listener(outbound, reason)
            except Exception:  # a listener's bookkeeping: never a reason to stop this chat's sends
                log.exception("recording the refusal of %s by %s failed", outbound.id,
                              outbound.chat_key)

    async def _hold(self, outbound: Outbound, exc: DeliveryError) -> None:
        """The platform takes this reply only after the user writes again: send it to the
        person's next chat (a report to `person:NAME`) or the platform's fallback chat when
        there is one, else keep it (a restart keeps it too) until then."""
        where = outbound.conversation_id or outbound.chat_key
        fallback = outbound.fallbacks[0] if outbound.fallbacks else exc.fallback
        if fallback:
            await self.queue(rerouted(outbound, fallback, exc.note))
            await asyncio.to_thread(self.store.outbox_done, outbound.id)
            await asyncio.to_thread(self.records.event, self.clock(), "rerouted", where,
                                    f"{exc}; sent to {fallback}")
            log.info("a %s for %s went to %s instead: %s", outbound.kind, outbound.chat_key,
                     fallback, exc)
            return
        # The platform answered with a refusal: nothing is in flight any more.
        await asyncio.to_thread(self.store.outbox_update, outbound.id, held=str(exc),
                                attempting=None)
        self._held.add(outbound.chat_key)
        await self._drop_stale_held(outbound.chat_key)
        await asyncio.to_thread(self.records.event, self.clock(), "held", where, str(exc))
        log.info("a %s for %s waits until the user writes again: %s", outbound.kind,
                 outbound.chat_key, exc)

    async def _drop_stale_held(self, chat_key: str) -> None:
        """Held replies are bounded: an hourly report to a user who never writes must not pile
        up for months and then arrive all at once. Beyond the newest HELD_MAX, or older than
        HELD_MAX_AGE, a held reply is given up (it stays in its conversation)."""
        held = sorted((d for d in await asyncio.to_thread(self.store.outbox_pending, chat_key)
                       if d.get("held")), key=lambda d: d["created"])
        now = self.clock()
        stale = [d for i, d in enumerate(held)
                 if i < len(held) - HELD_MAX or now - d["created"] > HELD_MAX_AGE]
        for doc in stale:
            await asyncio.to_thread(self.store.outbox_done, doc["id"])
            await asyncio.to_thread(self.records.event, now, "undelivered",
                                    doc.get("conversation_id") or chat_key,
                                    f"held too long: {doc['held']}")
            await self._tell_refused(Outbound.from_doc(doc), f"held too long: {doc['held']}")
        if stale:
            log.info("gave up %d held replies for %s (held too long)", len(stale), chat_key)

    async def _give_up(self, outbound: Outbound, exc: DeliveryError) -> None:
        """A delivery retrying cannot help. The reply stays in the conversation either way."""
        chat_key = outbound.chat_key
        await asyncio.to_thread(self.store.outbox_done, outbound.id)
        where = outbound.conversation_id or chat_key
        if exc.chat_blocked:
            log.warning("giving up delivery to %s: %s", chat_key, exc)
            self._unmarked.discard(chat_key)
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, "undeliverable",
                                    self.clock())
            await asyncio.to_thread(self.records.event, self.clock(), "undeliverable", where,
                                    str(exc))
            await self._tell_refused(outbound, str(exc))
            return
        log.warning("a %s for %s could not be delivered: %s", outbound.kind, chat_key, exc)
        await asyncio.to_thread(self.records.event, self.clock(), "undelivered", where, str(exc))
        await self._tell_refused(outbound, str(exc))
        if outbound.kind != "notice":  # a notice that fails is not announced by another
            text = (f"A reply could not be delivered ({exc}). Ask again if you need it; the "
                    "conversation goes on." if outbound.kind == "reply" else
                    f"The voice note could not be delivered ({exc}); the reply is written "
                    "above.")
            notice = Outbound(chat_key=chat_key, created=self.clock(), kind="notice", text=text)
            await asyncio.to_thread(self.store.outbox_add, notice.to_doc())
            self.wake(chat_key)  # sent by this worker's next pass, after this flush


def rerouted(outbound: Outbound, chat_key: str, note: str) -> Outbound:
    """`outbound` for another chat, `note` above it: the person's next chat (then the ones
    after it stay its fallbacks) or the platform's fallback chat. Its id follows from the
    original's: a crash before the original is done makes the next pass find it queued (or
    sent) and not queue it twice."""
    later = outbound.fallbacks[1:] if outbound.fallbacks[:1] == (chat_key,) else ()
    return dataclasses.replace(
        outbound, id=inbound_id(outbound.created, f"{outbound.id}:fallback"), chat_key=chat_key,
        text=f"{note}\n\n{outbound.text}", parts_sent=0, pieces_sent=0, attempting=None,
        held=None, fallbacks=later,
        # The original's message ids mean nothing in another chat.
        platform_ids=(), reply_to=None)
