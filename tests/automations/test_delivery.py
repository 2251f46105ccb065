"""An automation's report reaches the phone through the real app, its channels and scheduler."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from aiohttp import web
from telegram import Bot

from automations.commands import list_automations
from channels.telegram.delivery import TelegramChannel
from daemon.app.assembly import assemble
from daemon.app.serve import AUTOMATIONS, build_app
from daemon.core.config import Settings
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.automations.conftest import Clock, at, automation, wait_until
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

USER = 1111111
WA_USER = "972544401243"


async def test_a_scheduled_report_is_formatted_for_telegram_and_sent_once(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    settings = make_settings(
        model={"host": fake_ollama.url},
        telegram={"enabled": True, "mode": "polling", "api_base": fake_telegram.api_base,
                  "file_base": fake_telegram.file_base, "allow": (USER,),
                  "token": fake_telegram.token})
    # `every 1m` always has a slot less than the grace ago: the scheduler runs it at start.
    settings = dataclasses.replace(settings, automations=(
        automation("brief", "every 1m", deliver=(f"telegram:{USER}", "log")),))
    fake_ollama.script("**Morning brief**\n\n- one thing\n- another")
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        automations = app[AUTOMATIONS]
        assert automations.scheduler.running
        await wait_until(lambda: len(fake_telegram.sent_messages) >= 1)
        await wait_until(lambda: automations.state.runs("brief")[-1]["status"] != "running")
        sent = fake_telegram.sent_messages
        assert len(sent) == 1 and sent[0]["parse_mode"] == "HTML"
        assert "<b>Morning brief</b>" in str(sent[0]["text"])
        (run,) = automations.state.runs("brief")
        assert run["status"] == "ok" and run["delivered"][-1] == "log"
        assert len(fake_ollama.chat_requests) == 1
    finally:
        await runner.cleanup()
    await wait_until(lambda: not automations.scheduler.running)  # stopped with the app


async def test_a_run_records_the_message_ids_telegram_and_whatsapp_answered(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    async with FakeGraph() as graph:
        settings = make_settings(
            model={"host": fake_ollama.url},
            telegram={"enabled": True, "mode": "polling", "api_base": fake_telegram.api_base,
                      "file_base": fake_telegram.file_base, "allow": (USER,),
                      "token": fake_telegram.token},
            whatsapp={"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
                      "api_version": API_VERSION, "allow": (WA_USER,), "token": graph.token,
                      "app_secret": "s", "verify_token": "v"})
        targets = (f"telegram:{USER}", f"whatsapp:{WA_USER}", "log")
        settings = dataclasses.replace(settings, automations=(
            automation("brief", "every 1m", deliver=targets),))
        # Longer than one message on either platform: two parts each.
        fake_ollama.script("A long report. " * 400)
        app = build_app(settings)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        try:
            state = app[AUTOMATIONS].state
            await wait_until(lambda: len(state.runs("brief")) == 1 and len(
                state.runs("brief")[0]["message_ids"]) == 2)
            (run,) = state.runs("brief")
        finally:
            await runner.cleanup()
    telegram_ids = [str(message_id) for chat, message_id in fake_telegram.messages
                    if chat == USER]
    wamids = [call.wamid for call in graph.sent]
    assert len(telegram_ids) == 2 and len(wamids) == 2
    assert run["status"] == "ok"
    assert run["message_ids"] == {f"telegram:{USER}": telegram_ids,
                                  f"whatsapp:{WA_USER}": wamids}
    assert run["delivered"][-1] == "log"  # the log target has no message ids


BLOCKED = "Forbidden: bot was blocked by the user"


async def runs_to_a_blocked_bot(settings: Settings, fake_telegram: FakeTelegram,
                                console: RecordingChannel) -> list[dict[str, Any]]:
    """Three runs of `brief` (every 15 minutes) through the real Telegram channel, whose first
    send meets the 403 of a user who blocked the bot; the run records once each refusal is in."""
    clock = Clock(at(2026, 12, 1, 9, 59))
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    async with Bot(fake_telegram.token, base_url=fake_telegram.api_base,
                   base_file_url=fake_telegram.file_base) as bot:
        core = assemble(settings, store, llm,
                        {"telegram": TelegramChannel(bot, store), "console": console}, clock=clock)
        engine, automations = core.engine, core.automations
        await engine.start()
        await automations.start()
        try:
            fake_telegram.fail_next("sendMessage", status=403, description=BLOCKED)
            for minute in (0, 15, 30):
                clock.set(at(2026, 12, 1, 10, minute, 2))
                await automations.fire("brief")
                await wait_until(lambda m=minute: (automations.state.runs("brief")[-1]["id"]
                                                   == f"brief@2026-12-01T10:{m:02d}") and bool(
                    automations.state.runs("brief")[-1].get("refused")))
                await engine.wait_idle("console:local")
                await engine.wait_idle(f"telegram:{USER}")
            return automations.state.runs("brief")
        finally:
            await automations.stop()
            await engine.stop(1.0)
            await llm.close()
            store.close()


def with_brief(settings: Settings, *deliver: str) -> Settings:
    return dataclasses.replace(settings, automations=(automation(
        "brief", "every 15m", deliver=deliver),))


async def test_a_refused_report_is_on_the_record_in_list_and_alerted_elsewhere_when_repeated(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The user blocked the bot: its 403 and the reports dropped after it (the chat is then
    marked undeliverable) are refusals, not successes; the second in a row is alerted through
    the target that still takes reports, and in the journal."""
    monkeypatch.setattr(logging.getLogger("roost"), "propagate", True)  # caplog listens at root
    settings = with_brief(make_settings(daemon={"timezone": "Europe/Berlin"},
                                        model={"host": fake_ollama.url}),
                          f"telegram:{USER}", "console:local")
    console = RecordingChannel()
    runs = await runs_to_a_blocked_bot(settings, fake_telegram, console)
    assert fake_telegram.sent_messages == []  # the 403; nothing tried after it
    assert [r["status"] for r in runs] == ["undelivered"] * 3
    assert all("blocked" in r["refused"][f"telegram:{USER}"] for r in runs)
    assert console.texts("reply") == ["echo: Anything new on the things I follow?"] * 3
    # One alert, after the second refusal in a row, through the target that took the reports.
    (alert,) = console.texts("notice")
    assert f"telegram:{USER}" in alert and "blocked" in alert
    assert any(r.levelno >= logging.ERROR and "refused" in r.getMessage()
               for r in caplog.records)
    assert list_automations(settings) == 0
    listed = capsys.readouterr().out
    assert "last: undelivered" in listed and f"telegram:{USER}" in listed


async def test_refusals_by_the_only_target_are_alerted_in_the_journal_once_an_hour(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("roost"), "propagate", True)  # caplog listens at root
    settings = with_brief(make_settings(daemon={"timezone": "Europe/Berlin"},
                                        model={"host": fake_ollama.url}), f"telegram:{USER}")
    console = RecordingChannel()
    runs = await runs_to_a_blocked_bot(settings, fake_telegram, console)
    assert [r["status"] for r in runs] == ["undelivered"] * 3
    assert fake_telegram.sent_messages == [] and console.sent == []
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]  # 10:15, not 10:30
    assert "brief" in error.getMessage() and "2 runs in a row" in error.getMessage()
    assert "nobody else" in error.getMessage()
