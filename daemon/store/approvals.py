"""The tools each person said "Always for this tool" to: `<state>/approvals.json`.

A standing yes is the person's own, or an owner's for them (`by`): a shared tool's call outside
an owner's chat runs on an owner's "Always" for that person alone (daemon.turn.approvals).

Small and read afresh at every question (in a thread), so that `roost approvals revoke` takes
effect on the running daemon at once. Written atomically; a file that does not parse is moved
aside and counts as empty (everything is asked again: the safe side).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from daemon.store.files import CorruptFile, atomic_write, dumps, move_aside, read_json


@dataclass(frozen=True)
class Standing:
    """One person's standing yes to one tool."""

    person: str  # "<channel>:<user id>": whose calls it lets run
    tool: str  # the namespaced tool name, as the model calls it
    granted: float
    by: str | None = None  # the owner who gave it for them ("<channel>:<user id>"); None: their own


class ApprovalBook:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "approvals.json"

    def standing(self) -> list[Standing]:
        try:
            data = read_json(self.path)
        except CorruptFile as exc:
            move_aside(self.path, str(exc), "every tool call is asked about again")
            return []
        return [Standing(**s) for s in (data or {}).get("always", [])]

    def allows(self, person: str, tool: str) -> bool:
        return any(s.person == person and s.tool == tool for s in self.standing())

    def given(self, person: str, tool: str) -> list[str]:
        """Who gave `person` a standing yes to `tool` for them (owners, not the person)."""
        return [s.by for s in self.standing()
                if s.person == person and s.tool == tool and s.by is not None]

    def grant(self, person: str, tool: str, now: float, by: str | None = None) -> None:
        """A standing yes for `person`, their own or given by the owner `by`; it replaces the
        one they had for the tool."""
        kept = [s for s in self.standing() if (s.person, s.tool) != (person, tool)]
        self._write([*kept, Standing(person, tool, now, by)])

    def revoke(self, person: str | None = None, tool: str | None = None) -> list[Standing]:
        """Remove the standing yeses matching `person` and `tool` (None: any); the removed."""
        standing = self.standing()
        gone = [s for s in standing if person in (None, s.person) and tool in (None, s.tool)]
        if gone:
            self._write([s for s in standing if s not in gone])
        return gone

    def _write(self, standing: list[Standing]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # `by` only where an owner gave it: a person's own yes reads as it did before owners.
        atomic_write(self.path, dumps({"always": [
            {k: v for k, v in asdict(s).items() if k != "by" or v is not None}
            for s in standing]}))
