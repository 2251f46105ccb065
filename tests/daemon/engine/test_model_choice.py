"""/model: the models Ollama has, a switch per chat that outlives a restart, and a name Ollama
does not have; through the real engine against the fake Ollama."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama

CHAT = "console:local"
OTHER = "console:other"
SMALL = FakeModel(name="llama3.2:3b", context_length=4096, capabilities=("completion", "tools"))


@asynccontextmanager
async def engine_for(settings: Settings, channel: RecordingChannel) -> AsyncIterator[Engine]:
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": channel}).engine
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


async def say(engine: Engine, text: str, chat: str = CHAT) -> None:
    assert await engine.submit(Inbound(chat_key=chat, text=text, received=time.time()))
    await asyncio.wait_for(engine.wait_idle(chat), 10)


async def test_model_lists_what_ollama_has_with_window_and_capabilities(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    fake_ollama.models.append(SMALL)
    channel = RecordingChannel()
    async with engine_for(make_settings(model={"host": fake_ollama.url}), channel) as engine:
        await say(engine, "/model")
    (listing,) = channel.texts()
    assert "qwen3:4b: context 32,768 tokens, window 8,192; tools, thinking ← this chat" in listing
    assert "llama3.2:3b: context 4,096 tokens, window 4,096; tools" in listing


async def test_model_name_switches_this_chat_only_and_survives_a_restart(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    fake_ollama.models.append(SMALL)
    settings = make_settings(model={"host": fake_ollama.url})
    channel = RecordingChannel()
    async with engine_for(settings, channel) as engine:
        await say(engine, "hello")
        before = engine.store.active_conversation(CHAT)
        await say(engine, "/model llama3.2:3b")
        after = engine.store.active_conversation(CHAT)
        await say(engine, "and now?")
        await say(engine, "elsewhere", OTHER)
    assert before is not None and after is not None and before.id != after.id
    switched = channel.texts()[1]
    assert "now talks to llama3.2:3b" in switched and "new conversation" in switched
    models = [r["model"] for r in fake_ollama.chat_requests]
    assert models == ["qwen3:4b", "llama3.2:3b", "qwen3:4b"]
    # The window follows the new model: its context length, asked of /api/show again.
    assert fake_ollama.chat_requests[1]["options"]["num_ctx"] == 4096

    again = RecordingChannel()
    async with engine_for(settings, again) as engine:
        await say(engine, "after a restart")
    assert fake_ollama.chat_requests[-1]["model"] == "llama3.2:3b"


async def test_a_name_ollama_does_not_have_gets_the_list(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    channel = RecordingChannel()
    async with engine_for(make_settings(model={"host": fake_ollama.url}), channel) as engine:
        await say(engine, "/model gpt-5")
        await say(engine, "still here?")
    answer = channel.texts()[0]
    assert "no model called 'gpt-5'" in answer and "qwen3:4b" in answer
    assert [r["model"] for r in fake_ollama.chat_requests] == ["qwen3:4b"]


async def test_model_while_ollama_is_down_says_so(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    channel = RecordingChannel()
    await fake_ollama.refuse_connections()
    async with engine_for(make_settings(model={"host": fake_ollama.url}), channel) as engine:
        await say(engine, "/model llama3.2:3b")
    (answer,) = channel.texts()
    assert "cannot ask the Ollama server" in answer


async def test_status_names_the_chats_model(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    fake_ollama.models.append(SMALL)
    channel = RecordingChannel()
    async with engine_for(make_settings(model={"host": fake_ollama.url}), channel) as engine:
        await say(engine, "/model llama3.2:3b")
        await say(engine, "/status")
    status = channel.texts()[-1]
    assert status.startswith("Model: llama3.2:3b") and "Window: 4,096 tokens" in status
