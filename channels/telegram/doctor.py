"""`roost doctor`'s checks of Telegram: the token (getMe), the files address and the webhook."""

from __future__ import annotations

import httpx
from telegram import Bot
from telegram.error import InvalidToken, TelegramError
from telegram.request import HTTPXRequest

from channels.telegram.platform import BOT_TOKEN, TELEGRAM
from daemon.core.checks import Check, network_reason
from daemon.core.config import Settings
from daemon.core.errors import StoreError
from daemon.core.redact import redact_url
from daemon.store import NoState, Store

PENDING_PILE_UP = 100  # updates waiting at Telegram: roost has not been taking them for a while


async def doctor_checks(settings: Settings) -> list[Check]:
    """The bot's token, its files address and its webhook, as Telegram sees them."""
    tg = TELEGRAM.of(settings.platforms)
    if not tg.token or not BOT_TOKEN.fullmatch(tg.token):
        return []  # reported with the config checks
    # Its own request object, closed below: Bot.shutdown() closes only what initialize() opened.
    request = HTTPXRequest()
    bot = Bot(tg.token, base_url=tg.api_base, base_file_url=tg.file_base, request=request)
    try:
        try:
            me = await bot.get_me()
        except InvalidToken as exc:
            answer = exc.__cause__ if isinstance(exc.__cause__, TelegramError) else exc
            if "not found" in answer.message.lower():
                # PTB reports a 404 as a bad token too; mostly the address is wrong (as `roost
                # run` says): Telegram answers 401 Unauthorized for a token it refuses.
                return [Check("telegram getMe", False, _not_found(tg.api_base),
                              _api_base_fix(tg.api_base))]
            return [Check("telegram getMe", False, "Telegram refused the bot token",
                          "check ROOST_TELEGRAM_TOKEN with @BotFather")]
        except TelegramError as exc:
            return [Check("telegram getMe", False, "cannot reach the Bot API at "
                          f"{redact_url(tg.api_base)} ({network_reason(exc)})",
                          "check the network, or telegram.api_base")]
        checks = [Check("telegram getMe", True, f"bot @{me.username}"),
                  await _files_check(tg.file_base, tg.token)]
        try:
            info = await bot.get_webhook_info()
        except TelegramError as exc:
            checks.append(Check("telegram webhook", False, f"getWebhookInfo failed: {exc}",
                                "check the network, or telegram.api_base"))
            return checks
        checks.extend(_webhook_checks(settings, info.url, info.last_error_message,
                                      info.pending_update_count))
        return checks
    finally:
        await request.shutdown()


async def _files_check(file_base: str, token: str) -> Check:
    """Photos, voice notes and documents are downloaded from file_base: something there must
    answer for this bot (a file that does not exist gets 404 from Telegram and a local Bot API
    server alike; 401 means the address serves another bot API)."""
    shown = redact_url(file_base)
    fix = ("set telegram.file_base to where the Bot API serves files (for api_base "
           "https://HOST/bot it is https://HOST/file/bot), or remove it to follow api_base")
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.get(f"{file_base}{token}/roost-doctor-check")
    except httpx.HTTPError as exc:
        reason = redact_url(str(exc).replace(token, "<token>")) or "no answer"
        return Check("telegram files", False, f"nothing answers at {shown} ({reason}): no "
                     "photo, voice note or document sent to the bot could be read", fix)
    if answer.status_code == 401:
        return Check("telegram files", False, f"{shown} refuses this bot's token: no photo, "
                     "voice note or document sent to the bot could be read", fix)
    return Check("telegram files", True, f"{shown} answers")


def _not_found(api_base: str) -> str:
    return (f"the Bot API answered 404 Not Found for getMe at {redact_url(api_base)}<token>"
            "/getMe: telegram.api_base is not the address the token follows")


def _api_base_fix(api_base: str) -> str:
    if api_base.endswith("/"):
        return f'remove the slash at the end: telegram.api_base = "{api_base.rstrip("/")}"'
    return ("set telegram.api_base to the address the token follows, such as "
            "https://api.telegram.org/bot (no slash at the end), or remove it")


def _fresh_install(settings: Settings) -> bool:
    """No store yet: `roost run` has never started with this state directory."""
    try:
        Store.open(settings.daemon.state_dir, read_only=True).close()
    except NoState:
        return True
    except StoreError:
        return False
    return False


def _webhook_checks(settings: Settings, url: str, last_error: str | None,
                    pending: int) -> list[Check]:
    tg = TELEGRAM.of(settings.platforms)
    checks = []
    if tg.mode == "webhook":
        if url == tg.webhook_url:
            checks.append(Check("telegram webhook", True, f"registered at {url}"))
        elif not url and _fresh_install(settings):
            # roost registers the webhook when it starts: before the first start there is none.
            checks.append(Check("telegram webhook", True, f"none registered yet: `roost run` "
                                f"registers {tg.webhook_url} when it starts"))
        else:
            shown = url or "no webhook"
            checks.append(Check("telegram webhook", False,
                                f"Telegram has {shown}, the config says {tg.webhook_url}",
                                "start `roost run`, which registers telegram.webhook_url; "
                                "if another program uses this bot, give roost its own bot"))
    elif url:
        checks.append(Check("telegram webhook", False, f"a webhook is set ({url}) in polling "
                            "mode", "start `roost run`, which removes it before polling"))
    if last_error:
        checks.append(Check("telegram last error", False, last_error,
                            "make telegram.webhook_url reach roost's /webhooks/telegram "
                            "over HTTPS (see the Telegram section of the README)"))
    checks.append(Check("telegram pending updates", pending < PENDING_PILE_UP,
                        f"{pending} waiting at Telegram",
                        "" if pending < PENDING_PILE_UP else
                        "start roost (`roost run`, or its systemd unit); in webhook mode also "
                        "make telegram.webhook_url reach it (see `telegram last error`)"))
    return checks
