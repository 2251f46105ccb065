"""[[automations]]: one scheduled prompt each.

A `deliver` target is a chat key, `log`, or `person:NAME`: a person of `[people]` or
`[identities]`, reached on the first of their chats (in the config's order) that can take the
report when it goes out (engine/delivery.py); a name the config does not list is an error at
load (`_check_people`)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from daemon.core.config.identities import _IDENTITY_NAME
from daemon.core.config.values import (
    _BOOL,
    _STRING,
    Convert,
    _array,
    _like,
    _schedule,
    _seconds,
    _Spec,
    _value,
)
from daemon.core.errors import ConfigError
from daemon.core.platforms import chat_pattern

PERSON_PREFIX = "person:"  # a deliver target that names a person, not one of their chats


@dataclass(frozen=True)
class AutomationSettings:
    name: str
    schedule: str  # crontab, 5 fields, unconverted: 0 and 7 are Sunday; or "every <duration>"
    prompt: str
    deliver: tuple[str, ...]  # chat keys ("console:local" among them), "person:NAME", "log"
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
    "deliver": _array(lambda value: _target()(value)),
    "model": _STRING, "enabled": _BOOL, "quiet": _STRING,
    "grace": _value(str, "a duration string such as '5m'", lambda v: _seconds(v) >= 1,
                    "must be at least 1s", _seconds),
    "timeout": _value(str, "a duration string such as '10m'", lambda v: _seconds(v) >= 1,
                      "must be at least 1s", _seconds)}


def _target() -> Convert:
    """A chat some platform (or the terminal) delivers to, a person, or 'log': as the installed
    platforms describe their chat keys (whether the person is listed: `_check_people`)."""
    pattern, forms = chat_pattern()
    return _like(f"{pattern}|{PERSON_PREFIX}{_IDENTITY_NAME.pattern}|log",
                 f"a known target ({forms}, 'person:<name>' or 'log')")


def target_person(target: str) -> str | None:
    """The name a `person:NAME` target gives; None for a chat or 'log'."""
    return target.removeprefix(PERSON_PREFIX) if target.startswith(PERSON_PREFIX) else None


def _check_people(jobs: tuple[AutomationSettings, ...], named: Collection[str],
                  fail: Callable[[str, str], ConfigError]) -> None:
    """Each `person:NAME` target names someone in `[people]` or `[identities]` (`named`)."""
    for i, job in enumerate(jobs):
        for j, target in enumerate(job.deliver):
            name = target_person(target)
            if name is not None and name not in named:
                raise fail(f"automations[{i}].deliver[{j}]",
                           f"automation {job.name!r}: {target} names nobody: {name!r} is in "
                           "neither [people] nor [identities]")


_AUTOMATION_REQUIRED = ("name", "schedule", "prompt", "deliver")


def _automations(raw_jobs: Any, read: Callable[[Any, str, _Spec], dict[str, Any]],
                 fail: Callable[[str, str], ConfigError]) -> tuple[AutomationSettings, ...]:
    """The `[[automations]]` array, each table checked against its spec; an error names the
    automation when it has a name."""
    if not isinstance(raw_jobs, list):
        raise fail("automations", "expected an array of tables ([[automations]])")
    jobs: list[AutomationSettings] = []
    for i, table in enumerate(raw_jobs):
        # Every error about an automation names it, so the user knows which table to fix.
        label = table.get("name") if isinstance(table, dict) else None
        try:
            job = read(table, f"automations[{i}]", _AUTOMATION)
            if missing := [key for key in _AUTOMATION_REQUIRED if not job.get(key)]:
                raise fail(f"automations[{i}].{missing[0]}", "is required and must not be empty")
            if job["name"] in {other.name for other in jobs}:
                raise fail(f"automations[{i}].name", "is used by another automation")
        except ConfigError as error:
            if not isinstance(label, str):
                raise
            raise ConfigError(error.key, f"automation {label!r}: {error.problem}",
                              error.source) from None
        jobs.append(AutomationSettings(**job))
    return tuple(jobs)
