"""An automation's report reaches the phone through the real app, Telegram channel and scheduler."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from daemon.app import AUTOMATIONS, build_app
from tests.automations.conftest import automation, wait_until
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

USER = 1111111


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
