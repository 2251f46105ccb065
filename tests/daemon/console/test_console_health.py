"""The Health page: what /healthz knows, with the fix for what is not ok; the owner's only."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from daemon.app.serve import Tuning, build_app
from daemon.models.card import store_cards
from daemon.store.console_keys import OWNER
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.daemon.console.conftest import OMAR
from tests.daemon.console.test_console_automations import browser_for
from tests.daemon.models.test_card_surfaces import card
from tests.fakes.ollama import FakeOllama


async def test_health_shows_an_outage_with_its_fix_and_the_recovery(
        fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")},
                                        tuning=Tuning(health_interval=0.05)))
    try:
        async with await browser_for(url, state_dir, OWNER) as http:
            async def page() -> str:
                async with http.get(f"{url}/console/health") as answer:
                    assert answer.status == 200
                    return await answer.text()

            await fake_ollama.refuse_connections()
            for _ in range(400):  # the background probe notices within a few intervals
                text = await page()
                if "Health: degraded" in text:
                    break
                await asyncio.sleep(0.02)
            assert "Health: degraded" in text and "unreachable" in text
            assert "start Ollama (systemctl start ollama)" in text
            await fake_ollama.accept_connections()
            for _ in range(400):
                text = await page()
                if "Health: ok" in text:
                    break
                await asyncio.sleep(0.02)
            assert "Health: ok" in text and "reachable" in text and "pulled" in text
            assert "GiB free" in text and "telegram" in text
        async with await browser_for(url, state_dir, OMAR) as person, person.get(
                f"{url}/console/health") as answer:
            assert answer.status == 404
    finally:
        await runner.cleanup()


async def test_health_lists_the_running_ollamas_model_cards(
        fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    stored = card(settings.model.name, tools="text")  # on the fake's Ollama version
    store_cards(settings.daemon.state_dir, [stored, replace(stored, name="old:1b",
                                                            ollama_version="0.11.0")])
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")},
                                        tuning=Tuning(health_interval=0.05)))
    try:
        async with await browser_for(url, state_dir, OWNER) as http:
            async def page() -> str:
                async with http.get(f"{url}/console/health") as answer:
                    return await answer.text()

            for _ in range(400):  # the cards are read once Ollama said its version
                text = await page()
                if "writes its tool calls" in text:
                    break
                await asyncio.sleep(0.02)
            assert "writes its tool calls as JSON text" in text
            assert "old:1b" not in text  # another Ollama's card says nothing of this one
    finally:
        await runner.cleanup()


async def test_health_names_the_ollama_server_its_version_and_what_it_serves(
        fake_ollama: FakeOllama, make_settings: SettingsFactory, state_dir: Path) -> None:
    host = fake_ollama.url.replace("http://", "http://roost:hunter2@")
    settings = make_settings(model={"host": host})
    runner, url = await start(build_app(settings, {"telegram": RecordingChannel("telegram")},
                                        tuning=Tuning(health_interval=0.05)))
    try:
        async with await browser_for(url, state_dir, OWNER) as http:
            async def hosts() -> str:
                async with http.get(f"{url}/console/health") as answer:
                    text = await answer.text()
                assert "hunter2" not in text
                return text[text.index('id="hosts"'):text.index('id="cards"')]

            version = f'<td data-label="Version">{fake_ollama.version}</td>'
            for _ in range(400):  # the background probe asks the version once it reaches it
                if version in await hosts():
                    break
                await asyncio.sleep(0.02)
            shown = await hosts()
        assert version in shown and fake_ollama.url.removeprefix("http://") in shown
        assert '<td data-label="State">reachable</td>' in shown
        assert "every conversation" in shown
    finally:
        await runner.cleanup()
