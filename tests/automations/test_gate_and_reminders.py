"""The model gate serves chats first; reminders survive restarts and are delivered once."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from daemon.core.config import ModelSettings
from daemon.core.messages import Inbound
from daemon.llm.client import ChatResult, ModelClient
from tests.automations.conftest import DaemonFactory, at, automation, wait_until
from tests.fakes.ollama import FakeOllama, Reply


def said(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


async def test_a_chat_turn_arriving_during_an_automation_is_served_first(
    fake_ollama: FakeOllama,
) -> None:
    llm = ModelClient(ModelSettings(host=fake_ollama.url, concurrency=1))

    async def chat(text: str, scheduled: bool = False) -> ChatResult:
        messages = [{"role": "user", "content": text}]
        if scheduled:
            with llm.scheduled():
                return await llm.chat(messages)
        async with llm.turn():
            return await llm.chat(messages)

    try:
        fake_ollama.hang = True
        run_call_1 = asyncio.create_task(chat("automation call 1", scheduled=True))
        await fake_ollama.wait_for_chats(1, timeout=10)
        run_call_2 = asyncio.create_task(chat("automation call 2", scheduled=True))
        user = asyncio.create_task(chat("user message"))
        await wait_until(lambda: llm.waiting == 1 and llm.scheduled_waiting == 1)
        fake_ollama.hang = False
        await asyncio.gather(run_call_1, run_call_2, user)
        # The user waited behind the one call in flight, not behind the automation's next.
        assert [said(b) for b in fake_ollama.chat_requests] == [
            "automation call 1", "user message", "automation call 2"]
    finally:
        await llm.close()


async def test_an_automation_call_waits_while_a_chat_turn_holds_the_model(
    fake_ollama: FakeOllama,
) -> None:
    llm = ModelClient(ModelSettings(host=fake_ollama.url, concurrency=1))
    try:
        async with llm.turn():  # a turn between its model calls (running a tool)
            with llm.scheduled():
                waiting = asyncio.create_task(
                    llm.chat([{"role": "user", "content": "automation"}]))
            await wait_until(lambda: llm.scheduled_waiting == 1)
            await llm.chat([{"role": "user", "content": "turn"}])
            assert not waiting.done()
        await waiting
        assert [said(b) for b in fake_ollama.chat_requests] == ["turn", "automation"]
    finally:
        await llm.close()


async def test_a_reminder_survives_a_restart_and_is_delivered_once(
    make_daemon: DaemonFactory,
) -> None:
    daemon = make_daemon(start=at(2026, 12, 1, 9, 0))
    automations = await daemon.start()
    doc = await automations.reminders.add("console:local", at(2026, 12, 1, 15, 0).timestamp(),
                                          "call the plumber", by="model")
    # On its timer as soon as the scheduler takes it from the book.
    await wait_until(lambda: automations.scheduler.get_job(f"reminder:{doc['id']}") is not None)
    await daemon.stop()

    # roost is down at 15:00 and comes back at 15:20: the reminder goes out, marked late.
    again = make_daemon(start=at(2026, 12, 1, 15, 20))
    automations = await again.start()
    await wait_until(lambda: len(again.channel.texts("notice")) >= 1)
    # Fired again (a timer, a scan): no second one.
    await automations.reminders.fire(doc["id"], again.engine)  # type: ignore[arg-type]
    await automations.scan()
    await again.engine.wait_idle("console:local")  # type: ignore[union-attr]
    notices = again.channel.texts("notice")
    assert len(notices) == 1
    assert "call the plumber" in notices[0] and "late" in notices[0]
    await again.stop()

    third = make_daemon(start=at(2026, 12, 1, 16, 0))
    automations = await third.start()
    await automations.scan()
    await third.engine.wait_idle("console:local")  # type: ignore[union-attr]
    assert third.channel.texts("notice") == []
    assert automations.state.finished_reminder(doc["id"])["status"] == "late"  # type: ignore[index]


async def test_a_reminder_on_time_is_delivered_once_and_one_a_day_late_is_reported(
    make_daemon: DaemonFactory,
) -> None:
    daemon = make_daemon(start=at(2026, 12, 1, 9, 0))
    automations = await daemon.start()
    # The test fires by hand on a fake clock; APScheduler's timers run on the real one, where
    # these times are past, and would fire at whatever the fake clock says at that moment.
    automations.scheduler.pause()
    soon = await automations.reminders.add(
        "console:local", (at(2026, 12, 1, 9, 30)).timestamp(), "stretch", by="command")
    long_ago = await automations.reminders.add(
        "console:local", (at(2026, 12, 1, 9, 1)).timestamp(), "old news", by="command")
    daemon.clock.set(at(2026, 12, 1, 9, 30) + timedelta(seconds=1))
    await asyncio.gather(automations.reminders.fire(soon["id"], daemon.engine),
                         automations.reminders.fire(soon["id"], daemon.engine))
    await automations.reminders.fire(soon["id"], daemon.engine)
    daemon.clock.set(at(2026, 12, 2, 12, 0))
    await automations.scan()
    await wait_until(lambda: len(daemon.channel.texts("notice")) >= 2)
    await daemon.engine.wait_idle("console:local")  # type: ignore[union-attr]
    notices = daemon.channel.texts("notice")
    assert notices[0] == "⏰ Reminder: stretch"
    assert len(notices) == 2 and "old news" in notices[1] and "more than a day" in notices[1]
    assert automations.state.finished_reminder(long_ago["id"])["status"] == "missed"  # type: ignore[index]


async def test_the_model_sets_lists_and_cancels_reminders_through_its_tools(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    # A day long past on the wall clock: "15:30" is in roost's future and the wall clock's past,
    # so a timer armed by the wall clock would fire it at once, whatever the time of day.
    daemon = make_daemon(start=at(2020, 6, 1, 9, 0))
    automations = await daemon.start()
    engine = daemon.engine
    assert engine is not None

    def call(tool: str, **arguments: str) -> Reply:
        return Reply(tool_calls=[{"function": {"name": tool, "arguments": arguments}}])

    fake_ollama.script(call("tool_activate", name="reminders"),
                       call("schedule_reminder", when="15:30", text="call the plumber"),
                       "I will remind you at 15:30.")
    await engine.submit(Inbound(chat_key="console:local", text="remind me at 15:30 to call "
                                "the plumber", received=daemon.clock()))
    await wait_until(lambda: len(daemon.replies()) >= 1)
    (pending,) = await automations.reminders.pending("console:local")
    assert pending["text"] == "call the plumber"
    assert pending["due"] == at(2020, 6, 1, 15, 30).timestamp()
    assert automations.scheduler.get_job(f"reminder:{pending['id']}") is not None
    assert "- reminders: one-shot reminders" in fake_ollama.chat_requests[0]["messages"][0][
        "content"]

    fake_ollama.script(call("list_reminders"), call("cancel_reminder", id=pending["id"]),
                       "Cancelled.")
    await engine.submit(Inbound(chat_key="console:local", text="never mind",
                                received=daemon.clock()))
    await wait_until(lambda: len(daemon.replies()) >= 2)
    tool_results = [m["content"] for m in fake_ollama.chat_requests[-1]["messages"]
                    if m["role"] == "tool"]
    assert any("call the plumber" in r for r in tool_results)
    assert any(f"Reminder {pending['id']} cancelled" in r for r in tool_results)
    assert await automations.reminders.pending() == []


async def test_a_chat_message_queued_after_an_automation_call_is_still_served_first(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama
) -> None:
    daemon = make_daemon(automation("brief", "0 9 * * *"))
    automations = await daemon.start()
    engine, llm = daemon.engine, daemon.llm
    assert engine is not None and llm is not None
    fake_ollama.hang = True  # another chat's turn holds the model
    await engine.submit(Inbound(chat_key="console:other", text="first chat",
                                received=daemon.clock()))
    await fake_ollama.wait_for_chats(1, timeout=10)
    daemon.clock.set(at(2026, 12, 1, 9, 0, 1))
    run = asyncio.create_task(automations.fire("brief"))
    await wait_until(lambda: llm.scheduled_waiting == 1)  # the run queues first...
    await engine.submit(Inbound(chat_key="console:local", text="hi there",
                                received=daemon.clock()))
    await wait_until(lambda: llm.waiting == 1)  # ...then a user's message
    fake_ollama.hang = False
    await run
    await wait_until(lambda: len(daemon.replies()) >= 3)
    firsts = [b["messages"][-1]["content"].split("\n")[0] for b in fake_ollama.chat_requests]
    assert firsts == ["first chat", "hi there", "Anything new on the things I follow?"]
    assert automations.state.runs("brief")[-1]["status"] == "ok"


async def test_a_damaged_reminder_file_stops_neither_the_start_nor_the_other_reminders(
    make_daemon: DaemonFactory,
) -> None:
    daemon = make_daemon(start=at(2026, 12, 1, 9, 0))
    automations = await daemon.start()
    good = await automations.reminders.add(
        "console:local", at(2026, 12, 1, 10, 0).timestamp(), "water the plants", by="command")
    await daemon.stop()
    folder = automations.state.reminder_dir
    (folder / "broken.json").write_text("{not json")
    (folder / "edited.json").write_text('{"id": "edited", "text": "no due time"}')

    again = make_daemon(start=at(2026, 12, 1, 10, 5))  # came due while roost was down
    automations = await again.start()
    await wait_until(lambda: len(again.channel.texts("notice")) >= 1)
    assert "water the plants" in again.channel.texts("notice")[0]
    assert automations.state.finished_reminder(good["id"]) is not None
    assert sorted(p.name.split(".json")[0] for p in folder.iterdir()) == ["broken", "edited"]
    assert all(".corrupt-" in p.name for p in folder.iterdir())  # kept, renamed, not retried
    await again.stop()
