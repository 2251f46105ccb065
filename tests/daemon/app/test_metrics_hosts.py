"""`GET /metrics` with several Ollama hosts (`[model] hosts`): each host's series, named by its
URL without credentials: the calls it answered, whether it is up (its health check runs from
the daemon's start, before any chat), its requests now; and the errors and time of its calls
as the model client reports them. One host alone is named nowhere, as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.app.serve import ENGINE, build_app
from daemon.core.config.sections import HostSettings
from daemon.core.messages import Inbound
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.daemon.app.test_app import start
from tests.fakes.ollama import FakeOllama, Reply

DANA, OMAR = "telegram:1111111", "telegram:2222222"
Samples = dict[tuple[str, str], float]


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama() as b, FakeOllama() as c:
        yield a, b, c


async def scrape(url: str) -> Samples:
    """Each per-host sample by (name, host)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as reply:
        assert reply.status == 200
        text = await reply.text()
    return {(s.name, s.labels["host"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if "host" in s.labels}


async def scraped_until(url: str, check: dict[tuple[str, str], float]) -> Samples:
    """Scrape until the samples in `check` have their values (what an operator would see
    within a scrape or two)."""
    def holds(samples: Samples) -> bool:
        return all(samples.get(key) == value for key, value in check.items())

    async with asyncio.timeout(10):
        while not holds(samples := await scrape(url)):  # noqa: ASYNC110 (polled over HTTP)
            await asyncio.sleep(0.02)
    return samples


async def test_each_host_has_its_series_from_the_start(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
) -> None:
    a, b, c = hosts
    await c.refuse_connections()  # off before roost starts
    app = build_app(make_settings(model={"hosts": tuple(HostSettings(h.url) for h in hosts)}),
                    {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        # No chat yet: the hosts' health check, begun with the daemon, finds c down.
        samples = await scraped_until(url, {("roost_model_host_up", c.url): 0.0})
        assert samples[("roost_model_host_up", a.url)] == 1.0
        assert samples[("roost_model_host_up", b.url)] == 1.0
        assert all(samples[("roost_model_host_requests_total", h.url)] == 0.0 for h in hosts)
        assert all(samples[("roost_model_host_errors_total", h.url)] == 0.0 for h in hosts)
        assert b.requests and b.requests[0].path == "/api/tags"  # asked by the check alone

        engine = app[ENGINE]
        a.script(Reply(content="a slow answer", pause_after_chunks=1))
        assert await engine.submit(Inbound(chat_key=DANA, text="hello", received=time.time()))
        await wait_until(lambda: a.paused == 1)
        busy = await scrape(url)
        assert busy[("roost_model_host_requests_in_flight", a.url)] == 1.0
        assert busy[("roost_model_host_requests_in_flight", b.url)] == 0.0
        assert await engine.submit(Inbound(chat_key=OMAR, text="hi", received=time.time()))
        await asyncio.wait_for(engine.wait_idle(OMAR), 10)
        a.resume_paused()
        await asyncio.wait_for(engine.wait_idle(DANA), 10)
        assert await engine.submit(Inbound(chat_key=DANA, text="again", received=time.time()))
        await asyncio.wait_for(engine.wait_idle(DANA), 10)
        after = await scrape(url)
        assert after[("roost_model_host_requests_total", a.url)] == 2.0  # Dana's two turns
        assert after[("roost_model_host_requests_total", b.url)] == 1.0  # Omar's
        assert after[("roost_model_host_requests_total", c.url)] == 0.0
        assert after[("roost_model_host_requests_in_flight", a.url)] == 0.0
    finally:
        await runner.cleanup()


async def test_a_host_with_credentials_is_named_without_them(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
) -> None:
    a, b, _ = hosts
    secret = a.url.replace("http://", "http://roost:hunter2@")
    app = build_app(make_settings(model={"hosts": (HostSettings(secret), HostSettings(b.url))}),
                    {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        assert await app[ENGINE].submit(Inbound(chat_key=DANA, text="hi", received=time.time()))
        await asyncio.wait_for(app[ENGINE].wait_idle(DANA), 10)
        named = a.url.replace("http://", "http://***@")
        samples = await scraped_until(url, {("roost_model_host_requests_total", named): 1.0})
        assert samples[("roost_model_host_up", named)] == 1.0
        assert not any("hunter2" in host for _, host in samples)
    finally:
        await runner.cleanup()


async def test_one_host_alone_is_named_nowhere(
    fake_ollama: FakeOllama, make_settings: SettingsFactory,
) -> None:
    app = build_app(make_settings(model={"host": fake_ollama.url}),
                    {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        assert await app[ENGINE].submit(Inbound(chat_key=DANA, text="hi", received=time.time()))
        await asyncio.wait_for(app[ENGINE].wait_idle(DANA), 10)
        assert await scrape(url) == {}
    finally:
        await runner.cleanup()


async def test_errors_and_latency_of_each_host_from_a_real_failover(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
) -> None:
    """A turn whose host answers 503 goes on at the other: the first host counts an error,
    the second an answered call, and each call's time is in its host's histogram."""
    a, b, _ = hosts
    app = build_app(make_settings(model={"hosts": (HostSettings(a.url, priority=1),
                                                   HostSettings(b.url))}),
                    {"telegram": RecordingChannel("telegram")})
    runner, url = await start(app)
    try:
        a.script(Reply(status=503, error="server busy"))
        engine = app[ENGINE]
        assert await engine.submit(Inbound(chat_key=DANA, text="hello", received=time.time()))
        await asyncio.wait_for(engine.wait_idle(DANA), 10)
        samples = await scrape(url)
        assert samples[("roost_model_host_errors_total", a.url)] == 1.0
        assert samples[("roost_model_host_errors_total", b.url)] == 0.0
        assert samples[("roost_model_host_requests_total", b.url)] == 1.0
        assert samples[("roost_model_host_seconds_count", a.url)] == 1.0
        assert samples[("roost_model_host_seconds_count", b.url)] == 1.0
        assert samples[("roost_model_host_seconds_sum", b.url)] > 0.0
    finally:
        await runner.cleanup()
