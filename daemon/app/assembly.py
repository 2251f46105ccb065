"""The one place roost's core is put together: the tools, the turn's parts, the engine, the
automations and the MCP servers. `roost run` (daemon/app/serve.py), `roost chat` on its own,
`roost automations run` and the bench scripts all enter `core()`, so each offers the model the
same tools, the same capability index and so the same prefix.

Everything is wired through constructors, in one order: the reminders' book (the reminder tools
need it, the scheduler fires it), the registry from `tools()`, the MCP servers' capabilities, the
turn's parts, the engine, the automations. Left in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import channels.installed  # noqa: F401 (installs the platforms in the core's registry)
from automations import reminder_tools
from automations.reminders import Reminders
from automations.runner import RUN_STATUSES
from automations.scheduler import Automations
from automations.state import AutomationState
from daemon.app.metrics import Metrics
from daemon.app.shutdown import shutdown_budget
from daemon.core.config import Settings
from daemon.core.messages import Channel
from daemon.engine.delivery import DeliveryHooks
from daemon.engine.workers import Engine
from daemon.intake.household import Household
from daemon.llm.client import ModelClient
from daemon.llm.habits import no_habits
from daemon.models.book import CardBook
from daemon.store import Store
from daemon.store.search_index import SearchIndex
from daemon.tools import builtin, documents, facts
from daemon.tools.mcp.servers import McpServers, with_servers
from daemon.tools.registry import Registry
from daemon.tools.web import tools as web_tools
from daemon.turn.parts import TurnParts
from daemon.voice.hearing import Hearing
from daemon.voice.speaking import Speaking


def tools(settings: Settings, reminders: Reminders) -> tuple[Callable[[Registry], object], ...]:
    """Each tool module's `register`, in the order the capability index lists them. A new
    tool module is one more line here."""
    return (builtin.register,
            functools.partial(facts.register, household=bool(settings.linked)),
            functools.partial(web_tools.register, settings=settings.web),
            documents.register,
            functools.partial(reminder_tools.register, reminders=reminders))


def tool_registry(settings: Settings, reminders: Reminders) -> Registry:
    """Every built-in tool (the MCP servers' capabilities are added by `with_servers`)."""
    registry = Registry()
    for register in tools(settings, reminders):
        register(registry)
    return registry


class Runs(enum.Enum):
    """What the core runs while it is entered."""

    DAEMON = "daemon"  # the engine and the scheduler; the MCP servers start in the background
    CHAT = "chat"  # the engine (a terminal's chat); the servers are waited for, bounded
    ONCE = "once"  # nothing: one automation run on the parts; the servers are waited for


@dataclass(frozen=True)
class Core:
    """The parts an entry point talks through."""

    parts: TurnParts
    engine: Engine
    automations: Automations
    servers: McpServers
    cards: CardBook  # the models' cards the calls act on (daemon/models/book.py)


@dataclass(frozen=True)
class DaemonParts:
    """What only the daemon adds: its counters, the index opened with the store (so that a
    disk that cannot take it stops the start), hearing and speaking (which the daemon closes
    once the core is left)."""

    metrics: Metrics | None = None
    index: SearchIndex | None = None
    voice: Hearing | None = None
    speaking: Speaking | None = None


@contextlib.asynccontextmanager
async def core(settings: Settings, store: Store, llm: ModelClient,
               channels: Mapping[str, Channel], runs: Runs, *,
               extra: DaemonParts = DaemonParts(),
               clock: Callable[[], float] = time.time) -> AsyncIterator[Core]:
    """The core over an open `store` and `llm` (the caller closes those), running what `runs`
    says; on the way out the scheduler stops first and the MCP servers last. The daemon's stop
    takes `daemon.shutdown_grace` (see daemon/app/shutdown.py); a terminal's chat none."""
    built = assemble(settings, store, llm, channels, extra=extra, clock=clock,
                     probe=runs is Runs.DAEMON)
    try:
        built.cards.start()  # in the background: Ollama may be down or slow to answer
        llm.habits_of = built.cards.habits
        await _start(built, runs, settings)
        yield built
    finally:
        try:
            await _stop(built, runs, settings)
        finally:
            llm.habits_of = no_habits
            await built.cards.close()


def assemble(settings: Settings, store: Store, llm: ModelClient,
             channels: Mapping[str, Channel], *, extra: DaemonParts = DaemonParts(),
             clock: Callable[[], float] = time.time, probe: bool = False) -> Core:
    """The core built, nothing started (`core()` starts and stops it; a test may itself).
    `probe`: a model without a card is probed quietly on first use (the daemon's alone: a
    command leaves nothing running behind it)."""
    metrics = extra.metrics
    reminders = Reminders(settings.daemon.tz, AutomationState(store.state_dir), clock=clock)
    registry, servers = with_servers(settings.mcp, settings.daemon.state_dir,
                                     tool_registry(settings, reminders))
    cards = CardBook(settings.model, settings.daemon.state_dir, llm,
                     probe=probe and settings.model.probe_new)
    parts = TurnParts.build(
        settings=settings, store=store, llm=llm, index=extra.index, registry=registry,
        clock=clock, on_event=(lambda kind: metrics.events.labels(kind).inc()) if metrics else None,
        card_line=cards.card_line, roles=Household.of(settings))
    hooks = DeliveryHooks()
    engine = Engine(settings=settings, store=store, llm=llm, channels=channels, parts=parts,
                    clock=clock, hooks=hooks, voice=extra.voice, speaking=extra.speaking)
    automations = Automations(parts, engine, reminders, hooks=hooks, channels=engine.channels,
                              clock=clock, on_run=metrics.automation_run if metrics else None)
    if metrics is not None:
        metrics.automations_known((a.name for a in settings.automations), RUN_STATUSES)
    return Core(parts, engine, automations, servers, cards)


async def _start(core: Core, runs: Runs, settings: Settings) -> None:
    await core.servers.start()
    if runs is not Runs.DAEMON:
        # A command's first message should find the servers' tools; a broken server is said
        # by the command, never a command that does not start.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(core.servers.wait_started(), settings.mcp.start_timeout)
    if runs is not Runs.ONCE:
        await core.engine.start()
    if runs is Runs.DAEMON:
        await core.automations.start()


async def _stop(core: Core, runs: Runs, settings: Settings) -> None:
    if runs is Runs.DAEMON:
        budget = shutdown_budget(settings.daemon.shutdown_grace)
        await core.automations.stop(budget.unwind)
        # After serve() drained, this drains no more: the grace runs once.
        await core.engine.stop(budget.drain, budget.unwind)
    else:
        await core.automations.stop()
        if runs is Runs.CHAT:
            await core.engine.stop(grace=0)  # a terminal's Ctrl-D: nothing waits for a turn
        else:
            core.parts.index.close()  # the engine, which closes it, never started
    await core.servers.stop()
