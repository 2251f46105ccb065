"""The daemon process: one aiohttp application that owns every long-lived part.

Each part is a `cleanup_ctx` generator, set up in order and torn down in reverse: the store, the
Ollama client, the health monitor, pairing and pacing, the channels (before the engine, which
delivers through them), the core (daemon/app/assembly.py: the tools and MCP servers, the engine,
the automations' scheduler), then the channels' receiving sides (after the engine, which they
feed; so they stop first).
`serve()` refuses a channel's bad settings first, then binds the port (a second instance stops
before it touches Telegram), starts the parts, serves, tells systemd it is ready and keeps its
watchdog fed from the event loop; on SIGTERM or SIGINT it stops taking requests, gives turns in
flight most of `daemon.shutdown_grace` (the whole stop's budget, see `shutdown_budget`), closes
the store and returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

import channels.installed  # noqa: F401 (installs the platforms in the core's registry)
from automations.board import Board
from automations.scheduler import Automations
from daemon import __version__
from daemon.app.assembly import Core, DaemonParts, Runs, core
from daemon.app.chat_socket import ChatSocket
from daemon.app.console_health import HostNow, Running, health_view, hosts_now
from daemon.app.health import HealthMonitor
from daemon.app.httpguard import (
    GuardedSite,
    HttpLimits,
    RejectionLog,
    bind,
    guard_middleware,
    install_malformed_filter,
)
from daemon.app.metrics import START_TIME, HostGauges, Metrics
from daemon.app.platforms import runtime_of
from daemon.app.sdnotify import sd_notify, watchdog, watchdog_interval
from daemon.app.shutdown import shutdown_budget
from daemon.console.names import chat_names
from daemon.console.web import Console
from daemon.core.config import Settings
from daemon.core.errors import (
    ChannelError,
    ConfigError,
    DeliveryError,
    DocumentError,
    StoreError,
)
from daemon.core.filemodes import exposure
from daemon.core.logs import app_log as log
from daemon.core.messages import Channel, Inbound, Outbound, ReplySink
from daemon.core.platforms import automation_name, installed
from daemon.engine.workers import Engine
from daemon.intake.gate import Access
from daemon.intake.household import Household
from daemon.intake.pairing import PairingBook
from daemon.intake.platforms import PlatformParts, Route, Runtime
from daemon.intake.platforms import Running as RunningPlatform
from daemon.llm.client import ModelClient
from daemon.parsing.pool import shared_pool
from daemon.store import Store
from daemon.store.event_log import Records
from daemon.store.search_index import SearchIndex
from daemon.tools.mcp.servers import McpServers
from daemon.voice.backends import build_backend
from daemon.voice.hearing import Hearing, no_wait
from daemon.voice.speaking import Speaking, build_speaking

EX_UNAVAILABLE, EX_OSERR, EX_CANTCREAT = 69, 71, 73


@dataclass(frozen=True)
class Tuning:
    """Timings and limits of the process that are not user settings; tests make them short."""

    http: HttpLimits = field(default_factory=HttpLimits)
    health_interval: float = 30.0  # seconds between background probes of Ollama and the disk
    # A document worker starts this long after the start, once the daemon has settled in: its
    # imports (a second of CPU) would compete with the first turns, and the first PDF sent is
    # still read by a warm one.
    documents_warm_after: float = 15.0


SETTINGS = web.AppKey("settings", Settings)
TUNING = web.AppKey("tuning", Tuning)
STORE = web.AppKey("store", Store)
INDEX = web.AppKey("index", SearchIndex)
LLM = web.AppKey("llm", ModelClient)
HEALTH = web.AppKey("health", HealthMonitor)
METRICS = web.AppKey("metrics", Metrics)
ENGINE = web.AppKey("engine", Engine)
CORE = web.AppKey("core", Core)
CHANNELS = web.AppKey("channels", dict[str, Channel])
# The enabled platforms: their runtimes and tunings (before the start), then what runs.
RUNTIMES = web.AppKey("runtimes", dict[str, tuple[Runtime, Any]])
PLATFORMS = web.AppKey("platforms", dict[str, RunningPlatform])
ACCESS = web.AppKey("access", Access)
AUTOMATIONS = web.AppKey("automations", Automations)
MCP = web.AppKey("mcp", McpServers)
CHAT_SOCKET = web.AppKey("chat_socket", ChatSocket)
SPEAKING = web.AppKey("speaking", Speaking)
# The loop the parts live on: the console's Health page, read in a thread, reads the Ollama pool
# there (its pins change on the loop).
LOOP = web.AppKey("loop", asyncio.AbstractEventLoop)
Context = Callable[[web.Application], AsyncIterator[None]]


def build_app(settings: Settings, channels: Mapping[str, Channel] | None = None, *,
              tunings: Mapping[str, Any] | None = None,
              tuning: Tuning | None = None,
              speaking: Speaking | None = None) -> web.Application:
    """The application with its parts registered; nothing runs until it is started.
    `tunings` are platforms' own by name (tests shorten them); `speaking` speaks replies
    (none: built from the `[speech]` settings)."""
    tuning = tuning or Tuning()
    metrics = Metrics()
    rejections = RejectionLog()
    install_malformed_filter(RejectionLog())
    runtimes = {}
    for name, platform in installed().items():
        if platform.of(settings.platforms).enabled:
            runtime = runtime_of(platform)
            runtimes[name] = (runtime, (tunings or {}).get(name) or runtime.tuning())
    # The HTTP guard reads each body within this size; a channel then applies its own limit.
    max_body = max([1024 * 1024, *(getattr(own, "max_body", 0) for _, own in runtimes.values())])
    app = web.Application(client_max_size=max_body, middlewares=[guard_middleware(
        tuning.http, rejections, lambda cause: metrics.webhook_rejections.labels(cause).inc())])
    app[SETTINGS] = settings
    app[TUNING] = tuning
    app[METRICS] = metrics
    counted: dict[str, Channel] = {name: _Counted(channel, metrics)
                                   for name, channel in (channels or {}).items()}
    app[CHANNELS] = counted
    if speaking is not None:  # else built from the settings with the engine
        app[SPEAKING] = speaking
    # Channels open before the engine (it delivers through them) and start receiving after it
    # (they feed it), so they stop receiving first.
    app[RUNTIMES] = runtimes
    app[PLATFORMS] = {}
    opening: list[Context] = [platforms_ctx] if runtimes else []
    starting: list[Context] = [platforms_start_ctx] if runtimes else []
    for name in runtimes:
        for path in installed()[name].webhooks:  # routed to the running platform, if it has one
            for method in ("GET", "POST"):
                app.router.add_route(method, path, _platform_route(name, method, path))
    if "console" not in counted:  # `roost chat` while the daemon runs: app/chat_socket.py
        app[CHAT_SOCKET] = ChatSocket(settings.daemon.state_dir)
        counted["console"] = _Counted(app[CHAT_SOCKET], metrics)
        starting.append(chat_socket_ctx)
    app.cleanup_ctx.extend([store_ctx, documents_ctx, llm_ctx, health_ctx, access_ctx,
                            *opening, core_ctx, *starting])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_route)
    if settings.console.enabled:
        Console(settings, lambda: app[STORE],
                board=lambda: Board(settings, app[STORE], app[AUTOMATIONS].scan),
                reminders=lambda chat_key: app[AUTOMATIONS].reminders.pending(chat_key),
                health=lambda: health_view(_running(app))).add_routes(app)
    return app


async def store_ctx(app: web.Application) -> AsyncIterator[None]:
    state_dir = app[SETTINGS].daemon.state_dir
    if problem := exposure(state_dir):
        log.warning("the state directory %s is %s", state_dir, problem)
    store, index = await asyncio.to_thread(_open_state, state_dir)
    # What the store holds in memory (the conversation list, a year of dedupe keys) lives as
    # long as the process: out of the collector's full passes, which walk every tracked object
    # and stalled acks for tens of milliseconds each on a year of data.
    gc.collect()
    gc.freeze()
    app[STORE] = store
    app[INDEX] = index
    log.info("state directory %s", store.state_dir)
    yield
    index.close()  # the engine closed it already, unless it never started
    store.close()
    gc.unfreeze()
    log.info("store closed")


def _open_state(state_dir: Path) -> tuple[Store, SearchIndex]:
    """The store and its search index. The index is derived data, but it is written to at
    once: a disk that cannot take it (full, read-only) stops the start with one line (exit 73),
    as the store itself does."""
    store = Store.open(state_dir)
    try:
        return store, SearchIndex.open(state_dir / "memory.sqlite3")
    except BaseException:
        store.close()
        raise


async def documents_ctx(app: web.Application) -> AsyncIterator[None]:
    """The worker processes that parse documents and pages: `serve` starts one once the daemon
    is up (else the first document starts it); they stop with the daemon, not at exit."""
    yield
    await asyncio.to_thread(shared_pool().close)


async def llm_ctx(app: web.Application) -> AsyncIterator[None]:
    """The model client; with several Ollama hosts (`[model] hosts`) their health check runs
    from the start, so a host that is off is known before a chat is sent to it and one that
    comes on serves new conversations once it answers (a command's client checks only once it
    calls). Closed, its checks stopped, on the way out."""
    app[LOOP] = asyncio.get_running_loop()
    app[LLM] = ModelClient(app[SETTINGS].model, observer=app[METRICS])
    if app[LLM].pool.several:  # one host alone is named nowhere in /metrics, as before
        app[METRICS].per_host.hosts_known(host.name for host in app[LLM].pool.hosts)
    app[LLM].start()
    yield
    await app[LLM].close()


async def health_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    monitor = HealthMonitor(app[LLM], settings.model.name, settings.daemon.state_dir,
                            app[TUNING].health_interval)
    app[HEALTH] = monitor
    await monitor.start()
    yield
    await monitor.stop()


async def core_ctx(app: web.Application) -> AsyncIterator[None]:
    """The core (daemon/app/assembly.py): the tools with the MCP servers' (which start in the
    background: a broken one is a line in /status, never a daemon that does not start), the
    engine, then the scheduler; left in reverse, within the shutdown budget."""
    settings, store, llm, metrics = app[SETTINGS], app[STORE], app[LLM], app[METRICS]
    voice = Hearing(settings.voice, store, build_backend(settings.voice),
                    hold=llm.slot if settings.voice.queue_with_model else no_wait,
                    observe=metrics.transcription)
    # The voice replies hold the model slot around each synthesis: Speaking itself waits for none.
    speaking = app.get(SPEAKING) or build_speaking(settings.speech, store)
    extra = DaemonParts(metrics=metrics, index=app[INDEX], voice=voice, speaking=speaking)
    channels: dict[str, Channel] = app[CHANNELS]
    try:
        async with core(settings, store, llm, channels, Runs.DAEMON, extra=extra) as built:
            app[CORE], app[ENGINE], app[AUTOMATIONS] = built, built.engine, built.automations
            app[MCP] = built.servers
            yield
        log.info("engine and scheduler stopped")
    finally:
        await voice.close()
        if speaking is not None:
            await speaking.close()


async def chat_socket_ctx(app: web.Application) -> AsyncIterator[None]:
    """Listen for `roost chat` once the engine runs; stop before it stops."""
    chat = app[CHAT_SOCKET]
    try:
        await chat.start(app[ENGINE])
    except OSError as exc:  # a path too long for a socket, say: the daemon runs without it
        log.warning("roost chat cannot reach this daemon: cannot listen on %s: %s", chat.path,
                    exc.strerror or exc)
    yield
    await chat.stop()


async def access_ctx(app: web.Application) -> AsyncIterator[None]:
    """Pairing and pacing, shared by the channels (one rate limit per sender)."""
    settings = app[SETTINGS]
    inbound = app[METRICS].inbound
    book = PairingBook(settings.daemon.state_dir)
    app[ACCESS] = Access(settings.access, book, time.time,
                         lambda channel, outcome: inbound.labels(channel, outcome).inc(),
                         Household.of(settings, book))
    yield


async def platforms_ctx(app: web.Application) -> AsyncIterator[None]:
    """Each enabled platform built and opened (before the engine, which delivers through
    them); closed in reverse."""
    settings, metrics = app[SETTINGS], app[METRICS]
    records = Records(app[STORE].state_dir, settings.daemon.tz,
                      on_event=lambda kind: metrics.events.labels(kind).inc())
    opened: list[RunningPlatform] = []
    try:
        for name, (runtime, own) in app[RUNTIMES].items():
            running = runtime.open(PlatformParts(
                settings, app[STORE], app[ACCESS], records, own,
                on_resent=metrics.parts_resent.labels(name).inc))
            await running.open()
            opened.append(running)
            app[PLATFORMS][name] = running
            app[CHANNELS][name] = _Counted(running.channel, metrics)
        yield
    finally:
        for running in reversed(opened):
            await running.close()


async def platforms_start_ctx(app: web.Application) -> AsyncIterator[None]:
    """Each platform receiving (after the engine, which they feed); stopped first."""
    started: list[tuple[str, RunningPlatform]] = []
    try:
        for name, running in app[PLATFORMS].items():
            await running.start(_CountedIntake(app[ENGINE], app[METRICS], name),
                                app[CORE].parts.approvals)
            started.append((name, running))
        yield
    finally:
        for name, running in reversed(started):
            await running.stop()
            log.info("%s stopped", name)


def _platform_route(name: str, method: str, path: str
                    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The platform's own route at `path`, found once it runs; 404 where it has none (a
    Telegram in polling mode has no webhook) and 503 while it starts."""

    async def route(request: web.Request) -> web.StreamResponse:
        running = request.app[PLATFORMS].get(name)
        if running is None:
            return web.Response(status=503, text="starting\n")
        here = [r for r in running.routes() if r.path == path]
        found: Route | None = next((r for r in here if r.method == method), None)
        if found is None and not here:
            raise web.HTTPNotFound()
        if found is None:
            raise web.HTTPMethodNotAllowed(method, [r.method for r in here])
        return await (_stored_or_503(request, found.handler) if found.stores
                      else found.handler(request))

    return route


async def _stored_or_503(request: web.Request,
                         webhook: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
    """A webhook call while the disk is full gets 503 before anything is written, so the
    platform sends it again; a call that could not be stored makes the disk be looked at."""
    health = request.app[HEALTH]
    if health.health.disk_full:
        health.check_now()  # and see whether space was freed meanwhile
        return web.Response(status=503, text="disk full\n")
    response = await webhook(request)
    if response.status >= 500:
        health.check_now()
    return response


class _Counted:
    """A channel that counts what it delivers (for /metrics); otherwise the channel itself."""

    def __init__(self, channel: Channel, metrics: Metrics) -> None:
        self.channel = channel
        self.name = channel.name
        self.metrics = metrics

    def streaming(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[ReplySink]:
        return self.channel.streaming(chat_key)

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self.channel.working(chat_key)

    async def send(self, outbound: Outbound) -> None:
        try:
            await self.channel.send(outbound)
        except DeliveryError as exc:
            outcome = "undeliverable" if exc.permanent else "failed"
            self.metrics.outbound.labels(self.name, outcome).inc()
            raise
        self.metrics.outbound.labels(self.name, "sent").inc()


class _CountedIntake:
    """The engine as a channel's intake sees it, counting what comes in (for /metrics)."""

    def __init__(self, engine: Engine, metrics: Metrics, channel: str) -> None:
        self.engine = engine
        self.metrics = metrics
        self.channel = channel

    async def submit(self, inbound: Inbound) -> bool:
        taken = await self.engine.submit(inbound)
        self.metrics.inbound.labels(self.channel, "accepted" if taken else "refused").inc()
        return taken

    async def notify(self, chat_key: str, text: str) -> None:
        await self.engine.notify(chat_key, text)

    async def deliver(self, outbound: Outbound) -> bool:
        return await self.engine.deliver(outbound)

    async def release(self, chat_key: str) -> int:
        return await self.engine.release(chat_key)


def channel_names(app: web.Application) -> list[str]:
    channels: dict[str, Channel] = app[CHANNELS]
    return [name for name in channels if name != "console"]  # the platforms, not the terminal


def _status(app: web.Application) -> tuple[str, list[str]]:
    if not app[ENGINE].accepting:
        return "stopping", ["shutting down"]
    reasons = app[HEALTH].health.reasons()
    return ("degraded" if reasons else "ok"), reasons


def _running(app: web.Application) -> Running:
    """What the console's Health page shows; reads the outbox, the conversations pinned to each
    Ollama host and their names (call it in a thread, never on the loop: it waits for it)."""
    servers, core, settings, store = app.get(MCP), app.get(CORE), app[SETTINGS], app[STORE]

    async def read() -> tuple[HostNow, ...]:
        return hosts_now(app[LLM].pool)

    hosts = asyncio.run_coroutine_threadsafe(read(), app[LOOP]).result(timeout=10)
    chats = {route: conversation.chat_key for host in hosts for route in host.routes
             if automation_name(route) is None
             and (conversation := store.get_conversation(route)) is not None}
    names = chat_names(settings.linked, PairingBook(settings.daemon.state_dir)) if chats else {}
    return Running(settings, app[HEALTH].health, _status(app)[0], channel_names(app),
                   app[ENGINE].queue_depths(), app[LLM].in_flight, store.outbox_pending(),
                   servers.status() if servers is not None else [],
                   core.cards.cards() if core is not None else (), app[LLM].known_version,
                   hosts, chats, names)


async def _gauges(app: web.Application) -> dict[str, float]:
    engine, llm = app[ENGINE], app[LLM]
    depths = engine.queue_depths()
    store = app[STORE]

    def read() -> tuple[int, int]:
        return len(store.outbox_pending()), store.chats_flagged("undeliverable")

    outbox, undeliverable = await asyncio.to_thread(read)
    return {"roost_queued_messages": sum(depths.values()), "roost_busy_chats": len(depths),
            "roost_outbox_pending": outbox, "roost_undeliverable_chats": undeliverable,
            "roost_model_requests_in_flight": llm.in_flight,
            "roost_healthy": 1.0 if _status(app)[0] == "ok" else 0.0,
            "roost_start_time_seconds": START_TIME}


def _host_gauges(app: web.Application) -> dict[str, HostGauges]:
    """Each Ollama host of several: up as its health check or its last call found it, and its
    requests now (one host alone: none, `roost_healthy` says it)."""
    pool = app[LLM].pool
    return {host.name: HostGauges(host.up, host.in_flight) for host in pool.hosts} \
        if pool.several else {}


async def healthz(request: web.Request) -> web.Response:
    """Health at a glance, from cached state (no Ollama call per hit); no chat ids, no hosts."""
    app = request.app
    status, reasons = _status(app)
    health = app[HEALTH].health
    depths = app[ENGINE].queue_depths()
    body = {
        "status": status,
        "reasons": reasons,
        "version": __version__,
        "model": {"name": app[SETTINGS].model.name, "reachable": health.ollama_reachable,
                  "pulled": health.model_pulled},
        "channels": sorted(channel_names(app)),
        "queued": sum(depths.values()),
        "busy_chats": len(depths),
        "in_flight": app[LLM].in_flight,
        "accepting": app[ENGINE].accepting,
        "time": time.time(),
    }
    return web.json_response(body, status=503 if status == "stopping" else 200)


async def metrics_route(request: web.Request) -> web.Response:
    """Prometheus' text format (prometheus-client's own exposition)."""
    # The gauges are read here, on the event loop that changes them; the collector gets a copy.
    metrics = request.app[METRICS]
    metrics.gauges = await _gauges(request.app)
    metrics.per_host.now = _host_gauges(request.app)
    body = metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; "
                                                            "charset=utf-8"})


async def serve(settings: Settings, channels: Mapping[str, Channel] | None = None,
                tuning: Tuning | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT; returns the exit status."""
    tuning = tuning or Tuning()
    daemon = settings.daemon
    for platform in installed().values():
        if not platform.of(settings.platforms).enabled:
            continue
        try:  # a config error first: said as one, whatever the port (a plain user's port 9)
            runtime_of(platform).check(settings)
        except ConfigError as exc:
            log.error("config error: %s", exc)
            return ConfigError.exit_status
    sock = _bind(settings, tuning)
    if sock is None:
        return EX_OSERR
    app = build_app(settings, channels, tuning=tuning)
    budget = shutdown_budget(daemon.shutdown_grace)
    # aiohttp waits this long for open requests (webhooks answer in milliseconds), out of the
    # same budget as the engine's drain.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=budget.http,
                           keepalive_timeout=tuning.http.keepalive_timeout,
                           lingering_time=tuning.http.lingering_time)
    if (failed := await _set_up(runner, sock)) is not None:
        return failed
    await GuardedSite(runner, sock, tuning.http).start()
    log.info("roost %s listening on http://%s:%d", __version__, daemon.listen_host,
             daemon.listen_port)
    sd_notify("READY=1")
    warming = _DocumentsWarmup(tuning.documents_warm_after)
    interval = watchdog_interval()
    pinger = asyncio.create_task(watchdog(interval), name="roost-watchdog") if interval else None
    await _until_signalled()
    log.info("stopping: no new work; turns in flight get %.1fs of the %.1fs shutdown budget",
             budget.drain, daemon.shutdown_grace)
    sd_notify("STOPPING=1")
    # Drain while the server still answers: a webhook now gets 503 (Telegram sends it again
    # later) and /healthz says the daemon is stopping; then the parts close in reverse order.
    # The watchdog keeps pinging meanwhile: a long drain is not a hang.
    await app[ENGINE].drain(budget.drain)
    await warming.finish()
    await runner.cleanup()
    if pinger is not None:
        pinger.cancel()
        await asyncio.gather(pinger, return_exceptions=True)
    log.info("stopped")
    return 0


class _DocumentsWarmup:
    """One document worker started off the loop `after` seconds from now (Tuning says why)."""

    def __init__(self, after: float) -> None:
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(after, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(asyncio.to_thread(shared_pool().warm),
                                         name="roost-documents")

    async def finish(self) -> None:
        """Not begun: it never is; begun: waited for, so that no worker outlives the pool."""
        self._timer.cancel()
        if self._task is None:
            return
        try:
            await self._task
        except DocumentError as exc:  # not fatal: the first document tries again
            log.warning("the document worker did not start: %s", exc)


def _bind(settings: Settings, tuning: Tuning) -> socket.socket | None:
    """The listening socket, bound before anything starts; None (said why) when the address
    cannot be had."""
    daemon = settings.daemon
    try:
        return bind(daemon.listen_host, daemon.listen_port, tuning.http.backlog)
    except OSError as exc:
        where = settings.source or "the config file (~/.config/roost/roost.toml)"
        host = f"[{daemon.listen_host}]" if ":" in daemon.listen_host else daemon.listen_host
        fix = (f"another program (or another roost) listens there: stop it, or set "
               f'daemon.listen = "{host}:<a free port>" in {where}'
               if exc.errno == errno.EADDRINUSE else f"set daemon.listen in {where}")
        log.error("cannot listen on %s:%d: %s; %s", daemon.listen_host, daemon.listen_port,
                  exc.strerror or exc, fix)
        return None


async def _set_up(runner: web.AppRunner, sock: socket.socket) -> int | None:
    """Start the parts; the exit status (said why) when one cannot start, else None."""
    try:
        await runner.setup()
        return None
    except StoreError as exc:
        status, why = EX_CANTCREAT, _disk_hint(exc)
    except ConfigError as exc:  # found at start, e.g. webhook mode without a secret
        status, why = ConfigError.exit_status, f"config error: {exc}"
    except ChannelError as exc:  # e.g. the Bot API unreachable: systemd restarts us
        status, why = EX_UNAVAILABLE, str(exc)
    await runner.cleanup()
    sock.close()
    log.error("%s", why)
    return status


async def _until_signalled() -> None:
    """Until SIGTERM or SIGINT; the default handlers are back afterwards."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _disk_hint(exc: StoreError) -> str:
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full: {exc}; free some space and start roost again"
    return str(exc)
