"""The conversation engine: one worker per chat, fed from the persisted inbox.

`submit()` writes an inbound message to the inbox and wakes the chat's worker. The worker owns the
chat: it first sends what waits in the chat's outbox, then takes every pending inbox item and
answers them in one turn (messages that arrived during a turn are answered together in the
next), one turn at a time, so a chat's messages are answered in order. Commands run in their
place in that order. Because the inbox is the queue, a restart resumes exactly where a crash left
off, and `stop()` can cancel a turn without losing its messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import Callable, Mapping

from daemon.core.approval import Button
from daemon.core.config import Settings
from daemon.core.errors import StoreError
from daemon.core.logs import turn_log as log
from daemon.core.messages import Channel, Inbound, Outbound
from daemon.engine.answering import Answering
from daemon.engine.delivery import Delivery, DeliveryHooks
from daemon.engine.set_aside import SetAside
from daemon.engine.upkeep import Upkeep, bounded
from daemon.engine.voice_replies import VoiceReplies
from daemon.intake.quarantine import ATTEMPTS
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.turn.parts import TurnParts
from daemon.turn.runner import MAX_BACKOFF
from daemon.voice.hearing import Hearing, no_wait
from daemon.voice.speaking import Speaking

# The chat whose worker the current task is, or works for (a turn's stoppable part runs in a
# task of its own, which inherits this): a notice from there goes out at once.
_working_for: contextvars.ContextVar[str | None] = contextvars.ContextVar("roost_working_for",
                                                                         default=None)
WORKER_IDLE_EXIT = 600.0
UNWIND = 2.0  # seconds cancelled tasks get to finish at stop, per step


class Engine:
    """Per-chat workers over the inbox and outbox; see the module docstring."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        llm: ModelClient,
        channels: Mapping[str, Channel],
        clock: Callable[[], float] = time.time,
        parts: TurnParts,
        hooks: DeliveryHooks | None = None,
        voice: Hearing | None = None,
        speaking: Speaking | None = None,
    ) -> None:
        """`parts` are shared with the automations (daemon/app/assembly.py builds both);
        `hooks` listen to the outbox (see DeliveryHooks); `voice` transcribes recordings
        before their turn (none: they reach the model as attachment notes); `speaking` speaks
        replies (daemon.engine.voice_replies; none: roost does not speak). The index is
        filled at start() and closed at stop(): an engine runs once."""
        self.settings = settings
        self.store = store
        self.channels = dict(channels)
        self.clock = clock
        self.parts = parts
        speech = settings.speech
        self.speech = VoiceReplies(
            store=store, speaking=speaking, clock=clock, wake=self._kick,
            hold=llm.slot if speech.queue_with_model else no_wait,
            max_seconds=speech.max_duration)
        self.delivery = Delivery(settings=settings, store=store, records=self.parts.records,
                                 channels=self.channels, clock=clock, wake=self._kick,
                                 hooks=hooks, voice=self.speech)
        self.answering = Answering(self.parts, self.channels, self.notify, voice, self.speech)
        self.upkeep = Upkeep(self.parts, lambda: {
            k for k in self._workers if k in self._in_turn or self._depth.get(k)})
        self._workers: dict[str, asyncio.Task[None]] = {}
        # Seconds a chat's worker waits with nothing to do before it goes (a new message
        # starts another); tests shorten it.
        self.worker_idle_exit = WORKER_IDLE_EXIT
        self._wake: dict[str, asyncio.Event] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self._depth: dict[str, int] = {}
        self._in_turn: set[str] = set()
        self.set_aside = SetAside(store, clock, self.notify)
        self._accepting = False
        self._drain_until: float | None = None  # the event loop's time the drain ends

    async def start(self) -> None:
        """Resume what a previous run left: pending inbox items and unsent replies."""
        self._accepting = True
        self.upkeep.start()
        inbox = await asyncio.to_thread(self.store.inbox_pending)
        outbox = await asyncio.to_thread(self.store.outbox_pending)
        self.delivery.resumed(outbox)
        resumed = {i["chat_key"] for i in inbox} | {o["chat_key"] for o in outbox}
        for chat_key in sorted(resumed):
            self._kick(chat_key)
        if resumed:
            log.info("resuming %d inbox and %d outbox items in %d chats",
                     len(inbox), len(outbox), len(resumed))

    async def drain(self, grace: float) -> None:
        """Take no new work (submit answers False, /healthz 503) and give turns in flight up
        to `grace` seconds to finish. The grace runs once: a second call (stop() after the
        daemon drained) waits only for what is left of the first one's deadline."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        if self._drain_until is None:
            self._drain_until = loop.time() + grace
        for wake in self._wake.values():
            wake.set()
        left = self._drain_until - loop.time()
        if self._in_turn and left > 0:
            log.info("waiting up to %.1fs for %d turns in flight", left, len(self._in_turn))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._turns_settled(set(self._in_turn))

    async def _turns_settled(self, chats: set[str]) -> None:
        """Until each of these chats is idle or its turn waits for the user to answer an
        approval question: such a turn is cancelled by the stop and asked again after the
        start, so waiting for the answer would only hold the stop for the whole grace."""
        approvals = self.parts.approvals
        while busy := [k for k in chats if not self._idle[k].is_set()
                       and (approvals is None or not approvals.waiting_in(k))]:
            waits = [asyncio.ensure_future(self._idle[k].wait()) for k in busy]
            if approvals is not None:
                waits.append(asyncio.ensure_future(approvals.changed.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    async def stop(self, grace: float, unwind: float = UNWIND) -> None:
        """Drain (once: see drain), then cancel what is left and close the index. A cancelled
        turn loses nothing: its messages stay in the inbox and are answered after the next
        start. Cancelled tasks get `unwind` seconds each step to finish; one that does not is
        logged and left, so that a stuck task cannot hold the stop past its budget."""
        await self.upkeep.stop_sweep(unwind)
        await self.drain(grace)
        for task in self._workers.values():
            task.cancel()
        await bounded("chat workers", list(self._workers.values()), unwind)
        self._workers.clear()
        await self.upkeep.stop(unwind)

    @property
    def accepting(self) -> bool:
        return self._accepting

    async def submit(self, inbound: Inbound) -> bool:
        """Persist `inbound` and wake its chat's worker; False when shutting down."""
        if not self._accepting:
            return False
        if await asyncio.to_thread(self.store.inbox_add, inbound.to_doc()):
            if inbound.command == "stop":  # now: the chat's queue waits behind the reply
                self.answering.stop(inbound)
            elif self.parts.approvals is not None:  # told at once if a question holds the chat
                self.parts.approvals.nudge(inbound.chat_key)
            self._depth[inbound.chat_key] = self._depth.get(inbound.chat_key, 0) + 1
            self._kick(inbound.chat_key)
        return True

    def stop_reply(self, chat_key: str) -> bool:
        """Stop the reply being written in the chat (Ctrl-C in `roost chat`); False if none."""
        return self.answering.turns.stops.stop(chat_key)

    def queue_depths(self) -> dict[str, int]:
        """Pending inbound messages per chat (for /healthz)."""
        return {k: v for k, v in self._depth.items() if v}

    async def wait_idle(self, chat_key: str) -> None:
        """Wait until the chat has nothing pending and no turn running."""
        idle = self._idle.get(chat_key)
        if idle is not None:
            await idle.wait()

    async def notify(self, chat_key: str, text: str, *, buttons: tuple[Button, ...] = ()) -> None:
        """Send a notice (not part of the conversation) through the outbox. Only the chat's
        worker sends its outbox, so replies and notices never race: called from the worker (a
        turn), the notice goes out at once; from anywhere else (a channel telling the user
        about a broken photo), the worker is woken to send it."""
        outbound = Outbound(chat_key=chat_key, text=text, created=self.clock(), kind="notice",
                            buttons=buttons)
        await asyncio.to_thread(self.store.outbox_add, outbound.to_doc())
        if _working_for.get() == chat_key:
            await self._flush_outbox(chat_key)
        else:
            self._kick(chat_key)

    async def deliver(self, outbound: Outbound) -> bool:
        """Queue a message that answers nothing the chat sent (see Delivery.queue)."""
        return await self.delivery.queue(outbound)

    async def release(self, chat_key: str) -> int:
        """The user wrote: replies held until then go out (see Delivery.release)."""
        return await self.delivery.release(chat_key)

    def _kick(self, chat_key: str) -> None:
        self._wake.setdefault(chat_key, asyncio.Event()).set()
        self._idle.setdefault(chat_key, asyncio.Event()).clear()
        task = self._workers.get(chat_key)
        if task is None or task.done():
            self._workers[chat_key] = asyncio.create_task(self._worker(chat_key),
                                                          name=f"roost-chat-{chat_key}")

    async def _worker(self, chat_key: str) -> None:
        _working_for.set(chat_key)  # the turn's own tasks (its stoppable part) inherit it
        wake, idle = self._wake[chat_key], self._idle[chat_key]
        failures = errors = 0
        while True:
            wake.clear()
            try:
                if await self._work_once(chat_key, wake, idle):
                    # Idle for a while: the chat's worker and its state go, so a chat that
                    # wrote once (a stranger given a pairing code) leaves nothing behind. No
                    # await since the worker last looked: a `_kick` meanwhile would have set
                    # `wake`, and one after this starts a new worker.
                    for state in (self._workers, self._wake, self._idle, self._depth):
                        state.pop(chat_key, None)
                    self.delivery.forget(chat_key)
                    return
                failures = errors = 0
            except StoreError as exc:
                # A full or failing disk: nothing is marked done, so everything is retried.
                failures += 1
                delay = min(self.settings.model.retry_backoff * 2**failures, MAX_BACKOFF)
                log.error("chat %s cannot use the store (%s); retrying in %.0fs",
                          chat_key, exc, delay)
                await self._sleep_or_wake(wake, delay)
            except Exception as exc:
                # The boundary of a chat's work: whatever an item does, the worker lives. The
                # item is tried once more, then quarantined so that the chat carries on.
                errors += 1
                stuck = await self.set_aside.failed(chat_key, exc, errors)
                errors %= ATTEMPTS
                if stuck:  # the item stays: do not spin on it
                    await self._sleep_or_wake(wake, MAX_BACKOFF)
            finally:
                self.set_aside.done(chat_key)

    async def _work_once(self, chat_key: str, wake: asyncio.Event, idle: asyncio.Event) -> bool:
        """Send what waits in the outbox, then answer what waits in the inbox; True when the
        chat has been idle for `worker_idle_exit` seconds (the worker may go)."""
        if not await self._flush_outbox(chat_key):
            await self._sleep_or_wake(wake, self.delivery.delay(chat_key))
            return False
        docs = await asyncio.to_thread(self.store.inbox_pending, chat_key)
        self._depth[chat_key] = len(docs)
        if not docs or not self._accepting:
            if not wake.is_set():
                # Idle only when nothing came in since this pass looked: a message queued
                # during it is not in what it sent, and `wait_idle` must wait for that too.
                idle.set()
            await self._sleep_or_wake(wake, self.worker_idle_exit)
            return not wake.is_set() and self._accepting and chat_key not in self.answering.parked
        idle.clear()
        self._in_turn.add(chat_key)
        self.set_aside.doing(chat_key, "inbox", docs)
        try:
            await self.answering.handle([Inbound.from_doc(d) for d in docs], functools.partial(
                self.set_aside.doing, chat_key, "inbox"))
        finally:
            self._in_turn.discard(chat_key)
        if chat_key in self.answering.parked:
            await self._sleep_or_wake(wake, self.answering.park_interval())
        return False

    async def _flush_outbox(self, chat_key: str) -> bool:
        """Send the chat's outbox in order; False when a delivery failed and must wait."""
        with self.set_aside.aside(chat_key):
            return await self.delivery.send(
                chat_key, lambda doc: self.set_aside.doing(chat_key, "outbox", [doc]))

    @staticmethod
    async def _sleep_or_wake(wake: asyncio.Event, seconds: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # lands just as the event fires, and stop() would wait for this worker forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()
