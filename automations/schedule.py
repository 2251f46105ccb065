"""Schedules: a config line -> an APScheduler 3.x trigger that means what crontab(5) means.

Pure functions, no clock of their own. Three differences between crontab and APScheduler 3.x's
`CronTrigger` are translated here:

* Weekday numbers. APScheduler 3.x counts 0 as Monday (its `from_crontab` documents the
  mismatch and keeps it for compatibility); crontab counts 0 and 7 as Sunday. The weekday field
  is expanded to crontab day numbers (`daemon.core.crontab`, which also validates every line
  the config takes) and handed over as names (`sun`, `mon`, ...), which both read the same way.
* Day of month *and* day of week. When both are restricted, crontab runs on days matching
  either; APScheduler requires both. roost builds an `OrTrigger` of the two then.
* Daylight saving. Slot arithmetic is done on absolute (UTC) time, so that a wall-clock time
  that does not exist or happens twice cannot move a slot. Spring forward: APScheduler runs a
  time that does not exist (02:30 when 02:00 becomes 03:00) once, an hour later by the wall
  clock (03:30), and everything else on the real clock (`hourly` runs at 01:00 and 03:00,
  an hour apart). Fall back: a schedule whose minute or hour field is a wildcard (`*`, `*/N`:
  `hourly`, `every 15m`, `every 1h`) runs at every real occurrence through the repeated hour,
  as Vixie cron does; a fixed wall time (`30 2 * * *`, `every 1d`) runs once, at the first
  occurrence. `slot_key` tells the two occurrences apart for the first kind only.

`every <duration>` that divides an hour or a day is the matching crontab line (`every 15m` is
`*/15 * * * *`, `every 1d` is `0 0 * * *`), so it keeps to the wall clock across daylight
saving. Any other (`every 90m`) is an `IntervalTrigger` of elapsed time anchored at midnight,
2000-01-01, in the daemon's zone, so its times survive restarts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from daemon.core import crontab
from daemon.core.config import parse_duration

INTERVAL_ANCHOR = (2000, 1, 1)


def crontab_weekdays(field: str) -> str:
    """A crontab weekday field as APScheduler day names, e.g. "0" -> "sun", "1-5" -> "mon,...".

    `*` stays `*`. Numbers 0 and 7 are Sunday; ranges and steps run over crontab's numbering
    (so `5-7` is Friday to Sunday and `*/2` is Sunday, Tuesday, Thursday, Saturday).
    """
    if field == "*":
        return "*"
    return ",".join(crontab.DAY_NAMES[day] for day in sorted(crontab.weekdays(field)))


def build_trigger(schedule: str, tz: tzinfo) -> BaseTrigger:
    """The trigger of a schedule as the config accepts it (see the module docstring)."""
    if schedule.startswith("every "):
        seconds = parse_duration(schedule.removeprefix("every ").strip(), "schedule")
        as_cron = crontab.every_as_crontab(int(seconds) // 60)
        if as_cron is None:
            anchor = datetime(*INTERVAL_ANCHOR, tzinfo=tz)
            return IntervalTrigger(seconds=int(seconds), start_date=anchor, timezone=tz)
        schedule = as_cron
    minute, hour, day, month, weekday = crontab.fields(schedule)
    weekdays = crontab_weekdays(weekday)

    def cron(day: str, day_of_week: str) -> CronTrigger:
        return CronTrigger(minute=minute, hour=hour, day=day, month=month.lower(),
                           day_of_week=day_of_week, timezone=tz)

    if day != "*" and weekdays != "*":
        return OrTrigger([cron(day, "*"), cron("*", weekdays)])
    return cron(day, weekdays)


def next_fire(trigger: BaseTrigger, now: datetime) -> datetime | None:
    """The trigger's first fire time at or after `now`."""
    fire: datetime | None = trigger.get_next_fire_time(None, now)
    return fire


# How far before `now - grace` the search for a slot starts: APScheduler puts a time that does
# not exist an hour later (the largest daylight-saving shift in use), where a search starting
# at `now - grace` would not find it (its wall time, 02:30, is before the cursor's 03:25).
LOOKBACK = timedelta(hours=2)


def due_slot(trigger: BaseTrigger, now: datetime, grace: float) -> datetime | None:
    """The latest fire time in the `grace` seconds up to `now`: the slot a run at `now` serves.

    APScheduler does not tell a job which fire time it runs for; a run that starts a little late
    (a busy loop, a retry) still belongs to its slot, and a run far from any slot has none.
    Compared in UTC: `now - grace` by the wall clock may not exist (03:00 - 5 min in spring).
    """
    tz = now.tzinfo
    assert tz is not None
    found: datetime | None = None
    start = now.astimezone(UTC) - timedelta(seconds=grace)
    for fire in fires_between(trigger, start, now, tz):
        found = fire
    return found


def fires_between(trigger: BaseTrigger, start: datetime, end: datetime, tz: tzinfo,
                  limit: int | None = None) -> list[datetime]:
    """The trigger's fire times from `start` to `end` (both included, compared in UTC), each
    in `tz`, oldest first; at most `limit` (the first ones)."""
    low, high = start.astimezone(UTC), end.astimezone(UTC)
    cursor = low.astimezone(tz)
    if (low - LOOKBACK).astimezone(tz).utcoffset() != cursor.utcoffset():
        cursor = (low - LOOKBACK).astimezone(tz)  # only across a change of offset
    found: list[datetime] = []
    previous: datetime | None = None
    while limit is None or len(found) < limit:
        fire: datetime | None = trigger.get_next_fire_time(previous, cursor)
        if fire is None or fire.astimezone(UTC) > high:
            break
        fire = fire.astimezone(UTC).astimezone(tz)  # the real wall time, with its fold
        if fire.astimezone(UTC) >= low:
            found.append(fire)
        previous = fire
        # Step past it in absolute time: wall-clock arithmetic would loop in a repeated hour.
        cursor = (fire.astimezone(UTC) + timedelta(seconds=1)).astimezone(tz)
    return found


def every_occurrence(schedule: str) -> bool:
    """Whether the schedule runs at each real occurrence of a repeated (fall-back) hour: one
    whose minute or hour field is a wildcard, and `every` intervals. A fixed wall time runs
    once. (Vixie cron draws the same line.)"""
    if schedule.startswith("every "):
        seconds = parse_duration(schedule.removeprefix("every ").strip(), "schedule")
        as_cron = crontab.every_as_crontab(int(seconds) // 60)
        if as_cron is None:
            return True  # elapsed time: each occurrence is a new one
        schedule = as_cron  # `every 1d` is a fixed time, 00:00
    minute, hour = crontab.fields(schedule)[:2]
    return minute.startswith("*") or hour.startswith("*")


def repeated(fire: datetime) -> bool:
    """Whether `fire` is the second occurrence of a wall time that happens twice (fall back)."""
    local = fire.astimezone(UTC).astimezone(fire.tzinfo)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def slot_key(fire: datetime, every: bool = False) -> str:
    """A run's identity: its wall-clock minute in the daemon's zone. The second occurrence of a
    repeated time has the same key (so a fixed time is not run twice) unless `every` (see
    `every_occurrence`): then its UTC offset is added (`2027-10-31T02:00+01:00`)."""
    local = fire.astimezone(UTC).astimezone(fire.tzinfo)
    key = local.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M")
    if every and repeated(local):
        key += local.strftime("%z")[:3] + ":" + local.strftime("%z")[3:]
    return key
