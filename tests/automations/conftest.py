"""A daemon's automation side on a controllable clock: engine, scheduler, fake Ollama."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from automations.scheduler import Automations
from daemon.config import AutomationSettings, Settings
from daemon.engine import Engine
from daemon.llm import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel
from tests.fakes.ollama import FakeOllama

TZ = ZoneInfo("Europe/Berlin")


class Clock:
    """Wall-clock time that only moves when a test says so."""

    def __init__(self, start: datetime) -> None:
        self.now = start.timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, when: datetime) -> None:
        self.now = when.timestamp()


def at(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=TZ)  # type: ignore[misc]


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (conditions on plain state, no event to wait on)
            await asyncio.sleep(0.01)


@dataclasses.dataclass
class Daemon:
    """The parts `automations_ctx` runs on, opened and closed like the app does."""

    settings: Settings
    clock: Clock
    channel: RecordingChannel
    store: Store | None = None
    llm: ModelClient | None = None
    engine: Engine | None = None
    automations: Automations | None = None

    async def start(self) -> Automations:
        self.store = Store.open(self.settings.daemon.state_dir)
        self.llm = ModelClient(self.settings.model)
        self.engine = Engine(settings=self.settings, store=self.store, llm=self.llm,
                             channels={"console": self.channel}, clock=self.clock)
        self.automations = Automations(self.engine, clock=self.clock)
        await self.engine.start()
        await self.automations.start()
        return self.automations

    async def stop(self) -> None:
        assert self.engine and self.llm and self.store and self.automations
        await self.automations.stop()
        await self.engine.stop(1.0)
        await self.llm.close()
        self.store.close()

    def replies(self) -> list[str]:
        return self.channel.texts("reply")


def automation(name: str = "brief", schedule: str = "0 * * * *", **fields: Any
               ) -> AutomationSettings:
    values: dict[str, Any] = {"prompt": "Anything new on the things I follow?",
                              "deliver": ("console:local",), **fields}
    return AutomationSettings(name=name, schedule=schedule, **values)


DaemonFactory = Callable[..., Daemon]


@pytest.fixture
async def make_daemon(make_settings: Callable[..., Settings], fake_ollama: FakeOllama
                      ) -> AsyncIterator[DaemonFactory]:
    made: list[Daemon] = []

    def make(*automations: AutomationSettings, start: datetime | None = None,
             **model: Any) -> Daemon:
        settings = make_settings(
            daemon={"timezone": "Europe/Berlin"},
            model={"host": fake_ollama.url, "retry_attempts": 1, "retry_backoff": 0.01,
                   **model})
        settings = dataclasses.replace(settings, automations=tuple(automations))
        daemon = Daemon(settings, Clock(start or at(2026, 12, 1, 9, 59)), RecordingChannel())
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.automations is not None and daemon.store is not None \
                and daemon.store._lock_file is not None:
            await daemon.stop()
