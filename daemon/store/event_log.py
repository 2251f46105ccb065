"""What roost notes about itself: the daily event log and the last requests it sent.

* `corpus/YYYY-MM-DD.log.md` (the day in `daemon.timezone`): one line per fold, rotation,
  overflow retry, silent cut, compaction, so an operator can read what happened to a conversation.
* `debug/<id>.json`: the last 50 requests (every call of a turn) with their estimated tokens
  against the budget.

Synchronous; the daemon calls it through `asyncio.to_thread`. A failure to write a record is
logged and never fails a turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from daemon.core.errors import StoreError
from daemon.core.ids import new_id
from daemon.core.logs import store_log as log
from daemon.store import atomic_write

KEEP_SNAPSHOTS = 50


class Records:
    def __init__(self, state_dir: Path, tz: ZoneInfo, keep: int = KEEP_SNAPSHOTS, *,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.corpus = state_dir / "corpus"
        self.debug = state_dir / "debug"
        self.tz = tz
        self.keep = keep
        self.on_event = on_event  # told each kind (daemon.app.metrics)

    def event(self, now: float, kind: str, conversation_id: str, detail: str) -> None:
        """Append one line to the day's event log."""
        if self.on_event is not None:
            self.on_event(kind)
        local = datetime.fromtimestamp(now, self.tz)
        path = self.corpus / f"{local.date().isoformat()}.log.md"
        line = f"- {local.strftime('%H:%M:%S')} **{kind}** `{conversation_id}`: {detail}\n"
        try:
            self.corpus.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError as exc:
            log.warning("cannot append to %s: %s", path, exc)

    def events(self, day: str) -> list[str]:
        """The lines of one day's log (for tests and `/status`)."""
        path = self.corpus / f"{day}.log.md"
        return path.read_text("utf-8").splitlines() if path.exists() else []

    def snapshot(self, now: float, conversation_id: str, body: Mapping[str, Any]) -> None:
        """Keep one request (with its token accounting); only the newest `keep` stay."""
        name = f"{new_id(now)}.json"
        payload = {"conversation_id": conversation_id, "time": now, **body}
        try:
            self.debug.mkdir(parents=True, exist_ok=True)
            data = json.dumps(payload, ensure_ascii=False, indent=1).encode("utf-8")
            atomic_write(self.debug / name, data)
            for old in sorted(self.debug.glob("*.json"))[: -self.keep]:
                old.unlink(missing_ok=True)
        except (OSError, StoreError) as exc:
            log.warning("cannot keep a request snapshot in %s: %s", self.debug, exc)
