"""Telegram: python-telegram-bot's `Application`, driven by roost, never by PTB's own loops.

Two modes, never both at once:

* **webhook**: Telegram posts updates to roost's own aiohttp route (`Telegram.webhook`), and
  roost registers the URL with `setWebhook`.
* **polling**: for a box without public HTTPS. roost deletes any webhook first, then long-polls
  `getUpdates` in its own loop (`Telegram._poll`), which confirms an update only once it is on
  disk, and hands each to the same intake.

The Application is built with `updater(None)` in both modes: it provides the Bot, its HTTP
clients and the rate limiter.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import json
import re
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
from aiohttp import web
from telegram import BotCommand
from telegram.error import BadRequest, InvalidToken, TelegramError, TimedOut
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning

from channels.formatting import to_telegram_html
from channels.media import attachment_limits
from channels.telegram.callbacks import Callbacks
from channels.telegram.delivery import TelegramChannel
from channels.telegram.doctor import doctor_checks
from channels.telegram.intake import TelegramIntake
from channels.telegram.media import BOT_API_DOWNLOAD_LIMIT, MediaFetcher
from channels.telegram.parse import UPDATE_KINDS, BotIdentity
from channels.telegram.platform import BOT_TOKEN, MALFORMED_TOKEN, TELEGRAM, TelegramSettings, log
from channels.telegram.setup import set_up
from channels.webhooks import read_at_most
from daemon.core.approval import Approver
from daemon.core.bodies import MB
from daemon.core.capped_http import capped_transport
from daemon.core.config import AttachmentSettings, Settings
from daemon.core.errors import ChannelError, ConfigError, StoreError
from daemon.intake.durable import Submitter
from daemon.intake.gate import Access
from daemon.intake.platforms import PlatformParts, Route, Runtime
from daemon.store import Store

WEBHOOK_PATH = "/webhooks/telegram"
UPDATES_CAP = 16 * MB  # a getUpdates answer: 100 updates, each at most tens of kilobytes
POLL_BACKOFF_MAX = 60.0  # seconds between polls while the Bot API cannot be reached
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what setWebhook accepts as secret_token

# Shown in Telegram's command menu; the engine runs them (daemon/engine/chat_commands.py).
COMMANDS = (
    ("start", "What roost is and how to talk to it"),
    ("new", "Start a fresh conversation (the old one is kept)"),
    ("compact", "Fold the older part of this conversation into its summary"),
    ("status", "Model, window and the size of this conversation"),
    ("transcript", "What I heard in your last voice note"),
    ("stop", "Stop the reply being written"),
    ("model", "List the models, or switch this chat: /model NAME"),
    ("voice", "Voice replies: /voice on, off or auto"),
    ("remember", "Keep a fact about you for every conversation"),
    ("memory", "The facts roost keeps about you, numbered"),
    ("forget", "Forget fact number N (see /memory)"),
    ("console", "A sign-in link to your conversations in a browser"),
    ("help", "List the commands"),
)


@dataclass(frozen=True)
class TelegramTuning:
    """Timings and limits that are not user settings; tests make them short."""

    album_window: float = 1.5  # seconds to wait for the next photo of an album
    typing_interval: float = 4.0  # Telegram shows "typing…" for about 5 s per sendChatAction
    max_body: int = 1024 * 1024  # webhook bodies above this get a 413
    poll_timeout: int = 30  # seconds a getUpdates long poll may wait
    rate_limit_retries: int = 5  # 429s waited out per request before it counts as failed
    download_limit: int = BOT_API_DOWNLOAD_LIMIT
    download_backoff: float = 0.5
    poll_backoff: float = 1.0  # first pause after a failed poll or store, doubled up to a minute
    connection_pool_size: int = 256  # PTB's default for its Bot API connections


def check_settings(settings: TelegramSettings) -> None:
    """Refuse at start what cannot work: no token, a webhook without a secret, a bad secret."""
    if not settings.token:
        raise ConfigError("telegram.enabled", "needs the bot token: set ROOST_TELEGRAM_TOKEN or "
                          "$CREDENTIALS_DIRECTORY/ROOST_TELEGRAM_TOKEN")
    if not BOT_TOKEN.fullmatch(settings.token):  # refused here, before any call with it
        raise ConfigError("telegram.enabled", f"ROOST_TELEGRAM_TOKEN {MALFORMED_TOKEN}")
    if settings.secret is not None and not _SECRET.fullmatch(settings.secret):
        raise ConfigError("telegram.secret", "ROOST_TELEGRAM_SECRET must be 1-256 characters of "
                          "A-Z, a-z, 0-9, _ and - (Telegram's rule for the webhook secret)")
    if settings.mode == "webhook" and not settings.secret:
        raise ConfigError("telegram.secret", "webhook mode needs a secret, so that only Telegram "
                          "can post updates: set ROOST_TELEGRAM_SECRET (1-256 characters of "
                          "A-Z, a-z, 0-9, _ and -) or use telegram.mode = 'polling'")


_ApiResult = bool | dict[str, Any] | list[dict[str, Any]]  # what a Bot API call returns


class _FinishingRateLimiter(AIORateLimiter):
    """PTB's rate limiter, except that a request already on the wire finishes even when its
    caller is cancelled (as each turn cancels its "typing…"): httpx's connection pool loses the
    connection of a request cancelled while its response is being closed (encode/httpcore#1093,
    httpcore 1.0.9), and after as many turns as the pool has connections no reply could be sent.
    A call still waiting for its turn in the limiter is cancelled as before: it has no
    connection yet, and sent late it would show "typing…" after the reply.

    sendMessage is not shielded: only a stop cancels it (the pool closes then anyway), and a
    shield hands its answer over two turns of the event loop later, during which other tasks
    run before the part is recorded; that would widen the window in which a crash sends the
    part twice (see channels.progress)."""

    async def process_request(
        self, callback: Callable[..., Coroutine[Any, Any, _ApiResult]], args: Any,
        kwargs: dict[str, Any], endpoint: str, data: dict[str, Any], rate_limit_args: int | None,
    ) -> _ApiResult:
        async def finishing(*call_args: Any, **call_kwargs: Any) -> _ApiResult:
            return await asyncio.shield(callback(*call_args, **call_kwargs))

        return await super().process_request(
            callback if endpoint == "sendMessage" else finishing, args, kwargs, endpoint, data,
            rate_limit_args)


def build_application(settings: TelegramSettings, tuning: TelegramTuning) -> Application[
        Any, Any, Any, Any, Any, Any]:
    """PTB's Application pointed at the configured Bot API (for its Bot and rate limiter)."""
    # PTB 22.8 reads its own deprecated int `retry_after` while constructing every RetryAfter
    # (each 429), which warns unless $PTB_TIMEDELTA is set. roost never reads that attribute
    # (the rate limiter uses the timedelta), so this one warning is noise for an operator.
    warnings.filterwarnings("ignore", message=r".*attribute `retry_after` will be of type",
                            category=PTBDeprecationWarning, module=r"telegram\.error")
    assert settings.token is not None  # check_settings
    # PTB reads each answer whole, files too: each is held to what the largest file roost
    # downloads needs (getUpdates to UPDATES_CAP), so a Bot API gone wrong costs no more.
    pool = tuning.connection_pool_size
    builder = (
        ApplicationBuilder()
        .token(settings.token)
        .base_url(settings.api_base)
        .base_file_url(settings.file_base)
        .rate_limiter(_FinishingRateLimiter(max_retries=tuning.rate_limit_retries))
        .request(HTTPXRequest(connection_pool_size=pool, httpx_kwargs={
            "transport": capped_transport(tuning.download_limit + MB,
                                          limits=httpx.Limits(max_connections=pool))}))
        .get_updates_request(HTTPXRequest(connection_pool_size=1, httpx_kwargs={
            "transport": capped_transport(UPDATES_CAP, limits=httpx.Limits(max_connections=1))}))
        .job_queue(None)  # roost has its own scheduler
    )
    # No Updater in either mode: webhooks come through roost's own route, and polling is roost's
    # own loop (`Telegram._poll`) so that an update is confirmed only once it is on disk.
    return builder.updater(None).build()


class Telegram:
    """The Telegram part of the daemon: Application lifecycle, delivery, intake and webhook.

    `open()` (before the engine exists) initialises the Application and learns who the bot is;
    `start(engine)` (after) resumes stored updates, then registers the webhook or starts polling;
    `stop()` stops polling and the intake; `close()` shuts the Application down.
    """

    def __init__(self, settings: TelegramSettings, store: Store,
                 tuning: TelegramTuning | None = None,
                 attachments: AttachmentSettings | None = None,
                 access: Access | None = None,
                 on_resent: Callable[[], None] | None = None) -> None:
        """`on_resent` is told of each part of a reply sent again (see channels/progress.py)."""
        check_settings(settings)
        self.access = access
        self.settings = settings
        self.store = store
        self.tuning = tuning or TelegramTuning()
        self.limits = attachment_limits(attachments or AttachmentSettings())
        self.application = build_application(settings, self.tuning)
        self.bot = self.application.bot
        self.channel = TelegramChannel(self.bot, store,
                                       typing_interval=self.tuning.typing_interval,
                                       drafts=settings.streaming == "draft",
                                       draft_interval=settings.draft_interval,
                                       on_resent=on_resent)
        self.identity: BotIdentity | None = None
        self.intake: TelegramIntake | None = None
        self._polling = False
        self._poller: asyncio.Task[None] | None = None

    def routes(self) -> list[Route]:
        """Polling mode has no route: never both."""
        return [Route("POST", WEBHOOK_PATH, self.webhook)] if self.webhook_mode else []

    @property
    def webhook_mode(self) -> bool:
        return self.settings.mode == "webhook"

    async def open(self) -> None:
        """Initialise the Application (getMe); ConfigError for a refused token, ChannelError
        when the Bot API cannot be reached (systemd restarts roost to try again)."""
        try:
            await self.application.initialize()
        except TelegramError as exc:
            # The HTTP clients were opened before getMe failed; nothing else would close them.
            await self.bot.shutdown()
            answer = exc.__cause__ if isinstance(exc.__cause__, TelegramError) else exc
            if isinstance(exc, InvalidToken) and "not found" in answer.message.lower():
                # PTB reports a 404 (its cause) as a bad token too; mostly the URL is wrong.
                raise ConfigError("telegram.api_base", (
                    f"the Bot API answered 404 Not Found for getMe at {self.settings.api_base}"
                    "<token>/getMe: api_base must be the address the token follows, such as "
                    "https://api.telegram.org/bot (no slash at the end); or the token is "
                    "malformed")) from None
            if isinstance(exc, InvalidToken):  # its message quotes the token: not passed on
                raise ConfigError("ROOST_TELEGRAM_TOKEN", "Telegram refused the bot token; "
                                  "check it with @BotFather") from None
            raise ChannelError(f"cannot reach the Telegram Bot API at {self.settings.api_base}: "
                               f"{exc}") from exc
        self.identity = BotIdentity(id=self.bot.id, username=self.bot.username)
        log.info("Telegram bot @%s (%s mode)", self.identity.username, self.settings.mode)

    async def start(self, engine: Submitter, approver: Approver | None = None) -> None:
        """Process what an earlier run left, then start receiving (webhook or polling);
        taps on approval buttons go to `approver`."""
        assert self.identity is not None, "open() first"
        media = MediaFetcher(self.bot, self.store.state_dir / "attachments", limits=self.limits,
                             download_limit=self.tuning.download_limit,
                             backoff=self.tuning.download_backoff)
        self.intake = TelegramIntake(store=self.store, engine=engine, media=media,
                                     identity=self.identity, allow=self.settings.allow,
                                     album_window=self.tuning.album_window,
                                     access=self.access,
                                     callbacks=Callbacks(self.bot, approver))
        await self.intake.resume()
        await self.channel.clear_orphans()
        try:
            await self.bot.set_my_commands([BotCommand(c, d) for c, d in COMMANDS])
        except TelegramError as exc:  # only the command menu is missing: not worth stopping for
            log.warning("could not register the command menu with Telegram: %s", exc)
        try:
            if self.webhook_mode:
                await self._set_webhook()
            else:
                await self._start_polling()
        except BaseException:
            await self.stop()
            raise

    async def _set_webhook(self) -> None:
        assert self.settings.webhook_url is not None  # config requires it in webhook mode
        try:
            await self.bot.set_webhook(self.settings.webhook_url,
                                       secret_token=self.settings.secret,
                                       allowed_updates=list(UPDATE_KINDS))
        except BadRequest as exc:
            raise ConfigError("telegram.webhook_url",
                              f"Telegram refused it: {exc.message}") from exc
        except TelegramError as exc:
            raise ChannelError(f"cannot register the webhook with Telegram: {exc}") from exc
        log.info("webhook registered")

    async def _start_polling(self) -> None:
        try:
            # A webhook and getUpdates exclude each other: the webhook goes first, its pending
            # updates stay and are fetched by the first poll.
            await self.bot.delete_webhook(drop_pending_updates=False)
        except TelegramError as exc:
            raise ChannelError(f"cannot start polling Telegram: {exc}") from exc
        self._polling = True
        self._poller = asyncio.create_task(self._poll(), name="roost-telegram-poll")
        log.info("polling Telegram for updates")

    async def _poll(self) -> None:
        """Long-poll getUpdates. An update is confirmed to Telegram (by asking for the offset
        after it) only once it is on disk, so a crash in between loses nothing: Telegram sends
        it again and the redelivery check drops what was stored already. PTB's Updater
        confirms before its handlers run, which is why roost does not use it."""
        assert self.intake is not None
        offset: int | None = None
        failures = 0
        while self._polling:
            try:
                updates = await self.bot.get_updates(
                    offset=offset, timeout=dt.timedelta(seconds=self.tuning.poll_timeout),
                    allowed_updates=list(UPDATE_KINDS))
            except TimedOut:
                continue  # a long poll that ran out is the normal quiet case
            except TelegramError as exc:
                failures += 1
                delay = min(self.tuning.poll_backoff * 2 ** (failures - 1), POLL_BACKOFF_MAX)
                log.warning("polling Telegram failed (%s); again in %.0fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            for update in updates:
                try:
                    await self.intake.accept(update.to_dict())
                except Exception:  # the boundary of one update: keep it unconfirmed, retry
                    log.exception("storing polled update %d failed; fetching it again",
                                  update.update_id)
                    await asyncio.sleep(self.tuning.poll_backoff)
                    break
                offset = update.update_id + 1

    async def stop(self) -> None:
        """Stop receiving (polling first), then the intake's workers."""
        if self._polling:
            self._polling = False
            if self._poller is not None:
                self._poller.cancel()
                await asyncio.gather(self._poller, return_exceptions=True)
        if self.intake is not None:
            await self.intake.stop()

    async def close(self) -> None:
        await self.application.shutdown()

    async def webhook(self, request: web.Request) -> web.Response:
        """`POST /webhooks/telegram`: check, persist, answer; processing comes after."""
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        assert self.settings.secret is not None  # check_settings, webhook mode
        if not hmac.compare_digest(given, self.settings.secret.encode()):
            # Logged (once a minute, counted) by the HTTP guard: a stranger cannot fill the log.
            return web.Response(status=403, text="forbidden\n")
        if request.content_type != "application/json":
            return web.Response(status=415, text="expected application/json\n")
        body = await read_at_most(request, self.tuning.max_body)
        if body is None:
            return web.Response(status=413, text="too large\n")
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            log.debug("webhook body refused: malformed JSON")  # the HTTP guard logs it
            return web.Response(status=400, text="malformed JSON\n")
        except RecursionError:  # valid JSON nested too deep to read: no update roost handles
            log.warning("webhook body nested too deeply to read; dropped")
            return web.Response(status=200)
        if not isinstance(payload, dict) or type(payload.get("update_id")) is not int:
            log.debug("webhook body refused: not a Telegram update")
            return web.Response(status=400, text="not a Telegram update\n")
        if self.intake is None:  # between open() and start(): the site is not up yet anyway
            return web.Response(status=503, text="starting\n")
        try:
            # An update roost cannot read or does not handle is dropped with a 200: answering
            # otherwise only makes Telegram send it again, for ever.
            await self.intake.accept(payload)
        except StoreError as exc:  # e.g. the disk is full: Telegram delivers it again later
            log.error("storing update %s failed: %s", payload["update_id"], exc)
            return web.Response(status=503, text="not stored\n")
        except Exception:
            # The boundary of the route: 503 so that Telegram delivers the update again.
            log.exception("storing update %s failed", payload["update_id"])
            return web.Response(status=503, text="not stored\n")
        return web.Response(status=200)


def _open(parts: PlatformParts) -> Telegram:
    return Telegram(TELEGRAM.of(parts.settings.platforms), parts.store, parts.tuning,
                    parts.settings.attachments, parts.access, on_resent=parts.on_resent)


def _check(settings: Settings) -> None:
    check_settings(TELEGRAM.of(settings.platforms))


RUNTIME = Runtime(
    tuning=TelegramTuning,
    render=to_telegram_html,
    open=_open,
    check=_check,
    doctor=doctor_checks,
    setup=set_up)
