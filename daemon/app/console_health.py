"""The console's Health page: the facts /healthz and `roost doctor` give, read from the running
daemon's own state (nothing is probed per page view), each with its fix; each Ollama host with
what it has, what it serves now and the conversations pinned to it (`[model] hosts`,
daemon/llm/pool.py); and the models' cards with what roost does for each
(daemon.models.strategy)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from daemon.app.health import Health
from daemon.console.board import CardRow, Check, HealthView, HostRow, Served
from daemon.console.views import local_time
from daemon.core.config import Settings
from daemon.core.platforms import automation_name, installed
from daemon.core.redact import redact_url
from daemon.llm.pool import HostPool
from daemon.models.card import Card
from daemon.models.strategy import NOTHING_DIFFERENT, what_roost_does
from daemon.tools.mcp.servers import ServerStatus

LOW_DISK = 512 * 1024 * 1024  # bytes free under which the disk is worth a warning


@dataclass(frozen=True)
class HostNow:
    """One Ollama host as the pool knows it at a moment (`hosts_now`)."""

    name: str  # its URL without credentials
    up: bool
    error: str | None
    down_since: float | None
    checked: bool  # it has answered a health check (or a call said what it has)
    version: str | None
    models: tuple[str, ...] | None  # /api/tags; None before it was asked
    loaded: tuple[tuple[str, int | None], ...]  # /api/ps: model and the GPU memory it takes
    in_flight: int
    routes: tuple[str, ...]  # pinned to it: conversation ids and `automation:NAME`s


def hosts_now(pool: HostPool) -> tuple[HostNow, ...]:
    """Each host of `pool` now. On the event loop, which changes the pool (its pins)."""
    return tuple(HostNow(
        h.name, h.up, h.error, h.down_since, h.checked_at is not None or h.models is not None,
        h.version_text, tuple(sorted(h.models)) if h.models is not None else None,
        tuple(h.loaded.items()), h.in_flight, tuple(pool.routes_on(h))) for h in pool.hosts)


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
    hosts: Sequence[HostNow] = ()  # of several (`[model] hosts`)
    chats: Mapping[str, str] = field(default_factory=dict)  # conversation id -> chat key
    names: Mapping[str, str] = field(default_factory=dict)  # chat key -> its name


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
    hosts = tuple(pool_row(now, h) for h in now.hosts) if len(now.hosts) > 1 else (
        host_row(now),)
    return HealthView(now.status, tuple(checks), tuple(card_row(c) for c in now.cards), hosts)


def host_row(now: Running) -> HostRow:
    """The one Ollama roost talks to (`model.host`): a pool of one serves every conversation."""
    known = now.hosts[0] if now.hosts else None
    return HostRow(
        redact_url(now.settings.model.host),
        {True: "reachable", False: "unreachable", None: "not probed yet"}[
            now.health.ollama_reachable],
        now.ollama_version or "not asked yet", now.in_flight, "every conversation",
        *(_what_it_has(known) if known is not None else ()))


def pool_row(now: Running, host: HostNow) -> HostRow:
    """One host of several: its state and what it serves, each conversation by its name."""
    if host.up:
        state = "reachable" if host.checked else "not probed yet"
    else:
        state = f"unreachable: {host.error}" if host.error else "unreachable"
    served = tuple(_served(route, now) for route in host.routes)
    return HostRow(
        host.name, state, host.version or "not asked yet", host.in_flight,
        f"{len(served)} conversations" if len(served) != 1 else "1 conversation",
        *_what_it_has(host),
        down_since=local_time(host.down_since, now.settings.daemon.tz)
        if host.down_since is not None and not host.up else "",
        conversations=served)


def _what_it_has(host: HostNow) -> tuple[str, str]:
    """Its models and what it has loaded, as the cells say them."""
    models = ", ".join(host.models) or "none" if host.models is not None else "-"
    loaded = ", ".join(name if vram is None else f"{name} ({vram / 1e9:.1f}\u00a0GB on the GPU)"
                       for name, vram in host.loaded) or "nothing"
    return models, loaded


def _served(route: str, now: Running) -> Served:
    automation = automation_name(route)
    if automation is not None:
        return Served(f"automation {automation}", route, None)
    key = now.chats.get(route, "")
    return Served(now.names.get(key, key or route), key, route)


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
        probed=f"{card.probed_at[:10]} on Ollama {card.ollama_version}"
               + (f" at {card.host}" if card.host else "") + quick,
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
