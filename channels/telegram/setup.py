"""`roost init`'s part for Telegram: the bot token (checked by `getMe`), polling or a webhook,
and the owner's pairing by /start.

The owner claims the bot by sending it /start: the daemon is not running yet, so the pairing
step reads that update itself with `getUpdates` (bounded by init's `--pair-timeout`), confirms
it so the daemon does not see it again, and approves the sender; nobody needs a numeric user id.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

from telegram import Bot
from telegram.error import Conflict, InvalidToken, TelegramError

from channels.telegram.platform import BOT_TOKEN, DEFAULT_API_BASE, MALFORMED_TOKEN
from daemon.core.checks import network_reason
from daemon.core.setup import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    TRIES,
    Admit,
    Asker,
    SetUp,
    SetupRequest,
    SetupStop,
    Value,
)

POLL = 10.0  # seconds one getUpdates long poll may wait


async def set_up(request: SetupRequest) -> SetUp:
    """The bot, checked, and how Telegram reaches it; the bot stays open for the pairing."""
    asker, api_base = request.asker, str(request.options["telegram_api_base"])
    bot = await _connect_bot(asker, api_base, _token(request))
    try:
        webhook_url = _webhook_url(asker, request.options["webhook_url"])
    except BaseException:
        await bot.shutdown()
        raise
    table: dict[str, Value] = {"mode": "webhook" if webhook_url else "polling"}
    wanted = {"ROOST_TELEGRAM_TOKEN": bot.token}
    if webhook_url:  # Telegram sends it back with every call; roost refuses calls without
        table["webhook_url"] = webhook_url
        wanted["ROOST_TELEGRAM_SECRET"] = secrets.token_hex(32)
    if api_base != DEFAULT_API_BASE:
        table["api_base"] = api_base
    username = str(bot.bot.username)

    async def pair(admit: Admit, timeout: float) -> bool:  # noqa: ASYNC109 (init's bound)
        return await _pair(bot, asker, username, admit, timeout)

    return SetUp(table, wanted, pair=pair, close=bot.shutdown)


def _token(request: SetupRequest) -> str:
    token_file: Path | None = request.options["token_file"]
    if token_file:
        try:
            return token_file.read_text("utf-8").strip()
        except OSError as exc:
            raise SetupStop(f"cannot read {token_file}: {exc.strerror}", EX_CONFIG) from None
    if request.env.get("ROOST_TELEGRAM_TOKEN"):
        return request.env["ROOST_TELEGRAM_TOKEN"].strip()
    if not request.asker.interactive:
        raise SetupStop("no bot token: set ROOST_TELEGRAM_TOKEN or pass --token-file "
                        "(from @BotFather)", EX_CONFIG)
    request.asker.say("Make a bot with @BotFather in Telegram (/newbot); it gives you a token.")
    return request.asker.ask("Bot token", hidden=True)


async def _connect_bot(asker: Asker, api_base: str, token: str) -> Bot:
    """The bot, its @name known from getMe; a refused token is asked again (interactive)."""
    for attempt in range(TRIES):
        if not BOT_TOKEN.fullmatch(token):  # said here, not by the network as a refusal
            if not asker.interactive or attempt == TRIES - 1:
                raise SetupStop(f"the token {MALFORMED_TOKEN}", EX_CONFIG)
            asker.say(f"That {MALFORMED_TOKEN}.")
            token = asker.ask("Bot token", hidden=True)
            continue
        bot = Bot(token, base_url=api_base)
        try:
            await bot.initialize()  # getMe; and shutdown() then closes the connections
        except InvalidToken as exc:
            await bot.shutdown()
            answers = (exc, exc.__cause__, exc.__cause__ and exc.__cause__.__cause__)
            said = " ".join(e.message for e in answers if isinstance(e, TelegramError))
            if "not found" in said.lower():  # PTB calls a 404 a bad token too
                raise SetupStop(f"the Bot API at {api_base} answered 404: it is not the "
                                "address the token follows (--telegram-api-base)",
                                EX_CONFIG) from None
            if not asker.interactive or attempt == TRIES - 1:
                raise SetupStop("Telegram refused the bot token; copy it again from "
                                "@BotFather", EX_CONFIG) from None
            asker.say("Telegram refused that token; copy it again from @BotFather.")
            token = asker.ask("Bot token", hidden=True)
            continue
        except TelegramError as exc:
            await bot.shutdown()
            raise SetupStop(f"cannot reach the Bot API at {api_base} ({network_reason(exc)}): "
                            "check this machine's network, or the address "
                            "(--telegram-api-base)", EX_UNAVAILABLE) from None
        asker.say(f"Telegram: the token belongs to @{bot.bot.username}")
        return bot
    raise AssertionError("unreachable")


def _webhook_url(asker: Asker, given: str | None) -> str | None:
    if given or not asker.interactive:
        return given or None
    asker.say("Polling needs no public address. A webhook needs a public HTTPS URL that "
              "reaches /webhooks/telegram (README: A public HTTPS address).")
    for _ in range(TRIES):
        url = asker.ask("Public webhook URL (empty: polling)")
        if not url or url.startswith("https://"):
            return url or None
        asker.say("Telegram sends webhooks to https:// addresses only")
    raise SetupStop("no usable webhook URL", 1)


async def _pair(bot: Bot, asker: Asker, username: str, admit: Admit,
                timeout: float) -> bool:  # noqa: ASYNC109 (the owner's own bound)
    """Wait for /start in a private chat and approve its sender; False on timeout."""
    asker.say(f"Now send /start to @{username} in Telegram (https://t.me/{username}); "
              f"waiting up to {timeout:g} s.")
    deadline = time.monotonic() + timeout
    offset: int | None = None
    try:
        while (left := deadline - time.monotonic()) > 0:
            updates = await bot.get_updates(offset=offset, timeout=int(min(left, POLL)),
                                            allowed_updates=["message"])
            for update in updates:
                offset = update.update_id + 1
                message = update.message
                if (message is not None and message.from_user is not None
                        and message.chat.type == "private"
                        and (message.text or "").startswith("/start")):
                    await bot.get_updates(offset=offset, timeout=0)  # confirm what init read
                    admit(str(message.from_user.id), message.from_user.full_name)
                    await bot.send_message(message.chat.id, "You are paired: roost answers you "
                                           "here once it runs.")
                    return True
            await asyncio.sleep(0)
    except Conflict:
        asker.say("A webhook is registered with Telegram, so init cannot read /start: once "
                  "roost runs, write to the bot and `roost pairing approve CODE`.")
        return False
    except TelegramError as exc:
        raise SetupStop(f"reading /start from Telegram failed ({network_reason(exc)})",
                        EX_UNAVAILABLE) from None
    asker.say(f"nobody sent /start within {timeout:g} s. Once roost runs, write to the bot "
              "and approve the code it gives you: `roost pairing approve CODE`.")
    return False
