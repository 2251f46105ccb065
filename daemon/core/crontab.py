"""Crontab lines as roost reads them: the one module that knows crontab(5)'s syntax.

Pure functions. A schedule is five fields (minute hour day month weekday) of what crontab(5)
and APScheduler 3.x both read: `*`, `a`, `a-b`, `*/n`, `a-b/n` and lists of them, with month
and weekday names. Weekdays count as crontab counts them (0 and 7 are Sunday, not APScheduler's
Monday). The config validates a schedule through `check` (so a line it takes is one the
scheduler can build), and `automations.schedule` builds its triggers from `fields`, `weekdays`
and `every_as_crontab`.
"""

from __future__ import annotations

import re

DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
# (field, lowest, highest, names); 0 and 7 are both Sunday, as in crontab(5).
FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTH_NAMES), ("day of week", 0, 7, DAY_NAMES))
_ITEM = re.compile(r"(\*|(\w+)(?:-(\w+))?)(?:/([1-9][0-9]*))?")
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # 29 February: leap years


def check(text: str) -> str:
    """The line itself when it is a crontab line that runs; else a ValueError that says why."""
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 crontab fields (minute hour day month weekday), got "
                         f"{text!r}")
    for field_text, (name, low, high, names) in zip(fields, FIELDS, strict=True):
        for item in field_text.split(","):
            match = _ITEM.fullmatch(item)
            if not match or (match[4] and not (match[1] == "*" or match[3])):
                raise ValueError(f"{name} field {field_text!r} is not valid crontab syntax")
            bounds = [_value(token, name, low, high, names) for token in match.group(2, 3)
                      if token]
            if bounds != sorted(bounds):
                raise ValueError(f"{name} field {field_text!r}: the range runs backwards")
    _check_runs(fields)
    return text


def fields(text: str) -> tuple[str, str, str, str, str]:
    """A (checked) line's five fields: minute, hour, day, month, weekday."""
    minute, hour, day, month, weekday = text.split()
    return minute, hour, day, month, weekday


def weekdays(field_text: str) -> set[int]:
    """The days a (checked) weekday field matches, 0 (Sunday) to 6: `5-7` is Friday to Sunday
    and `*/2` Sunday, Tuesday, Thursday and Saturday, as in crontab."""
    return {day % 7 for day in _expand(field_text, 4)}


def every_as_crontab(minutes: int) -> str | None:
    """`every N` minutes that divides an hour or a day, as the crontab line that keeps it on the
    wall clock (an elapsed-time interval would drift by an hour across daylight saving)."""
    if minutes < 60 and 60 % minutes == 0:
        return f"*/{minutes} * * * *"
    if minutes == 24 * 60:
        return "0 0 * * *"
    if minutes < 24 * 60 and minutes % 60 == 0 and 24 % (minutes // 60) == 0:
        return f"0 */{minutes // 60} * * *"
    return None


def _check_runs(fields: list[str]) -> None:
    """A day of month that no month of the schedule has (`0 0 30 2 *`) never runs: an error
    rather than an automation that silently never fires. With a weekday as well, crontab runs
    on either, so such a line still runs on that weekday."""
    day, month, weekday = fields[2], fields[3], fields[4]
    if day == "*" or weekday != "*":
        return
    if not any(d <= _MONTH_DAYS[m - 1] for d in _expand(day, 2) for m in _expand(month, 3)):
        raise ValueError(f"the schedule {' '.join(fields)!r} never runs: no month of it has "
                         f"day {day}")


def _expand(field_text: str, index: int) -> set[int]:
    """The values a (checked) field matches."""
    _, low, high, names = FIELDS[index]
    values: set[int] = set()
    for item in field_text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ValueError(f"{field_text!r} is not valid crontab syntax")
        first = low if match[1] == "*" else _value(match[2], "", low, high, names)
        last = (high if match[1] == "*" or (match[4] and not match[3]) else
                _value(match[3] or match[2], "", low, high, names))
        values.update(range(first, last + 1, int(match[4] or 1)))
    return values


def _value(token: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if token.lower() in names:
        return names.index(token.lower()) + low
    if not re.fullmatch("[0-9]+", token) or not low <= int(token) <= high:
        raise ValueError(f"{name} field: {token!r} is not a number in {low}-{high}")
    return int(token)
