"""The times a person writes for a reminder, read against a fixed clock (a Tuesday evening in
Berlin): the short forms and the natural ones of issue 20 (`tomorrow 9am`, `in 2 hours`,
`next monday 8:00`)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from automations.when import parse_when, split_when

BERLIN = ZoneInfo("Europe/Berlin")
NOW = datetime(2026, 12, 1, 22, 0, tzinfo=BERLIN)  # Tuesday 22:00


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=BERLIN)


@pytest.mark.parametrize(("text", "due"), [
    ("tomorrow 9am", at(2, 9)),
    ("Tomorrow 9:30PM", at(2, 21, 30)),
    ("in 2 hours", at(2, 0)),
    ("in 20 minutes", at(1, 22, 20)),
    ("in 3 days", at(4, 22)),
    ("in 1 week", at(8, 22)),
    ("next monday 8:00", at(7, 8)),
    ("monday 8:00", at(7, 8)),
    ("tuesday 23:00", at(1, 23)),  # today's weekday, the time still ahead: today
    ("tuesday 21:00", at(8, 21)),  # already past: a week on
    ("next tuesday 23:00", at(8, 23)),  # "next" is never today
    ("12am", at(2, 0)),
    ("12pm", at(2, 12)),
    ("15:30", at(2, 15, 30)),
    ("in 20m", at(1, 22, 20)),
    ("tomorrow 09:00", at(2, 9)),
])
def test_natural_and_short_times(text: str, due: datetime) -> None:
    assert parse_when(text, NOW) == due


@pytest.mark.parametrize("text", ["13pm", "0am", "25:00", "at noon", "9", "next 9am"])
def test_what_is_not_a_time_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a time of day|cannot read"):
        parse_when(text, NOW)


def test_the_time_ends_where_the_text_begins() -> None:
    assert split_when("next monday 8:00 standup notes".split(), NOW) == (at(7, 8),
                                                                       "standup notes")
    assert split_when("in 2 hours stretch".split(), NOW) == (at(2, 0), "stretch")
    assert split_when(["tomorrow 9am", "call the plumber"], NOW) == (at(2, 9),
                                                                    "call the plumber")
