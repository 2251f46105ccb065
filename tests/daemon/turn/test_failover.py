"""Turns over a pool of Ollama hosts (`[model] hosts`), as a user notices them: a conversation
stays on its host; a host killed before a turn or in the middle of an answer is left within the
turn (one answer, nothing twice, no outage notice); a host back serves new conversations, and a
moved one only after its fold; an automation keeps its host across runs; a model on one host
only is served there, one on none is named with every host; all hosts down is told once; a
restart keeps each conversation on its host."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.config.sections import HostSettings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.turn.runner import MOVED_LINE
from tests.automations.conftest import (  # noqa: F401  (make_daemon is a fixture)
    DaemonFactory,
    at,
    automation,
    make_daemon,
)
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.daemon.turn.test_turn import count_turns, typed
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT, OTHER = "console:local", "console:other"


@pytest.fixture
async def hosts() -> AsyncIterator[tuple[FakeOllama, FakeOllama, FakeOllama]]:
    async with FakeOllama() as a, FakeOllama() as b, FakeOllama() as c:
        yield a, b, c


class Daemons:
    """Engines started on settings, each stopped (or at the end) as the daemon stops."""

    def __init__(self, channel: RecordingChannel) -> None:
        self.channel = channel
        self.running: list[tuple[Engine, ModelClient, Store]] = []

    async def __call__(self, settings: Settings) -> tuple[Engine, ModelClient]:
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        engine = assemble(settings, store, llm, {"console": self.channel}).engine
        await engine.start()
        self.running.append((engine, llm, store))
        return engine, llm

    async def stop(self) -> None:
        engine, llm, store = self.running.pop()
        await engine.stop(grace=0)
        await llm.close()
        store.close()


Start = Callable[[Settings], Awaitable[tuple[Engine, ModelClient]]]


@pytest.fixture
async def start(recording_channel: RecordingChannel) -> AsyncIterator[Daemons]:
    daemons = Daemons(recording_channel)
    yield daemons
    while daemons.running:
        await daemons.stop()


def pool(make_settings: SettingsFactory, *hosts: FakeOllama, **model: Any) -> Settings:
    return make_settings(model={"hosts": tuple(HostSettings(h.url) for h in hosts),
                                "retry_backoff": 0.02, "retry_attempts": 3, **model})


async def say(engine: Engine, text: str, chat: str = CHAT) -> None:
    assert await engine.submit(Inbound(chat_key=chat, text=text, received=time.time()))
    await asyncio.wait_for(engine.wait_idle(chat), 10)


def said(fake: FakeOllama) -> list[str]:
    """The user's words each chat a host was asked ended with."""
    return [typed(str(body["messages"][-1]["content"])) for body in fake.chat_requests]


def last_reply_host(engine: Engine, chat: str = CHAT) -> Any:
    conversation = engine.store.active_conversation(chat)
    assert conversation is not None
    return [m for m in engine.store.messages(conversation.id) if m.role == "assistant"][-1] \
        .meta.get("host")


async def test_a_conversation_stays_on_its_host_and_two_at_once_go_to_two_hosts(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Start, recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    engine, _ = await start(pool(make_settings, a, b))
    a.script(Reply(content="a slow first answer", pause_after_chunks=1))
    assert await engine.submit(Inbound(chat_key=CHAT, text="first", received=time.time()))
    await wait_until(lambda: a.paused == 1)
    await say(engine, "meanwhile", OTHER)  # A is busy answering: the other chat goes to B
    a.resume_paused()
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    for n in range(3):
        await say(engine, f"local {n}")
        await say(engine, f"other {n}", OTHER)
    assert said(a) == ["first", "local 0", "local 1", "local 2"]
    assert said(b) == ["meanwhile", "other 0", "other 1", "other 2"]
    assert last_reply_host(engine) == a.url and last_reply_host(engine, OTHER) == b.url
    assert recording_channel.texts("notice") == []


async def test_a_host_killed_between_turns_is_left_within_the_turn_unnoticed(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Start, recording_channel: RecordingChannel, caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, c = hosts
    engine, _ = await start(pool(make_settings, a, b, c))
    await say(engine, "one")
    await a.refuse_connections()
    caplog.set_level(logging.WARNING, "roost.turn")
    await say(engine, "two")
    await say(engine, "three")
    assert recording_channel.texts("reply") == ["echo: one", "echo: two", "echo: three"]
    assert recording_channel.texts("notice") == []  # no outage was told
    assert said(a) == ["one"] and said(b) == ["two", "three"] and said(c) == []
    [moved] = [r.getMessage() for r in caplog.records if "answered by" in r.getMessage()]
    assert f"{a.url} failed" in moved and moved.endswith(f"answered by {b.url}")


async def test_a_host_killed_in_the_middle_of_an_answer_is_left_for_one_answer(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Start, recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    engine, _ = await start(pool(make_settings, a, b))
    await say(engine, "one")
    a.script(Reply(content="the answer from the first box, which never ends", chunks=6,
                   pause_after_chunks=3))
    assert await engine.submit(Inbound(chat_key=CHAT, text="two", received=time.time()))
    await wait_until(lambda: a.paused == 1)
    await a.refuse_connections()  # switched off mid-sentence: the stream is cut
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    # The user saw the first box's words being written; the one reply says they are replaced.
    assert "the answer from" in "".join(recording_channel.deltas)
    assert recording_channel.texts("reply") == ["echo: one", f"{MOVED_LINE}\n\necho: two"]
    assert recording_channel.texts("notice") == []
    assert said(b) == ["two"]
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == [
        "one", "echo: one", "two", "echo: two"]  # roost's own line is not the model's words
    assert last_reply_host(engine) == b.url


def summarising(body: dict[str, Any]) -> Reply:
    """A fold's answer: a short summary of its messages; anything else echoed."""
    if str(body["messages"][0]["content"]).startswith(FOLD_SYSTEM):
        return Reply(content="Summary: the user counted from one to six, message by message.")
    return echo_reply(body)


async def test_a_host_back_serves_new_conversations_and_a_moved_one_only_after_its_fold(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Start,
) -> None:
    a, b, _ = hosts
    for fake in (a, b):
        fake.default_reply = summarising
    engine, llm = await start(pool(make_settings, a, b))
    await say(engine, "one")
    await a.refuse_connections()
    await say(engine, "two")
    await a.accept_connections()
    await llm.pool.check_all()  # the health check finds it back
    await say(engine, "hello", OTHER)  # a new conversation: on A at once
    await say(engine, "three")  # the moved one keeps its cache on B ...
    await say(engine, "four")
    folds = len(b.chat_requests)
    await say(engine, "/compact")  # ... its fold too (the prompt's start is still B's) ...
    assert len(b.chat_requests) == folds + 1 and engine.store.active_conversation(
        CHAT).summary.fold_count == 1  # type: ignore[union-attr]
    await say(engine, "five")  # ... and after the fold it goes home
    await say(engine, "six")
    assert said(a) == ["one", "hello", "five", "six"]
    assert said(b)[:3] == ["two", "three", "four"]


async def test_an_automation_keeps_its_host_across_runs(
    make_daemon: DaemonFactory, fake_ollama: FakeOllama,  # noqa: F811
) -> None:
    async with FakeOllama() as b:
        daemon = make_daemon(automation("brief"), hosts=(HostSettings(fake_ollama.url),
                                                         HostSettings(b.url)))
        automations = await daemon.start()
        assert daemon.engine is not None
        # A chat holds A when the first run starts: the run goes to B ...
        fake_ollama.script(Reply(content="slow", pause_after_chunks=1))
        assert await daemon.engine.submit(Inbound(chat_key="console:local", text="hi",
                                                  received=daemon.clock()))
        await wait_until(lambda: fake_ollama.paused == 1)
        daemon.clock.set(at(2026, 12, 1, 10, 0, 1))
        await automations.fire("brief")
        await wait_until(lambda: len(b.chat_requests) == 1)
        fake_ollama.resume_paused()
        await daemon.engine.wait_idle("console:local")
        # ... and stays there: A, idle and first in the config, does not get the next run.
        for hour in (11, 12):
            daemon.clock.set(at(2026, 12, 1, hour, 0, 1))
            await automations.fire("brief")
        await wait_until(lambda: len(b.chat_requests) == 3)
        await daemon.settle()
        assert len(fake_ollama.chat_requests) == 1  # the chat's alone
        prompts = [body["messages"][-1]["content"] for body in b.chat_requests]
        assert all(p.startswith("Anything new on the things I follow?") for p in prompts)
        assert [r["status"] for r in automations.state.runs("brief")] == ["ok"] * 3


async def test_a_model_on_one_host_is_served_there_and_one_on_none_names_every_host(
    make_settings: SettingsFactory, start: Start, recording_channel: RecordingChannel,
) -> None:
    async with FakeOllama() as a, FakeOllama(models=[FakeModel(), FakeModel("qwen3:14b")]) as b:
        engine, _ = await start(pool(make_settings, a, b, name="qwen3:14b"))
        await say(engine, "a big question")
        assert recording_channel.texts("reply") == ["echo: a big question"]
        assert said(a) == [] and said(b) == ["a big question"]

        nowhere = pool(make_settings, a, b, name="llama3.2:1b")
        nowhere = dataclasses.replace(nowhere, daemon=dataclasses.replace(
            nowhere.daemon, state_dir=nowhere.daemon.state_dir.parent / "other"))
        engine, _ = await start(nowhere)
        await say(engine, "hello")
        [notice] = recording_channel.texts("notice")
        assert a.url in notice and b.url in notice and "ollama pull llama3.2:1b" in notice


async def test_every_host_down_is_told_once_and_the_message_answered_when_one_is_back(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Start, recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    engine, _ = await start(pool(make_settings, a, b))
    await say(engine, "warm up")
    await a.refuse_connections()
    await b.refuse_connections()
    turns = count_turns(engine)
    assert await engine.submit(Inbound(chat_key=CHAT, text="are you there?",
                                       received=time.time()))
    await wait_until(lambda: turns.done >= 2)  # tried, parked, tried again
    [notice] = recording_channel.texts("notice")
    assert "not answering" in notice and a.url in notice and b.url in notice
    await b.accept_connections()
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: warm up", "echo: are you there?"]
    assert len(recording_channel.texts("notice")) == 1
    assert said(b) == ["are you there?"]


async def test_a_restart_keeps_each_conversation_on_its_host(
    hosts: tuple[FakeOllama, FakeOllama, FakeOllama], make_settings: SettingsFactory,
    start: Daemons, recording_channel: RecordingChannel,
) -> None:
    a, b, _ = hosts
    # The first box is preferred for every new conversation, and off when this one begins.
    settings = make_settings(model={"hosts": (HostSettings(a.url, priority=10),
                                              HostSettings(b.url)), "retry_backoff": 0.02})
    await a.refuse_connections()
    engine, _ = await start(settings)
    await say(engine, "one")
    assert said(b) == ["one"] and last_reply_host(engine) == b.url
    await start.stop()

    await a.accept_connections()  # roost restarts with both boxes on
    engine, _ = await start(settings)
    await say(engine, "two")  # where its cache is, by the last reply's host
    await say(engine, "hi", OTHER)  # a new conversation takes the preferred box
    assert said(b) == ["one", "two"] and said(a) == ["hi"]
    assert recording_channel.texts("reply") == ["echo: one", "echo: two", "echo: hi"]
