""""The user wrote again" is one event on every platform: the engine's `release`. It lets the
replies held for it go out and unmarks a chat marked undeliverable (a blocked bot), whichever
platform the chat is on."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web

from daemon.app.serve import ENGINE, STORE, build_app
from daemon.core.messages import Outbound
from daemon.store import Store
from tests.channels.telegram import test_telegram as tg
from tests.channels.whatsapp import test_whatsapp as wa
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, text_message, webhook
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram


@dataclass
class Platform:
    """One platform's roost against its fake: who the user is, how they write, what they see."""

    app: web.Application
    runner: web.AppRunner
    chat_key: str
    write: Callable[[int, str], Awaitable[int]]  # the webhook's status
    seen: Callable[[], list[str]]

    @property
    def store(self) -> Store:
        return self.app[STORE]


async def _telegram(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                    make_settings: SettingsFactory) -> Platform:
    daemon = await tg.start_roost(make_settings, fake_telegram, fake_ollama)

    async def write(n: int, text: str) -> int:
        return await daemon.post(tg.message(n, text))

    return Platform(daemon.app, daemon.runner, tg.CHAT_KEY, write, lambda: tg.texts(fake_telegram))


async def _whatsapp(graph: FakeGraph, fake_ollama: FakeOllama,
                    make_settings: SettingsFactory) -> Platform:
    whatsapp = {"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "api_base": graph.url,
                "api_version": API_VERSION, "allow": (wa.USER,), "token": graph.token,
                "app_secret": wa.APP_SECRET, "verify_token": wa.VERIFY}
    settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.05},
                             whatsapp=whatsapp)
    app = build_app(settings, tunings={"whatsapp": wa.FAST})
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    daemon = wa.Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")

    async def write(n: int, text: str) -> int:
        return await daemon.post(webhook(text_message(f"wamid.again{n}", wa.USER, text)))

    return Platform(app, runner, wa.KEY, write, graph.texts)


@pytest.fixture(params=["telegram", "whatsapp"])
async def platform(request: pytest.FixtureRequest, fake_telegram: FakeTelegram,
                   fake_ollama: FakeOllama, make_settings: SettingsFactory
                   ) -> AsyncIterator[Platform]:
    async with FakeGraph() as graph:
        started = (await _telegram(fake_telegram, fake_ollama, make_settings)
                   if request.param == "telegram"
                   else await _whatsapp(graph, fake_ollama, make_settings))
        yield started
        await started.runner.cleanup()


async def test_a_held_reply_goes_out_when_the_user_writes_again(platform: Platform) -> None:
    engine = platform.app[ENGINE]
    held = Outbound(chat_key=platform.chat_key, text="the report you missed",
                    created=time.time(), held="waits until the user writes again")
    assert await engine.deliver(held)
    await engine.wait_idle(platform.chat_key)
    assert platform.seen() == []  # held: nothing goes out on its own
    assert await platform.write(1, "I'm back") == 200
    await wait_until(lambda: len(platform.seen()) == 2)
    await engine.wait_idle(platform.chat_key)
    assert platform.seen() == ["the report you missed", "echo: I'm back"]
    assert platform.store.outbox_pending() == []


async def test_a_chat_marked_undeliverable_is_answered_when_the_user_writes_again(
        platform: Platform) -> None:
    # The platform refused the chat for good earlier (the user had blocked the bot).
    platform.store.set_chat_flag(platform.chat_key, "undeliverable", time.time() - 60)
    assert await platform.write(1, "unblocked you") == 200
    await wait_until(lambda: len(platform.seen()) == 1)
    assert platform.seen() == ["echo: unblocked you"]
    assert "undeliverable" not in platform.store.chat_flags(platform.chat_key)
