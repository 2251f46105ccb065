"""/status with several Ollama hosts (`[model] hosts`): it names the host the conversation is on,
says when a failure moved its turns to another host (and since when the first is down), that
the conversation goes back once the host is up and it folded, and after a restart the host its
last reply came from. A pool of one reads as it always did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.config.sections import HostSettings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeOllama

CHAT = "console:local"


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama() as b, FakeOllama() as c:
        yield a, b, c


class Daemon:
    """The engine over the state directory, as `roost run` assembles it; `restart` stops it and
    starts another on the same state (the pins in memory are gone)."""

    def __init__(self, settings: Settings, channel: RecordingChannel) -> None:
        self.settings, self.channel = settings, channel
        self.parts: tuple[Engine, ModelClient, Store] | None = None

    async def start(self) -> None:
        store = Store.open(self.settings.daemon.state_dir)
        llm = ModelClient(self.settings.model)
        engine = assemble(self.settings, store, llm, {"console": self.channel}).engine
        await engine.start()
        self.parts = engine, llm, store

    async def stop(self) -> None:
        if self.parts is not None:
            engine, llm, store = self.parts
            self.parts = None
            await engine.stop(grace=0)
            await llm.close()
            store.close()

    @property
    def llm(self) -> ModelClient:
        assert self.parts is not None
        return self.parts[1]

    async def say(self, text: str) -> None:
        assert self.parts is not None
        engine = self.parts[0]
        assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
        await asyncio.wait_for(engine.wait_idle(CHAT), 10)

    async def status(self) -> list[str]:
        await self.say("/status")
        return self.channel.texts("notice")[-1].splitlines()


@pytest.fixture
async def daemons(recording_channel: RecordingChannel) -> AsyncIterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        await daemon.stop()


async def daemon_on(daemons: list[Daemon], settings: Settings,
                    channel: RecordingChannel) -> Daemon:
    daemon = Daemon(settings, channel)
    daemons.append(daemon)
    await daemon.start()
    return daemon


def pool(make_settings: SettingsFactory, *hosts: FakeOllama, **model: Any) -> Settings:
    return make_settings(model={"hosts": tuple(HostSettings(h.url) for h in hosts),
                                "retry_backoff": 0.02, "retry_attempts": 2, **model})


def host_lines(status: list[str]) -> list[str]:
    return [line for line in status if line.startswith("Host:")]


async def test_status_names_the_conversations_host_and_a_failover_with_since_when(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    daemons: list[Daemon], recording_channel: RecordingChannel,
) -> None:
    a, b, c = hosts
    daemon = await daemon_on(daemons, pool(make_settings, a, b, c), recording_channel)
    status = await daemon.status()  # no conversation yet: no host is its own
    assert status[0] == (f"Model: qwen3:4b on 3 Ollama hosts ({a.url}, {b.url}, {c.url}): the "
                         "next turn takes the best one up")
    await daemon.say("one")
    status = await daemon.status()
    assert status[0] == f"Model: qwen3:4b at {a.url}" and host_lines(status) == []

    await a.refuse_connections()  # box one switched off between two turns
    await daemon.say("two")
    assert recording_channel.texts("reply")[-1] == "echo: two"
    status = await daemon.status()
    assert status[0] == f"Model: qwen3:4b at {b.url}"
    [moved] = host_lines(status)
    assert moved.startswith(f"Host: answered by {b.url} ({a.url} down since ")
    assert status[-1].startswith("Times in ")  # the time it names is in the daemon's zone

    await a.accept_connections()
    await daemon.llm.pool.check_all()  # the health check finds it back
    [back] = host_lines(await daemon.status())
    assert back == (f"Host: answered by {b.url} ({a.url} failed; it is back, and this "
                    "conversation returns there at its next fold (/compact folds now))")


async def test_a_conversation_whose_host_went_down_says_so_before_its_next_turn(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    daemons: list[Daemon], recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    daemon = await daemon_on(daemons, pool(make_settings, a, b), recording_channel)
    await daemon.say("one")
    await a.refuse_connections()
    await daemon.llm.pool.check_all()
    status = await daemon.status()
    assert status[0] == f"Model: qwen3:4b at {a.url}"
    [down] = host_lines(status)
    assert down.startswith(f"Host: {a.url} is down since ")
    assert down.endswith("; the next turn goes to another host that has the model")


async def test_after_a_restart_status_names_the_host_of_the_last_reply(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    daemons: list[Daemon], recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    settings = pool(make_settings, a, b)
    daemon = await daemon_on(daemons, settings, recording_channel)
    await daemon.say("one")
    await a.refuse_connections()
    await daemon.say("two")  # answered by b
    await daemon.stop()
    await a.accept_connections()
    again = await daemon_on(daemons, settings, recording_channel)
    status = await again.status()
    assert status[0] == f"Model: qwen3:4b at {b.url}"  # where its cache is, though a is first


async def test_a_pool_of_one_reads_as_it_always_did(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, daemons: list[Daemon],
    recording_channel: RecordingChannel,
) -> None:
    daemon = await daemon_on(daemons, make_settings(model={"host": fake_ollama.url}),
                             recording_channel)
    await daemon.say("one")
    status = await daemon.status()
    assert status[0] == f"Model: qwen3:4b at {fake_ollama.url}" and host_lines(status) == []
