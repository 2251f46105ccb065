"""When a reminder is due: the words a person (or a small model) writes -> a point in time.

Pure: `now` and the zone are passed in. Accepted, case-insensitive:

* a duration from now: `20m`, `in 2h`, `in 1h30m`, `1d`;
* the same in words: `in 2 hours`, `in 20 minutes`, `in 3 days`, `in 1 week`;
* a time of day, `15:30`, `9am` or `9:30pm`: today, or tomorrow when it has passed; after
  `today`, `tomorrow`, a weekday (`monday 8:00`: the coming Monday, today if the time is still
  ahead) or `next` and a weekday (`next monday 8:00`: the coming Monday, never today);
* a date and time: `2026-12-24 18:00` or ISO 8601 (`2026-12-24T18:00`, with an offset if
  wanted); without an offset it is in the daemon's zone.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, tzinfo

from daemon.core.config import parse_duration
from daemon.core.errors import ConfigError

FORMS = ("'in 20m', 'in 2 hours', '15:30', 'tomorrow 09:00', 'next monday 9am' or "
         "'2026-12-24 18:00'")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_SPOKEN = re.compile(r"in\s+([0-9]+)\s*(seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?)")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}  # by the unit's first letter
_CLOCK = re.compile(r"([0-9]{1,2})(?::([0-9]{2}))?\s*(am|pm)?")


def parse_when(text: str, now: datetime) -> datetime:
    """The moment `text` names, in `now`'s zone; ValueError (naming the forms) otherwise."""
    tz = now.tzinfo
    assert tz is not None, "now must be aware"
    words = text.strip().lower()
    if not words:
        raise ValueError(f"no time given; use {FORMS}")
    duration = words.removeprefix("in ").strip()
    if re.fullmatch(r"-\s*([0-9.]+(ms|s|m|h|d))+", duration):
        raise ValueError(f"{text!r} is in the past; a reminder needs a time after now")
    if re.fullmatch(r"([0-9.]+(ms|s|m|h|d))+", duration):
        try:
            return now + timedelta(seconds=parse_duration(duration))
        except ConfigError:
            pass
        except OverflowError:  # past the year 9999, where datetime ends
            raise ValueError(f"{text!r} is too far in the future") from None
    if spoken := _SPOKEN.fullmatch(words):
        try:
            return now + timedelta(seconds=int(spoken[1]) * _SECONDS[spoken[2][0]])
        except OverflowError:
            raise ValueError(f"{text!r} is too far in the future") from None
    day_words, _, clock = words.rpartition(" ")
    day_words = day_words.strip()
    weekday = day_words.removeprefix("next ").removeprefix("on ").strip()
    named = (clock_match := _CLOCK.fullmatch(clock)) is not None \
        and (clock_match[2] is not None or clock_match[3] is not None)
    if named and (day_words in ("", "today", "tomorrow") or weekday in WEEKDAYS):
        assert clock_match is not None
        hour, minute = int(clock_match[1]), int(clock_match[2] or 0)
        if clock_match[3] is not None:  # 12am is midnight, 12pm noon
            if not 1 <= hour <= 12:
                raise ValueError(f"{text!r} is not a time of day")
            hour = hour % 12 + (12 if clock_match[3] == "pm" else 0)
        if hour > 23 or minute > 59:
            raise ValueError(f"{text!r} is not a time of day")
        at = _local(now.date(), time(hour, minute), tz)
        if weekday in WEEKDAYS:
            ahead = (WEEKDAYS.index(weekday) - now.weekday()) % 7
            if ahead == 0 and (day_words.startswith("next ") or at <= now):
                ahead = 7
            return _local(now.date() + timedelta(days=ahead), time(hour, minute), tz)
        if day_words == "tomorrow" or (not day_words and at <= now):
            at = _local(now.date() + timedelta(days=1), time(hour, minute), tz)
        return at
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a time; use {FORMS}") from None
    try:
        return moment.astimezone(tz) if moment.tzinfo else moment.replace(tzinfo=tz)
    except OverflowError:  # an offset that pushes it past the year 9999
        raise ValueError(f"{text!r} is too far in the future") from None


def split_when(words: list[str], now: datetime) -> tuple[datetime, str]:
    """The moment the leading words name, and the rest as the text: `in 20m call the plumber`
    -> (now + 20 min, "call the plumber"). The longest leading run of words (at most three)
    that reads as a time wins; a first word with a space in it was quoted and is the time
    whole. ValueError (naming the forms) when no leading run is a time."""
    if not words:
        raise ValueError(f"no time given; use {FORMS}")
    if " " in words[0].strip():
        return parse_when(words[0], now), " ".join(words[1:])
    first_error: ValueError | None = None
    for n in range(min(3, len(words)), 0, -1):
        try:
            return parse_when(" ".join(words[:n]), now), " ".join(words[n:])
        except ValueError as exc:
            # "in -5m ..." or "in 99999999d ...": a time, but a refused one; say why.
            if first_error is None and not str(exc).startswith("cannot read"):
                first_error = exc
    raise first_error or ValueError(f"cannot read {words[0]!r} as a time; use {FORMS}")


def _local(day: date, at: time, tz: tzinfo) -> datetime:
    return datetime.combine(day, at, tzinfo=tz)
