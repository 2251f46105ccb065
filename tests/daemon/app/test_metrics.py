"""`GET /metrics` as an operator's Prometheus reads it: parsed with prometheus-client's own parser,
through the real app, channels and scheduler, against the fakes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from channels.telegram.channel import TelegramTuning
from channels.whatsapp.channel import WEBHOOK_PATH as WHATSAPP_PATH
from channels.whatsapp.channel import WhatsAppTuning
from daemon.app.serve import AUTOMATIONS, build_app
from daemon.core.config import AutomationSettings
from tests.conftest import SettingsFactory
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph, sign, text_message, webhook
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

USER = 1111111
WA_USER = "972544401243"
APP_SECRET = "1222e786b144d0e85b9f365372d93676"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


@dataclasses.dataclass
class Daemon:
    app: web.Application
    url: str

    async def scrape(self) -> Samples:
        async with aiohttp.ClientSession() as http, http.get(self.url + "/metrics") as reply:
            assert reply.status == 200
            text = await reply.text()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def until(self, check: Callable[[Samples], bool], timeout: float = 20.0  # noqa: ASYNC109
                    ) -> Samples:
        """Scrape until `check` holds (what an operator would see within a scrape or two)."""
        async with asyncio.timeout(timeout):
            while not check(samples := await self.scrape()):  # noqa: ASYNC110 (polled over HTTP)
                await asyncio.sleep(0.05)
        return samples


Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start(fake_ollama: FakeOllama, fake_telegram: FakeTelegram, graph: FakeGraph,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    runners: list[web.AppRunner] = []

    async def run(*automations: AutomationSettings, telegram: bool = False,
                  whatsapp: bool = False) -> Daemon:
        settings = make_settings(
            model={"host": fake_ollama.url, "retry_attempts": 1, "retry_backoff": 0.05},
            telegram={"enabled": telegram, "mode": "polling", "api_base": fake_telegram.api_base,
                      "file_base": fake_telegram.file_base, "allow": (USER,),
                      "token": fake_telegram.token},
            whatsapp={"enabled": whatsapp, "phone_number_id": PHONE_NUMBER_ID,
                      "api_base": graph.url, "api_version": API_VERSION, "allow": (WA_USER,),
                      "token": graph.token, "app_secret": APP_SECRET, "verify_token": "v"})
        settings = dataclasses.replace(settings, automations=automations)
        app = build_app(settings, tunings={
            "telegram": TelegramTuning(poll_timeout=1, poll_backoff=0.05),
            "whatsapp": WhatsAppTuning(typing_refresh=0.1, media_backoff=0.01)})
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return Daemon(app, f"http://127.0.0.1:{runner.addresses[0][1]}")

    yield run
    fake_ollama.hang = False
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


def telegram_message(update_id: int, text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": text,
        "chat": {"id": USER, "type": "private", "first_name": "Test"},
        "from": {"id": USER, "is_bot": False, "first_name": "Test"}}}


async def test_automation_runs_are_counted_by_automation_and_outcome(
    start: Start, fake_ollama: FakeOllama
) -> None:
    # Once a year: nothing runs unless asked, so each change below is the run the test made.
    brief = AutomationSettings(name="brief", schedule="0 0 1 1 *", prompt="Anything new?",
                               deliver=("log",))
    slow = dataclasses.replace(brief, name="slow", timeout=0.3)
    daemon = await start(brief, slow)
    ok, failed = (series("roost_automation_runs_total", automation="brief", outcome="ok"),
                  series("roost_automation_runs_total", automation="slow", outcome="failed"))
    before = await daemon.scrape()
    assert before[ok] == 0 and before[failed] == 0  # known before the first run

    fake_ollama.script("Nothing much.")
    await daemon.app[AUTOMATIONS].run_now("brief")
    after = await daemon.scrape()
    assert after[ok] == 1 and after[failed] == 0

    fake_ollama.hang = True  # the model never answers: the run is stopped at its timeout
    await daemon.app[AUTOMATIONS].run_now("slow")
    fake_ollama.hang = False
    last = await daemon.scrape()
    assert last[failed] == 1 and last[ok] == 1
    assert last[series("roost_automation_runs_total", automation="slow", outcome="ok")] == 0


async def test_a_run_whose_report_a_target_refused_is_counted_undelivered(
    start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    brief = AutomationSettings(name="brief", schedule="0 0 1 1 *", prompt="Anything new?",
                               deliver=(f"telegram:{USER}",))
    daemon = await start(brief, telegram=True)
    undelivered = series("roost_automation_runs_total", automation="brief",
                         outcome="undelivered")
    assert (await daemon.scrape())[undelivered] == 0  # known before the first run
    fake_telegram.fail_next("sendMessage", status=403,
                            description="Forbidden: bot was blocked by the user")
    fake_ollama.script("A report nobody gets.")
    await daemon.app[AUTOMATIONS].run_now("brief")
    await daemon.until(lambda s: s[undelivered] == 1)
    (run,) = daemon.app[AUTOMATIONS].state.runs("brief")
    assert run["status"] == "undelivered"


async def test_undeliverable_chats_gauge_follows_a_block_and_an_unblock(
    start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    daemon = await start(telegram=True)
    undeliverable = series("roost_undeliverable_chats")
    assert (await daemon.scrape())[undeliverable] == 0

    fake_telegram.fail_next("sendMessage", status=403,
                            description="Forbidden: bot was blocked by the user")
    fake_ollama.script("a reply nobody gets", "welcome back")
    fake_telegram.queue_update(telegram_message(1, "then I block you"))
    blocked = await daemon.until(lambda s: s[undeliverable] == 1)
    assert blocked[series("roost_outbound_messages_total", channel="telegram",
                          outcome="undeliverable")] == 1

    fake_telegram.queue_update(telegram_message(2, "I unblocked you"))  # writing again clears it
    back = await daemon.until(lambda s: s[undeliverable] == 0)
    await daemon.until(lambda s: s.get(series("roost_outbound_messages_total", channel="telegram",
                                              outcome="sent"), 0) == 1)
    assert back[series("roost_inbound_messages_total", channel="telegram",
                       outcome="accepted")] == 2
    assert [m["text"] for m in fake_telegram.sent_messages] == ["welcome back"]


async def test_whatsapp_traffic_is_counted_under_its_channel(
    start: Start, graph: FakeGraph, fake_ollama: FakeOllama
) -> None:
    daemon = await start(whatsapp=True)
    fake_ollama.script("hello from roost")
    body = webhook(text_message("wamid.IN1", WA_USER, "hi there"))
    async with aiohttp.ClientSession() as http, http.post(
            daemon.url + WHATSAPP_PATH, data=body,
            headers={"Content-Type": "application/json",
                     "X-Hub-Signature-256": sign(APP_SECRET, body)}) as reply:
        assert reply.status == 200
    sent = series("roost_outbound_messages_total", channel="whatsapp", outcome="sent")
    samples = await daemon.until(lambda s: s.get(sent, 0) == 1)
    assert samples[series("roost_inbound_messages_total", channel="whatsapp",
                          outcome="accepted")] == 1
    assert not any(dict(labels).get("channel") == "telegram" for _, labels in samples)
    assert graph.texts() == ["hello from roost"]
