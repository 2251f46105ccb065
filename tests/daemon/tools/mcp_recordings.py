"""Eight real MCP servers as the daemon has them, from their recordings (tests/fixtures/mcp).

Each recording is what the server said about itself (its `initialize` answer and `tools/list`).
It goes into the catalog as the server's last listing (its title, else its own description, as
`Connection` takes them, and its instructions), and the servers are registered from there by
`with_servers`, as the daemon registers a configured server before it is up: no process and no
network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from daemon.core.config import McpServerSettings, McpSettings
from daemon.tools.mcp.servers import with_servers
from daemon.tools.registry import Registry

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "mcp"
# The names a user would give them; "time", "memory" and "files" are roost's own.
SERVERS = ("everything", "filesystem", "knowledge", "thinking", "clock", "git", "fetch",
           "sqlite")


def recording(name: str) -> dict[str, Any]:
    return dict(json.loads((RECORDINGS / f"{name}.json").read_text("utf-8")))


def catalog_entry(name: str) -> dict[str, Any]:
    """The server's listing as `mcp/catalog.json` keeps it."""
    said = recording(name)
    info = said["server_info"]
    return {"description": info.get("title") or info.get("description") or "",
            "instructions": said.get("instructions") or "", "tools": said["tools"]}


def with_recorded_servers(state_dir: Path, registry: Registry,
                          names: tuple[str, ...] = SERVERS) -> Registry:
    """`registry` with the recorded servers `names` registered (configured, not started)."""
    path = state_dir / "mcp" / "catalog.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({name: catalog_entry(name) for name in names}), "utf-8")
    settings = McpSettings(tuple(McpServerSettings(name=name, command="unused")
                                 for name in names))
    with_servers(settings, state_dir, registry)
    return registry
