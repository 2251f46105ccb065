"""What did not run is on the record: skipped and missed slots, and a run cut off by a stop."""

from __future__ import annotations

import pytest

from automations.commands import list_automations
from tests.automations.conftest import Daemon, DaemonFactory, at, automation, wait_until
from tests.fakes.ollama import FakeOllama


def listed(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    list_automations(daemon.settings)
    return capsys.readouterr().out


async def test_a_slot_that_comes_while_the_previous_run_goes_on_is_recorded_as_skipped(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run longer than a minute on a minutely schedule, through the real scheduler: APScheduler
    # itself refuses the second instance (max_instances=1) and only logs it.
    daemon = make_daemon(automation("minutely", "* * * * *", grace=20),
                         start=at(2026, 12, 1, 9, 59, 30), on_clock=True)
    automations = await daemon.start()
    fake_ollama.hang = True
    daemon.clock.set(at(2026, 12, 1, 10, 0, 0))
    automations.scheduler.wakeup()
    await fake_ollama.wait_for_chats(1, timeout=10)
    daemon.clock.set(at(2026, 12, 1, 10, 1, 0))
    automations.scheduler.wakeup()
    await wait_until(lambda: len(automations.state.runs("minutely")) == 2)
    fake_ollama.hang = False
    await wait_until(lambda: automations.state.runs("minutely")[0]["status"] == "ok")
    first, second = automations.state.runs("minutely")
    assert first["id"] == "minutely@2026-12-01T10:00"
    assert second["id"] == "minutely@2026-12-01T10:01" and second["status"] == "skipped"
    assert second["error"] == "the previous run was still going"
    assert daemon.counted("minutely", "skipped") == 1
    assert len(fake_ollama.chat_requests) == 1
    out = listed(daemon, capsys)
    assert "not run: 1 skipped (latest: skipped Tue 2026-12-01 10:01: the previous run " \
           "was still going)" in out


async def test_slots_that_came_while_roost_was_down_are_recorded_as_missed(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    first = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 9, 59))
    automations = await first.start()
    first.clock.set(at(2026, 12, 1, 10, 0, 1))
    await automations.fire("hourly")
    first.clock.set(at(2026, 12, 1, 10, 30))
    await first.stop()
    # Down from 10:30 to 13:02: 11:00 and 12:00 are missed, 13:00 is within the grace and runs.
    second = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 13, 2))
    automations = await second.start()
    await wait_until(lambda: len(automations.state.runs("hourly")) == 3
                     and automations.state.runs("hourly")[-1]["status"] == "ok")
    ok, missed, late = automations.state.runs("hourly")
    assert ok["id"] == "hourly@2026-12-01T10:00" and ok["status"] == "ok"
    assert missed["status"] == "missed" and missed["slots"] == 2
    assert missed["error"] == ("roost was not running: 2 slots not run "
                               "(Tue 2026-12-01 11:00 to Tue 2026-12-01 12:00)")
    assert late["id"] == "hourly@2026-12-01T13:00"
    assert second.counted("hourly", "missed") == 2
    assert len(fake_ollama.chat_requests) == 2
    assert "not run: 2 missed" in listed(second, capsys)
    # A restart soon after misses nothing more.
    await second.stop()
    third = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 13, 20))
    automations = await third.start()
    assert len(automations.state.runs("hourly")) == 3
    assert third.counted("hourly", "missed") == 0


async def test_a_run_cut_off_by_a_stop_runs_again_once_within_the_grace(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.hang = True
    first = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 9, 59))
    automations = await first.start()
    first.clock.set(at(2026, 12, 1, 10, 0, 1))
    automations.scheduler.add_job(automations.fire, args=["hourly"])
    await fake_ollama.wait_for_chats(1, timeout=10)
    await first.stop()  # mid-run: the record still says running, as after a crash
    fake_ollama.hang = False
    second = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 10, 2))
    automations = await second.start()
    await wait_until(lambda: second.replies() == ["echo: Anything new on the things I follow?"])
    (run,) = automations.state.runs("hourly")
    assert run["id"] == "hourly@2026-12-01T10:00" and run["status"] == "ok" and run["rerun"]
    assert len(fake_ollama.chat_requests) == 2


async def test_a_rerun_cut_off_again_is_not_run_a_third_time(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.hang = True
    first = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 9, 59))
    automations = await first.start()
    first.clock.set(at(2026, 12, 1, 10, 0, 1))
    automations.scheduler.add_job(automations.fire, args=["hourly"])
    await fake_ollama.wait_for_chats(1, timeout=10)
    await first.stop()
    second = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 10, 1))
    await second.start()  # the rerun starts, and hangs too
    await fake_ollama.wait_for_chats(2, timeout=10)
    await second.stop()
    fake_ollama.hang = False
    third = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 10, 2))
    automations = await third.start()
    await wait_until(lambda: automations.state.runs("hourly")[0]["status"] != "running")
    (run,) = automations.state.runs("hourly")
    assert run["status"] == "failed" and "not run again" in run["error"]
    assert len(fake_ollama.chat_requests) == 2
    assert third.replies() == []


async def test_a_run_cut_off_longer_ago_than_the_grace_is_recorded_as_failed(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    fake_ollama.hang = True
    first = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 9, 59))
    automations = await first.start()
    first.clock.set(at(2026, 12, 1, 10, 0, 1))
    automations.scheduler.add_job(automations.fire, args=["hourly"])
    await fake_ollama.wait_for_chats(1, timeout=10)
    await first.stop()
    fake_ollama.hang = False
    second = make_daemon(automation("hourly", "0 * * * *"), start=at(2026, 12, 1, 10, 6))
    automations = await second.start()
    (run,) = automations.state.runs("hourly")
    assert run["status"] == "failed" and run["error"] == "roost stopped during the run"
    assert len(fake_ollama.chat_requests) == 1
