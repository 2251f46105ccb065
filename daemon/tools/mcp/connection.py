"""One MCP server, kept running: connect, list the tools, watch, restart with backoff.

Each server has one supervising task, because the SDK's transports (`stdio_client`,
`streamable_http_client`) and `ClientSession` are anyio context managers that must be entered
and left in the same task. The task connects, asks for the tools, reports them (`on_listed`),
then watches: a failed ping, or a call that found the connection closed, ends the session and
the task starts it again after a backoff (1 s, doubling to a minute). Nothing a server does
reaches further than this task and the call that asked it: every failure is an `McpError`.

A stdio server gets an environment from the allow list (`daemon.core.child_env`: PATH, HOME,
the locale, ...) plus its configured `env`: roost's own secrets never reach it. Its stderr goes to
`<state>/logs/mcp-<name>.log`.

The SDK is imported where a server is talked to, not at the top: `import mcp` takes about 0.6 s
(a third of `roost run`'s start), which every command and daemon without a server would pay.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from daemon.core import confine
from daemon.core.bodies import MB
from daemon.core.capped_http import capped_transport
from daemon.core.child_env import child_env
from daemon.core.config import McpServerSettings
from daemon.core.errors import McpError
from daemon.core.logs import mcp_log as log

if TYPE_CHECKING:
    from mcp import ClientSession, types

BACKOFF_FIRST = 1.0
ANSWER_CAP = 32 * MB  # one answer of a server over HTTP (a JSON body or a stream)
BACKOFF_MAX = 60.0
# What a wait for a start adds to the start timeout: the start's own timeout, begun earlier,
# speaks first, so the waiter hears why it failed.
START_SLACK = 5.0
PING_EVERY = 15.0
PING_TIMEOUT = 10.0
MAX_PAGES = 20  # tools/list pages read at most
INSTRUCTIONS_KEPT = 4000  # characters of a server's instructions kept (plain_line reads as many)


class State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"  # failed; restarting after a backoff (or never: a secret it names is unset)
    DISABLED = "disabled"  # enabled = false


@dataclass(frozen=True)
class Listing:
    """What a server said about itself once it was up."""

    description: str  # its title, else its own description
    tools: tuple[types.Tool, ...]
    instructions: str = ""  # what it tells a client's model (its index line's second choice)


class Connection:
    """The supervised session of one server; see the module docstring."""

    def __init__(self, settings: McpServerSettings, *, log_dir: Path, start_timeout: float,
                 on_listed: Callable[[str, Listing], None] | None = None,
                 on_down: Callable[[str, str], None] | None = None) -> None:
        self.on_down = on_down
        self.settings = settings
        self.name = settings.name
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.on_listed = on_listed
        self.state = State.STARTING
        self.error = ""
        self.failures = 0  # failed starts since it was last up
        self.starts = 0  # times it came up in this process
        self.up_since: float | None = None
        self.listing: Listing | None = None
        self._session: ClientSession | None = None
        self._broken = asyncio.Event()
        self._settled = asyncio.Event()  # set while the state is not STARTING
        self._tried = asyncio.Event()  # set after the first attempt, whichever way it went
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._errlog: TextIO | None = None

    def start(self) -> None:
        if not self.settings.enabled:
            self.state, self.error = State.DISABLED, "disabled in the config (enabled = false)"
            self._tried.set()
            self._settled.set()
            return
        if self.settings.missing:
            names = ", ".join(self.settings.missing)
            self.state, self.error = State.DOWN, (
                f"needs {names} in the environment or $CREDENTIALS_DIRECTORY")
            self._tried.set()
            self._settled.set()
            return
        if self.settings.command:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._errlog = (self.log_dir / f"mcp-{self.name}.log").open("a", encoding="utf-8")
        self._task = asyncio.create_task(self._supervise(), name=f"roost-mcp-{self.name}")

    async def stop(self, unwind: float = 5.0) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(unwind):
                    await self._task
        if self._errlog is not None:
            self._errlog.close()

    async def first_attempt(self) -> bool:
        """Wait until the first start either worked or failed; True when it is up."""
        await self._tried.wait()
        return self.state is State.UP

    async def ready(self) -> bool:
        """True when the server is up, after waiting for a start under way (bounded by the
        start timeout): the first request after roost starts finds the server coming up."""
        if self.state is State.STARTING and self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.start_timeout + START_SLACK):
                    await self._settled.wait()
        return self.state is State.UP

    async def call(self, tool: str, arguments: dict[str, Any],
                   limit: float) -> types.CallToolResult:
        """Call a tool; `McpError` when the server is not up, the call timed out or failed on
        the protocol level (a tool's own error is a result with `is_error`)."""
        from mcp import types
        from mcp.shared.exceptions import MCPError

        await self.ready()
        session = self._session
        if session is None or self.state is not State.UP:
            raise McpError(f"the MCP server {self.name!r} is not running"
                           f"{f' ({self.error})' if self.error else ''}")
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=limit)
        except MCPError as exc:
            if "timed out" in str(exc.error.message):
                raise McpError(f"{tool} on {self.name} timed out after {limit:.0f}s") from exc
            if "closed" in str(exc.error.message).lower():
                self._broken.set()
                raise McpError(f"the MCP server {self.name!r} went away during the call; "
                               "it is being restarted") from exc
            raise McpError(f"{self.name} answered with an error: {exc.error.message}") from exc
        except (OSError, RuntimeError, ValueError, anyio.ClosedResourceError,
                anyio.BrokenResourceError, anyio.EndOfStream) as exc:  # the transport gave out
            self._broken.set()
            raise McpError(f"calling {tool} on {self.name} failed: {exc}") from exc
        if not isinstance(result, types.CallToolResult):
            raise McpError(f"{self.name} answered {tool} with something other than a result")
        return result

    # ---- the supervising task --------------------------------------------------------------

    async def _supervise(self) -> None:
        backoff = BACKOFF_FIRST
        while not self._stopping.is_set():
            self.state = State.STARTING
            self._settled.clear()
            self._broken.clear()
            try:
                async with self._connected() as session:
                    async with asyncio.timeout(self.start_timeout):
                        listing = await self._list(session)
                    self.listing, self._session = listing, session
                    self.state, self.error, self.failures = State.UP, "", 0
                    self.up_since = time.time()
                    self.starts += 1
                    backoff = BACKOFF_FIRST
                    log.info("MCP server %s is up with %d tools", self.name,
                             len(listing.tools))
                    if self.on_listed is not None:
                        self.on_listed(self.name, listing)
                    self._tried.set()
                    self._settled.set()
                    await self._watch(session)
            except Exception as exc:  # the boundary of a server: whatever it did, retry later
                # The start's timeout may come wrapped in the transport's exception group.
                self.error = (f"did not answer within {self.start_timeout:.0f}s"
                              if _innermost(exc, TimeoutError) else _describe(exc))
            finally:
                self._session = None
            if self._stopping.is_set():
                break
            self.failures += 1
            self.state = State.DOWN
            self.up_since = None
            if self.on_down is not None:
                self.on_down(self.name, self.error or "it stopped")
            self._tried.set()
            self._settled.set()
            log.warning("MCP server %s is down (%s); starting it again in %.0fs",
                        self.name, self.error or "it stopped", backoff)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._stopping.wait()
            backoff = min(backoff * 2, BACKOFF_MAX)

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[ClientSession]:
        import httpx2
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

        settings = self.settings
        async with contextlib.AsyncExitStack() as stack:
            if settings.command:
                # Through confine's launcher: no read access to the credentials folder.
                command, *args = confine.wrapped([settings.command, *settings.args])
                # The SDK lays its own short list of roost's variables under this (PATH,
                # HOME, USER, ...): all of them in the allow list as well.
                params = StdioServerParameters(command=command, args=args,
                                               env=child_env(settings.env), cwd=settings.cwd)
                assert self._errlog is not None
                read, write = await stack.enter_async_context(stdio_client(params, self._errlog))
            else:
                assert settings.url is not None
                # The SDK's client (create_mcp_http_client) with answers held to ANSWER_CAP:
                # the SDK holds each event of a stream to 1 MB, but reads a JSON answer whole.
                http = await stack.enter_async_context(httpx2.AsyncClient(
                    headers=dict(settings.headers),
                    timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
                    transport=capped_transport(ANSWER_CAP, httpx2)))
                read, write = await stack.enter_async_context(
                    streamable_http_client(settings.url, http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            yield session

    async def _list(self, session: ClientSession) -> Listing:
        from mcp import types

        init = await session.initialize()
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        info = init.server_info
        # Without a title, the instructions' first line of prose makes its index line
        # (daemon.tools.mcp.about); they can run to pages, so only their start is kept.
        instructions = (init.instructions or "")[:INSTRUCTIONS_KEPT]
        return Listing(description=info.title or info.description or "", tools=tuple(tools),
                       instructions=instructions)

    async def _watch(self, session: ClientSession) -> None:
        """Until the session breaks or roost stops: a ping now and then finds a dead server
        between calls too."""
        from mcp.shared.exceptions import MCPError

        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_EVERY):
                    await self._broken.wait()
            if self._broken.is_set():
                self.error = "the connection closed"
                return
            try:
                async with asyncio.timeout(PING_TIMEOUT):
                    await session.send_ping()
            except (MCPError, TimeoutError, OSError) as exc:
                self.error = f"no answer to a ping ({_describe(exc)})"
                return


def _innermost(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `exc`, or the first of the exception groups it is wrapped in, is a `kind`."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return isinstance(exc, kind)


def _describe(exc: BaseException) -> str:
    """One line for a failure that may be an exception group of the transport's tasks."""
    from mcp.shared.exceptions import MCPError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.error.message
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
