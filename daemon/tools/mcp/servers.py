"""The configured MCP servers as capabilities of the registry.

Servers start with the daemon, in the background: the index line of a server names its tool
count and `tool_search` needs its tools' names, and a cold start (an `npx` download) should not
fall on the user's first activation. Nothing waits for them: a server that is slow or broken
makes its calls fail (as error results), a doctor FAIL and a line in /status, never a daemon
that will not start.

Each server is one capability named after it; its tools are `server__tool`, with simplified
schemas (`daemon.tools.mcp.schema`), the server's timeout and its approval policy; a tool that
must run as a task (`execution.taskSupport = "required"`) is left out, since roost makes plain
calls only and such a tool fails every one. Until a
server has listed its tools in this process, its capability is what it listed last time
(`catalog`), so the prefix keeps its bytes across restarts.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import referencing.exceptions

from daemon.core.config import McpServerSettings, McpSettings
from daemon.core.errors import McpError, StoreError
from daemon.core.logs import mcp_log as log
from daemon.tools import builtin
from daemon.tools.mcp.about import index_about
from daemon.tools.mcp.catalog import Catalog
from daemon.tools.mcp.connection import Connection, Listing, State
from daemon.tools.mcp.results import ERROR_PREFIX, result_output
from daemon.tools.mcp.schema import description_caps, plain_text, simplify, tool_name
from daemon.tools.registry import Capability, Registry, Tool, ToolOutput

if TYPE_CHECKING:
    from mcp import types

GROUP = "mcp"
TIMEOUT_SLACK = 5.0  # the registry's own limit, past the server's: the server's speaks first


@dataclass(frozen=True)
class McpTool(Tool):
    """A server's tool: the model sees the simplified schema, the arguments are checked
    against the server's own (which may allow more: `X | int` simplified to X)."""

    original: Mapping[str, Any] = field(default_factory=dict)

    def check(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        problem = check_arguments(self.original, arguments)
        if problem is None:
            return dict(arguments), None
        coerced, _ = super().check(arguments)  # "5" for an integer, as small models send it
        if coerced and check_arguments(self.original, coerced) is None:
            return coerced, None
        return {}, problem


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: str
    tools: int
    error: str
    transport: str  # "stdio" or "http"


class McpServers:
    """See the module docstring. `register()` before the first turn, `start()`, `stop()`."""

    def __init__(self, settings: McpSettings, state_dir: Path, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.catalog = Catalog(state_dir)
        self._listings: dict[str, Listing] = {}
        self.connections = {
            s.name: Connection(s, log_dir=state_dir / "logs", start_timeout=settings.start_timeout,
                               on_listed=self._listed, on_down=self._down)
            for s in settings.servers}
        self._refused: dict[str, str] = {}  # servers whose name a built-in has
        self._writes: set[asyncio.Task[None]] = set()
        self._saving = asyncio.Lock()
        self._saved: dict[str, Listing] = {}

    def register(self) -> None:
        """One capability per server, from the catalog (or empty until it lists its tools)."""
        if not self.settings.servers:
            return  # nothing to list: the catalog, and the SDK that reads it, are not needed
        self._listings = self.catalog.read()
        self._saved = dict(self._listings)
        for server in self.settings.servers:
            if not server.enabled:  # never started nor offered, whatever it listed once
                continue
            try:
                self.registry.register(self._capability(server,
                                                        self._listings.get(server.name)))
            except ValueError as exc:
                self._refused[server.name] = f"cannot be registered: {exc}"
                log.error("MCP server %s %s", server.name, self._refused[server.name])

    async def start(self) -> None:
        for name, connection in self.connections.items():
            if name in self._refused:
                self.registry.problems[name] = self._refused[name]
                continue
            connection.start()
            self.registry.starting[name] = connection.ready
            if connection.state is State.DOWN:  # a secret it names is not set
                self._down(name, connection.error)

    def _down(self, name: str, error: str) -> None:
        self.registry.problems[name] = error

    async def stop(self, unwind: float = 5.0) -> None:
        await asyncio.gather(*(c.stop(unwind) for c in self.connections.values()))
        if self._writes:
            await asyncio.wait(self._writes, timeout=unwind)

    async def wait_started(self) -> None:
        """Until every server's first start worked or failed (for `roost mcp`, the tests)."""
        await asyncio.gather(*(c.first_attempt() for n, c in self.connections.items()
                               if n not in self._refused))

    def status(self) -> list[ServerStatus]:
        out = []
        for server in self.settings.servers:
            connection = self.connections[server.name]
            capability = self.registry.capabilities.get(server.name)
            refused = self._refused.get(server.name, "")
            out.append(ServerStatus(
                name=server.name, state="failed" if refused else connection.state.value,
                tools=len(capability.tools) if capability and not refused else 0,
                error=refused or connection.error,
                transport="stdio" if server.command else "http"))
        return out

    def down(self) -> list[ServerStatus]:
        """The servers that are enabled and not up (for /status and doctor)."""
        return [s for s in self.status() if s.state not in (State.UP.value,
                                                            State.STARTING.value)
                or (s.state == State.STARTING.value and s.error)]

    # ---- capabilities --------------------------------------------------------------------

    def _listed(self, name: str, listing: Listing) -> None:
        self.registry.problems.pop(name, None)
        if task_only := not_offered(listing):
            log.info("MCP server %s: %s must run as tasks, which roost does not do; not offered",
                     name, ", ".join(task_only))
        server = next(s for s in self.settings.servers if s.name == name)
        try:
            self.registry.replace(self._capability(server, listing))
        except ValueError as exc:
            log.error("MCP server %s listed tools that cannot be registered: %s", name, exc)
            return
        if self._listings.get(name) != listing:
            self._listings[name] = listing
            task = asyncio.create_task(self._save(), name="roost-mcp-catalog")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _save(self) -> None:
        """Write the newest listings, one write at a time; a change an earlier write already
        carried is not written again."""
        async with self._saving:
            listings = dict(self._listings)
            if listings == self._saved:
                return
            await self._write(listings)

    async def _write(self, listings: dict[str, Listing]) -> None:
        try:
            await asyncio.to_thread(self.catalog.write, listings)
            self._saved = listings
        except StoreError as exc:  # the next start lists the tools again: nothing is lost
            log.warning("could not save the MCP catalog: %s", exc)

    def _capability(self, server: McpServerSettings, listing: Listing | None) -> Capability:
        """The server's capability from what it listed (None: it never did, its tools are
        still coming); its index line from `index_about`."""
        offered = [t for t in listing.tools if callable_here(t)] if listing else []
        caps = description_caps([len(t.description or "") for t in offered])
        return Capability(name=server.name, group=GROUP,
                          description=index_about(server.name, server.description, listing,
                                                  offered),
                          tools=tuple(self._tool(server, t, cap)
                                      for t, cap in zip(offered, caps, strict=True)))

    def _tool(self, server: McpServerSettings, tool: types.Tool, cap: int) -> Tool:
        return McpTool(
            name=tool_name(server.name, tool.name),
            description=plain_text(tool.description, cap) or tool.name,
            parameters=simplify(tool.input_schema),
            handler=functools.partial(self._call, server.name, tool.name),
            timeout=server.timeout + TIMEOUT_SLACK,
            approve=server.approve_tools.get(tool.name, server.approve),
            shared=server.shared,
            original=dict(tool.input_schema))

    async def _call(self, server: str, tool: str, context: object,
                    **arguments: Any) -> str | ToolOutput:
        """One call (its arguments checked by `McpTool.check`, as the registry does before
        every call): the server's timeout, and every failure an error line for the model."""
        connection = self.connections[server]
        try:
            result = await connection.call(tool, arguments, connection.settings.timeout)
        except McpError as exc:
            return f"{ERROR_PREFIX}{exc}"
        return result_output(result, self.settings.result_max_chars,
                             f"the MCP server {server} ({tool})")


def callable_here(tool: types.Tool) -> bool:
    """Whether roost can call the tool: not when it must run as a task (task-augmented
    execution, MCP 2025-11-25), which roost does not do."""
    return tool.execution is None or tool.execution.task_support != "required"


def not_offered(listing: Listing) -> list[str]:
    """The server's own names of the tools it listed that the model is not offered."""
    return [t.name for t in listing.tools if not callable_here(t)]


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """The first way `arguments` break the tool's schema, in words; None when they fit."""
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
        return None  # a schema the validator cannot use: the server checks for itself
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return (f"argument {where}: {error.message}" if where
            else f"arguments: {error.message}")[:300]


def with_servers(settings: McpSettings, state_dir: Path,
                 registry: Registry | None = None) -> tuple[Registry, McpServers]:
    """`registry` (else one of the core built-ins) with one capability per configured MCP
    server (started by `McpServers.start`)."""
    if registry is None:
        registry = Registry()
        builtin.register(registry)
    servers = McpServers(settings, state_dir, registry)
    servers.register()
    return registry, servers
