"""Schedules mean what crontab means: weekdays, day-of-month-or-weekday, DST, every N."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, timedelta
from pathlib import Path

import pytest

from automations.schedule import build_trigger, crontab_weekdays, due_slot, next_fire, slot_key
from tests.automations.conftest import TZ, at


@pytest.mark.parametrize("weekday", ["0", "7", "sun", "SUN"])
def test_0_and_7_and_sun_are_sunday(weekday: str) -> None:
    monday = at(2026, 11, 30, 12, 0)
    fire = next_fire(build_trigger(f"0 9 * * {weekday}", TZ), monday)
    assert fire == at(2026, 12, 6, 9, 0)
    assert fire is not None and fire.strftime("%A") == "Sunday"


@pytest.mark.parametrize(
    ("field", "days"),
    [("1-5", "mon,tue,wed,thu,fri"), ("5-7", "sun,fri,sat"), ("*/2", "sun,tue,thu,sat"),
     ("mon-fri", "mon,tue,wed,thu,fri"), ("0,6", "sun,sat"), ("*", "*")],
)
def test_weekday_fields_translate_as_in_crontab(field: str, days: str) -> None:
    assert crontab_weekdays(field) == days


def test_weekdays_1_to_5_skip_the_weekend() -> None:
    trigger = build_trigger("0 7 * * 1-5", TZ)
    fires, now = [], at(2026, 12, 4, 8, 0)  # a Friday, after 07:00
    for _ in range(3):
        fire = next_fire(trigger, now)
        assert fire is not None
        fires.append(fire.strftime("%a"))
        now = fire + timedelta(minutes=1)
    assert fires == ["Mon", "Tue", "Wed"]


def test_day_of_month_and_weekday_mean_either_as_in_crontab() -> None:
    # "on the 13th, and on Fridays": crontab runs on either, not only on Friday the 13th.
    trigger = build_trigger("0 9 13 * 5", TZ)
    assert next_fire(trigger, at(2026, 12, 1, 0, 0)) == at(2026, 12, 4, 9, 0)  # a Friday
    assert next_fire(trigger, at(2026, 12, 12, 0, 0)) == at(2026, 12, 13, 9, 0)  # a Sunday


def test_every_interval_is_anchored_on_the_clock() -> None:
    assert next_fire(build_trigger("every 1h", TZ), at(2026, 12, 1, 10, 17)) == at(
        2026, 12, 1, 11, 0)
    assert next_fire(build_trigger("every 15m", TZ), at(2026, 12, 1, 10, 17)) == at(
        2026, 12, 1, 10, 30)
    # In summer time too: an elapsed-time interval from a winter anchor would say 01:00.
    assert next_fire(build_trigger("every 1d", TZ), at(2026, 7, 1, 10, 17)) == at(
        2026, 7, 2, 0, 0)
    assert next_fire(build_trigger("every 6h", TZ), at(2026, 7, 1, 10, 17)) == at(
        2026, 7, 1, 12, 0)
    assert next_fire(build_trigger("every 90m", TZ), at(2026, 12, 1, 10, 17)) == at(
        2026, 12, 1, 10, 30)


def test_a_run_belongs_to_its_slot_within_the_grace() -> None:
    trigger = build_trigger("0 * * * *", TZ)
    assert due_slot(trigger, at(2026, 12, 1, 10, 0, 2), 300) == at(2026, 12, 1, 10, 0)
    assert due_slot(trigger, at(2026, 12, 1, 10, 4), 300) == at(2026, 12, 1, 10, 0)
    assert due_slot(trigger, at(2026, 12, 1, 10, 6), 300) is None


def test_daylight_saving_spring_forward_runs_the_missing_time_once_an_hour_later() -> None:
    # 02:30 does not exist in Berlin on 2026-03-29: it runs once, at 03:30 summer time.
    trigger = build_trigger("30 2 * * *", TZ)
    fire = next_fire(trigger, at(2026, 3, 28, 12, 0))
    assert fire is not None
    assert fire.astimezone(UTC).astimezone(TZ).strftime("%Y-%m-%d %H:%M %Z") == (
        "2026-03-29 03:30 CEST")
    following = next_fire(trigger, fire + timedelta(minutes=1))
    assert following == at(2026, 3, 30, 2, 30)


def test_daylight_saving_fall_back_runs_a_repeated_time_once() -> None:
    # 02:30 happens twice on 2026-10-25; APScheduler fires at both, roost's slot is the same.
    trigger = build_trigger("30 2 * * *", TZ)
    first = next_fire(trigger, at(2026, 10, 24, 12, 0))
    assert first is not None
    second = next_fire(trigger, first + timedelta(minutes=1))
    assert second is not None and second.fold == 1
    assert slot_key(due_slot(trigger, first, 300)) == slot_key(  # type: ignore[arg-type]
        due_slot(trigger, second + timedelta(seconds=5), 300))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [('schedule = "0 9 * * 8"', "day of week"), ('deliver = ["signal:1"]', "a known target")],
)
def test_config_errors_name_the_automation_and_exit_78(
    tmp_path: Path, entry: str, problem: str
) -> None:
    config = tmp_path / "roost.toml"
    table = {"name": '"morning-brief"', "schedule": '"0 7 * * *"', "prompt": '"Hi"',
             "deliver": '["telegram:1"]'}
    key, _, value = entry.partition(" = ")
    table[key] = value
    body = "".join(f"{k} = {v}\n" for k, v in table.items())
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[automations]]\n{body}')
    result = subprocess.run([sys.executable, "-m", "daemon", "automations", "list", "--config",
                             str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 78
    assert "'morning-brief'" in result.stderr and problem in result.stderr


def test_duplicate_names_are_a_config_error_naming_the_automation(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    table = ('[[automations]]\nname = "brief"\nschedule = "every 1h"\nprompt = "Hi"\n'
             'deliver = ["log"]\n')
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n' + table * 2)
    result = subprocess.run([sys.executable, "-m", "daemon", "automations", "list", "--config",
                             str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 78
    assert "automations[1].name" in result.stderr and "'brief'" in result.stderr


@pytest.mark.parametrize("schedule", ["every 30s", "every 90s", "every", "every 1 h"])
def test_every_takes_whole_minutes(tmp_path: Path, schedule: str) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[automations]]\nname = "x"\n'
                      f'schedule = "{schedule}"\nprompt = "Hi"\ndeliver = ["log"]\n')
    result = subprocess.run([sys.executable, "-m", "daemon", "automations", "list", "--config",
                             str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 78 and "automations[0].schedule" in result.stderr
