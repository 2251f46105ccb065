"""What each MCP server listed when it was last up: `<state>/mcp/catalog.json`.

The capability index is part of the system prefix, which must be the same bytes on every turn.
A server starts in the background and may come up after the first turn (or not at all today):
its capability is built from what it listed last time, so a restart changes no byte of the
prefix, and only a server whose tools really changed changes its index line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from daemon.store.files import CorruptFile, atomic_write, dumps, move_aside, read_json
from daemon.tools.mcp.connection import Listing


class Catalog:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "mcp" / "catalog.json"
        self._lock = threading.Lock()  # writes come from worker threads; one at a time

    def read(self) -> dict[str, Listing]:
        try:
            data = read_json(self.path) or {}
        except CorruptFile as exc:
            move_aside(self.path, str(exc), "the servers' tools are listed anew")
            return {}
        from mcp import types  # not at the top: see daemon/tools/mcp/connection.py

        out: dict[str, Listing] = {}
        for name, entry in data.items():
            try:
                tools = tuple(types.Tool.model_validate(t) for t in entry["tools"])
            except (KeyError, TypeError, ValueError):
                continue  # one bad entry: that server is listed anew
            out[name] = Listing(description=str(entry.get("description", "")), tools=tools,
                                instructions=str(entry.get("instructions", "")))
        return out

    def write(self, listings: dict[str, Listing]) -> None:
        data: dict[str, Any] = {
            name: {"description": listing.description, "instructions": listing.instructions,
                   "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                             for t in listing.tools]}
            for name, listing in sorted(listings.items())}
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, dumps(data))
