"""An automation's report reaches the phone through the real app, its channels and scheduler."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from daemon.app import AUTOMATIONS, build_app
from tests.automations.conftest import automation, wait_until
from tests.conftest import SettingsFactory
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
