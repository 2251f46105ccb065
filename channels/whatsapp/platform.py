"""WhatsApp (the official Business Cloud API), described once for the core
(daemon/core/platforms.py): its `[whatsapp]` table, secrets and chat keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from daemon.core.config.values import _BASE_URL, _BOOL, _DIGITS, _PERIOD, _array, _Bad, _like
from daemon.core.logs import platform_log
from daemon.core.platforms import Platform, chat_pattern
from daemon.core.setup import InitFlag

log = platform_log("whatsapp")
@dataclass(frozen=True)
class WhatsAppSettings:
    enabled: bool = False
    phone_number_id: str | None = None
    api_base: str = "https://graph.facebook.com"
    api_version: str = "v23.0"
    allow: tuple[str, ...] = ()  # wa_ids, digits only
    fallback: str | None = None  # a chat key for replies WhatsApp refuses after 24 hours
    # An approved template sent when a reply is held by the 24-hour rule ("reply to see it")
    template: str | None = None
    template_language: str = "en_US"
    template_parameter: bool = False  # its one body parameter: the held reply's first words
    template_interval: float = 24 * 3600.0  # at most one template per chat this often
    business_account_id: str | None = None  # the WABA, for doctor's check of the template
    token: str | None = field(default=None, repr=False)
    app_secret: str | None = field(default=None, repr=False)
    verify_token: str | None = field(default=None, repr=False)


def _fallback(value: Any) -> str:
    """Another platform's chat, for the replies WhatsApp will not take after 24 hours."""
    pattern, forms = chat_pattern()
    if not isinstance(value, str) or not re.fullmatch(pattern, value) \
            or value.startswith("whatsapp:") or value.startswith("console:"):
        others = ", ".join(f for f in forms.split(", ") if not f.startswith(("'whatsapp:",
                                                                          "'console:")))
        raise _Bad(f"must be another platform's chat ({others}), got {value!r}")
    return value


def _check(settings: WhatsAppSettings) -> list[tuple[str, str]]:
    if not settings.phone_number_id:
        return [("phone_number_id", "is required when WhatsApp is enabled")]
    return []


def _allowed(settings: WhatsAppSettings, sender: str) -> bool:
    return sender in settings.allow


WHATSAPP: Platform[WhatsAppSettings] = Platform(
    name="whatsapp", title="WhatsApp", settings=WhatsAppSettings,
    spec={
        "enabled": _BOOL, "phone_number_id": _DIGITS, "api_base": _BASE_URL,
        "api_version": _like("v[0-9]+[.][0-9]+", "like 'v23.0'"), "allow": _array(_DIGITS),
        "fallback": _fallback,
        "template": _like("[a-z0-9_]{1,512}", "a template's name: lowercase letters, digits, _"),
        "template_language": _like("[a-z]{2,3}(_[A-Z]{2})?", "a language code such as 'en_US'"),
        "template_parameter": _BOOL, "template_interval": _PERIOD,
        "business_account_id": _DIGITS},
    secrets={"token": "ROOST_WHATSAPP_TOKEN", "app_secret": "ROOST_WHATSAPP_APP_SECRET",
             "verify_token": "ROOST_WHATSAPP_VERIFY_TOKEN"},
    required_secrets=("token", "app_secret", "verify_token"),
    # A chat is the wa_id of one person: the Cloud API has no groups.
    person="[0-9]+", group="(?!)",
    forms="'whatsapp:<wa_id>'", person_forms="'whatsapp:<wa_id>'",
    note=("The user reads you in WhatsApp. Write Markdown as usual: it is converted to "
          "WhatsApp's own formatting. Keep it simple: WhatsApp shows no headings, tables or "
          "link labels, only bold, italics, strikethrough, lists and code."),
    runtime="channels.whatsapp.channel",
    sends=frozenset({"voice", "templates", "buttons"}),
    webhooks=("/webhooks/whatsapp",),
    check=_check, allowed=_allowed,
    init_flags=(
        InitFlag("--whatsapp-phone-number-id", "set WhatsApp up; its three secrets from "
                 "$ROOST_WHATSAPP_TOKEN, $ROOST_WHATSAPP_APP_SECRET and "
                 "$ROOST_WHATSAPP_VERIFY_TOKEN", metavar="ID"),
        InitFlag("--whatsapp-owner", "your own WhatsApp number with its country code: roost "
                 "answers it without pairing (whatsapp.allow)", metavar="NUMBER"),
        InitFlag("--whatsapp-api-base", "the Graph API's base URL", metavar="URL",
                 default=WhatsAppSettings.api_base, selects=False)))
