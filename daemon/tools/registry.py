"""The capability registry: what the model may call, grouped into capabilities.

A capability is a named group of tools with a one-line description. The core capabilities are
always loaded; the others are loaded per conversation with `tool_activate`, found with
`tool_search` (ranked by `daemon.tools.ranking`, its index kept until a capability changes).
Each tool module has one `register(registry, ...)`, called from the list in
daemon/app/assembly.py, the same path an extra would use; a tool carries its own progress line.

Running a tool never raises out of here: a tool that raises, times out, gets bad arguments or does
not exist becomes an error result for the model, so a turn never crashes on a tool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from daemon.context.prefix import Capability as CapabilityLine
from daemon.core.logs import turn_log as log
from daemon.tools.ranking import Hit, Ranking

ERROR_PREFIX = "ERROR: "
DEFAULT_TIMEOUT = 30.0
SEARCH_RESULTS = 5  # tool_search's answers at most: a small model reads the first few


@dataclass(frozen=True)
class ToolCall:
    """What the model asked for, as Ollama reports it."""

    name: str
    arguments: Mapping[str, Any]

    @classmethod
    def from_ollama(cls, call: Mapping[str, Any]) -> ToolCall:
        function = call.get("function") or {}
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):  # some templates hand over a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {"_unparsed": arguments}
        return cls(name=str(function.get("name", "")), arguments=dict(arguments))


@dataclass(frozen=True)
class ToolOutput:
    """What a handler may return instead of plain text: text with images (an MCP tool's),
    which the turn stores and shows to a model that can see."""

    text: str
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    error: bool = False
    images: tuple[bytes, ...] = ()


Handler = Callable[..., Awaitable[str | ToolOutput]]


@dataclass(frozen=True)
class Tool:
    """One callable tool: its schema for the model and the coroutine that runs it.

    The handler is called as `handler(context, **arguments)` and returns the result text.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: Handler
    timeout: float = DEFAULT_TIMEOUT
    # Whether a call waits for the user's yes (daemon.turn.approvals): "never" (built-ins),
    # "ask" (unless the person said "always" for it) or "always".
    approve: str = "never"
    # It acts outside the asker's own data (an MCP server marked `shared`): outside an owner's
    # chat only an owner approves it, whatever `approve` says.
    shared: bool = False
    # The line the user sees while it runs ("searching the web…"); none: "using <name>…".
    progress: str = ""

    def schema(self) -> dict[str, Any]:
        """The tool as Ollama's `tools` field wants it (OpenAI-style function schema)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": dict(self.parameters)}}

    def check(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The arguments ready to pass, or a problem (missing required, unknown, wrong type).

        Small models often send numbers as strings ("5"); those are converted, not refused.
        """
        properties = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", ()) if k not in arguments]
        if missing:
            return {}, f"missing required argument(s): {', '.join(missing)}"
        unknown = [k for k in arguments if k not in properties]
        if unknown:
            expected = ", ".join(properties) or "no arguments"
            return {}, f"unknown argument(s): {', '.join(unknown)}; expected {expected}"
        ready: dict[str, Any] = {}
        for key, value in arguments.items():
            expected = properties[key].get("type")
            value = _coerce(value, expected)
            if expected and not _is_type(value, expected):
                return {}, f"argument {key!r} must be a {expected}, got {type(value).__name__}"
            ready[key] = value
        return ready, None


@dataclass(frozen=True)
class Capability:
    name: str
    description: str
    tools: tuple[Tool, ...]
    core: bool = False
    group: str = "other"


@dataclass
class Registry:
    """All capabilities known to this process, in registration order."""

    capabilities: dict[str, Capability] = field(default_factory=dict)
    # Capabilities not working right now, with why (an MCP server that is down): /status.
    problems: dict[str, str] = field(default_factory=dict)
    # Capabilities whose tools may still be coming (an MCP server starting): tool_activate
    # awaits this (it bounds itself) before it answers.
    starting: dict[str, Callable[[], Awaitable[object]]] = field(default_factory=dict)
    # tool_search's index, with the capabilities it was built from (see `ranking`).
    _ranking: tuple[tuple[Capability, ...], Ranking] | None = field(
        default=None, init=False, repr=False, compare=False)

    def register(self, capability: Capability) -> None:
        if capability.name in self.capabilities:
            raise ValueError(f"capability {capability.name!r} is already registered")
        taken = {t.name for c in self.capabilities.values() for t in c.tools}
        clash = taken & {t.name for t in capability.tools}
        if clash:
            raise ValueError(f"tool name(s) already registered: {', '.join(sorted(clash))}")
        self.capabilities[capability.name] = capability

    def replace(self, capability: Capability) -> None:
        """Put a registered capability's new version in its place (an MCP server that listed
        its tools anew); its tool names must not clash with another capability's."""
        taken = {t.name for c in self.capabilities.values() if c.name != capability.name
                 for t in c.tools}
        clash = taken & {t.name for t in capability.tools}
        if clash:
            raise ValueError(f"tool name(s) already registered: {', '.join(sorted(clash))}")
        self.capabilities[capability.name] = capability

    def loaded(self, active: Iterable[str]) -> list[Capability]:
        """Core capabilities and the conversation's activated ones, in a deterministic order."""
        wanted = set(active)
        return sorted((c for c in self.capabilities.values() if c.core or c.name in wanted),
                      key=lambda c: (not c.core, c.name))

    def schemas(self, active: Iterable[str]) -> list[dict[str, Any]]:
        return [t.schema() for c in self.loaded(active) for t in c.tools]

    def index(self, active: Iterable[str]) -> list[CapabilityLine]:
        """The `<capabilities>` lines of the prefix for a conversation."""
        loaded = {c.name for c in self.loaded(active)}
        return [CapabilityLine(c.name, c.description, c.name in loaded, c.group)
                for c in self.capabilities.values() if self.in_index(c)]

    def in_index(self, capability: Capability) -> bool:
        """Whether the index names it: it has tools, or it is an MCP server still starting
        (tool_activate waits for it). One that failed without ever listing tools is not:
        tool_activate would refuse it."""
        return bool(capability.tools) or (capability.name in self.starting
                                          and capability.name not in self.problems)

    def ranking(self) -> Ranking:
        """tool_search's index of every capability, built again only when one was registered
        or replaced (an MCP server that listed its tools anew), never per query."""
        current = tuple(self.capabilities.values())
        kept = self._ranking
        if kept is None or len(kept[0]) != len(current) or any(
                a is not b for a, b in zip(kept[0], current, strict=True)):
            kept = self._ranking = (current, Ranking(current))
        return kept[1]

    def search(self, query: str, active: Iterable[str]) -> list[Hit]:
        """The capabilities not loaded yet that `query` means, best first, at most
        SEARCH_RESULTS; with no query, every one not loaded, by name."""
        loaded = {c.name for c in self.loaded(active)}
        if not query.strip():
            return [Hit(c, 0.0, "") for c in sorted(self.capabilities.values(),
                                                    key=lambda c: c.name)
                    if c.name not in loaded]
        return self.ranking().search(query, loaded, SEARCH_RESULTS)

    def tool(self, name: str, active: Iterable[str]) -> Tool | None:
        for capability in self.loaded(active):
            for tool in capability.tools:
                if tool.name == name:
                    return tool
        return None

    def progress_line(self, name: str) -> str:
        """What the user sees while the tool `name` runs: its own line, else its name."""
        for capability in self.capabilities.values():
            for tool in capability.tools:
                if tool.name == name and tool.progress:
                    return tool.progress
        return f"using {name.replace('_', ' ')}…"

    async def run(self, call: ToolCall, context: Any, active: Sequence[str]) -> ToolResult:
        """Run one call; every failure becomes an error result, never an exception."""
        tool = self.tool(call.name, active)
        if tool is None:
            hint = (" It exists but is not loaded: call tool_activate first."
                    if any(t.name == call.name for c in self.capabilities.values()
                           for t in c.tools) else " Use tool_search to find tools.")
            return ToolResult(call.name, f"{ERROR_PREFIX}no tool named {call.name!r}.{hint}",
                              error=True)
        arguments, problem = tool.check(call.arguments)
        if problem:
            return ToolResult(call.name, f"{ERROR_PREFIX}{problem}", error=True)
        try:
            content = await asyncio.wait_for(tool.handler(context, **arguments), tool.timeout)
        except TimeoutError:
            return ToolResult(call.name, f"{ERROR_PREFIX}{call.name} timed out after "
                                         f"{tool.timeout:.0f}s", error=True)
        except Exception as exc:  # the boundary of a tool: report to the model, keep the turn
            log.exception("tool %s failed", call.name)
            return ToolResult(call.name, f"{ERROR_PREFIX}{call.name} failed: {exc}", error=True)
        if isinstance(content, ToolOutput):
            return ToolResult(call.name, content.text, images=content.images)
        return ToolResult(call.name, content)


def _coerce(value: Any, expected: str | None) -> Any:
    if isinstance(value, str) and expected in ("integer", "number"):
        try:
            return int(value) if expected == "integer" else float(value)
        except ValueError:
            return value
    return value


def _is_type(value: Any, expected: str) -> bool:
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    check = checks.get(expected)
    return check(value) if check else True
