"""The console's Health page: the facts /healthz and `roost doctor` give, read from the running
daemon's own state (nothing is probed per page view), each with its fix; and the models' cards
with what roost does for each (daemon.models.strategy)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daemon.app.health import Health
from daemon.console.board import CardRow, Check, HealthView, HostRow
from daemon.core.config import Settings
from daemon.core.platforms import installed
from daemon.core.redact import redact_url
from daemon.models.card import Card
from daemon.models.strategy import NOTHING_DIFFERENT, what_roost_does
from daemon.tools.mcp.servers import ServerStatus

LOW_DISK = 512 * 1024 * 1024  # bytes free under which the disk is worth a warning


@dataclass(frozen=True)
class Running:
    """What the running daemon knows at this moment (serve.py gathers it)."""

    settings: Settings
    health: Health
    status: str
    channels: Sequence[str]
    queue_depths: Mapping[str, int]
    in_flight: int
    outbox: Sequence[Mapping[str, Any]]
    servers: Sequence[ServerStatus]
    cards: Sequence[Card] = ()  # the running Ollama's, as the calls act on them
    ollama_version: str | None = None  # as far as roost has asked


def health_view(now: Running) -> HealthView:
    """Synchronous (the disk); called through asyncio.to_thread."""
    model, health = now.settings.model, now.health
    held = [item for item in now.outbox if item.get("held")]
    checks = [
        Check("Ollama", health.ollama_reachable is not False,
              {True: "reachable", False: "unreachable", None: "not probed yet"}[
                  health.ollama_reachable],
              f"start Ollama (systemctl start ollama) or set model.host ({model.host})"),
        Check(f"model {model.name}", health.model_pulled is not False,
              {True: "pulled", False: "not pulled", None: "not probed yet"}[health.model_pulled],
              f"ollama pull {model.name}"),
        Check("channels", bool(now.channels), ", ".join(sorted(now.channels)) or "none enabled",
              f"enable one of {', '.join(f'[{name}]' for name in installed())} in the config "
              "(roost init sets one up)"),
        Check("queues", True, f"{sum(now.queue_depths.values())} messages waiting in "
                              f"{len(now.queue_depths)} chats; {now.in_flight} requests at Ollama"),
        Check("outbox", not held, f"{len(now.outbox)} replies to send, {len(held)} held",
              "a held reply goes out when its platform takes it again (on WhatsApp: once the "
              "person writes again); the conversation shows why it is held"),
        *(Check(f"MCP {s.name}", s.state == "up",
                f"{s.state}, {s.tools} tools ({s.transport})" + (f": {s.error}" if s.error else ""),
                f"`roost mcp test {s.name}` shows why it is not up") for s in now.servers),
        Check("voice", True, now.settings.voice.backend),
        _disk(now),
    ]
    return HealthView(now.status, tuple(checks), tuple(card_row(c) for c in now.cards),
                      (host_row(now),))


def host_row(now: Running) -> HostRow:
    """The one Ollama roost talks to (`model.host`): a pool of one serves every conversation."""
    return HostRow(
        redact_url(now.settings.model.host),
        {True: "reachable", False: "unreachable", None: "not probed yet"}[
            now.health.ollama_reachable],
        now.ollama_version or "not asked yet", now.in_flight, "every conversation")


def card_row(card: Card) -> CardRow:
    """The card's cells, in the units `roost models` prints them in (a number and its unit
    kept together: the cells wrap)."""
    quick = " (quick probe)" if card.quick else ""
    return CardRow(
        name=card.name, tools=card.tools, thinking=card.thinking,
        over_window="cut" if card.truncate == "cuts" else "refused",
        estimate_error=_or_dash(card.estimate_error, "{:+.1%}"),
        tokens_per_s=_or_dash(card.tokens_per_s, "{:.1f}"),
        first_token=_or_dash(card.first_token_s, "{:.2f}\u00a0s"),
        # As `roost models` says it: the model was loaded already, no cold load to time.
        load="warm" if card.already_loaded else _or_dash(card.load_s, "{:.1f}\u00a0s"),
        vision={True: "describes images", False: "did not describe an image", None: "-"}[
            card.vision],
        memory=_memory(card.memory, card.memory_vram),
        probed=f"{card.probed_at[:10]} on Ollama {card.ollama_version}{quick}",
        does=tuple(what_roost_does(card)) or (NOTHING_DIFFERENT,))


def _or_dash(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _memory(size: int | None, vram: int | None) -> str:
    if size is None:
        return "-"
    on_gpu = f" ({vram / size:.0%} on the GPU)" if vram is not None and size else ""
    return f"{size / 1e9:.1f}\u00a0GB{on_gpu}"


def _disk(now: Running) -> Check:
    state_dir = now.settings.daemon.state_dir
    free = shutil.disk_usage(state_dir).free
    return Check("disk", free > LOW_DISK and not now.health.disk_full,
                 f"{free / 2**30:.1f} GiB free for the state directory",
                 "free some space: roost stops taking messages when the disk is full")
