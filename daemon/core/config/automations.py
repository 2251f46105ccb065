"""[[automations]]: one scheduled prompt each."""

from __future__ import annotations

from dataclasses import dataclass

from daemon.core.config.values import (
    _BOOL,
    _STRING,
    _array,
    _like,
    _schedule,
    _seconds,
    _Spec,
    _value,
)


@dataclass(frozen=True)
class AutomationSettings:
    name: str
    schedule: str  # crontab, 5 fields, unconverted: 0 and 7 are Sunday; or "every <duration>"
    prompt: str
    deliver: tuple[str, ...]  # "telegram:<chat id>", "whatsapp:<wa_id>", "console:local", "log"
    model: str | None = None  # None: the chat model (another one means a reload on one GPU)
    enabled: bool = True
    quiet: str | None = None  # a reply that is exactly this token is not delivered
    grace: float = 300.0  # APScheduler's misfire_grace_time; also how long a run retries
    timeout: float = 600.0  # a run still going after this long is stopped and recorded


_AUTOMATION: _Spec = {
    "name": _like("[a-z0-9_-]+", "lowercase letters, digits, '-' and '_'"),
    "schedule": _value(str, "a crontab string such as '0 7 * * *' or 'every 1h'",
                       then=_schedule),
    "prompt": _STRING,
    # A forum topic is its own chat: `telegram:<chat>:<topic>`, as channels/telegram/parse.py
    # keys it (topic ids start at 1; the General topic has none).
    "deliver": _array(_like("telegram:-?[0-9]+(:[1-9][0-9]*)?|whatsapp:[0-9]+|console:local|log",
                            "a known target ('telegram:<chat id>', 'telegram:<chat id>:<topic>', "
                            "'whatsapp:<wa_id>', 'console:local' or 'log')")),
    "model": _STRING, "enabled": _BOOL, "quiet": _STRING,
    "grace": _value(str, "a duration string such as '5m'", lambda v: _seconds(v) >= 1,
                    "must be at least 1s", _seconds),
    "timeout": _value(str, "a duration string such as '10m'", lambda v: _seconds(v) >= 1,
                      "must be at least 1s", _seconds)}
_AUTOMATION_REQUIRED = ("name", "schedule", "prompt", "deliver")
