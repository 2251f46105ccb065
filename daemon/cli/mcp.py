"""`roost mcp list|test` and doctor's MCP checks: start the configured servers here, ask
for their tools, call nothing, stop them."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from typing import TextIO

from daemon.core.config import Settings
from daemon.tools.mcp.servers import McpServers, ServerStatus, not_offered, with_servers

EX_UNKNOWN = 2


async def _probed(settings: Settings, names: Sequence[str] | None = None
                  ) -> tuple[list[ServerStatus], McpServers]:
    mcp = settings.mcp
    if names is not None:
        mcp = dataclasses.replace(mcp, servers=tuple(s for s in mcp.servers if s.name in names))
    _, servers = await asyncio.to_thread(with_servers, mcp, settings.daemon.state_dir)
    await servers.start()
    try:
        await asyncio.wait_for(servers.wait_started(), mcp.start_timeout + 5)
    except TimeoutError:
        pass
    return servers.status(), servers


async def mcp_list(settings: Settings, out: TextIO | None = None) -> int:
    """Each server: transport, state, its tools (or why it is not up)."""
    out = out or sys.stdout
    if not settings.mcp.servers:
        out.write("No MCP servers configured ([mcp.servers.NAME] in roost.toml).\n")
        return 0
    statuses, servers = await _probed(settings)
    try:
        for status in statuses:
            out.write(f"{status.name} ({status.transport}): {status.state}"
                      f"{f' - {status.error}' if status.error else ''}\n")
            capability = servers.registry.capabilities.get(status.name)
            if status.state == "up" and capability is not None:
                for tool in capability.tools:
                    out.write(f"  {tool.name} [approve: {tool.approve}] {tool.description}\n")
                _write_not_offered(servers, status.name, out)
    finally:
        await servers.stop()
    return 0 if all(s.state in ("up", "disabled") for s in statuses) else 1


def _write_not_offered(servers: McpServers, name: str, out: TextIO) -> None:
    listing = servers.connections[name].listing
    if listing is not None and (task_only := not_offered(listing)):
        out.write(f"  not offered: {', '.join(task_only)} (must run as tasks, which roost "
                  "does not do)\n")


async def mcp_test(settings: Settings, name: str, out: TextIO | None = None,
                   err: TextIO | None = None) -> int:
    """Start one server, list its tools with their schemas as the model gets them."""
    out, err = out or sys.stdout, err or sys.stderr
    if name not in {s.name for s in settings.mcp.servers}:
        known = ", ".join(s.name for s in settings.mcp.servers) or "none"
        err.write(f"roost: no MCP server {name!r} (configured: {known})\n")
        return EX_UNKNOWN
    statuses, servers = await _probed(settings, [name])
    try:
        (status,) = statuses
        if status.state != "up":
            out.write(f"{name}: {status.state} - {status.error or 'did not come up'}\n")
            return 1
        capability = servers.registry.capabilities[name]
        out.write(f"{name}: up, {capability.description}\n")
        for tool in capability.tools:
            out.write(f"  {tool.name} [approve: {tool.approve}]: {tool.description}\n"
                      f"    {tool.schema()['function']['parameters']}\n")
        _write_not_offered(servers, name, out)
        return 0
    finally:
        await servers.stop()


async def doctor_checks(settings: Settings) -> list[tuple[str, bool, str, str]]:
    """(name, ok, detail, fix) for each configured server."""
    if not settings.mcp.servers:
        return []
    statuses, servers = await _probed(settings)
    await servers.stop()
    checks = []
    for status in statuses:
        ok = status.state in ("up", "disabled")
        detail = (f"{status.transport}, {status.tools} tools" if status.state == "up"
                  else f"{status.state}: {status.error}")
        checks.append((f"mcp {status.name}", ok, detail,
                       "" if ok else f"run `roost mcp test {status.name}`; its stderr is in "
                       f"{settings.daemon.state_dir}/logs/mcp-{status.name}.log"))
    return checks
