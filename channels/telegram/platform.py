"""Telegram, described once for the core (daemon/core/platforms.py): its `[telegram]` table,
secrets and chat keys. Light: nothing here imports python-telegram-bot."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from daemon.core.config.values import _BOOL, _URL, _array, _one_of, _seconds, _value
from daemon.core.logs import platform_log
from daemon.core.platforms import Platform
from daemon.core.setup import InitFlag

# What @BotFather gives: the bot's id, a colon, then letters, digits, '-' and '_'.
BOT_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
MALFORMED_TOKEN = ("does not look like a bot token (digits, a colon, then letters, digits, - "
                   "and _, with no quotes or spaces): copy it again from @BotFather")
DEFAULT_API_BASE = "https://api.telegram.org/bot"


log = platform_log("telegram")
@dataclass(frozen=True)
class TelegramSettings:
    enabled: bool = False
    mode: str = "webhook"  # or "polling"; a file without mode: webhook only with a webhook_url
    webhook_url: str | None = None
    api_base: str = DEFAULT_API_BASE
    file_base: str = "https://api.telegram.org/file/bot"
    allow: tuple[int, ...] = ()  # user ids
    streaming: str = "draft"  # or "off": replies shown as they are written (sendMessageDraft)
    draft_interval: float = 0.7  # seconds between two draft updates of one chat
    token: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)


def file_base(api_base: str) -> str:
    """Where files are downloaded beside a Bot API base, as Telegram and a local Bot API server
    lay them out: https://api.telegram.org/bot -> https://api.telegram.org/file/bot."""
    parts = urlsplit(api_base)
    head, _, last = parts.path.rpartition("/")
    if not last:  # no path to go by (doctor names the address's problem)
        return api_base.rstrip("/") + "/file/bot"
    return parts._replace(path=f"{head}/file/{last}").geturl()


def _prepare(table: dict[str, Any]) -> None:
    # No mode: a webhook_url says webhook, else polling (a box without a public address).
    table.setdefault("mode", "webhook" if table.get("webhook_url") else "polling")
    if "api_base" in table and "file_base" not in table:
        table["file_base"] = file_base(table["api_base"])


def _check(settings: TelegramSettings) -> list[tuple[str, str]]:
    if settings.mode == "webhook" and not settings.webhook_url:
        return [("webhook_url", "is required when telegram.mode is 'webhook' (the public HTTPS "
                 "URL of /webhooks/telegram); without a public address, set "
                 'mode = "polling"')]
    return []


def _allowed(settings: TelegramSettings, sender: str) -> bool:
    return sender.lstrip("-").isdigit() and int(sender) in settings.allow


TELEGRAM: Platform[TelegramSettings] = Platform(
    name="telegram", title="Telegram", settings=TelegramSettings,
    spec={
        "enabled": _BOOL, "mode": _one_of("webhook", "polling"), "webhook_url": _URL,
        "api_base": _URL, "file_base": _URL, "allow": _array(_value(int, "an integer user id")),
        "streaming": _one_of("draft", "off"),
        "draft_interval": _value(str, "a duration string such as '700ms'",
                                 lambda v: 0.1 <= _seconds(v) <= 60, "must be 100ms to 60s",
                                 _seconds)},
    secrets={"token": "ROOST_TELEGRAM_TOKEN", "secret": "ROOST_TELEGRAM_SECRET"},
    required_secrets=("token",),
    # A private chat's id is the user's (positive); a group's is negative, and a forum topic
    # is its own chat, `telegram:<chat>:<topic>` (topic ids start at 1; General has none).
    person="[1-9][0-9]*", group="-?[0-9]+(:[1-9][0-9]*)?",
    forms="'telegram:<chat id>', 'telegram:<chat id>:<topic>'",
    person_forms="'telegram:<user id>'",
    note="The user reads you in Telegram. Markdown is fine: it is rendered for them.",
    runtime="channels.telegram.channel",
    sends=frozenset({"voice", "drafts", "buttons"}),
    webhooks=("/webhooks/telegram",),
    prepare=_prepare, check=_check, allowed=_allowed,
    init_flags=(
        InitFlag("--token-file", "set Telegram up with the bot token in this file (or "
                 "in $ROOST_TELEGRAM_TOKEN)", metavar="PATH", path=True,
                 env="ROOST_TELEGRAM_TOKEN"),
        InitFlag("--telegram-api-base", "the Bot API's base URL (a local Bot API server)",
                 metavar="URL", default=DEFAULT_API_BASE, selects=False),
        InitFlag("--webhook-url", "the public HTTPS URL of /webhooks/telegram (default: "
                 "polling)", metavar="URL", selects=False)))
