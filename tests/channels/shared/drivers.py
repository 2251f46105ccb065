"""One way to drive roost on each platform, so that a test is written once for all three.

A `Driver` starts the whole daemon (`build_app` + an AppRunner on 127.0.0.1, as the
per-platform tests do) against that platform, speaks as a person there and reads what reaches
the person's phone:

    alice = await driver.person("alice")
    async with driver.roost(allow=[alice]) as daemon:
        await driver.send(alice, "hello")
        seen = await driver.wait_seen(alice, lambda seen: len(seen) == 1)
        await daemon.settle(alice)

Telegram is the fake Bot API (an update on roost's webhook), WhatsApp the fake Graph API (a
signed webhook), Matrix a real Synapse with a nio client as the person (tests/synapse).
`break_delivery()` takes the platform away from roost until `mend_delivery()`: the fake API
stops listening, or Synapse is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from daemon.app.serve import ENGINE, METRICS, STORE
from daemon.engine.workers import Engine
from daemon.store import Store

WAIT = 30.0  # seconds any one wait may take on a loaded machine before the test fails


@dataclass
class Person:
    """Someone on a platform: their id there and the chat key roost gives their chat."""

    name: str
    id: str
    chat_key: str
    room: str | None = None  # Matrix: their direct room with the bot, once made


class Daemon:
    """The running daemon, as the shared tests look at it."""

    def __init__(self, app: web.Application, idle: Callable[[], Awaitable[None]]) -> None:
        self.app = app
        self._idle = idle

    @property
    def store(self) -> Store:
        return self.app[STORE]

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE]

    async def settle(self, person: Person) -> None:
        """Until the platform's intake has nothing in hand and the person's chat no turn and
        nothing to send: what is not on the phone then will not come."""
        await asyncio.wait_for(self._idle(), WAIT)
        await asyncio.wait_for(self.engine.wait_idle(person.chat_key), WAIT)

    def deliveries(self, outcome: str) -> float:
        """roost_outbound_messages_total for this outcome ("sent", "failed"), as /metrics
        says it."""
        return self._metric("roost_outbound_messages_total", outcome)

    def arrivals(self, outcome: str) -> float:
        """roost_inbound_messages_total for this outcome ("stranger": one a stranger's message
        the door turned away)."""
        return self._metric("roost_inbound_messages_total", outcome)

    def _metric(self, name: str, outcome: str) -> float:
        families = text_string_to_metric_families(self.app[METRICS].exposition().decode())
        return sum(s.value for f in families for s in f.samples
                   if s.name == name and s.labels["outcome"] == outcome)


class Driver(Protocol):
    """What the shared tests ask of a platform."""

    name: str

    async def person(self, name: str) -> Person:
        """A new person on the platform (who has not written to the bot yet)."""

    def roost(self, allow: Sequence[Person] = (), *, pairing: bool = True
              ) -> contextlib.AbstractAsyncContextManager[Daemon]:
        """The daemon with this platform; `allow` may talk at once, strangers get a pairing
        code when `pairing`, else nothing."""

    async def send(self, person: Person, text: str) -> None:
        """`text` from `person` to the bot, as the platform brings it to roost."""

    async def seen(self, person: Person) -> list[str]:
        """The texts of the bot's messages on the person's phone, in order, as shown there."""

    async def writing(self, person: Person) -> bool:
        """Whether the person's phone shows a reply being written (a Telegram draft, a
        Matrix message edited as it grows); always True on WhatsApp, which shows none."""

    async def break_delivery(self) -> None:
        """From now on roost cannot reach the platform."""

    async def mend_delivery(self) -> None:
        """The platform can be reached again."""


async def wait_seen(driver: Driver, person: Person, condition: Callable[[list[str]], bool],
                    timeout: float = WAIT) -> list[str]:  # noqa: ASYNC109
    """What the person's phone shows once `condition` holds on it (TimeoutError, saying what
    was shown, when it does not within `timeout`)."""
    shown: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            # The phone is read, not told: Matrix's read is itself a long poll of the
            # homeserver, the fakes' a look at what they took.
            while not condition(shown := await driver.seen(person)):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise TimeoutError(f"{driver.name}: {person.name} was shown {shown!r}") from None
    return shown


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[web.AppRunner]:
    """`app` on 127.0.0.1 (the daemon's routes, webhooks included), cleaned up after."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner
    finally:
        await runner.cleanup()
