"""Telegram: python-telegram-bot's `Application`, driven by roost, never by PTB's own loops.

Two modes, never both at once:

* **webhook**: Telegram posts updates to roost's own aiohttp route (`Telegram.webhook`), and
  roost registers the URL with `setWebhook`.
* **polling**: for a box without public HTTPS. roost deletes any webhook first, then long-polls
  `getUpdates` in its own loop (`Telegram._poll`), which confirms an update only once it is on
  disk, and hands each to the same intake.

The Application is built with `updater(None)` in both modes: it provides the Bot, its HTTP
clients and the rate limiter.

Delivery (`TelegramChannel.send`) renders the model's Markdown to Telegram HTML, split at 4,096
visible characters, and records after each part how many were sent, so a restart resumes after
the last part delivered. python-telegram-bot's `AIORateLimiter` keeps under the flood limits and
waits out a 429's `retry_after`; other failures become `DeliveryError`s for the engine to retry
(or, when the user blocked the bot, to give up and mark the chat).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import html
import json
import re
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from aiohttp import web
from telegram import Bot, BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder
from telegram.warnings import PTBDeprecationWarning

from channels.formatting import split_telegram, split_text
from channels.media import attachment_limits
from channels.progress import Progress
from channels.telegram.callbacks import Callbacks
from channels.telegram.drafts import Draft
from channels.telegram.intake import TelegramIntake
from channels.telegram.media import BOT_API_DOWNLOAD_LIMIT, MediaFetcher
from channels.telegram.parse import UPDATE_KINDS, BotIdentity, address_of
from channels.webhooks import read_at_most
from channels.working import kept_up
from daemon.core.approval import Approver
from daemon.core.config import BOT_TOKEN, MALFORMED_TOKEN, AttachmentSettings, TelegramSettings
from daemon.core.errors import ChannelError, ConfigError, DeliveryError, StoreError
from daemon.core.logs import telegram_log as log
from daemon.core.messages import UNSEEN, Outbound, ReplySink
from daemon.intake.durable import Submitter
from daemon.intake.gate import Access
from daemon.store import Store

WEBHOOK_PATH = "/webhooks/telegram"
POLL_BACKOFF_MAX = 60.0  # seconds between polls while the Bot API cannot be reached
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what setWebhook accepts as secret_token
_TAG = re.compile(r"<[^>]*>")
SMALLER_PIECE = 1024  # characters: the last try for a part Telegram refused whole
# A chat flag: ids of a reply's parts sent while it was written, until its delivery takes them.
STREAMED_FLAG = "streamed_parts"

# Shown in Telegram's command menu; the engine runs them (daemon/engine/chat_commands.py).
COMMANDS = (
    ("start", "What roost is and how to talk to it"),
    ("new", "Start a fresh conversation (the old one is kept)"),
    ("compact", "Fold the older part of this conversation into its summary"),
    ("status", "Model, window and the size of this conversation"),
    ("transcript", "What I heard in your last voice note"),
    ("stop", "Stop the reply being written"),
    ("model", "List the models, or switch this chat: /model NAME"),
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
    builder = (
        ApplicationBuilder()
        .token(settings.token)
        .base_url(settings.api_base)
        .base_file_url(settings.file_base)
        .rate_limiter(_FinishingRateLimiter(max_retries=tuning.rate_limit_retries))
        .connection_pool_size(tuning.connection_pool_size)
        .job_queue(None)  # roost has its own scheduler
    )
    # No Updater in either mode: webhooks come through roost's own route, and polling is roost's
    # own loop (`Telegram._poll`) so that an update is confirmed only once it is on disk.
    return builder.updater(None).build()


def visible_text(part: str) -> str:
    """The text a Telegram-HTML part shows: the plain fallback when Telegram rejects the HTML."""
    return html.unescape(_TAG.sub("", part))


class TelegramChannel:
    """Delivery to Telegram chats: HTML parts, resumable; "typing…" while a turn runs."""

    name = "telegram"

    def __init__(self, bot: Bot, store: Store, *, typing_interval: float = 4.0,
                 drafts: bool = True, draft_interval: float = 0.7) -> None:
        self.bot = bot
        self.store = store
        self.progress = Progress(store)
        self.typing_interval = typing_interval
        self.drafts = drafts  # telegram.streaming = "draft"
        self.draft_interval = draft_interval
        self._no_drafts: set[int] = set()  # chats whose drafts Telegram refused outright
        self._drafting: dict[str, Draft] = {}  # chat key -> its running turn's draft
        self._streamed: dict[str, list[str]] = {}  # reply id -> its parts sent while written

    @contextlib.asynccontextmanager
    async def streaming(self, chat_key: str) -> AsyncIterator[ReplySink]:
        """The reply as it is written, in a draft (channels/telegram/drafts.py) in private
        chats and their topics. Groups keep "typing…": the Bot API takes drafts only in
        private chats, and a preview message edited as it grows would be a second record of
        the reply beside the outbox, orphaned by a crash mid-stream."""
        chat_id, topic = address_of(chat_key)
        if not self.drafts or chat_id < 0 or chat_id in self._no_drafts:
            yield UNSEEN
            return
        where = _Destination(chat_id, topic, None)

        async def send_part(part: str) -> str | None:
            try:
                return await self._send_whole(where, part, chat_key)
            except TelegramError as exc:  # the reply's delivery sends it, and tells of errors
                log.info("a finished part for %s did not go out early: %s", chat_key, exc)
                return None

        async def keep(ids: list[str]) -> None:
            await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, ids)

        draft = Draft(self.bot, chat_id, topic, interval=self.draft_interval,
                      refused=lambda: self._no_drafts.add(chat_id), send_part=send_part,
                      keep=keep)
        draft.start()
        self._drafting[chat_key] = draft
        try:
            yield draft
        finally:
            if self._drafting.get(chat_key) is draft:
                del self._drafting[chat_key]
            await draft.close()
            if draft.part_ids:
                await self._hand_over(chat_key, draft.parts, draft.part_ids)

    async def _hand_over(self, chat_key: str, parts: list[str], ids: list[str]) -> None:
        """The parts sent while the reply was written become its first parts, when the turn
        saved a reply that begins with them (its delivery then sends only the rest); else
        (the turn failed, or the reply renders differently) they are deleted, and the reply,
        if any, goes out whole."""
        pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
        for doc in reversed(pending):
            reply = Outbound.from_doc(doc)
            if reply.kind == "reply" and reply.parts_sent == 0 and \
                    split_telegram(reply.text)[:len(parts)] == parts:
                self._streamed[reply.id] = ids
                return
        await self._delete(chat_key, ids)

    async def _delete(self, chat_key: str, ids: list[str]) -> None:
        chat_id, _ = address_of(chat_key)
        for message_id in ids:
            try:
                await self.bot.delete_message(chat_id, int(message_id))
            except TelegramError as exc:  # too old, or gone: nothing more to do about it
                log.info("could not delete an early part in %s: %s", chat_key, exc)
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, STREAMED_FLAG, None)

    async def clear_orphans(self) -> None:
        """At start: parts a crash left sent while their reply was written, and not handed to
        a reply's delivery (their ids are in no outbox item), are deleted: the reply, written
        again or resumed from the outbox, goes out whole."""
        flagged = await asyncio.to_thread(self.store.chats_with_flag, STREAMED_FLAG)
        for chat_key, ids in flagged.items():
            pending = await asyncio.to_thread(self.store.outbox_pending, chat_key)
            recorded = {i for doc in pending for i in doc.get("platform_ids", ())}
            await self._delete(chat_key, [i for i in ids if i not in recorded])

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        chat_id, topic = address_of(chat_key)

        async def show() -> None:
            draft = self._drafting.get(chat_key)
            if draft is not None and draft.sent:
                return  # the draft shows the reply coming: "typing…" would be one call more
            try:
                await self.bot.send_chat_action(chat_id, ChatAction.TYPING,
                                                message_thread_id=topic)
            except TelegramError as exc:  # cosmetic: never worth failing a turn for
                log.debug("sendChatAction to %d failed: %s", chat_id, exc)

        return kept_up(show, self.typing_interval, f"roost-typing-{chat_key}")

    async def send(self, outbound: Outbound) -> None:
        """Send the parts not yet delivered, recording progress after each one."""
        chat_id, topic = address_of(outbound.chat_key)
        parts = split_telegram(outbound.text)
        done, ids = self.progress.start(outbound)
        streamed = self._streamed.pop(outbound.id, None)
        if streamed and not done:  # its first parts went out while it was written
            done, ids = len(streamed), list(streamed)
            await self.progress.record(outbound, done, ids, more=done < len(parts))
            await asyncio.to_thread(self.store.set_chat_flag, outbound.chat_key, STREAMED_FLAG,
                                    None)
        for index in range(done, len(parts)):
            # In a group the answer quotes the message that asked, so everyone sees whom it
            # answers; sent anyway when that message has been deleted meanwhile.
            reply = (ReplyParameters(int(outbound.reply_to), allow_sending_without_reply=True)
                     if index == 0 and chat_id < 0 and outbound.reply_to else None)
            # An approval question's buttons go under its last part.
            markup = (InlineKeyboardMarkup([[InlineKeyboardButton(b.label, callback_data=b.id)]
                                            for b in outbound.buttons])
                      if outbound.buttons and index + 1 == len(parts) else None)
            where = _Destination(chat_id, topic, reply, markup)
            await self.progress.attempt(outbound, index)
            more = index + 1 < len(parts)
            with _delivery_errors(), _lost_answer(self.progress, outbound, index):
                pieces = self.progress.pieces_sent(outbound, index)
                if not pieces:  # else it was refused whole before: on with its next piece
                    sent = await self._send_whole(where, parts[index], outbound.chat_key)
                    if sent is not None:
                        ids.append(sent)
                        # First thing after Telegram's answer: a crash before this write
                        # sends it again.
                        await self.progress.record(outbound, index + 1, ids, more=more)
                        continue
                await self._send_pieces(outbound, where, index, parts[index], pieces, ids,
                                        more=more)

    async def _send_whole(self, where: _Destination, part: str, chat_key: str) -> str | None:
        """One part, HTML first; its message_id, or None when Telegram refused the content
        (not the chat) as HTML and as plain text, so that it goes in smaller pieces."""
        try:
            return await self._send(where, part, ParseMode.HTML)
        except BadRequest as exc:
            # PTB drops "Bad Request: " and capitalises the rest.
            log.warning("Telegram refused a part for %s (%s); sending it as plain text",
                        chat_key, exc.message)
        try:
            return await self._send(where, visible_text(part), None)
        except BadRequest as exc:
            log.warning("Telegram refused the plain text for %s too (%s); sending it in "
                        "smaller pieces", chat_key, exc.message)
        return None

    async def _send_pieces(self, outbound: Outbound, where: _Destination, index: int,
                           part: str, done: int, ids: list[str], *, more: bool) -> None:
        """Part `index` as plain text in smaller pieces from piece `done` on, each recorded
        first thing after Telegram's answer, like a part: a failure or crash on one piece
        resumes with it, not with the pieces before. A piece refused too gives this reply up
        (the engine tells the user)."""
        pieces = split_text(visible_text(part), SMALLER_PIECE)
        for number in range(done, len(pieces)):
            ids.append(await self._send(where, pieces[number], None))
            if number + 1 < len(pieces):
                await self.progress.record_piece(outbound, index, number + 1, ids)
            else:  # the last piece completes the part
                await self.progress.record(outbound, index + 1, ids, more=more)

    async def _send(self, where: _Destination, text: str, parse_mode: str | None) -> str:
        message = await self.bot.send_message(where.chat_id, text, parse_mode=parse_mode,
                                              message_thread_id=where.topic,
                                              reply_parameters=where.reply,
                                              reply_markup=where.markup)
        return str(message.message_id)


@dataclass(frozen=True)
class _Destination:
    chat_id: int
    topic: int | None  # a forum topic's message_thread_id
    reply: ReplyParameters | None
    markup: InlineKeyboardMarkup | None = None


@contextlib.contextmanager
def _delivery_errors() -> Iterator[None]:
    """Telegram's refusals as the engine's DeliveryErrors. Only 403 (blocked, removed from the
    group) gives up on the chat; a 400 that is left (refused whatever its form) gives up on
    this reply; the rest are tried again later."""
    try:
        yield
    except Forbidden as exc:  # the user blocked the bot, or it was removed from the group
        raise DeliveryError(f"Telegram refused delivery: {exc.message}{_forbidden_hint(exc)}",
                            permanent=True, chat_blocked=True) from exc
    except BadRequest as exc:  # refused whatever its form: this reply cannot go out
        raise DeliveryError(f"Telegram refused it: {exc.message}", permanent=True) from exc
    except RetryAfter as exc:  # still flooded after the rate limiter's retries
        raise DeliveryError(f"Telegram flood control: {exc}") from exc
    except NetworkError as exc:
        raise DeliveryError(f"cannot reach Telegram: {exc}") from exc
    except TelegramError as exc:
        raise DeliveryError(f"Telegram error: {exc}") from exc


# httpx (python-telegram-bot's HTTP client) failing before the request left: nothing was sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@contextlib.contextmanager
def _lost_answer(progress: Progress, outbound: Outbound, index: int) -> Iterator[None]:
    """A network error after the request left (not a refused connection) may hide a message
    Telegram took: the retry is then a duplicate, which /metrics counts."""
    try:
        yield
    except NetworkError as exc:
        if not isinstance(exc, BadRequest) and not isinstance(exc.__cause__, _NOT_SENT):
            progress.answer_lost(outbound, index)
        raise


class Telegram:
    """The Telegram part of the daemon: Application lifecycle, delivery, intake and webhook.

    `open()` (before the engine exists) initialises the Application and learns who the bot is;
    `start(engine)` (after) resumes stored updates, then registers the webhook or starts polling;
    `stop()` stops polling and the intake; `close()` shuts the Application down.
    """

    def __init__(self, settings: TelegramSettings, store: Store,
                 tuning: TelegramTuning | None = None,
                 attachments: AttachmentSettings | None = None,
                 access: Access | None = None) -> None:
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
                                       draft_interval=settings.draft_interval)
        self.identity: BotIdentity | None = None
        self.intake: TelegramIntake | None = None
        self._polling = False
        self._poller: asyncio.Task[None] | None = None

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


def _forbidden_hint(exc: Forbidden) -> str:
    """What the operator can do about a 403: a bot may not write first to a person, so one who
    never opened it (an automation's or reminder's target, say) has to start it once."""
    if "initiate conversation" in exc.message:
        return (" (this user has not started the bot: they must open it in Telegram and press "
                "Start once; later messages to them are dropped until they write)")
    return ""
