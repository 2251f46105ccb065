"""Runs as a user notices them: on time, once per slot, byte-stable, not doubled, alerts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from automations.schedule import slot_key
from automations.state import AutomationState
from daemon.cli.automation_run import run_automation
from daemon.core.errors import StoreError
from daemon.core.messages import Inbound, Outbound
from daemon.store import Store
from tests.automations.conftest import TZ, DaemonFactory, at, automation, wait_until
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama


async def test_an_hourly_job_fires_each_hour_and_delivers_once_per_slot(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("hourly", "0 * * * *"))
    automations = await daemon.start()
    assert automations.scheduler.get_job("automation:hourly") is not None
    for hour in (10, 11, 12):
        daemon.clock.set(at(2026, 12, 1, hour, 0, 1))
        await automations.fire("hourly")
        daemon.clock.set(at(2026, 12, 1, hour, 0, 40))  # APScheduler firing again: same slot
        await automations.fire("hourly")
    await wait_until(lambda: len(daemon.replies()) >= 3)
    # The real scheduler fires the job too (told to run now); the clock says 13:00.
    daemon.clock.set(at(2026, 12, 1, 13, 0, 2))
    automations.scheduler.modify_job("automation:hourly", next_run_time=datetime.now(TZ))
    await wait_until(lambda: len(daemon.replies()) >= 4)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert len(daemon.replies()) == 4
    assert len(fake_ollama.chat_requests) == 4
    runs = automations.state.runs("hourly")
    assert [r["id"] for r in runs] == [f"hourly@2026-12-01T{h}:00" for h in (10, 11, 12, 13)]
    assert all(r["status"] == "ok" and r["prompt_tokens"] for r in runs)


async def test_two_runs_on_one_day_send_identical_bytes_up_to_the_volatile_tail(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("brief", "0 9,17 * * *"))
    automations = await daemon.start()
    for hour in (9, 17):
        daemon.clock.set(at(2026, 12, 1, hour, 0, 3))
        await automations.fire("brief")
    first, second = fake_ollama.chat_requests
    assert first["messages"][:-1] == second["messages"][:-1]
    assert {k: v for k, v in first.items() if k != "messages"} == {
        k: v for k, v in second.items() if k != "messages"}
    last_a, last_b = first["messages"][-1]["content"], second["messages"][-1]["content"]
    prompt = "Anything new on the things I follow?"
    assert last_a.startswith(prompt) and last_b.startswith(prompt)
    # The only difference is the run's time, at the very end of the last message.
    common = next(i for i, (x, y) in enumerate(zip(last_a, last_b, strict=False)) if x != y)
    assert "09:00" in last_a[common - 3:] and "17:00" in last_b[common - 3:]
    assert last_a.endswith("09:00]") and last_b.endswith("17:00]")
    # On the wire: the bytes of the two requests' messages part only in the last few, the stamp.
    a = json.dumps(first["messages"], ensure_ascii=False)
    b = json.dumps(second["messages"], ensure_ascii=False)
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert len(a) - shared <= len('09:00]"}]') and shared / len(a) > 0.95
    assert first["messages"][0]["role"] == "system"
    # The automation's note follows its prompt, after the system message every chat shares.
    assert "scheduled automation" in first["messages"][1]["content"]


async def test_crontab_sunday_fires_on_sunday_and_not_on_monday(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("weekly", "0 9 * * 0"))
    automations = await daemon.start()
    daemon.clock.set(at(2026, 11, 30, 9, 0, 1))  # a Monday
    await automations.fire("weekly")
    daemon.clock.set(at(2026, 12, 6, 9, 0, 1))  # a Sunday
    await automations.fire("weekly")
    await wait_until(lambda: len(daemon.replies()) >= 1)
    assert len(fake_ollama.chat_requests) == 1
    assert [r["id"] for r in automations.state.runs("weekly")] == ["weekly@2026-12-06T09:00"]
    job = automations.scheduler.get_job("automation:weekly")
    assert job.next_run_time.strftime("%A %H:%M") == "Sunday 09:00"


async def test_a_run_overlapping_the_next_slot_is_not_doubled(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("hourly", "0 * * * *"))
    automations = await daemon.start()
    fake_ollama.hang = True
    daemon.clock.set(at(2026, 12, 1, 10, 0, 1))
    first = asyncio.create_task(automations.fire("hourly"))
    await fake_ollama.wait_for_chats(1, timeout=10)
    daemon.clock.set(at(2026, 12, 1, 11, 0, 1))
    await automations.fire("hourly")  # the next slot while the first still runs
    fake_ollama.hang = False
    await first
    await wait_until(lambda: len(daemon.replies()) >= 1)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert len(daemon.replies()) == 1
    assert len(fake_ollama.chat_requests) == 1
    statuses = {r["id"]: r["status"] for r in automations.state.runs("hourly")}
    assert statuses == {"hourly@2026-12-01T10:00": "ok", "hourly@2026-12-01T11:00": "skipped"}


async def test_the_quiet_token_delivers_nothing(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("watch", "0 * * * *", quiet="NOTHING"))
    automations = await daemon.start()
    fake_ollama.script("NOTHING", "A new release is out.")
    for hour in (10, 11):
        daemon.clock.set(at(2026, 12, 1, hour, 0, 1))
        await automations.fire("watch")
    await wait_until(lambda: len(daemon.replies()) >= 1)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert daemon.replies() == ["A new release is out."]
    assert [r["status"] for r in automations.state.runs("watch")] == ["quiet", "ok"]


async def test_failures_are_retried_recorded_and_alerted_at_most_hourly(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("often", "every 15m", grace=0.3))
    automations = await daemon.start()
    await fake_ollama.refuse_connections()
    for hour, minute in ((10, 0), (10, 15), (10, 30)):
        daemon.clock.set(at(2026, 12, 1, hour, minute, 0))
        await automations.fire("often")
    runs = automations.state.runs("often")
    assert [r["status"] for r in runs] == ["failed"] * 3
    assert "unreachable" in runs[0]["error"]
    await wait_until(lambda: len(daemon.channel.texts("notice")) >= 1)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    alerts = daemon.channel.texts("notice")
    assert len(alerts) == 1 and "'often' failed 2 times in a row" in alerts[0]
    daemon.clock.set(at(2026, 12, 1, 11, 15, 0))  # an hour after the alert: one more
    await automations.fire("often")
    await wait_until(lambda: len(daemon.channel.texts("notice")) >= 2)
    assert "failed 4 times in a row" in daemon.channel.texts("notice")[1]
    await fake_ollama.accept_connections()
    daemon.clock.set(at(2026, 12, 1, 11, 30, 0))
    await automations.fire("often")
    await wait_until(lambda: len(daemon.replies()) >= 1)
    assert automations.state.runs("often")[-1]["status"] == "ok"
    assert automations.state.consecutive_failures("often") == 0


async def test_an_automation_on_a_smaller_model_gets_a_request_fitted_to_that_model(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    # The chat model has a large window; the automation's own model only 2,048 tokens, and no
    # tools. A long prompt fits the chat model's budget whole but not the small one's.
    fake_ollama.models.append(FakeModel(name="tiny:1b", context_length=2048,
                                        capabilities=("completion",)))
    prompt = "Look at each of these topics and tell me what is new. " * 150  # ~2,700 tokens
    daemon = make_daemon(automation("brief", "0 9 * * *", model="tiny:1b", prompt=prompt),
                         window=8192, response_reserve=512)
    automations = await daemon.start()
    daemon.clock.set(at(2026, 12, 1, 9, 0, 5))
    await automations.fire("brief")
    requests = fake_ollama.chat_requests
    whole = fake_ollama.count_tokens([{"role": "user", "content": prompt}])
    for request in requests:
        assert request["model"] == "tiny:1b" and request["options"]["num_ctx"] == 2048
        assert not request.get("tools")
        # Each one cut for the small window, though the chat model's budget holds it whole.
        assert fake_ollama.count_tokens(request["messages"]) < whole <= 8192 - 512
    # The fake's tokenizer counts a third more than roost's first guess for a model it has not
    # measured yet: a first request over by that is refused (truncate false) and refitted once.
    # Ollama cut nothing, and what it answered fits.
    assert len(requests) <= 2 and fake_ollama.overflows == len(requests) - 1
    assert fake_ollama.count_tokens(requests[-1]["messages"]) <= 2048 - 512
    assert fake_ollama.cuts == 0
    (run,) = automations.state.runs("brief")
    assert run["status"] == "ok"
    await wait_until(lambda: len(daemon.replies()) == 1)  # the report goes out through the outbox


async def test_a_run_past_its_timeout_is_stopped_and_recorded(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("slow", "0 * * * *", timeout=0.3))
    automations = await daemon.start()
    fake_ollama.hang = True
    daemon.clock.set(at(2026, 12, 1, 10, 0, 1))
    await automations.fire("slow")
    fake_ollama.hang = False
    (run,) = automations.state.runs("slow")
    assert run["status"] == "failed" and "timeout" in run["error"]
    assert daemon.replies() == []


async def test_a_run_the_scheduler_could_not_start_within_the_grace_is_recorded_as_missed(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    # A yearly schedule: no regular fire time lies in the real last minutes.
    daemon = make_daemon(automation("yearly", "0 3 1 1 *"))
    automations = await daemon.start()
    late = datetime.now(TZ) - timedelta(minutes=10)  # as after a blocked loop or a sleep
    automations.scheduler.modify_job("automation:yearly", next_run_time=late)
    await wait_until(lambda: bool(automations.state.runs("yearly")))
    (run,) = automations.state.runs("yearly")
    assert run["status"] == "missed" and "grace" in run["error"]
    assert fake_ollama.chat_requests == [] and daemon.replies() == []


async def test_a_report_a_crash_left_behind_goes_out_at_start_for_its_run(
    make_daemon: DaemonFactory, state_dir: Path
) -> None:
    daemon = make_daemon(automation("brief", "0 * * * *"),
                         automation("watch", "0 * * * *", quiet="NOTHING"))
    # What a crash between the model's reply and its delivery leaves: the runs still going,
    # each reply in its automation chat's outbox.
    state, store = AutomationState(state_dir), Store.open(state_dir)
    slot = at(2026, 12, 1, 9, 0)
    for name, text in (("brief", "The report."), ("watch", "NOTHING")):
        state.start_run({"id": f"{name}@{slot_key(slot)}", "name": name,
                         "scheduled": slot.timestamp(), "started": slot.timestamp(),
                         "ended": None, "status": "running", "delivered": [],
                         "message_ids": {}, "error": None})
        store.outbox_add(Outbound(chat_key=f"automation:{name}", text=text,
                                  created=slot.timestamp() + 5).to_doc())
    state.close()
    store.close()
    automations = await daemon.start()
    await wait_until(lambda: daemon.replies() == ["The report."])
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    (brief,) = automations.state.runs("brief")
    assert brief["status"] == "ok" and len(brief["delivered"]) == 1
    assert daemon.replies() == ["The report."]  # the quiet token was not delivered


async def test_a_quiet_reply_a_crash_left_behind_ends_its_run_quiet_without_another_call(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama, state_dir: Path
) -> None:
    # Started within the grace of the slot: a run still "running" would be run again.
    daemon = make_daemon(automation("watch", "0 * * * *", quiet="NOTHING"),
                         start=at(2026, 12, 1, 9, 2))
    state, store = AutomationState(state_dir), Store.open(state_dir)
    slot = at(2026, 12, 1, 9, 0)
    state.start_run({"id": f"watch@{slot_key(slot)}", "name": "watch",
                     "scheduled": slot.timestamp(), "started": slot.timestamp(),
                     "ended": None, "status": "running", "delivered": [],
                     "message_ids": {}, "error": None})
    store.outbox_add(Outbound(chat_key="automation:watch", text="NOTHING",
                              created=slot.timestamp() + 5).to_doc())
    state.close()
    store.close()
    automations = await daemon.start()
    await daemon.settle()
    (run,) = automations.state.runs("watch")
    assert run["status"] == "quiet"
    assert fake_ollama.chat_requests == [] and daemon.replies() == []
    assert daemon.counted("watch", "quiet") == 1


def system_messages(fake: FakeOllama) -> list[str]:
    return [str(body["messages"][0]["content"]) for body in fake.chat_requests]


async def test_a_restart_keeps_the_days_prefix_and_the_map_counts_what_was_there_at_midnight(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    """The memory map is the day's: a restart (a new process) builds the same system message
    as the run before it on that day, so Ollama's prompt cache still matches it."""
    brief = automation("brief", "0 * * * *")
    daemon = make_daemon(brief, start=at(2026, 11, 30, 19, 59))
    automations = await daemon.start()
    for when in (at(2026, 11, 30, 20, 0, 2), at(2026, 12, 1, 10, 0, 2)):
        daemon.clock.set(when)
        await automations.fire("brief")
    await daemon.stop()
    again = make_daemon(brief, start=at(2026, 12, 1, 10, 59))
    automations = await again.start()
    again.clock.set(at(2026, 12, 1, 11, 0, 2))
    await automations.fire("brief")
    yesterday, before, after = system_messages(fake_ollama)
    assert after == before
    # The map of Dec 1 counts the one conversation stored before it began (Nov 30's run).
    assert "Stored from 2026-11-30 to 2026-11-30: 1 conversation, 2 messages" in after
    assert "<memory_map>" not in yesterday  # nothing stored yet: no map at all


async def test_two_command_line_runs_send_the_same_system_message(
    make_settings: SettingsFactory, fake_ollama: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    """`roost automations run` without the daemon is a new process each time: its map is the
    day's, not what the previous call just stored."""
    settings = make_settings(model={"host": fake_ollama.url})
    settings = dataclasses.replace(settings, automations=(automation("brief"),))
    assert await run_automation(settings, "brief") == 0
    assert await run_automation(settings, "brief") == 0
    first, second = system_messages(fake_ollama)
    assert first == second
    assert capsys.readouterr().out.count("echo: Anything new") == 2


async def test_chats_on_every_channel_and_a_run_share_the_system_message_and_tools(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    """One prefix for everyone: with one model slot, a chat between two runs must not evict
    the runs' cached prefix (nor a run the chat's). What differs heads the first user turn."""
    daemon = make_daemon(automation("brief", "0 * * * *"))
    automations = await daemon.start()
    assert daemon.engine is not None
    chats = ("telegram:1111111", "whatsapp:972544401243", "console:local")
    for count, chat_key in enumerate(chats, 1):
        daemon.clock.now += 1
        await daemon.engine.submit(Inbound(chat_key=chat_key, text="What is new?",
                                           received=daemon.clock.now))
        await wait_until(lambda n=count: len(fake_ollama.chat_requests) == n)
    daemon.clock.set(at(2026, 12, 1, 10, 0, 2))
    await automations.fire("brief")
    bodies = fake_ollama.chat_requests
    assert len(bodies) == 4
    assert len({json.dumps(b["messages"][0]) for b in bodies}) == 1
    assert len({json.dumps(b.get("tools"), sort_keys=True) for b in bodies}) == 1
    assert bodies[0].get("tools")
    firsts = [str(b["messages"][1]["content"]) for b in bodies]
    notes = [f.split("<channel>\n", 1)[1].split("\n</channel>", 1)[0] for f in firsts]
    assert "Telegram" in notes[0] and "WhatsApp" in notes[1]
    assert "terminal" in notes[2] and "scheduled automation" in notes[3]
    assert firsts[0].startswith("What is new?\n\n<channel>")
    assert firsts[3].startswith("Anything new on the things I follow?\n\n<channel>")
    assert all(f.endswith("]") for f in firsts)  # the sent stamp stays last


async def test_a_failure_alert_that_cannot_be_queued_for_one_target_is_logged_and_others_get_it(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("roost"), "propagate", True)  # caplog listens at root
    broken = "console:broken"
    daemon = make_daemon(automation("often", "every 15m", grace=0.3,
                                    deliver=(broken, "console:local")))
    automations = await daemon.start()
    assert daemon.store is not None
    store = daemon.store
    add = store.outbox_add

    def full_disk_for_broken(item: Mapping[str, Any]) -> None:
        if item["chat_key"] == broken:
            raise StoreError(f"cannot write {store.state_dir}/outbox: No space left on device")
        add(item)

    monkeypatch.setattr(store, "outbox_add", full_disk_for_broken)
    await fake_ollama.refuse_connections()
    for minute in (0, 15):
        daemon.clock.set(at(2026, 12, 1, 10, minute, 0))
        await automations.fire("often")
    await wait_until(lambda: len(daemon.channel.texts("notice")) >= 1)
    assert "'often' failed 2 times in a row" in daemon.channel.texts("notice")[0]
    (logged,) = [r for r in caplog.records if r.exc_info and broken in r.getMessage()]
    assert logged.levelno >= logging.ERROR and "No space left" in str(logged.exc_info[1])


async def test_a_failure_alert_skips_a_target_that_refuses_roost_and_reaches_the_journal(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("roost"), "propagate", True)  # caplog listens at root
    blocked = "telegram:1111111"
    daemon = make_daemon(automation("often", "every 15m", grace=0.3,
                                    deliver=(blocked, "console:local")))
    automations = await daemon.start()
    assert daemon.store is not None and daemon.engine is not None
    daemon.store.set_chat_flag(blocked, "undeliverable", daemon.clock())  # a 403 earlier
    await fake_ollama.refuse_connections()
    for minute in (0, 15):
        daemon.clock.set(at(2026, 12, 1, 10, minute, 0))
        await automations.fire("often")
    await wait_until(lambda: len(daemon.channel.texts("notice")) >= 1)
    assert "'often' failed 2 times in a row" in daemon.channel.texts("notice")[0]
    assert daemon.store.outbox_pending(blocked) == []  # not queued where it would be dropped
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "often" in error.getMessage() and blocked in error.getMessage()
