"""The daemon process: one aiohttp application that owns every long-lived part.

Each part is a `cleanup_ctx` generator, set up in order and torn down in reverse: the store, the
Ollama client, the Telegram Application (before the engine, which delivers through it), the
engine, the automations' scheduler (after the engine it runs turns on), then Telegram's
receiving side (after the engine, which it feeds; so it stops first).
`serve()` starts the HTTP site, tells systemd it is ready, and on SIGTERM or SIGINT stops taking
requests, gives turns in flight `daemon.shutdown_grace` seconds, closes the store and returns 0.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from automations.scheduler import Automations
from channels.base import Channel
from channels.telegram import WEBHOOK_PATH, Telegram, TelegramTuning
from daemon import __version__
from daemon.config import Settings
from daemon.engine import Engine
from daemon.errors import ChannelError, ConfigError, LLMError, StoreError
from daemon.llm import ModelClient
from daemon.logs import app_log as log
from daemon.sdnotify import sd_notify
from daemon.store import Store

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
LLM = web.AppKey("llm", ModelClient)
ENGINE = web.AppKey("engine", Engine)
CHANNELS = web.AppKey("channels", dict[str, Channel])
TELEGRAM = web.AppKey("telegram", Telegram)
TELEGRAM_TUNING = web.AppKey("telegram_tuning", TelegramTuning)
AUTOMATIONS = web.AppKey("automations", Automations)

HEALTH_PROBE_TIMEOUT = 2.0


def build_app(settings: Settings, channels: Mapping[str, Channel] | None = None, *,
              telegram_tuning: TelegramTuning | None = None) -> web.Application:
    """The application with its parts registered; nothing runs until it is started."""
    app = web.Application()
    app[SETTINGS] = settings
    app[CHANNELS] = dict(channels or {})
    if settings.telegram.enabled:
        app[TELEGRAM_TUNING] = telegram_tuning or TelegramTuning()
        app.cleanup_ctx.extend([store_ctx, llm_ctx, telegram_ctx, engine_ctx, automations_ctx,
                                telegram_start_ctx])
        if settings.telegram.mode == "webhook":  # polling mode has no route: never both
            app.router.add_post(WEBHOOK_PATH, telegram_webhook)
    else:
        app.cleanup_ctx.extend([store_ctx, llm_ctx, engine_ctx, automations_ctx])
    app.router.add_get("/healthz", healthz)
    return app


async def store_ctx(app: web.Application) -> AsyncIterator[None]:
    store = await asyncio.to_thread(Store.open, app[SETTINGS].daemon.state_dir)
    app[STORE] = store
    log.info("state directory %s", store.state_dir)
    yield
    store.close()
    log.info("store closed")


async def llm_ctx(app: web.Application) -> AsyncIterator[None]:
    app[LLM] = ModelClient(app[SETTINGS].model)
    yield
    await app[LLM].close()


async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
    channels: dict[str, Channel] = app[CHANNELS]
    engine = Engine(settings=app[SETTINGS], store=app[STORE], llm=app[LLM], channels=channels)
    app[ENGINE] = engine
    await engine.start()
    yield
    await engine.stop(app[SETTINGS].daemon.shutdown_grace)
    log.info("engine stopped")


async def automations_ctx(app: web.Application) -> AsyncIterator[None]:
    # Right after the engine: the reminder tools are registered (in Automations()) before any
    # turn runs, and the scheduler stops before the engine it delivers through.
    automations = Automations(app[ENGINE])
    app[AUTOMATIONS] = automations
    await automations.start()
    yield
    await automations.stop()
    log.info("scheduler stopped")


async def telegram_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    telegram = Telegram(settings.telegram, app[STORE], app[TELEGRAM_TUNING],
                        settings.attachments)
    await telegram.open()
    app[TELEGRAM] = telegram
    app[CHANNELS]["telegram"] = telegram.channel
    yield
    await telegram.close()


async def telegram_start_ctx(app: web.Application) -> AsyncIterator[None]:
    await app[TELEGRAM].start(app[ENGINE])
    yield
    await app[TELEGRAM].stop()
    log.info("telegram stopped")


async def telegram_webhook(request: web.Request) -> web.Response:
    return await request.app[TELEGRAM].webhook(request)


def channel_names(app: web.Application) -> list[str]:
    channels: dict[str, Channel] = app[CHANNELS]
    return list(channels)


async def healthz(request: web.Request) -> web.Response:
    """Liveness and what an operator wants at a glance: model, channels, queues, version."""
    app = request.app
    llm, settings = app[LLM], app[SETTINGS]
    model: dict[str, object] = {"host": settings.model.host, "name": settings.model.name}
    try:
        pulled = await asyncio.wait_for(llm.pulled_models(), HEALTH_PROBE_TIMEOUT)
        model["reachable"] = True
        model["pulled"] = settings.model.name in pulled or f"{settings.model.name}:latest" in pulled
    except (LLMError, TimeoutError) as exc:
        model["reachable"] = False
        model["error"] = str(exc) or type(exc).__name__
    engine = app[ENGINE]
    body = {
        "status": "ok" if model["reachable"] else "degraded",
        "version": __version__,
        "model": model,
        "channels": sorted(channel_names(app)),
        "queues": engine.queue_depths(),
        "in_flight": llm.in_flight,
        "accepting": engine.accepting,
        "time": time.time(),
    }
    return web.json_response(body, status=200 if engine.accepting else 503)


async def serve(settings: Settings, channels: Mapping[str, Channel] | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT; returns the exit status."""
    app = build_app(settings, channels)
    # aiohttp waits this long for open requests; the engine's own grace comes after.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=5.0)
    try:
        await runner.setup()
    except StoreError as exc:
        log.error("%s", exc)
        return 73  # EX_CANTCREAT
    except ConfigError as exc:  # found at start, e.g. webhook mode without a secret
        await runner.cleanup()
        log.error("config error: %s", exc)
        return ConfigError.exit_status
    except ChannelError as exc:  # e.g. the Bot API unreachable: systemd restarts us
        await runner.cleanup()
        log.error("%s", exc)
        return 69  # EX_UNAVAILABLE
    daemon = settings.daemon
    site = web.TCPSite(runner, daemon.listen_host, daemon.listen_port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        log.error("cannot listen on %s:%d: %s", daemon.listen_host, daemon.listen_port,
                  exc.strerror or exc)
        return 71  # EX_OSERR
    for name, enabled in (("telegram", settings.telegram.enabled),
                          ("whatsapp", settings.whatsapp.enabled)):
        if enabled and name not in app[CHANNELS]:
            log.warning("[%s] is enabled but this version of roost has no %s channel yet; "
                        "its messages are not served", name, name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("roost %s listening on http://%s:%d", __version__, daemon.listen_host,
             daemon.listen_port)
    sd_notify("READY=1")
    await stop.wait()
    log.info("stopping: no new work; turns in flight get %.0fs", daemon.shutdown_grace)
    sd_notify("STOPPING=1")
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
    # Drain while the server still answers: a webhook now gets 503 (Telegram sends it again
    # later) and /healthz says the daemon is stopping; then the parts close in reverse order.
    await app[ENGINE].drain(daemon.shutdown_grace)
    await runner.cleanup()
    log.info("stopped")
    return 0
