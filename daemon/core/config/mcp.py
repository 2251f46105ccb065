"""[mcp] and its [mcp.servers.NAME] tables."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from daemon.core.config.credentials import read_secret
from daemon.core.config.values import (
    _BOOL,
    _PERIOD,
    _STRING,
    _TEXT,
    _URL,
    _array,
    _at_least,
    _Bad,
    _one_of,
    _Spec,
    _value,
)
from daemon.core.errors import ConfigError


@dataclass(frozen=True)
class McpServerSettings:
    """One `[mcp.servers.NAME]`: a stdio server (`command`) or a streamable HTTP one (`url`)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # ${NAME}s resolved
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # likewise
    description: str | None = None  # the index line; else the server's own, cut to one line
    approve: str = "ask"  # "never" | "ask" | "always", for every tool of the server
    approve_tools: Mapping[str, str] = field(default_factory=dict)  # per tool, over `approve`
    # Its tools act outside the asker's own data (the house's lights, a family calendar): only
    # an owner approves a call from anyone else's chat (daemon.turn.approvals).
    shared: bool = False
    timeout: float = 60.0  # seconds one call may take
    enabled: bool = True
    missing: tuple[str, ...] = ()  # ${NAME}s with no value: the server cannot start


@dataclass(frozen=True)
class McpSettings:
    servers: tuple[McpServerSettings, ...] = ()
    approve_timeout: float = 600.0  # no answer within this counts as Deny
    start_timeout: float = 30.0  # a server not listing its tools by then failed this start
    result_max_chars: int = 20_000  # what is kept of one result; the model sees less of it


_APPROVE = _one_of("never", "ask", "always")
_MCP: _Spec = {"approve_timeout": _PERIOD, "start_timeout": _PERIOD,
               "result_max_chars": _at_least(1000)}
_MCP_SERVER: _Spec = {
    "command": _STRING, "args": _array(_TEXT), "env": _value(dict, "a table of strings"),
    "cwd": _STRING, "url": _URL, "headers": _value(dict, "a table of strings"),
    "description": _STRING, "approve": _APPROVE,
    "approve_tools": _value(dict, "a table of tool name = 'never', 'ask' or 'always'"),
    "timeout": _PERIOD, "enabled": _BOOL, "shared": _BOOL}
_SERVER_NAME = re.compile("[a-z0-9][a-z0-9_-]{0,29}")
# The capabilities roost registers itself (daemon/tools, automations/reminders.py): a server's
# name is its capability's, so it cannot be one of these (a test holds the list to the code).
BUILTIN_CAPABILITIES = frozenset({"memory", "time", "tools", "files", "facts", "web",
                                  "documents", "reminders"})
# A value the file gives literally under one of these names is a secret in the file.
_SECRETISH = re.compile("(?i)token|secret|password|passwd|api_?key|authorization|cookie")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _mcp(table: Any, read: Callable[[Any, str, _Spec], dict[str, Any]],
         fail: Callable[[str, str], ConfigError], env: Mapping[str, str],
         path: Path | None) -> McpSettings:
    """`[mcp]` and its `[mcp.servers.NAME]` tables. Values of `env` and `headers` may name
    secrets as `${NAME}` (from the environment or $CREDENTIALS_DIRECTORY/NAME); one that is
    not set leaves the server unable to start (doctor says so), not the daemon."""
    servers_table = table.get("servers", {}) if isinstance(table, dict) else {}
    top = read({k: v for k, v in table.items() if k != "servers"}
               if isinstance(table, dict) else table, "mcp", _MCP)
    if not isinstance(servers_table, dict):
        raise fail("mcp.servers", "expected a table of [mcp.servers.NAME] tables")
    servers = []
    for name, raw in servers_table.items():
        where = f"mcp.servers.{name}"
        if not _SERVER_NAME.fullmatch(name):
            raise fail(where, "the name must be lowercase letters, digits, '-' and '_' "
                       "(at most 30), starting with a letter or digit")
        if name in BUILTIN_CAPABILITIES:
            raise fail(where, f"{name!r} is the name of one of roost's own capabilities; give "
                       f"the server another name, such as "
                       f"[mcp.servers.{_free_name(name, servers_table)}]")
        values = read(raw, where, _MCP_SERVER)
        if ("command" in values) == ("url" in values):
            raise fail(where, "needs either command (a stdio server) or url (streamable HTTP)")
        missing: list[str] = []
        for key in ("env", "headers"):
            resolved = {}
            for item, value in values.get(key, {}).items():
                if not isinstance(value, str):
                    raise fail(f"{where}.{key}.{item}", "expected a string")
                if _SECRETISH.search(item) and not _REFERENCE.search(value):
                    raise fail(f"{where}.{key}.{item}", "secrets do not belong in the config "
                               "file; write \"${NAME}\" and set NAME in the environment or "
                               "$CREDENTIALS_DIRECTORY/NAME")
                missing += [n for n in _REFERENCE.findall(value)
                            if not read_secret(n, env, path)]
                resolved[item] = _REFERENCE.sub(
                    lambda m: read_secret(m.group(1), env, path) or "", value)
            values[key] = MappingProxyType(resolved)
        for tool, policy in values.get("approve_tools", {}).items():
            try:
                _APPROVE(policy)
            except _Bad as bad:
                raise fail(f"{where}.approve_tools.{tool}", str(bad)) from None
        values["approve_tools"] = MappingProxyType(dict(values.get("approve_tools", {})))
        servers.append(McpServerSettings(name=name, missing=tuple(missing), **values))
    return McpSettings(servers=tuple(servers), **top)


def _free_name(name: str, taken: Mapping[str, object]) -> str:
    """A server name like `name` that is neither a built-in's nor another server's."""
    candidates = [f"{name}-mcp", f"{name}-server", *(f"{name}-{n}" for n in range(2, 100))]
    return next(c for c in candidates if c not in taken and c not in BUILTIN_CAPABILITIES)
