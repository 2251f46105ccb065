"""Pairing: a stranger gets a code, the owner approves it with `roost pairing approve CODE`.

The book is one small JSON file in the state directory (`pairing.json`), separate from the
store so that the `roost pairing` commands can change it while the daemon runs: every change
is a read-modify-write under `pairing.lock` (flock) with an atomic replace, and the daemon
notices a change by the file's mtime. Strangers cost nothing that grows: at most
`MAX_PENDING` codes wait per channel, each expires after an hour and is dropped at the next
write, and a sender who already has a code gets no second one. Only the owner's approvals add
lasting entries.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from daemon.core.errors import StoreError
from daemon.store.files import atomic_write, exclusive

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L or U: read aloud safely
CODE_LENGTH = 8
CODE_TTL = 3600.0  # seconds a code stays valid
MAX_PENDING = 3  # codes waiting per channel; further strangers get nothing until one goes


@dataclass(frozen=True)
class PairingRequest:
    code: str
    channel: str  # "telegram"
    sender: str  # the platform's user id, as a string
    chat_key: str  # where the code was sent (and where to say hello once approved)
    name: str  # what the platform calls the sender, for the owner's list
    created: float


@dataclass(frozen=True)
class Approved:
    channel: str
    sender: str
    name: str
    approved: float


class PairingBook:
    """The pending codes and the approved senders of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "pairing.json"
        self._lock_path = state_dir / "pairing.lock"
        self._seen: int | None = None  # mtime_ns of the file behind `_approved`
        self._approved: frozenset[tuple[str, str]] = frozenset()

    # ---- what the daemon asks -----------------------------------------------------------

    def is_approved(self, channel: str, sender: str) -> bool:
        """Whether the owner approved this sender (re-read only when the file changed)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return False
        if mtime != self._seen:
            self._approved = frozenset((a.channel, a.sender) for a in self.approved())
            self._seen = mtime
        return (channel, sender) in self._approved

    def request(self, channel: str, sender: str, chat_key: str, name: str,
                now: float) -> PairingRequest | None:
        """A new code for a stranger; None when they have one already or the channel's
        waiting list is full (either way nothing is sent)."""
        with self._locked():
            data = self._read(now)
            pending = [PairingRequest(**p) for p in data["pending"]]
            if any(p.channel == channel and p.sender == sender for p in pending):
                return None
            if sum(p.channel == channel for p in pending) >= MAX_PENDING:
                return None
            taken = {p.code for p in pending}
            code = _new_code()
            while code in taken:
                code = _new_code()
            made = PairingRequest(code, channel, sender, chat_key, name[:64], now)
            data["pending"].append(asdict(made))
            self._write(data)
            return made

    # ---- what the owner does ------------------------------------------------------------

    def pending(self, now: float) -> list[PairingRequest]:
        return [PairingRequest(**p) for p in self._read(now)["pending"]]

    def approved(self) -> list[Approved]:
        return [Approved(**a) for a in self._read(None)["approved"]]

    def approve(self, code: str, now: float) -> PairingRequest | None:
        """Approve the sender behind `code`; None when no such code is waiting."""
        with self._locked():
            data = self._read(now)
            found = self._take(data, code)
            if found is not None:
                data["approved"] = [a for a in data["approved"]
                                    if (a["channel"], a["sender"]) != (found.channel,
                                                                       found.sender)]
                data["approved"].append(asdict(Approved(found.channel, found.sender,
                                                        found.name, now)))
                self._write(data)
            return found

    def admit(self, channel: str, sender: str, name: str, now: float) -> Approved:
        """Approve a sender without a code: `roost init` for the owner who sent /start."""
        with self._locked():
            data = self._read(now)
            data["approved"] = [a for a in data["approved"]
                                if (a["channel"], a["sender"]) != (channel, sender)]
            data["pending"] = [p for p in data["pending"]
                               if (p["channel"], p["sender"]) != (channel, sender)]
            made = Approved(channel, sender, name[:64], now)
            data["approved"].append(asdict(made))
            self._write(data)
            return made

    def deny(self, code: str, now: float) -> PairingRequest | None:
        """Drop `code` (the sender may ask again later); None when no such code is waiting."""
        with self._locked():
            data = self._read(now)
            found = self._take(data, code)
            if found is not None:
                self._write(data)
            return found

    def revoke(self, channel: str, sender: str) -> Approved | None:
        """Remove an approved sender (they must pair again); None when not approved."""
        with self._locked():
            data = self._read(None)
            for i, item in enumerate(data["approved"]):
                if (item["channel"], item["sender"]) == (channel, sender):
                    found = Approved(**data["approved"].pop(i))
                    self._write(data)
                    return found
            return None

    # ---- the file -------------------------------------------------------------------------

    @staticmethod
    def _take(data: dict[str, list[dict[str, Any]]], code: str) -> PairingRequest | None:
        code = code.strip().upper()
        for i, item in enumerate(data["pending"]):
            if item["code"] == code:
                return PairingRequest(**data["pending"].pop(i))
        return None

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive(self._lock_path)

    def _read(self, now: float | None) -> dict[str, list[dict[str, Any]]]:
        """The book, without codes that expired by `now` (None: keep them all)."""
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc
        pending = [p for p in data.get("pending", [])
                   if now is None or now - p["created"] < CODE_TTL]
        return {"pending": pending, "approved": list(data.get("approved", []))}

    def _write(self, data: dict[str, list[dict[str, Any]]]) -> None:
        """Atomic replace; owned like the state directory, so that `sudo roost pairing ...`
        leaves a file the service's own user (a systemd DynamicUser) can still read."""
        payload = json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8")
        atomic_write(self.path, payload, folder_owner=True)


def _new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
