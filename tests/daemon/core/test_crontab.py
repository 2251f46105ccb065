"""The one reader of crontab lines: what the config takes is what the scheduler builds."""

from __future__ import annotations

import pytest

from daemon.core import crontab


@pytest.mark.parametrize(("field", "days"), [
    ("0", {0}), ("7", {0}), ("sun", {0}), ("1-5", {1, 2, 3, 4, 5}), ("5-7", {5, 6, 0}),
    ("*/2", {0, 2, 4, 6}), ("mon-fri/2", {1, 3, 5}), ("0,6", {0, 6})])
def test_weekdays_count_as_crontab_does(field: str, days: set[int]) -> None:
    assert crontab.weekdays(crontab.fields(crontab.check(f"0 7 * * {field}"))[4]) == days


@pytest.mark.parametrize(("line", "why"), [
    ("0 7 * *", "expected 5 crontab fields"),
    ("60 7 * * *", "minute field: '60' is not a number in 0-59"),
    ("0 7 * * fri-mon", "the range runs backwards"),
    ("0 7 * * 1/2", "not valid crontab syntax"),  # a step needs * or a range
    ("0 0 30 2 *", "never runs"),
])
def test_lines_the_scheduler_could_not_read_are_refused_with_the_reason(line: str,
                                                                        why: str) -> None:
    with pytest.raises(ValueError, match=why):
        crontab.check(line)


def test_every_that_divides_an_hour_or_a_day_is_a_crontab_line() -> None:
    assert crontab.every_as_crontab(15) == "*/15 * * * *"
    assert crontab.every_as_crontab(6 * 60) == "0 */6 * * *"
    assert crontab.every_as_crontab(24 * 60) == "0 0 * * *"
    assert crontab.every_as_crontab(90) is None  # elapsed time instead
