"""Matrix, described once for the core (daemon/core/platforms.py): its `[matrix]` table,
secrets and chat keys. Light: nothing here imports matrix-nio."""

from __future__ import annotations

from typing import Any

from channels.matrix.settings import MatrixSettings
from daemon.core.config.values import (
    _BASE_URL,
    _BOOL,
    _STRING,
    _array,
    _like,
    _one_of,
    _seconds,
    _value,
)
from daemon.core.logs import platform_log
from daemon.core.platforms import Platform
from daemon.core.setup import InitFlag

log = platform_log("matrix")

# A user id (`@dana:example.org`); a room id (`!abc:example.org`, or `!abc` from room version
# 12 on). Neither has white space.
USER_ID = r"@[^:\s]+:\S+"
ROOM_ID = r"![^\s:]+(:\S+)?"


def _homeserver(value: Any) -> str:
    url: str = _BASE_URL(value)
    return url


def _check(settings: MatrixSettings) -> list[tuple[str, str]]:
    if not settings.homeserver:
        return [("homeserver", "is required when Matrix is enabled (the homeserver's base URL, "
                 "such as https://matrix.example.org)")]
    if not settings.user_id:
        return [("user_id", "is required when Matrix is enabled (the bot's user id, such as "
                 "@roost:example.org)")]
    return []


def _allowed(settings: MatrixSettings, sender: str) -> bool:
    return sender in settings.allow


def _secret_given(settings: MatrixSettings) -> list[str]:
    return [] if settings.password or settings.access_token else ["ROOST_MATRIX_PASSWORD"]


MATRIX: Platform[MatrixSettings] = Platform(
    name="matrix", title="Matrix", settings=MatrixSettings,
    spec={
        "enabled": _BOOL, "homeserver": _homeserver,
        "user_id": _like(USER_ID, "a user id such as '@roost:example.org'"),
        "device_id": _like(r"[A-Za-z0-9_.=-]{0,64}", "a device id such as 'ROOSTBOT'"),
        "device_name": _STRING,
        "allow": _array(_like(USER_ID, "a user id such as '@dana:example.org'")),
        "require_mention": _BOOL, "streaming": _one_of("edit", "off"),
        "stream_interval": _value(str, "a duration string such as '1500ms'",
                                  lambda v: 0.5 <= _seconds(v) <= 60, "must be 500ms to 60s",
                                  _seconds)},
    secrets={"password": "ROOST_MATRIX_PASSWORD", "access_token": "ROOST_MATRIX_TOKEN"},
    # Either one: a password logs in once (the device's token is kept), a token is used as is.
    required_secrets=(), unset_secrets=_secret_given,
    person=USER_ID, group=ROOM_ID,
    forms="'matrix:@<user>:<server>', 'matrix:!<room id>'",
    person_forms="'matrix:@<user>:<server>'",
    note=("The user reads you in Matrix. Markdown is fine: it is rendered for them."),
    runtime="channels.matrix.channel",
    sends=frozenset({"voice", "drafts"}),
    check=_check, allowed=_allowed,
    init_flags=(
        InitFlag("--matrix-homeserver", "set Matrix up: the homeserver's address (such as "
                 "https://matrix.example.org); the bot's password from $ROOST_MATRIX_PASSWORD "
                 "(or its access token from $ROOST_MATRIX_TOKEN)", metavar="URL"),
        InitFlag("--matrix-user", "the bot's Matrix user id (such as @roost:example.org)",
                 metavar="USER_ID"),
        InitFlag("--matrix-owner", "your own Matrix user id: roost answers it without "
                 "pairing (matrix.allow)", metavar="USER_ID")))
