"""A daemon's automation side on a controllable clock: engine, scheduler, fake Ollama."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import apscheduler.executors.base
import apscheduler.schedulers.base
import apscheduler.triggers.date
import apscheduler.triggers.interval
import pytest
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
)

from automations.scheduler import Automations
from daemon.app.assembly import DaemonParts, assemble
from daemon.app.metrics import Metrics
from daemon.core.config import AutomationSettings, Settings
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import (  # wait_until: re-exported for the tests here
    RecordingChannel,
    wait_until,
)
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


def clocked_datetime(clock: Callable[[], float]) -> type[datetime]:
    """`datetime` whose `now()` reads `clock`: what APScheduler's scheduler and executor see,
    so that the real scheduler decides on the test's clock which jobs are due (and late)."""

    class ClockedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.fromtimestamp(clock(), tz)

    return ClockedDatetime


class Jobs:
    """Counts the scheduler's job events, to wait until what it started has ended."""

    def __init__(self) -> None:
        self.submitted = self.ended = 0

    def __call__(self, event: JobEvent) -> None:
        if event.code == EVENT_JOB_SUBMITTED:
            self.submitted += 1
        elif event.code in (EVENT_JOB_EXECUTED, EVENT_JOB_ERROR, EVENT_JOB_MISSED):
            self.ended += 1


def at(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=TZ)  # type: ignore[misc]




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
    monkeypatch: pytest.MonkeyPatch | None = None  # set: APScheduler runs on `clock` too
    jobs: Jobs = dataclasses.field(default_factory=Jobs)
    # Runs counted as /metrics counts them, from before the start (as daemon/app/serve.py does).
    metrics: Metrics = dataclasses.field(default_factory=Metrics)

    async def start(self) -> Automations:
        if self.monkeypatch is not None:
            clocked = clocked_datetime(self.clock)
            self.monkeypatch.setattr(apscheduler.schedulers.base, "datetime", clocked)
            for module in (apscheduler.executors.base, apscheduler.triggers.date,
                           apscheduler.triggers.interval):
                self.monkeypatch.setattr(module, "datetime", clocked)
        self.store = Store.open(self.settings.daemon.state_dir)
        self.llm = ModelClient(self.settings.model)
        core = assemble(self.settings, self.store, self.llm, {"console": self.channel},
                        extra=DaemonParts(metrics=self.metrics), clock=self.clock)
        self.engine, self.automations = core.engine, core.automations
        self.automations.scheduler.add_listener(
            self.jobs, EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR
            | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        await self.engine.start()
        await self.automations.start()
        return self.automations

    async def stop(self) -> None:
        assert self.engine and self.llm and self.store and self.automations
        await self.automations.stop()
        await self.engine.stop(1.0)
        await self.llm.close()
        self.store.close()

    def counted(self, name: str, outcome: str) -> float:
        """`roost_automation_runs_total` of one automation and outcome."""
        value = self.metrics.registry.get_sample_value(
            "roost_automation_runs_total", {"automation": name, "outcome": outcome})
        return value or 0.0

    def replies(self) -> list[str]:
        return self.channel.texts("reply")

    async def settle(self) -> None:
        """Wait until the scheduler has looked at the clock and what it started has ended."""
        automations = self.automations
        assert automations is not None

        def settled() -> bool:
            jobs = automations.scheduler.get_jobs()
            return (all(j.next_run_time is None or j.next_run_time.timestamp() > self.clock()
                        for j in jobs)
                    and self.jobs.ended == self.jobs.submitted and not automations._tasks
                    and not automations.runner._running)

        await wait_until(settled, timeout=30)

    async def advance(self, to: datetime) -> None:
        """Move the clock to `to` and let the real scheduler fire what is due (APScheduler
        must be on the clock: `make_daemon(..., on_clock=True)`)."""
        assert self.automations is not None and self.monkeypatch is not None
        self.clock.set(to)
        self.automations.scheduler.wakeup()
        await self.settle()

    async def run_until(self, end: datetime) -> None:
        """Step the clock from one fire time to the next, as the scheduler names them, each
        time 0.4 s after it (runs start a little after their time), until `end`."""
        assert self.automations is not None
        while True:
            # Timestamps: aware datetimes in one zone compare by the wall clock.
            times = [j.next_run_time.timestamp() for j in self.automations.scheduler.get_jobs()
                     if j.id.startswith("automation:") and j.next_run_time is not None]
            if not times or min(times) > end.timestamp():
                return
            await self.advance(datetime.fromtimestamp(min(times) + 0.4, TZ))


def automation(name: str = "brief", schedule: str = "0 * * * *", **fields: Any
               ) -> AutomationSettings:
    values: dict[str, Any] = {"prompt": "Anything new on the things I follow?",
                              "deliver": ("console:local",), **fields}
    return AutomationSettings(name=name, schedule=schedule, **values)


DaemonFactory = Callable[..., Daemon]


@pytest.fixture
async def make_daemon(make_settings: Callable[..., Settings], fake_ollama: FakeOllama,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DaemonFactory]:
    made: list[Daemon] = []

    def make(*automations: AutomationSettings, start: datetime | None = None,
             on_clock: bool = False, **model: Any) -> Daemon:
        settings = make_settings(
            daemon={"timezone": "Europe/Berlin"},
            model={"host": fake_ollama.url, "retry_attempts": 1, "retry_backoff": 0.01,
                   **model})
        settings = dataclasses.replace(settings, automations=tuple(automations))
        daemon = Daemon(settings, Clock(start or at(2026, 12, 1, 9, 59)), RecordingChannel(),
                        monkeypatch=monkeypatch if on_clock else None)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.automations is not None and daemon.store is not None \
                and daemon.store._lock_file is not None:
            await daemon.stop()
