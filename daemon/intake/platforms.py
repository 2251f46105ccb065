"""What the daemon runs of a platform: the parts it is handed and the lifecycle it gives back.

Each platform's runtime module (named by its `Platform.runtime`, channels/<name>/channel.py)
exports `RUNTIME`: `check` refuses bad settings before the daemon binds its port, `open` builds
the platform's `Running` from the daemon's parts. The daemon (daemon/app/serve.py) opens it
before the engine (which delivers through `channel`), starts it after (it feeds the engine),
serves its `routes`, and stops and closes it in reverse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from daemon.core.approval import Approver
from daemon.core.checks import Check
from daemon.core.config import Settings
from daemon.core.messages import Channel, Outbound
from daemon.core.setup import Setup
from daemon.intake.durable import Submitter
from daemon.intake.gate import Access
from daemon.store import Store
from daemon.store.event_log import Records

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """An HTTP route of a platform; `stores` is a webhook that writes what it receives (the
    daemon answers it 503 while the disk is full, so the platform sends it again)."""

    method: str
    path: str
    handler: Handler
    stores: bool = True


@dataclass(frozen=True)
class PlatformParts:
    """What a platform is built from; `tuning` is the platform's own (tests shorten it)."""

    settings: Settings
    store: Store
    access: Access
    records: Records
    tuning: Any
    on_resent: Callable[[], None] = lambda: None


class Port(Submitter, Protocol):
    """The engine as a platform is handed it at start: what every channel has (submit,
    notify, release when the user wrote again) and `deliver`, to queue a reply of its own (a
    part WhatsApp took and then refused for its 24-hour rule, sent again to the fallback chat or
    held until the user writes)."""

    async def deliver(self, outbound: Outbound) -> bool: ...


class Running(Protocol):
    """A platform the daemon runs."""

    @property
    def channel(self) -> Channel: ...

    def routes(self) -> Sequence[Route]: ...

    async def open(self) -> None: ...

    async def start(self, engine: Port, approver: Approver | None = None) -> None: ...

    async def stop(self) -> None: ...

    async def close(self) -> None: ...


def _fine(settings: Settings) -> None:
    return None


async def _nothing_to_check(settings: Settings) -> list[Check]:
    return []


@dataclass(frozen=True)
class Runtime:
    """A platform's runtime: `tuning` makes its default tuning (which has `max_body`, the
    largest request its routes read), `open` builds it, `check` raises ConfigError early
    (before the port is bound; doctor asks it too)."""

    tuning: Callable[[], Any]
    open: Callable[[PlatformParts], Running]
    check: Callable[[Settings], None] = field(default=_fine)
    # `roost doctor`'s lines about it, asked of the platform itself (enabled, secrets set).
    doctor: Callable[[Settings], Awaitable[list[Check]]] = field(default=_nothing_to_check)
    # Its formatting overlay: the model's Markdown as the platform shows it
    # (channels/formatting.py). Here, not in the light description: markdown-it would load at
    # every command's start.
    render: Callable[[str], str] = field(default=lambda markdown: markdown)
    # `roost init`'s questions and checks for it (daemon/core/setup.py); None: init offers
    # no way to set it up.
    setup: Setup | None = None
