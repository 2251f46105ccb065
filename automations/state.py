"""What the automations remember: run records, reminders, alert times.

Layout, in the state directory (apart from the store's files, which stay the store's own)::

    automations.json          TinyDB (atomic writes): runs, reminders done, alerts
    automations-alive         when the daemon last noted that it ran (the start of an outage)
    reminders/<id>.json       one file per pending reminder, written atomically
    run-requests/<id>.json    `roost automations run NAME` asking the running daemon

A pending reminder is a file of its own so that `roost automations remind` can add one while the
daemon runs, without two processes writing one database: the command only creates files, the
daemon arms them (at start and by a periodic scan), and when a reminder is delivered, cancelled
or reported it records it in `automations.json` and only then removes the file. Both files are
bounded: runs keep the last `RUNS_KEPT` per automation, finished reminders `DONE_KEPT`.

Synchronous and serialised by one lock; the daemon calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinydb import Query, TinyDB

from daemon.core.logs import automation_log as log
from daemon.store import AtomicJSONStorage, atomic_write
from daemon.store.files import FollowingJSONStorage, move_aside

REMINDER_FIELDS = frozenset({"id", "chat_key", "due", "text"})  # what delivering one needs
RUNS_KEPT = 100
DONE_KEPT = 500
FILE = "automations.json"
REMINDERS = "reminders"
REQUESTS = "run-requests"
SCAN_EVERY = 10.0  # seconds between the daemon's scans of reminders and run requests
ALIVE = "automations-alive"


@dataclass(frozen=True)
class RunResult:
    """What a run did (the record's fields, for the command that prints it)."""

    run_id: str
    status: str  # ok, undelivered, quiet, failed, skipped
    text: str = ""
    error: str = ""


def manual_run_id(name: str, request: str) -> str:
    """The record id of a run made by hand (`roost automations run`)."""
    return f"{name}@now-{request}"


class AutomationState:
    """Run records, reminders and alert times; see the module docstring."""

    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        self.state_dir = state_dir
        self.reminder_dir = state_dir / REMINDERS
        self.read_only = read_only
        if not read_only:
            self.reminder_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Read-only is a command beside the running daemon, which writes the file meanwhile:
        # its copy must follow the file (the daemon's own copy is the file, it is the writer).
        storage = FollowingJSONStorage if read_only else AtomicJSONStorage
        self._db = TinyDB(state_dir / FILE, storage=storage)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- runs ----------------------------------------------------------------------------

    def run(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            doc = self._db.table("runs").get(Query().id == run_id)
        return dict(doc) if isinstance(doc, Mapping) else None

    def start_run(self, doc: Mapping[str, Any]) -> bool:
        """Record a run that starts; False when its slot already has a record (run once)."""
        with self._lock:
            runs = self._db.table("runs")
            if runs.contains(Query().id == doc["id"]):
                return False
            runs.insert(dict(doc))
            mine = sorted((r for r in runs.all() if r["name"] == doc["name"]),
                          key=lambda r: r["started"])
            if len(mine) > RUNS_KEPT:
                old = {r["id"] for r in mine[:-RUNS_KEPT]}
                runs.remove(Query().id.one_of(sorted(old)))
            return True

    def update_run(self, run_id: str, **fields: Any) -> str | None:
        """Set fields of a run's record; "ok" stays "undelivered" when a target has refused
        the report already (its chat worker may be quicker than the run's last write). The
        status written, if any."""
        with self._lock:
            runs = self._db.table("runs")
            if fields.get("status") == "ok":
                doc = runs.get(Query().id == run_id)
                if isinstance(doc, Mapping) and doc.get("refused"):
                    fields = {**fields, "status": "undelivered"}
            runs.update(fields, Query().id == run_id)
        status = fields.get("status")
        return None if status is None else str(status)

    def record_refused(self, run_id: str, target: str,
                       reason: str) -> tuple[str, bool] | None:
        """A target refused the run's report: on the record (`refused`, per target), and an
        "ok" run becomes "undelivered". The automation's name and whether this turned the run
        from "ok" into "undelivered" (once per run: /metrics counts it); None when the run is
        not known."""
        with self._lock:
            runs = self._db.table("runs")
            doc = runs.get(Query().id == run_id)
            if not isinstance(doc, Mapping):
                return None
            refused = {**doc.get("refused", {}), target: reason}
            fields: dict[str, Any] = {"refused": refused, "error": "not delivered to " + "; ".join(
                f"{where} ({why})" for where, why in sorted(refused.items()))}
            turned = doc.get("status") == "ok"
            if turned:
                fields["status"] = "undelivered"
            runs.update(fields, Query().id == run_id)
            return str(doc["name"]), turned

    def consecutive_refusals(self, name: str, through: str) -> int:
        """Scheduled runs in a row up to the run `through`, newest first, whose report a target
        refused (runs that delivered nothing by design, a failure, a skip, a quiet reply, do not
        break the row). Counted from that run, not the newest: a refusal may come in after the
        next run started."""
        runs = self.runs(name)
        ids = [r["id"] for r in runs]
        count = 0
        for run in reversed(runs[: ids.index(through) + 1] if through in ids else runs):
            if run.get("manual") or run.get("status") in ("skipped", "missed", "quiet", "failed"):
                continue
            if not run.get("refused"):
                break
            count += 1
        return count

    def record_sent(self, run_id: str, target: str, message_ids: list[str]) -> bool:
        """The platform's ids of what a run delivered to `target` (set again, not appended, so
        hearing of one delivery twice records it once); False when the run is not known."""
        with self._lock:
            runs = self._db.table("runs")
            doc = runs.get(Query().id == run_id)
            if not isinstance(doc, Mapping):
                return False
            sent = {**doc.get("message_ids", {}), target: list(message_ids)}
            runs.update({"message_ids": sent}, Query().id == run_id)
            return True

    def runs(self, name: str | None = None) -> list[dict[str, Any]]:
        """Run records, oldest first."""
        with self._lock:
            found = [dict(r) for r in self._db.table("runs").all()
                     if name is None or r["name"] == name]
        return sorted(found, key=lambda r: r["started"])

    def consecutive_failures(self, name: str) -> int:
        count = 0
        for run in reversed(self.runs(name)):
            if run.get("status") == "skipped":
                continue
            if run.get("status") != "failed":
                break
            count += 1
        return count

    def alive(self) -> float | None:
        """When the daemon last noted that it ran (see `Automations.scan`), if ever."""
        try:
            return float((self.state_dir / ALIVE).read_text("ascii"))
        except (OSError, ValueError):  # never noted, or half a note: no outage known
            return None

    def set_alive(self, at: float) -> None:
        # A file of its own: a note a minute would otherwise rewrite all of automations.json.
        atomic_write(self.state_dir / ALIVE, repr(at).encode("ascii"))

    def last_alert(self, name: str) -> float | None:
        with self._lock:
            doc = self._db.table("alerts").get(Query().name == name)
        return float(doc["at"]) if isinstance(doc, Mapping) else None

    def set_alert(self, name: str, at: float) -> None:
        with self._lock:
            self._db.table("alerts").upsert({"name": name, "at": at}, Query().name == name)

    # ---- reminders -----------------------------------------------------------------------

    def add_reminder(self, doc: Mapping[str, Any]) -> None:
        """A pending reminder, as its own file (safe from another process, see above)."""
        self.reminder_dir.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(dict(doc), ensure_ascii=False).encode("utf-8")
        atomic_write(self.reminder_dir / f"{doc['id']}.json", payload)

    def pending_reminders(self) -> list[dict[str, Any]]:
        """Every pending reminder, soonest first. A file that is not a reminder (damaged,
        hand-edited, unreadable by this user) is skipped and named, once: it is moved aside
        when it can be, so it stops neither the others nor a start."""
        found = []
        for path in sorted(self.reminder_dir.glob("*.json")):
            try:
                doc = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError) as exc:
                self._set_aside(path, str(exc))
                continue
            if not (isinstance(doc, dict) and REMINDER_FIELDS <= doc.keys()
                    and isinstance(doc["due"], int | float)):
                self._set_aside(path, "not a reminder record")
                continue
            found.append(doc)
        return sorted(found, key=lambda d: d["due"])

    @staticmethod
    def _set_aside(path: Path, reason: str) -> None:
        try:
            move_aside(path, reason, "that reminder is not delivered")
        except OSError as exc:  # e.g. a file of another user in a folder we cannot write
            log.error("cannot use the reminder file %s (%s) nor move it aside: %s", path,
                      reason, exc)

    def finish_reminder(self, doc: Mapping[str, Any], status: str, at: float) -> None:
        """Record how a reminder ended (delivered, late, missed, cancelled), then forget the
        pending file; a crash in between finds the record and removes the file again."""
        with self._lock:
            done = self._db.table("reminders")
            if not done.contains(Query().id == doc["id"]):
                done.insert({**doc, "status": status, "finished": at})
            records = sorted(done.all(), key=lambda r: r["finished"])
            if len(records) > DONE_KEPT:
                done.remove(Query().id.one_of([r["id"] for r in records[:-DONE_KEPT]]))
        (self.reminder_dir / f"{doc['id']}.json").unlink(missing_ok=True)

    def finished_reminder(self, reminder_id: str) -> dict[str, Any] | None:
        with self._lock:
            doc = self._db.table("reminders").get(Query().id == reminder_id)
        return dict(doc) if isinstance(doc, Mapping) else None

    # ---- run requests from the command line ------------------------------------------------

    def request_run(self, doc: Mapping[str, Any]) -> None:
        folder = self.state_dir / REQUESTS
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / f"{doc['id']}.json", json.dumps(dict(doc)).encode("utf-8"))

    def run_requested(self, request_id: str) -> bool:
        """Whether the request is still waiting to be taken by the daemon."""
        return (self.state_dir / REQUESTS / f"{request_id}.json").exists()

    def take_run_requests(self) -> list[dict[str, Any]]:
        """The requests waiting, each removed as it is taken (a crash loses the request, and
        the command that made it says the daemon did not answer)."""
        taken = []
        for path in sorted((self.state_dir / REQUESTS).glob("*.json")):
            # Claimed by a rename first: two scans at once (the interval's and the console's
            # Run now) cannot both take one request and run it twice.
            claimed = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.taken")
            try:
                path.rename(claimed)
            except OSError:
                continue  # taken by the other scan
            try:
                taken.append(json.loads(claimed.read_text("utf-8")))
            except (OSError, ValueError):
                pass  # half a request cannot be run; dropped below
            claimed.unlink(missing_ok=True)
        return taken

    def finished_reminders(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted((dict(r) for r in self._db.table("reminders").all()),
                          key=lambda r: r["finished"])
