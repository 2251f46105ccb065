"""One durable intake for every channel: persist before the 200, dedupe, order, resume, quarantine.

A channel verifies a webhook call, parses it, decides whether roost handles it (`admit`), and
hands the raw payload to `Intake.accept` with its platform key and chat. The intake:

* **persists** the payload before `accept` returns, so the platform gets its 200 only for what
  is on disk. Payloads that arrive together share one write and one fsync (group commit): while
  one write is in flight the next callers queue, and the next write takes them all.
* **dedupes** by the platform key: a redelivery (also after a restart, for 14 days) returns
  False and is not processed again.
* **orders**: one worker per chat processes its payloads in arrival order, through the channel's
  `Handler.process` (translate, download, `engine.submit`). Payloads the handler groups (a
  Telegram album) wait `group_window` seconds for each other and are processed together.
* **resumes**: what an earlier run accepted but did not finish is processed at `resume()`.
* **quarantines**: a payload whose processing raises is tried once more; if it fails again it is
  moved to the store's quarantine with its error (`roost doctor` lists it), its sender is told
  that roost could not read it (`Handler.unreadable`), and the chat carries on. A full disk is
  not the payload's fault: it is retried, and left pending at worst.

A worker survives any exception and logs it; no stored payload can stop the daemon starting.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from daemon.core.errors import StoreError
from daemon.core.ids import inbound_id
from daemon.core.logs import intake_log as log
from daemon.core.messages import Inbound
from daemon.intake.quarantine import ATTEMPTS, error_text, set_aside
from daemon.store import Store

STORE_RETRY_DELAY = 1.0  # seconds, doubled per retry
STORE_RETRY_MAX = 60.0  # seconds between tries while the disk refuses
# An OSError a handler lets through with one of these (a folder made for an attachment) is the
# disk's fault like a StoreError: waited out, one line each time, never quarantined.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Submitter(Protocol):
    """What a channel's handler needs of the engine."""

    async def submit(self, inbound: Inbound) -> bool: ...

    async def notify(self, chat_key: str, text: str) -> None: ...

    async def release(self, chat_key: str) -> int:
        """The user wrote again: held replies go out, a blocked chat is unmarked (how many
        replies that released)."""
        ...


class Outcome(enum.Enum):
    DONE = "done"  # handled: remember the key so a redelivery is dropped
    DROPPED = "dropped"  # left nothing behind (e.g. a stranger): forget it entirely
    LATER = "later"  # the engine is stopping: stays stored for the next start


@dataclass(frozen=True)
class Pending:
    """One stored payload on its way through a chat's worker."""

    key: str
    chat: str
    payload: Mapping[str, Any]
    received: float
    resumed: bool  # stored by an earlier run: may already have been submitted

    @property
    def inbound_id(self) -> str:
        """The id of the Inbound made of it: derived from the payload, the same at every pass."""
        return inbound_id(self.received, self.key)

    async def submitted_before(self, store: Store) -> bool:
        """Whether a crash came after this payload's Inbound was submitted (the payload stayed
        stored): its second pass must not submit it twice. Checked before any download, so a
        resumed payload does not fetch its media twice either."""
        if self.resumed and await asyncio.to_thread(store.inbox_known, self.inbound_id):
            log.info("%s was submitted before the last stop; not again", self.key)
            return True
        return False


class Handler(Protocol):
    """What a channel gives the intake."""

    def route(self, payload: Mapping[str, Any]) -> str | None:
        """The chat of a stored payload (to resume it), None when it has none."""
        ...

    def group(self, item: Pending) -> str | None:
        """Payloads with the same group are processed together (an album); None for most."""
        ...

    async def process(self, batch: list[Pending]) -> Outcome:
        """Admit, translate and submit; raising counts as a failure of the payloads."""
        ...

    async def unreadable(self, batch: list[Pending]) -> None:
        """The payloads were set aside unread: tell their sender so in one short line
        (`quarantine.UNREADABLE`), where the chat is one roost answers and the sender may
        talk; else nothing (a stranger gets what strangers always get, at the door)."""
        ...


class GroupCommit:
    """Writes accepted payloads in groups: whoever arrives during a write joins the next."""

    def __init__(self, store: Store, channel: str) -> None:
        self.store = store
        self.channel = channel
        # A thread of its own: in the default executor the commit would queue behind the
        # turns' store calls, and every ack would wait for them.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="roost-commit")
        self._waiting: list[tuple[str, Mapping[str, Any], float, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # for tests and the bench: how many group writes were made

    async def accept(self, key: str, payload: Mapping[str, Any], received: float) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, payload, received, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="roost-group-commit")
        return await future

    async def _write_all(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting, []
            items = [(key, payload, received) for key, payload, received, _ in group]
            try:
                answers = await asyncio.get_running_loop().run_in_executor(
                    self._thread, self.store.updates_accept_many, self.channel, items)
            except Exception as exc:  # every caller in the group answers "not stored"
                for *_, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.writes += 1
            for (*_, future), new in zip(group, answers, strict=True):
                if not future.done():
                    future.set_result(new)

    async def close(self) -> None:
        """Finish the write in flight, then release the thread."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        self._thread.shutdown(wait=False)


class Intake:
    """The durable intake of one channel; see the module docstring."""

    def __init__(self, *, store: Store, channel: str, handler: Handler,
                 group_window: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.channel = channel
        self.handler = handler
        self.group_window = group_window
        self.clock = clock
        self.commit = GroupCommit(store, channel)
        self.store_retry_delay = STORE_RETRY_DELAY  # the first pause; tests shorten it
        self._queues: dict[str, asyncio.Queue[Pending]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    async def accept(self, key: str, chat: str, payload: Mapping[str, Any]) -> bool:
        """Persist one payload before the platform is answered; False for a redelivery.
        Raises (`StoreError`) when it could not be stored: the platform must retry."""
        now = self.clock()
        if not await self.commit.accept(key, payload, now):
            log.info("%s %s delivered again; dropped", self.channel, key)
            return False
        self._enqueue(Pending(key, chat, payload, now, resumed=False))
        return True

    async def resume(self) -> int:
        """Queue what an earlier run accepted but did not finish; returns how many."""
        pending = await asyncio.to_thread(self.store.updates_pending, self.channel)
        for doc in pending:
            try:
                chat = self.handler.route(doc["payload"])
            except Exception as exc:  # the boundary of one stored payload
                log.exception("%s payload %s cannot be resumed", self.channel, doc["key"])
                await self._quarantine(doc, f"cannot be resumed: {exc!r}")
                continue
            if chat is None:
                await asyncio.to_thread(self.store.updates_done, doc["key"], remember=False)
                continue
            self._enqueue(Pending(doc["key"], chat, doc["payload"], doc["received"],
                                  resumed=True))
        if pending:
            log.info("resuming %d %s payloads received before the last stop", len(pending),
                     self.channel)
        return len(pending)

    async def stop(self) -> None:
        """Cancel the workers; what they had not finished stays stored for `resume()`."""
        for task in self._workers.values():
            task.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
        self._workers.clear()
        self._queues.clear()
        await self.commit.close()

    def waiting(self, chat: str) -> int:
        """Payloads of `chat` queued behind the one being processed."""
        queue = self._queues.get(chat)
        return queue.qsize() if queue is not None else 0

    async def idle(self) -> None:
        """Wait until every queued payload has been processed (for tests and shutdown)."""
        await asyncio.gather(*(queue.join() for queue in list(self._queues.values())))

    # ---- the per-chat worker ---------------------------------------------------------------

    def _enqueue(self, item: Pending) -> None:
        queue = self._queues.setdefault(item.chat, asyncio.Queue())
        queue.put_nowait(item)
        task = self._workers.get(item.chat)
        if task is None or task.done():
            self._workers[item.chat] = asyncio.create_task(
                self._worker(item.chat, queue), name=f"roost-{self.channel}-{item.chat}")

    async def _worker(self, chat: str, queue: asyncio.Queue[Pending]) -> None:
        carry: Pending | None = None
        # A worker lives while its chat has payloads queued, so chats that wrote once leave no
        # task behind.
        while carry is not None or not queue.empty():
            item = carry or queue.get_nowait()
            carry = None
            batch = [item]
            try:
                carry = await self._gather_group(batch, queue)
                await self._process(batch)
            except Exception:  # never let one payload end the chat's worker
                log.exception("%s worker for %s failed on %s", self.channel, chat,
                              ", ".join(i.key for i in batch))
            finally:
                # task_done once per item taken from the queue; the carried one is not done yet.
                for _ in batch:
                    queue.task_done()
        # No await between the emptiness check and here: nothing can be queued in between.
        self._workers.pop(chat, None)
        self._queues.pop(chat, None)

    async def _gather_group(self, batch: list[Pending], queue: asyncio.Queue[Pending]
                            ) -> Pending | None:
        """Collect the payloads of the first one's group; returns the next one of another."""
        group = self.handler.group(batch[0])
        while group is not None:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
                # cancellation that stop() sends.
                async with asyncio.timeout(self.group_window):
                    following = await queue.get()
            except TimeoutError:
                return None
            if self.handler.group(following) != group:
                return following
            batch.append(following)
        return None

    async def _process(self, batch: list[Pending]) -> None:
        keys = ", ".join(item.key for item in batch)
        store_failures = failures = 0
        while True:
            try:
                outcome = await self.handler.process(batch)
            except (StoreError, OSError) as exc:
                if not isinstance(exc, StoreError) and exc.errno not in _DISK_FULL:
                    failures += 1  # any other OSError: the payload's boundary below
                    if await self._failed(batch, keys, exc, failures):
                        return
                    continue
                # A full or failing disk is not the payload's fault: it stays pending and is
                # tried again here, with growing pauses, until the disk takes it. Giving up
                # would leave it on disk but out of the queue until the next start, with the
                # platform's redeliveries dropped as known and later messages answered first.
                store_failures += 1
                delay = min(self.store_retry_delay * 2 ** (store_failures - 1),
                            STORE_RETRY_MAX)
                log.error("cannot store %s payloads %s (%s); try %d, again in %.0fs",
                          self.channel, keys, exc, store_failures, delay)
                await asyncio.sleep(delay)
                continue
            except Exception as exc:
                failures += 1
                if await self._failed(batch, keys, exc, failures):
                    return
                continue
            if outcome is not Outcome.LATER:
                try:
                    for item in batch:
                        await asyncio.to_thread(self.store.updates_done, item.key,
                                                remember=outcome is Outcome.DONE)
                except StoreError as exc:  # processed; only the mark is missing
                    log.error("cannot mark %s payloads %s done (%s); a redelivery is taken as "
                              "new", self.channel, keys, exc)
            return

    async def _failed(self, batch: list[Pending], keys: str, exc: Exception,
                      failures: int) -> bool:
        """The boundary of one payload's processing: a bug or a poison payload must not kill
        the chat's worker, nor fail again at every start. True once it is set aside."""
        log.error("processing %s payloads %s failed (attempt %d of %d)", self.channel, keys,
                  failures, ATTEMPTS, exc_info=exc)
        if failures < ATTEMPTS:
            return False
        error = error_text(exc)
        kept = [await self._quarantine({"channel": self.channel, "key": item.key,
                                        "chat_key": item.chat, "payload": dict(item.payload),
                                        "received": item.received}, error)
                for item in batch]
        if all(kept):  # else it stays pending and is tried again: told then, if ever
            await self._tell_unreadable(batch, keys)
        return True

    async def _tell_unreadable(self, batch: list[Pending], keys: str) -> None:
        try:
            await self.handler.unreadable(batch)
        except Exception:  # the payload is kept; only the courtesy line is missing
            log.exception("cannot tell the sender of %s payloads %s that they were not read",
                          self.channel, keys)

    async def _quarantine(self, doc: Mapping[str, Any], error: str) -> bool:
        """Set a payload aside with its error; the chat goes on without it. False when the
        store refused (it stays pending)."""
        key = str(doc["key"])
        return await set_aside(self.store, "update", [(key, doc)], error, self.clock(),
                               lambda: self.store.updates_done(key), f"{self.channel} {key}",
                               log)
