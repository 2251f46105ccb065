"""A report to a Telegram user who never started the bot: Telegram answers 403 (a bot may not
write first); roost gives that delivery up once, says why, and serves the other targets."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from aiohttp import web

from daemon.app.serve import AUTOMATIONS, STORE, build_app
from tests.automations.conftest import automation, wait_until
from tests.conftest import FIXTURE_USER, SettingsFactory
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

USER = FIXTURE_USER  # has started the bot


async def test_a_report_to_someone_who_never_started_the_bot_is_given_up_once(
    fake_telegram: FakeTelegram, fake_ollama: FakeOllama, make_settings: SettingsFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stranger = 3333333  # never wrote to the bot: Telegram answers 403 to every send
    settings = make_settings(
        model={"host": fake_ollama.url, "retry_backoff": 0.01},
        telegram={"enabled": True, "mode": "polling", "api_base": fake_telegram.api_base,
                  "file_base": fake_telegram.file_base, "allow": (USER,),
                  "token": fake_telegram.token})
    settings = dataclasses.replace(settings, automations=(automation(
        "brief", "every 1m", deliver=(f"telegram:{stranger}", f"telegram:{USER}", "log")),))
    fake_ollama.script("First report.", "Second report.")
    caplog.set_level(logging.INFO, logger="roost")
    app = build_app(settings)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        automations = app[AUTOMATIONS]
        store = app[STORE]
        # "ok" would hide the refusal: the run is on the record as not delivered everywhere.
        await wait_until(lambda: [r["status"] for r in automations.state.runs("brief")]
                         == ["undelivered"])
        (run,) = automations.state.runs("brief")
        assert list(run["refused"]) == [f"telegram:{stranger}"]
        await wait_until(lambda: store.outbox_pending() == [] and len(
            fake_telegram.sent_messages) == 1)
        assert [m["text"] for m in fake_telegram.sent_messages] == ["First report."]
        assert fake_telegram.sent_messages[0]["chat_id"] == USER  # the other target got it
        refused = [c for c in fake_telegram.calls_to("sendMessage")
                   if c.params["chat_id"] == stranger]
        assert len(refused) == 1  # given up at once: no retry
        assert "undeliverable" in store.chat_flags(f"telegram:{stranger}")
        (line,) = [r.getMessage() for r in caplog.records if f"telegram:{stranger}" in
                   r.getMessage() and "giving up" in r.getMessage()]
        assert "has not started the bot" in line and "press Start" in line
        # The next run reaches the user again and costs the stranger's chat no call at all.
        await automations.run_now("brief")
        await wait_until(lambda: len(fake_telegram.sent_messages) == 2
                         and store.outbox_pending() == [])
        assert fake_telegram.sent_messages[1]["text"] == "Second report."
        assert len([c for c in fake_telegram.calls_to("sendMessage")
                    if c.params["chat_id"] == stranger]) == 1
    finally:
        await runner.cleanup()
