"""The core a command puts together when no daemon runs: `roost chat` on its own and
`roost automations run`.

Both offer the model what the daemon offers (issue 31): the same registry (the built-ins, the
MCP servers' tools, the reminders), so the same capability index and the same prefix. Built here
once, in the daemon's order, and left in reverse. The scheduler does not run in a command: a
reminder set here is stored, and the daemon arms it when it starts (as `roost automations
remind` does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from automations.scheduler import Automations
from daemon.core.config import Settings
from daemon.core.messages import Channel
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.mcp.servers import McpServers, with_servers
from daemon.turn.parts import TurnParts, builtin_registry


@dataclass(frozen=True)
class Core:
    """The parts a command talks through."""

    engine: Engine
    automations: Automations
    servers: McpServers


@contextlib.asynccontextmanager
async def standalone_core(settings: Settings, store: Store, llm: ModelClient,
                          channels: Mapping[str, Channel]) -> AsyncIterator[Core]:
    """The engine, the automations (not scheduled) and the MCP servers over an open `store`
    and `llm`, which the caller closes. The servers are waited for, bounded by
    `mcp.start_timeout`, so that the first message finds their tools; the engine is not
    started (a chat starts it, a single run needs no workers)."""
    registry, servers = await asyncio.to_thread(with_servers, settings.mcp,
                                                settings.daemon.state_dir,
                                                builtin_registry(settings))
    engine = Engine(settings=settings, store=store, llm=llm, channels=channels,
                    parts=TurnParts.build(settings=settings, store=store, llm=llm,
                                          registry=registry))
    # Registers the reminder tools, as the daemon's does before any turn.
    automations = Automations(engine.parts, engine)
    try:
        await servers.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(servers.wait_started(), settings.mcp.start_timeout)
        yield Core(engine, automations, servers)
    finally:
        await automations.stop()
        await servers.stop()
