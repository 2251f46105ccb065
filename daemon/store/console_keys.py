"""Sign-in links and sessions of the web console (`console.json` in the state directory).

A link is made by `roost console` (the owner: every chat) or by `/console` in a chat (that
person's chats only); it works once, within `LINK_TTL`, and becomes a session that the browser
keeps in a cookie. Only SHA-256 digests of links and session tokens are stored, so the file
gives nobody a way in. The daemon and the `roost` command share the file under a lock, as they
share the pairing book.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from daemon.core.config import Settings
from daemon.store.files import CorruptFile, atomic_write, exclusive, move_aside, read_json

LINK_TTL = 10 * 60.0
SESSION_TTL = 7 * 24 * 3600.0
OWNER = "*"  # the scope of the owner's link: every person's data
MAX_SESSIONS = 64  # the oldest session goes first; a home daemon has a handful of browsers


@dataclass(frozen=True)
class ConsoleSession:
    """Who a browser is: the chats it may see (`OWNER`: all) and its form token."""

    scope: tuple[str, ...]
    csrf: str
    created: float
    expires: float

    @property
    def is_owner(self) -> bool:
        return OWNER in self.scope

    def covers(self, chat_key: str) -> bool:
        return self.is_owner or chat_key in self.scope


def console_url(settings: Settings) -> str:
    """Where a browser reaches the console: `console.url` (a proxy's address), else the
    daemon's own listening address."""
    if settings.console.url:
        return settings.console.url.rstrip("/") + "/console"
    host = settings.daemon.listen_host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.daemon.listen_port}/console"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ConsoleKeys:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "console.json"
        self._lock_path = state_dir / "console.lock"

    def issue_link(self, scope: tuple[str, ...], now: float) -> str:
        """A new single-use sign-in token for `scope`."""
        token = secrets.token_urlsafe(24)
        with self._locked():
            data = self._read(now)
            data["links"][_digest(token)] = {"scope": list(scope), "expires": now + LINK_TTL}
            self._write(data)
        return token

    def redeem(self, link: str, now: float) -> tuple[str, ConsoleSession] | None:
        """Use a link up: a new session token and its session; None when the link is unknown,
        used or expired."""
        with self._locked():
            data = self._read(now)
            found = data["links"].pop(_digest(link), None)
            if found is None:
                return None
            token = secrets.token_urlsafe(32)
            session = ConsoleSession(tuple(found["scope"]), secrets.token_urlsafe(24), now,
                                     now + SESSION_TTL)
            sessions = data["sessions"]
            sessions[_digest(token)] = asdict(session)
            for old in sorted(sessions, key=lambda k: sessions[k]["created"])[:-MAX_SESSIONS]:
                del sessions[old]
            self._write(data)
        return token, session

    def session(self, token: str, now: float) -> ConsoleSession | None:
        found = self._read(now)["sessions"].get(_digest(token))
        if found is None:
            return None
        return ConsoleSession(tuple(found["scope"]), found["csrf"], found["created"],
                              found["expires"])

    def end(self, token: str) -> None:
        """Sign one browser out."""
        with self._locked():
            data = self._read(None)
            if data["sessions"].pop(_digest(token), None) is not None:
                self._write(data)

    def revoke_all(self) -> int:
        """End every session and unused link; how many there were."""
        with self._locked():
            data = self._read(None)
            count = len(data["sessions"]) + len(data["links"])
            self._write({"links": {}, "sessions": {}})
        return count

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self._lock_path)

    def _read(self, now: float | None) -> dict[str, dict[str, Any]]:
        """The file without what expired by `now` (None: everything)."""
        try:
            data = read_json(self.path) or {}
            kept = {part: {k: v for k, v in data.get(part, {}).items()
                           if now is None or float(v["expires"]) > now}
                    for part in ("links", "sessions")}
            for entry in (*kept["links"].values(), *kept["sessions"].values()):
                tuple(entry["scope"])
        except (CorruptFile, AttributeError, KeyError, TypeError, ValueError) as exc:
            # Sessions are cheap to make again: a broken file means signing in anew.
            move_aside(self.path, str(exc) or type(exc).__name__,
                       "every browser signs in to the console again")
            return {"links": {}, "sessions": {}}
        return kept

    def _write(self, data: dict[str, dict[str, Any]]) -> None:
        atomic_write(self.path, json.dumps(data, indent=1).encode("utf-8"), folder_owner=True)
