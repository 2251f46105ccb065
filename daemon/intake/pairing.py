"""Pairing: a stranger gets a code, the owner approves it with `roost pairing approve CODE`.

The book is one small JSON file in the state directory (`pairing.json`), separate from the
store so that the `roost pairing` commands can change it while the daemon runs: every change
is a read-modify-write under `pairing.lock` (flock) with an atomic replace, and the daemon
notices a change by the file's stamp (mtime, inode, size). Strangers cost nothing that grows:
at most `MAX_PENDING` codes wait per channel, each expires after an hour and is dropped at the
next write, and a sender who already has a code gets no second one. Only the owner's approvals
add lasting entries.

An approved entry carries the sender's role, "member" or "guest" (`roost pairing approve
--role`, `roost people set-role`); only the config names an owner. An entry written before roles
existed has none and reads as a member, so that an upgrade demotes nobody.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from daemon.core.config import GUEST, MEMBER
from daemon.core.errors import StoreError
from daemon.store.files import atomic_write, exclusive

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L or U: read aloud safely
CODE_LENGTH = 8
CODE_TTL = 3600.0  # seconds a code stays valid
MAX_PENDING = 3  # codes waiting per channel; further strangers get nothing until one goes
PAIRED_ROLES = (GUEST, MEMBER)  # what pairing may give; "owner" only the config names


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
    role: str = MEMBER  # absent from entries written before roles: they stay members

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> Approved:
        """An entry of the file; keys this version does not know are left out."""
        return cls(**{f.name: item[f.name] for f in fields(cls) if f.name in item})

    @property
    def chat_key(self) -> str:
        """The sender's own chat: the platform's user id is the id of their private chat."""
        return f"{self.channel}:{self.sender}"


Approvals = Mapping[tuple[str, str], Approved]  # (channel, sender) -> their entry
_NOBODY: Approvals = MappingProxyType({})


class PairingBook:
    """The pending codes and the approved senders of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "pairing.json"
        self._lock_path = state_dir / "pairing.lock"
        # The approved entries and the stamp of the file they were read from, set together.
        self._known: tuple[tuple[int, int, int] | None, Approvals] = (None, _NOBODY)

    # ---- what the daemon asks -----------------------------------------------------------

    def is_approved(self, channel: str, sender: str) -> bool:
        """Whether the owner approved this sender (re-read only when the file changed)."""
        return (channel, sender) in self.approvals()

    def approvals(self) -> Approvals:
        """The approved senders now, re-read only when the file changed: every change is an
        atomic replace, so a new inode, mtime or size tells (two writes within the clock's
        tick keep the mtime, not the size: "guest" and "member" differ by a letter)."""
        try:
            found = self.path.stat()
        except FileNotFoundError:
            return _NOBODY
        stamp = (found.st_mtime_ns, found.st_ino, found.st_size)
        seen, approvals = self._known
        if stamp != seen:
            approvals = MappingProxyType({(a.channel, a.sender): a for a in self.approved()})
            self._known = (stamp, approvals)
        return approvals

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
        return [Approved.of(a) for a in self._read(None)["approved"]]

    def approve(self, code: str, now: float, role: str = GUEST) -> PairingRequest | None:
        """Approve the sender behind `code` as a guest (or `role`: "member"); None when no such
        code is waiting."""
        _check_role(role)
        with self._locked():
            data = self._read(now)
            found = self._take(data, code)
            if found is not None:
                data["approved"] = [a for a in data["approved"]
                                    if (a["channel"], a["sender"]) != (found.channel,
                                                                       found.sender)]
                data["approved"].append(asdict(Approved(found.channel, found.sender,
                                                        found.name, now, role)))
                self._write(data)
            return found

    def admit(self, channel: str, sender: str, name: str, now: float,
              role: str = MEMBER) -> Approved:
        """Approve a sender without a code: `roost init` for the owner who sent /start."""
        _check_role(role)
        with self._locked():
            data = self._read(now)
            data["approved"] = [a for a in data["approved"]
                                if (a["channel"], a["sender"]) != (channel, sender)]
            data["pending"] = [p for p in data["pending"]
                               if (p["channel"], p["sender"]) != (channel, sender)]
            made = Approved(channel, sender, name[:64], now, role)
            data["approved"].append(asdict(made))
            self._write(data)
            return made

    def set_role(self, channel: str, sender: str, role: str) -> Approved | None:
        """Give an approved sender another role ("member" or "guest"); None when not
        approved. The rest of their entry stays as it was."""
        _check_role(role)
        with self._locked():
            data = self._read(None)
            for i, item in enumerate(data["approved"]):
                if (item["channel"], item["sender"]) == (channel, sender):
                    data["approved"][i] = {**item, "role": role}
                    self._write(data)
                    return Approved.of(data["approved"][i])
            return None

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
                    found = Approved.of(data["approved"].pop(i))
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


def _check_role(role: str) -> None:
    if role not in PAIRED_ROLES:
        raise ValueError(f"pairing gives the role guest or member, not {role!r}")


def _new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
