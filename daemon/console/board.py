"""What the console's Automations page shows and asks, as plain values. The automations package
fills it (automations/board.py); the console only draws it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RunView:
    status: str  # ok, quiet, failed, undelivered, missed, skipped, running
    # A local time in the daemon's zone, which the page names once; the zone's abbreviation
    # only on a wall time that happens twice (the hour the clocks go back).
    scheduled: str
    manual: bool
    seconds: float | None  # how long it ran
    prompt_tokens: int | None
    cached_share: float | None  # of the first request, from Ollama's cache (the byte-stable prefix)
    error: str
    conversation_id: str | None


@dataclass(frozen=True)
class AutomationView:
    name: str
    schedule: str
    next_run: str  # a time as `scheduled` is, "disabled" or "never"
    deliver: tuple[str, ...]
    runs: tuple[RunView, ...]  # newest first


class AutomationBoard(Protocol):
    def overview(self) -> list[AutomationView]: ...

    async def run_now(self, name: str) -> str:
        """Ask the daemon to run one now; what to tell the person."""
        ...


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # what to do when it is not ok


@dataclass(frozen=True)
class CardRow:
    """One model's card as the Health page's table shows it: each cell text, "-" where the
    battery did not measure it; `does` is what roost does differently for it, line by line."""

    name: str
    tools: str
    thinking: str
    over_window: str
    estimate_error: str
    tokens_per_s: str
    first_token: str
    load: str
    vision: str
    memory: str
    probed: str
    does: tuple[str, ...]


@dataclass(frozen=True)
class Served:
    """A conversation or an automation pinned to an Ollama host."""

    name: str  # the chat's name as roost knows it, or "automation NAME"
    key: str  # its chat key (`automation:NAME` for an automation)
    conversation_id: str | None  # its page; None for an automation (on the Automations page)


@dataclass(frozen=True)
class HostRow:
    """One Ollama server roost sends requests to, and what it serves."""

    url: str  # without credentials
    state: str  # reachable, unreachable, not probed yet
    version: str  # as /api/version said, or "not asked yet"
    in_flight: int  # requests at it now
    serves: str  # which conversations go to it, in words
    models: str = "-"  # what it has pulled (/api/tags), "-" before it was asked
    loaded: str = "-"  # what it has in memory (/api/ps), with the GPU memory it takes
    down_since: str = ""  # a time in the daemon's zone while it is down, else ""
    conversations: tuple[Served, ...] = ()  # the ones pinned to it, the most recent last


@dataclass(frozen=True)
class HealthView:
    status: str  # ok, degraded, stopping (as /healthz says)
    checks: tuple[Check, ...]
    cards: tuple[CardRow, ...] = ()  # of the running Ollama's version
    hosts: tuple[HostRow, ...] = ()
