"""The model gate: who holds the model's request slots (`model.concurrency` calls at once).

A chat's call goes first: it stops a background call (the fold, which raises `Preempted` and is
tried again later) and queues ahead of automations. An automation's call (`scheduled`) waits
until no turn waits for or holds the model. A turn keeps its claim between its calls (`turn`),
so no background call evicts its prompt from Ollama's cache while its tools run, and gives it
up while it waits for the user (`waiting_for_user`). `slot` holds a request slot for other
work on the same GPU (a transcription), queued as the caller's own model call would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from daemon.core.errors import Preempted

T = TypeVar("T")
Call = Callable[[], Coroutine[Any, Any, T]]  # one model call, made when it may go

# Set while an automation runs (see `ModelGate.scheduled`): its calls queue behind turns.
# A context variable, so the turn path it shares with chats needs no priority argument. The
# model is not carried here: the turn passes it down explicitly, so that the budget, num_ctx
# and capabilities are all looked up for the model the request goes to.
_scheduled: contextvars.ContextVar[bool] = contextvars.ContextVar("roost_scheduled",
                                                                default=False)


class ModelGate:
    """The gate in front of Ollama's request slots; see the module docstring."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._gate = asyncio.Semaphore(concurrency)
        self._background: set[asyncio.Task[Any]] = set()
        self.in_flight = 0
        self.waiting = 0
        self.turns_active = 0
        self.scheduled_waiting = 0
        # Calls holding the model whose answer has been silent for `model.stall` now
        # (daemon/turn/silence.py): /healthz says so while the chat is told.
        self.silent_calls = 0
        self._changed = asyncio.Event()  # replaced (after being set) whenever the gate may free

    async def call(
        self, call: Call[T], *, background: bool = False,
        while_held: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
    ) -> T:
        """Make `call` once it may go: a background one yields to turns, one inside `scheduled`
        queues behind them, any other goes first. `while_held` is entered once the call holds
        the model (not while it waits for it)."""
        if background:
            return await self._background_call(call)
        if _scheduled.get():
            return await self._scheduled_call(call)
        await self._acquire_interactive()
        self.in_flight += 1
        try:
            async with while_held() if while_held is not None else contextlib.nullcontext():
                return await call()
        finally:
            self.in_flight -= 1
            self._gate.release()
            self._poke()

    @contextlib.contextmanager
    def scheduled(self) -> Iterator[None]:
        """Calls made inside (an automation's run, on the turn path) queue
        behind interactive turns: each waits until no turn waits for or holds the model, and
        then holds one request slot for its one call, so a user's message waits behind at most
        that one call. Unlike a fold's call it is never cancelled: a run's work is not thrown
        away."""
        token = _scheduled.set(True)
        try:
            yield
        finally:
            _scheduled.reset(token)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the model's request slots for other work on the same GPU (a
        transcription), queued as the caller's own model call would be: from a chat, ahead of
        folds (a running fold call is stopped) and of automations; inside `scheduled`, behind
        every turn. What runs in the slot is not a request to Ollama (`in_flight` does not
        count it)."""
        if _scheduled.get():
            await self._acquire_scheduled()
        else:
            await self._acquire_interactive()
        try:
            yield
        finally:
            self._gate.release()
            self._poke()

    async def until_free(self) -> None:
        """Return once no turn waits for or holds the model and a slot is free: a background
        call made then goes at once, unless a turn comes first."""
        while self._no_room_for_background() or self._gate.locked():
            await self._changed.wait()

    def silence_began(self) -> None:
        self.silent_calls += 1

    def silence_ended(self) -> None:
        self.silent_calls -= 1

    def _poke(self) -> None:
        """Wake the scheduled calls waiting for room; each looks again."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _acquire_interactive(self) -> None:
        """A slot for a chat's call: ahead of folds (a running fold call is cancelled) and of
        automations."""
        self.waiting += 1
        try:
            if self._gate.locked():
                for task in list(self._background):
                    task.cancel()
            await self._gate.acquire()
        finally:
            self.waiting -= 1
            self._poke()

    async def _acquire_scheduled(self) -> None:
        """A slot for an automation's call: once no turn waits for or holds the model."""
        self.scheduled_waiting += 1
        try:
            while self._no_room_for_background() or self._gate.locked():
                await self._changed.wait()
            # Free and nobody interactive waiting: acquire() returns without suspending, so
            # no turn can arrive in between.
            await self._gate.acquire()
        finally:
            self.scheduled_waiting -= 1

    async def _scheduled_call(self, call: Call[T]) -> T:
        await self._acquire_scheduled()
        self.in_flight += 1
        try:
            return await call()
        finally:
            self.in_flight -= 1
            self._gate.release()
            self._poke()

    @contextlib.asynccontextmanager
    async def turn(self, done: Callable[[float], None] | None = None) -> AsyncIterator[None]:
        """Held for a whole turn: between its model calls (while tools run) no background call
        may slip into the turn's request slot and evict its prompt from Ollama's cache; one
        running there is stopped.

        An automation's run (inside `scheduled`) is not an interactive turn: it neither counts
        here nor stops anything; its calls queue instead."""
        if _scheduled.get():
            yield
            return
        self.turns_active += 1
        if self._no_room_for_background():
            for task in list(self._background):
                task.cancel()
        started = time.monotonic()
        try:
            yield
        finally:
            self.turns_active -= 1
            self._poke()
            if done is not None:
                done(time.monotonic() - started)

    def others_answering(self) -> bool:
        """Whether a turn other than the caller's (which holds `turn`) is under way or a chat
        call waits: then a fold the caller owes would delay their replies."""
        return self.turns_active > 1 or self.waiting > 0

    @contextlib.asynccontextmanager
    async def waiting_for_user(self) -> AsyncIterator[None]:
        """Inside a turn, while it waits for the user (an approval): the turn gives up its
        claim on the model, so a background fold may use it meanwhile; taken back after."""
        if _scheduled.get():
            yield
            return
        self.turns_active -= 1
        self._poke()
        try:
            yield
        finally:
            self.turns_active += 1
            if self._no_room_for_background():
                for task in list(self._background):
                    task.cancel()

    def _no_room_for_background(self) -> bool:
        """Turns hold every request slot Ollama has (`model.concurrency`), or wait for one."""
        return bool(self.waiting) or self.turns_active >= self.concurrency

    async def _background_call(self, call: Call[T]) -> T:
        if self._no_room_for_background():
            raise Preempted("turns are using the model")
        await self._gate.acquire()
        if self._no_room_for_background():  # a turn arrived while we queued: it goes first
            self._gate.release()
            raise Preempted("a turn needs the model")
        inner = asyncio.create_task(call())
        self._background.add(inner)
        self.in_flight += 1
        try:
            return await inner
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if inner.cancelled() and current is not None and not current.cancelling():
                raise Preempted("a turn needs the model") from None
            raise
        finally:
            self.in_flight -= 1
            self._background.discard(inner)
            self._gate.release()
            self._poke()
