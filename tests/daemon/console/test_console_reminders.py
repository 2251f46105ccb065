"""Pending reminders show at the end of the chat's conversation, in the daemon's zone, and only
in that chat's conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from daemon.app.serve import AUTOMATIONS, build_app
from daemon.core.config import Settings
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import DANA, OMAR, Seeded, seed
from tests.daemon.console.test_console_requests import page_of, words
from tests.fakes.ollama import FakeOllama


@pytest.fixture
async def daemon(fake_ollama: FakeOllama, make_settings: SettingsFactory,
                 state_dir: Path) -> AsyncIterator[tuple[str, Settings, Seeded, web.Application]]:
    seeded = seed(state_dir)
    settings = make_settings(model={"host": fake_ollama.url},
                             daemon={"timezone": "Europe/Berlin"})
    app = build_app(settings, {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        yield url, settings, seeded, app
    finally:
        await runner.cleanup()


async def test_a_chats_pending_reminders_close_its_conversation_and_no_other(
        daemon: tuple[str, Settings, Seeded, web.Application],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, settings, seeded, app = daemon
    reminders = app[AUTOMATIONS].reminders
    # 2030-01-15 08:00 UTC is 09:00 in Berlin.
    await reminders.add(DANA, 1_894_694_400.0, "call the plumber about the <b>leak</b>", DANA)
    await reminders.add(OMAR, 1_894_694_400.0, "Omar's secret errand", OMAR)
    danas = await page_of(url, settings, capsys, seeded.dana)
    upcoming = words(danas[danas.index('id="reminders"'):danas.index("</aside>")])
    assert "2030-01-15 09:00: call the plumber about the <b>leak</b>" in upcoming
    assert "<b>leak</b>" not in danas  # the words as text
    assert "secret errand" not in danas
    omars = await page_of(url, settings, capsys, seeded.omar)
    assert "Omar's secret errand" in words(omars) and "plumber" not in omars
