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
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from daemon.core.config import Settings
from daemon.core.conversations import kind_of
from daemon.core.errors import DeliveryError, StoreError
from daemon.core.ids import inbound_id
from daemon.core.logs import turn_log as log
from daemon.core.messages import Channel, Inbound, Outbound
from daemon.engine.chat_commands import Commands
from daemon.intake.quarantine import ATTEMPTS, error_text, set_aside
from daemon.llm.client import ModelClient, holding_model
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.store.memory_index import MemoryIndex
from daemon.tools.builtin import register_builtin
from daemon.tools.registry import Registry
from daemon.turn.folder import Folder
from daemon.turn.prompting import Prompting
from daemon.turn.router import Router
from daemon.turn.runner import MAX_BACKOFF, Outcome, TurnRunner

DELIVERY_RETRY_MAX = 300.0
WORKER_IDLE_EXIT = 600.0
UNWIND = 2.0  # seconds cancelled tasks get to finish at stop, per step
HELD_MAX = 20  # replies kept per chat while the platform waits for the user to write
HELD_MAX_AGE = 7 * 86400.0  # seconds a reply may wait for that
UNDELIVERABLE = ("the platform refused this chat earlier (the user blocked the bot or removed "
                 "it); nothing is sent to it until the user writes again")


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
        index: MemoryIndex | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.channels = dict(channels)
        self.clock = clock
        self.router = Router(store, settings.daemon.idle_rotation)
        self.records = Records(store.state_dir, settings.daemon.tz)
        self.registry = Registry()
        register_builtin(self.registry)
        # Derived from the store and rebuilt from it when lost; filled at start(), closed at
        # stop() (an engine runs once). The daemon opens it with the store, so that a disk
        # that cannot take it stops the start before anything else runs.
        self.index = index or MemoryIndex.open(store.state_dir / "memory.sqlite3")
        self.prompting = Prompting(settings=settings, store=store, llm=llm,
                                   registry=self.registry, clock=clock)
        self.folder = Folder(settings=settings, store=store, llm=llm, records=self.records,
                             clock=clock, on_fold=self.index.mark_dirty)
        self.commands = Commands(settings=settings, store=store, router=self.router, llm=llm,
                                 prompting=self.prompting, folder=self.folder, clock=clock)
        self.turns = TurnRunner(settings=settings, store=store, llm=llm, router=self.router,
                                prompting=self.prompting, registry=self.registry,
                                index=self.index, records=self.records,
                                notify=self.notify, stream=self._stream, clock=clock,
                                folder=self.folder)
        self._rotation: asyncio.Task[None] | None = None
        self._indexing: asyncio.Task[int] | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        # Seconds a chat's worker waits with nothing to do before it goes (a new message
        # starts another); tests shorten it.
        self.worker_idle_exit = WORKER_IDLE_EXIT
        self._wake: dict[str, asyncio.Event] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self._depth: dict[str, int] = {}
        self._in_turn: set[str] = set()
        self._parked: set[str] = set()
        self._delivery_failures: dict[str, int] = {}
        # What each chat's worker is doing, to quarantine it if it fails twice.
        self._current: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        self._accepting = False
        self._drain_until: float | None = None  # the event loop's time the drain ends
        # Told of each outbox item the platform took, while the item (with what the channel
        # recorded on it, e.g. `platform_ids`) is still in the outbox: a crash before it is
        # forgotten tells again. Automations record their runs' message ids this way.
        self.on_sent: Callable[[Outbound], Awaitable[None]] | None = None
        # Told of each outbox item given up without being delivered (the platform refused it
        # or its chat, or it was held too long), with the reason: a run's report refused is
        # on its record, not a success.
        self.on_refused: Callable[[Outbound, str], Awaitable[None]] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume what a previous run left: pending inbox items and unsent replies."""
        self._accepting = True
        self._rotation = asyncio.create_task(self._rotation_loop(), name="roost-rotation")
        # Catch the search index up with the store (everything, the first time) in the
        # background; a search before it is done syncs what it needs itself.
        self._indexing = asyncio.create_task(asyncio.to_thread(self.index.sync, self.store),
                                             name="roost-index")
        inbox = await asyncio.to_thread(self.store.inbox_pending)
        outbox = await asyncio.to_thread(self.store.outbox_pending)
        resumed = {i["chat_key"] for i in inbox} | {o["chat_key"] for o in outbox}
        for chat_key in sorted(resumed):
            self._kick(chat_key)
        if resumed:
            log.info("resuming %d inbox and %d outbox items in %d chats",
                     len(inbox), len(outbox), len(resumed))

    async def drain(self, grace: float) -> None:
        """Take no new work (submit answers False, /healthz 503) and give turns in flight up
        to `grace` seconds to finish.

        The grace runs once: a second call (stop() after the daemon drained) waits only for
        what is left of the first one's deadline.
        """
        self._accepting = False
        loop = asyncio.get_running_loop()
        if self._drain_until is None:
            self._drain_until = loop.time() + grace
        for wake in self._wake.values():
            wake.set()
        left = self._drain_until - loop.time()
        if self._in_turn and left > 0:
            busy = [self._idle[k].wait() for k in self._in_turn]
            log.info("waiting up to %.1fs for %d turns in flight", left, len(busy))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await asyncio.gather(*busy)

    async def stop(self, grace: float, unwind: float = UNWIND) -> None:
        """Drain (once: see drain), then cancel what is left and close the index.

        A cancelled turn loses nothing: its messages stay in the inbox and are answered after
        the next start. Cancelled tasks get `unwind` seconds each step to finish; one that does
        not is logged and left, so that a stuck task cannot hold the stop past its budget.
        """
        if self._rotation is not None:
            self._rotation.cancel()
            await _bounded("the rotation sweep", [self._rotation], unwind)
        await self.drain(grace)
        for task in self._workers.values():
            task.cancel()
        await _bounded("chat workers", list(self._workers.values()), unwind)
        self._workers.clear()
        await self.folder.stop(unwind)
        # Closing first makes a first full build stop at its next conversation; a long one
        # keeps the index busy (and its lock held), so both are bounded like the steps above.
        closing = asyncio.create_task(asyncio.to_thread(self.index.close))
        await _bounded("index steps (closing, syncing)",
                       [closing, *([self._indexing] if self._indexing is not None else [])],
                       unwind)

    # ---- taking work -----------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._accepting

    async def submit(self, inbound: Inbound) -> bool:
        """Persist `inbound` and wake its chat's worker; False when shutting down."""
        if not self._accepting:
            return False
        if await asyncio.to_thread(self.store.inbox_add, inbound.to_doc()):
            self._depth[inbound.chat_key] = self._depth.get(inbound.chat_key, 0) + 1
            self._kick(inbound.chat_key)
        return True

    def queue_depths(self) -> dict[str, int]:
        """Pending inbound messages per chat (for /healthz)."""
        return {k: v for k, v in self._depth.items() if v}

    async def wait_idle(self, chat_key: str) -> None:
        """Wait until the chat has nothing pending and no turn running."""
        idle = self._idle.get(chat_key)
        if idle is not None:
            await idle.wait()

    async def rotate_idle(self) -> list[str]:
        """Archive conversations idle for `daemon.idle_rotation` (the timer calls this)."""
        now = self.clock()
        busy = {k for k in self._workers if k in self._in_turn or self._depth.get(k)}
        archived = await asyncio.to_thread(self.router.rotate_idle, now, busy)
        for conversation in archived:
            idle_for = (now - conversation.last_active) / 3600
            await asyncio.to_thread(self.records.event, now, "rotation", conversation.id,
                                    f"{conversation.chat_key} idle for {idle_for:.1f} h; archived")
        return [c.id for c in archived]

    async def _rotation_loop(self) -> None:
        interval = min(60.0, max(self.settings.daemon.idle_rotation / 10, 1.0))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.rotate_idle()
            except Exception:
                log.exception("idle rotation sweep failed; trying again in %.0fs", interval)

    async def notify(self, chat_key: str, text: str) -> None:
        """Send a notice (not part of the conversation) through the outbox.

        Only the chat's worker sends its outbox, so replies and notices never race: called
        from the worker (a turn), the notice goes out at once; from anywhere else (a channel
        telling the user about a broken photo), the worker is woken to send it.
        """
        outbound = Outbound(chat_key=chat_key, text=text, created=self.clock(), kind="notice")
        await asyncio.to_thread(self.store.outbox_add, outbound.to_doc())
        if asyncio.current_task() is self._workers.get(chat_key):
            await self._flush_outbox(chat_key)
        else:
            self._kick(chat_key)

    async def deliver(self, outbound: Outbound) -> bool:
        """Queue a message that answers nothing the chat sent (an automation's report, a
        reminder) and wake the chat's worker to send it. Idempotent by the outbound's id: one
        already queued or sent is not queued again (False), so a retry cannot send it twice."""
        def add() -> bool:
            queued = any(d["id"] == outbound.id
                         for d in self.store.outbox_pending(outbound.chat_key))
            if queued or self.store.was_sent(outbound.id):
                return False
            self.store.outbox_add(outbound.to_doc())
            return True

        added = await asyncio.to_thread(add)
        self._kick(outbound.chat_key)
        return added

    def wake(self, chat_key: str) -> None:
        """Have the chat's worker look at its inbox and outbox again (e.g. replies that were
        held until the user wrote are free to go)."""
        self._kick(chat_key)

    # ---- the worker ------------------------------------------------------------------------

    def _kick(self, chat_key: str) -> None:
        self._wake.setdefault(chat_key, asyncio.Event()).set()
        self._idle.setdefault(chat_key, asyncio.Event()).clear()
        task = self._workers.get(chat_key)
        if task is None or task.done():
            self._workers[chat_key] = asyncio.create_task(
                self._worker(chat_key), name=f"roost-chat-{chat_key}"
            )

    async def _worker(self, chat_key: str) -> None:
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
                    for state in (self._workers, self._wake, self._idle, self._depth,
                                  self._delivery_failures):
                        state.pop(chat_key, None)
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
                log.exception("chat %s: processing %s failed (attempt %d of %d)", chat_key,
                              self._current.get(chat_key, ("nothing",))[0], errors, ATTEMPTS)
                if errors >= ATTEMPTS:
                    errors = 0
                    try:
                        done = await self._quarantine_current(chat_key, exc)
                    except Exception:  # still the boundary: the worker outlives this too
                        log.exception("chat %s: quarantining failed", chat_key)
                        done = False
                    if not done:  # the item stays: do not spin on it
                        await self._sleep_or_wake(wake, MAX_BACKOFF)
            finally:
                self._current.pop(chat_key, None)

    async def _quarantine_current(self, chat_key: str, exc: Exception) -> bool:
        """Set aside what failed twice (an outbox item, or the inbox items of a turn); False
        when it could not be."""
        current = self._current.get(chat_key)
        if current is None:
            return False
        kind, docs = current
        ids = [str(doc["id"]) for doc in docs]

        def done() -> None:
            if kind == "outbox":
                self.store.outbox_done(ids[0])
            else:
                self.store.inbox_done(ids)

        if not await set_aside(self.store, kind, list(zip(ids, docs, strict=True)),
                               error_text(exc), self.clock(), done,
                               f"{len(docs)} {kind} items of {chat_key} (failed twice)", log):
            return False
        if kind == "inbox":
            with contextlib.suppress(Exception):  # the chat may be what is broken
                await self.notify(chat_key, (
                    "Something went wrong inside roost while answering. Please try again."))
        return True

    async def _work_once(self, chat_key: str, wake: asyncio.Event, idle: asyncio.Event) -> bool:
        """Send what waits in the outbox, then answer what waits in the inbox; True when the
        chat has been idle for `worker_idle_exit` seconds (the worker may go)."""
        if not await self._flush_outbox(chat_key):
            await self._sleep_or_wake(wake, self._delivery_delay(chat_key))
            return False
        docs = await asyncio.to_thread(self.store.inbox_pending, chat_key)
        self._depth[chat_key] = len(docs)
        if not docs or not self._accepting:
            if not wake.is_set():
                # Idle only when nothing came in since this pass looked: a message queued
                # during it is not in what it sent, and `wait_idle` must wait for that too.
                idle.set()
            await self._sleep_or_wake(wake, self.worker_idle_exit)
            return not wake.is_set() and self._accepting and chat_key not in self._parked
        idle.clear()
        self._in_turn.add(chat_key)
        self._current[chat_key] = ("inbox", docs)
        try:
            await self._handle([Inbound.from_doc(d) for d in docs])
        finally:
            self._in_turn.discard(chat_key)
        if chat_key in self._parked:
            await self._sleep_or_wake(wake, self._park_interval())
        return False

    async def _handle(self, items: list[Inbound]) -> None:
        """Run the leading command, or one turn for the messages before the next command."""
        chat_key = items[0].chat_key
        command = items[0].command
        if command in self.commands.names:
            handled = items[:1]
        else:
            handled = list(itertools.takewhile(
                lambda i: i.command not in self.commands.names, items))
        if command in self.commands.names:
            self._current[chat_key] = ("inbox", [handled[0].to_doc()])
            reply = await self.commands.run(command, chat_key)
            await self.notify(chat_key, reply)
            await asyncio.to_thread(self.store.inbox_done, [handled[0].id])
            return
        self._current[chat_key] = ("inbox", [i.to_doc() for i in handled])
        # The user is told about an outage once (by the turn's first failed try); while the
        # chat is parked, the retries are silent. An unexpected failure goes to the worker,
        # which tries the items once more and then quarantines them.
        announce = chat_key not in self._parked
        channel = self.channels.get(kind_of(chat_key))
        token = holding_model.set((lambda: channel.working(chat_key)) if channel else None)
        try:
            result = await self.turns.run(chat_key, handled, announce_outage=announce)
        finally:
            holding_model.reset(token)
        if result.outcome is Outcome.ANSWERED and result.conversation_id:
            self.folder.schedule(result.conversation_id, urgent=result.crowded)
        if result.outcome is Outcome.PARKED:
            self._parked.add(chat_key)
        else:
            self._parked.discard(chat_key)

    async def _flush_outbox(self, chat_key: str) -> bool:
        """Send the chat's outbox in order; False when a delivery failed and must wait."""
        # Called from inside a turn too (a notice): what the worker was doing before is what
        # it is doing again after, unless a send raises (then that item is the culprit).
        previous = self._current.get(chat_key)
        result = await self._send_outbox(chat_key)
        if previous is None:
            self._current.pop(chat_key, None)
        else:
            self._current[chat_key] = previous
        return result

    async def _send_outbox(self, chat_key: str) -> bool:
        docs = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        channel = self.channels.get(kind_of(chat_key))
        if docs and channel is None:
            log.warning("%d replies for %s wait: its channel is not enabled", len(docs), chat_key)
            return True
        if docs and "undeliverable" in await asyncio.to_thread(self.store.chat_flags, chat_key):
            # The platform refused this chat for good (the user blocked the bot); the replies
            # stay in the conversation. The channel clears the mark when the user writes again.
            log.info("dropping %d replies for %s: the chat is marked undeliverable",
                     len(docs), chat_key)
            for doc in docs:
                await asyncio.to_thread(self.store.outbox_done, doc["id"])
                await self._tell_refused(Outbound.from_doc(doc), UNDELIVERABLE)
            return True
        for doc in docs:
            if doc.get("held"):
                continue  # waits for the user to write again (the intake releases it)
            self._current[chat_key] = ("outbox", [doc])
            outbound = Outbound.from_doc(doc)
            if await asyncio.to_thread(self.store.was_sent, outbound.id):
                await asyncio.to_thread(self.store.outbox_done, outbound.id)  # crash after send
                continue
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
                failures = self._delivery_failures.get(chat_key, 0) + 1
                self._delivery_failures[chat_key] = failures
                log.warning("delivery to %s failed (%d in a row): %s", chat_key, failures, exc)
                return False
            self._delivery_failures.pop(chat_key, None)
            await self._tell_sent(outbound)
            await asyncio.to_thread(self.store.mark_sent, outbound.id, self.clock())
        return True

    async def _tell_sent(self, outbound: Outbound) -> None:
        if self.on_sent is None:
            return
        try:
            await self.on_sent(outbound)
        except Exception:  # a listener's bookkeeping: never a reason to send a message again
            log.exception("recording the delivery of %s to %s failed", outbound.id,
                          outbound.chat_key)

    async def _tell_refused(self, outbound: Outbound, reason: str) -> None:
        if self.on_refused is None:
            return
        try:
            await self.on_refused(outbound, reason)
        except Exception:  # a listener's bookkeeping: never a reason to stop this chat's sends
            log.exception("recording the refusal of %s by %s failed", outbound.id,
                          outbound.chat_key)

    async def _hold(self, outbound: Outbound, exc: DeliveryError) -> None:
        """The platform takes this reply only after the user writes again: send it through the
        fallback chat when there is one, else keep it (a restart keeps it too) until then."""
        where = outbound.conversation_id or outbound.chat_key
        if exc.fallback:
            # Its id follows from the original's: a crash before the original is done makes
            # the next pass find it queued (or sent) and not queue it twice.
            rerouted = dataclasses.replace(
                outbound, id=inbound_id(outbound.created, f"{outbound.id}:fallback"),
                chat_key=exc.fallback, text=f"{exc.note}\n\n{outbound.text}", parts_sent=0,
                pieces_sent=0, attempting=None,
                # The original's message ids mean nothing in another chat.
                platform_ids=(), reply_to=None)
            await self.deliver(rerouted)
            await asyncio.to_thread(self.store.outbox_done, outbound.id)
            await asyncio.to_thread(self.records.event, self.clock(), "rerouted", where,
                                    f"{exc}; sent to {exc.fallback}")
            log.info("a %s for %s went to %s instead: %s", outbound.kind, outbound.chat_key,
                     exc.fallback, exc)
            return
        # The platform answered with a refusal: nothing is in flight any more.
        await asyncio.to_thread(self.store.outbox_update, outbound.id, held=str(exc),
                                attempting=None)
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
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, "undeliverable",
                                    self.clock())
            await asyncio.to_thread(self.records.event, self.clock(), "undeliverable", where,
                                    str(exc))
            await self._tell_refused(outbound, str(exc))
            return
        log.warning("a %s for %s could not be delivered: %s", outbound.kind, chat_key, exc)
        await asyncio.to_thread(self.records.event, self.clock(), "undelivered", where, str(exc))
        await self._tell_refused(outbound, str(exc))
        if outbound.kind == "reply":  # a notice that fails is not announced by another
            notice = Outbound(chat_key=chat_key, created=self.clock(), kind="notice",
                              text=f"A reply could not be delivered ({exc}). Ask again if "
                                   "you need it; the conversation goes on.")
            await asyncio.to_thread(self.store.outbox_add, notice.to_doc())
            self._kick(chat_key)  # sent by this worker's next pass, after this flush

    def _stream(self, chat_key: str, delta: str) -> None:
        channel = self.channels.get(kind_of(chat_key))
        if channel is not None:
            channel.stream_delta(chat_key, delta)

    def _delivery_delay(self, chat_key: str) -> float:
        failures = self._delivery_failures.get(chat_key, 1)
        return min(self.settings.model.retry_backoff * 2 ** (failures - 1), DELIVERY_RETRY_MAX)

    def _park_interval(self) -> float:
        model = self.settings.model
        return min(model.retry_backoff * 2**model.retry_attempts, MAX_BACKOFF)

    @staticmethod
    async def _sleep_or_wake(wake: asyncio.Event, seconds: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # lands just as the event fires, and stop() would wait for this worker forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()


async def _bounded(what: str, tasks: list[asyncio.Task[Any]], seconds: float) -> None:
    """Wait up to `seconds` for cancelled tasks to finish; log the ones that do not."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(seconds, 0.0))
    if pending:
        log.warning("%d %s did not stop within %.1fs of being cancelled; leaving them",
                    len(pending), what, seconds)
