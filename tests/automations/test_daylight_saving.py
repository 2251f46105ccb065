"""Daylight saving through the real scheduler on a test clock: every form of schedule, both
transitions (Europe/Berlin, 2027: 02:00 CET becomes 03:00 CEST on 28 March, 03:00 CEST becomes
02:00 CET on 31 October)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from automations.schedule import every_occurrence, slot_key
from tests.automations.conftest import TZ, DaemonFactory, at, automation, wait_until

FORMS = {"hourly": "0 * * * *", "every-1h": "every 1h", "every-15m": "every 15m",
         "at-3": "0 3 * * *", "at-2-30": "30 2 * * *"}


def quarter_hours(first: str, last: str, day: str) -> list[str]:
    """Every 15 minutes of real (UTC) time from `first` to `last`, as 'HH:MMZ'."""
    start = datetime.fromisoformat(f"{day}T{first}+00:00")
    end = datetime.fromisoformat(f"{day}T{last}+00:00")
    if end < start:  # across midnight UTC
        end = end.replace(day=end.day + 1)
    times, moment = [], start
    while moment <= end:
        times.append(moment.strftime("%H:%MZ"))
        moment = datetime.fromtimestamp(moment.timestamp() + 900, UTC)
    return times


# What ran, in UTC, from 00:51 to 04:10 local time on the day of each transition.
SPRING = {
    # 01:00 CET, then 03:00 and 04:00 CEST: every real hour.
    "hourly": ["00:00Z", "01:00Z", "02:00Z"],
    "every-1h": ["00:00Z", "01:00Z", "02:00Z"],
    # 01:00 CET to 04:00 CEST every real 15 minutes: 01:45 CET is followed by 03:00 CEST.
    "every-15m": quarter_hours("00:00", "02:00", "2027-03-28"),
    "at-3": ["01:00Z"],  # 03:00 CEST
    "at-2-30": ["01:30Z"],  # 02:30 does not exist: once, an hour later by the clock, 03:30 CEST
}
AUTUMN = {
    # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET, 04:00 CET: every real hour.
    "hourly": ["23:00Z", "00:00Z", "01:00Z", "02:00Z", "03:00Z"],
    "every-1h": ["23:00Z", "00:00Z", "01:00Z", "02:00Z", "03:00Z"],
    "every-15m": quarter_hours("23:00", "03:00", "2027-10-30"),  # the repeated hour twice
    "at-3": ["02:00Z"],  # 03:00 CET
    "at-2-30": ["00:30Z"],  # 02:30 happens twice: once, the first (CEST)
}


@pytest.mark.parametrize(("day", "expected"), [((2027, 3, 28), SPRING),
                                                ((2027, 10, 31), AUTUMN)],
                         ids=["spring", "autumn"])
async def test_every_schedule_runs_on_the_real_clock_through_a_transition(
    make_daemon: DaemonFactory, day: tuple[int, int, int], expected: dict[str, list[str]]
) -> None:
    daemon = make_daemon(*(automation(name, schedule) for name, schedule in FORMS.items()),
                         start=at(*day, 0, 51), on_clock=True)
    automations = await daemon.start()
    await daemon.run_until(at(*day, 4, 10))
    ran = {name: [datetime.fromtimestamp(r["scheduled"], UTC).strftime("%H:%MZ")
                  for r in automations.state.runs(name)] for name in FORMS}
    assert ran == expected
    for name in FORMS:
        for run in automations.state.runs(name):
            assert run["status"] == "ok", run
            # Started just after its time, never before it: the retry deadline is the grace.
            assert 0 <= run["started"] - run["scheduled"] < 5, run
    reports = sum(len(times) for times in expected.values())
    await wait_until(lambda: len(daemon.replies()) >= reports)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert len(daemon.replies()) == reports


# The forms whose times lie around midnight or follow elapsed time, from 23:51 local the day
# before to 04:10 local on the day of each transition.
MORE_FORMS = {"every-1d": "every 1d", "every-90m": "every 90m", "dom": "0 2 28,31 * *",
              "weekday": "30 2 * * 0", "dom-or-weekday": "0 2 1 * 0"}
MORE_SPRING = {
    "every-1d": ["23:00Z"],  # 00:00 CET
    # Elapsed time from 2000-01-01 00:00 CET (23:00Z): the same UTC times every day.
    "every-90m": ["23:00Z", "00:30Z", "02:00Z"],
    "dom": ["01:00Z"],  # 02:00 does not exist: once, an hour later by the clock, 03:00 CEST
    "weekday": ["01:30Z"],  # 28 March is a Sunday; 02:30 does not exist: 03:30 CEST
    "dom-or-weekday": ["01:00Z"],  # not the 1st, but a Sunday: 03:00 CEST
}
MORE_AUTUMN = {
    "every-1d": ["22:00Z"],  # 00:00 CEST
    "every-90m": ["23:00Z", "00:30Z", "02:00Z"],  # 02:30 CEST and 03:00 CET, an hour apart
    "dom": ["00:00Z"],  # 02:00 happens twice: once, the first (CEST)
    "weekday": ["00:30Z"],  # 31 October is a Sunday: 02:30 CEST, once
    "dom-or-weekday": ["00:00Z"],
}


@pytest.mark.parametrize(("day", "expected"), [((2027, 3, 27), MORE_SPRING),
                                                ((2027, 10, 30), MORE_AUTUMN)],
                         ids=["spring", "autumn"])
async def test_daily_elapsed_and_day_schedules_run_on_the_real_clock_through_a_transition(
    make_daemon: DaemonFactory, day: tuple[int, int, int], expected: dict[str, list[str]]
) -> None:
    daemon = make_daemon(*(automation(name, schedule) for name, schedule in MORE_FORMS.items()),
                         start=at(*day, 23, 51), on_clock=True)
    automations = await daemon.start()
    await daemon.run_until(at(day[0], day[1], day[2] + 1, 4, 10))
    ran = {name: [datetime.fromtimestamp(r["scheduled"], UTC).strftime("%H:%MZ")
                  for r in automations.state.runs(name)] for name in MORE_FORMS}
    assert ran == expected
    for name in MORE_FORMS:
        for run in automations.state.runs(name):
            assert run["status"] == "ok", run
            assert 0 <= run["started"] - run["scheduled"] < 5, run
    reports = sum(len(times) for times in expected.values())
    await wait_until(lambda: len(daemon.replies()) >= reports)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert len(daemon.replies()) == reports


async def test_a_repeated_hour_keeps_two_records_apart_for_hourly_and_one_for_a_fixed_time(
    make_daemon: DaemonFactory,
) -> None:
    daemon = make_daemon(automation("hourly", "0 * * * *"), automation("at-2-30", "30 2 * * *"),
                         start=at(2027, 10, 31, 1, 50), on_clock=True)
    automations = await daemon.start()
    await daemon.run_until(datetime(2027, 10, 31, 2, 40, fold=1, tzinfo=TZ))
    assert [r["id"] for r in automations.state.runs("hourly")] == [
        "hourly@2027-10-31T02:00", "hourly@2027-10-31T02:00+01:00"]
    assert [r["id"] for r in automations.state.runs("at-2-30")] == ["at-2-30@2027-10-31T02:30"]


@pytest.mark.parametrize(("schedule", "twice"), [
    ("0 * * * *", True), ("every 1h", True), ("every 15m", True), ("*/10 * * * *", True),
    ("every 90m", True), ("30 2 * * *", False), ("every 1d", False), ("0 1-5 * * *", False)])
def test_which_schedules_run_twice_through_the_repeated_hour(schedule: str, twice: bool) -> None:
    first = datetime(2027, 10, 31, 2, 30, tzinfo=TZ)
    second = datetime(2027, 10, 31, 2, 30, fold=1, tzinfo=TZ)
    keys = {slot_key(first, every_occurrence(schedule)), slot_key(second,
                                                                  every_occurrence(schedule))}
    assert len(keys) == (2 if twice else 1)
