"""The cards the running daemon acts on: read once the server's version is known, and a model
without one probed quietly (the battery's cheap parts) the first time a chat uses it.

`habits(model)` is what the client asks on every call (daemon.llm.habits), so it answers from
memory at once; what it cannot answer yet (the server's version, a card still to make) it
starts in the background and answers with `Habits()`, roost's way with any model.
The quiet probe's requests wait until no chat wants the model and then go as background calls,
which a chat that comes cancels: such a request is made again once the model is free, and a
probe that could not finish is tried again at a later use (`RETRY_AFTER`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from daemon.core.config import ModelSettings
from daemon.core.errors import LLMError, Preempted, StoreError
from daemon.core.logs import llm_log as log
from daemon.llm.client import ModelClient
from daemon.llm.habits import Habits
from daemon.models.card import Card, all_cards, store_cards
from daemon.models.probe import Battery
from daemon.models.strategy import card_line, card_of, habits_of
from daemon.models.wire import ProbeWire

PREEMPTIONS = 5  # a probe's request stopped by chats this often waits for a later use
RETRY_AFTER = 600.0  # seconds before a probe or a version lookup that failed is tried again
T = TypeVar("T")


class CardBook:
    """See the module docstring. `probe` allows the quiet probe (`model.probe_new`)."""

    def __init__(self, settings: ModelSettings, state_dir: Path, llm: ModelClient, *,
                 probe: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.state_dir = state_dir
        self.llm = llm
        self.probe = probe
        self.clock = clock
        self.version: str | None = None
        self._cards: dict[str, Card] = {}
        self._tried: dict[str, float] = {}  # model (or "" for the version) -> when last tried
        self._tasks: set[asyncio.Task[None]] = set()

    def card(self, model: str) -> Card | None:
        """The model's card for the running Ollama however its name is tagged, None when
        there is none (yet)."""
        return card_of(self.cards(), model, self.version or "")

    def cards(self) -> list[Card]:
        """The cards of the running Ollama (a copy: the quiet probe adds to them)."""
        return sorted(list(self._cards.values()), key=lambda c: c.name)

    def card_line(self, model: str) -> str | None:
        """The model's card in one line (`/status`), None when it has none."""
        card = self.card(model)
        return card_line(card) if card is not None else None

    def habits(self, model: str) -> Habits:
        """What the client does for `model`; starts what is missing (see the docstring)."""
        card = self.card(model)
        if card is not None:
            return habits_of(card)
        if self.version is None:
            self._start("", self._read)
        elif self.probe:
            self._start(model, lambda: self._quick(model))
        return Habits()

    def start(self) -> None:
        """Read the cards of the running Ollama's version, in the background (Ollama may be
        down: then a call that asks tries again, after `RETRY_AFTER`)."""
        self._start("", self._read)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _start(self, key: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asked from a worker thread (a new chat's ratio): no work there
            return
        last = self._tried.get(key)
        if last is not None and self.clock() - last < RETRY_AFTER:
            return
        self._tried[key] = self.clock()

        async def run() -> None:
            await work()

        task = loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self) -> None:
        wire = ProbeWire(self.settings.host, self.settings.timeout)
        try:
            version = await wire.version()
        except LLMError as exc:
            log.info("model cards not read yet: %s", exc)
            return
        finally:
            await wire.close()
        cards = await asyncio.to_thread(all_cards, self.state_dir)
        # Of several hosts' cards of a model, the newest: what it does is the same on each.
        self._cards = {c.name: c for c in sorted(cards, key=lambda c: c.probed_at)
                       if c.ollama_version == version}
        self.version = version
        if self._cards:
            log.info("model cards for Ollama %s: %s", version, ", ".join(sorted(self._cards)))

    async def _quick(self, model: str) -> None:
        """The battery's cheap parts for `model`, its requests behind the chats' (see the
        module docstring); the card is kept, and used from the next call on."""
        assert self.version is not None
        battery = Battery(self.settings, through=self._behind_chats)
        try:
            card = await battery.probe(await battery.target(model), self.version, quick=True)
            await asyncio.to_thread(store_cards, self.state_dir, [card])
        except (LLMError, StoreError) as exc:  # a chat took the model, or it is away
            log.info("quiet probe of %s not finished (%s); tried again later", model, exc)
            return
        finally:
            await battery.close()
        self._cards[model] = card
        log.info("model %s probed quietly: tools %s, thinking %s, over-window prompts %s",
                 model, card.tools, card.thinking, card.truncate)

    async def _behind_chats(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """One of the probe's requests, made once no chat wants the model; one that a chat
        stopped is made again once the model is free, `PREEMPTIONS` times at most."""
        for attempt in range(PREEMPTIONS):
            await self.llm.gate.until_free()
            try:
                return await self.llm.gate.call(make, background=True)
            except Preempted:
                if attempt + 1 == PREEMPTIONS:
                    raise
        raise AssertionError("PREEMPTIONS is at least 1")
