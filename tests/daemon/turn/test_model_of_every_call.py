"""Every model call of a conversation goes to its model at its window: a chat switched with
/model folds, condenses its notes and writes its safety-net state with the model its turns use,
so one GPU never swaps models for them and each is sized for the window it runs in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.context.compact import STATE_REQUEST
from daemon.context.fold import FOLD_SYSTEM, NOTES_HEADING
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.registry import Capability, Tool
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT = "console:local"
SMALL = FakeModel(name="llama3.2:3b", context_length=4096, capabilities=("completion", "tools"))


def is_fold(body: dict[str, Any]) -> bool:
    return str(body["messages"][0]["content"]).startswith(FOLD_SYSTEM)


def asks_state(body: dict[str, Any]) -> bool:
    return any(STATE_REQUEST in str(m.get("content")) for m in body["messages"])


@pytest.fixture
async def engine(make_settings: SettingsFactory) -> AsyncIterator[tuple[Engine, FakeOllama]]:
    fake = FakeOllama(models=[FakeModel(), SMALL])
    await fake.start()
    settings = make_settings(model={"host": fake.url, "window": 8192, "max_calls": 12})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": RecordingChannel()}).engine
    await engine.start()
    try:
        yield engine, fake
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
        await fake.stop()


async def say(engine: Engine, text: str) -> None:
    assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
    await asyncio.wait_for(engine.wait_idle(CHAT), 20)
    conversation = engine.store.active_conversation(CHAT)
    if conversation is not None:
        await engine.parts.folder.wait(conversation.id)


async def test_a_model_chats_folds_go_to_its_model_at_its_window(
    engine: tuple[Engine, FakeOllama],
) -> None:
    rig, fake = engine
    await say(rig, "/model llama3.2:3b")
    for n in range(8):
        await say(rig, f"Note {n}: the hedge by the shed needs trimming in week {n}. " * 3)
    await say(rig, "/compact")
    folds = [r for r in fake.chat_requests if is_fold(r)]
    assert folds
    assert {(r["model"], r["options"]["num_ctx"]) for r in folds} == {("llama3.2:3b", 4096)}
    assert fake.reloads == 0 and set(fake.loaded) == {"llama3.2:3b"}


async def test_a_model_chats_notes_are_condensed_for_its_window(
    engine: tuple[Engine, FakeOllama],
) -> None:
    rig, fake = engine
    await say(rig, "/model llama3.2:3b")
    # About 400 tokens of the user's own words: over the notes' cap at 4,096 (256), under it
    # at 8,192 (512), so only a fold sized for the chat's window asks to condense them.
    for n in range(8):
        await say(rig, f"Remember item {n}: " + f"the blue folder on shelf {n} holds receipts. "
                  * 4)
    await say(rig, "/compact")
    folds = [r for r in fake.chat_requests if is_fold(r)]
    assert folds and NOTES_HEADING in folds[-1]["messages"][-1]["content"]
    assert folds[-1]["model"] == "llama3.2:3b"


async def test_a_model_chats_safety_net_state_goes_to_its_model_at_its_window(
    engine: tuple[Engine, FakeOllama],
) -> None:
    rig, fake = engine

    async def fetch_page(context: object, name: str) -> str:
        return (f"Page {name} line with facts. " * 1300)[:30_000]

    rig.parts.registry.register(Capability(
        name="pages", core=True, description="fetch pages", tools=(Tool(
            "fetch_page", "Fetch a page by name.",
            {"type": "object", "properties": {"name": {"type": "string"}},
             "required": ["name"]}, fetch_page),)))
    pages = [Reply(tool_calls=[{"function": {"name": "fetch_page",
                                             "arguments": {"name": f"p{n}"}}}])
             for n in range(8)]

    def answer(body: dict[str, Any]) -> Reply:
        if asks_state(body):
            return Reply("TASK: read pages\nPROGRESS: some\nREMAINING: more\nDATA: facts\n"
                         "DECISIONS: none")
        if is_fold(body):
            return Reply("The user reads pages.")
        if body["messages"][-1]["role"] == "user":
            if "/model" in body["messages"][-1]["content"]:
                return echo_reply(body)
        # After a safety-net pass the turn goes on from a user message: more pages, then done.
        return pages.pop(0) if pages else Reply("The pages say: facts.")

    fake.default_reply = answer
    await say(rig, "/model llama3.2:3b")
    await say(rig, "Read the pages and tell me what they say.")
    states = [r for r in fake.chat_requests if asks_state(r)]
    assert states, "the safety net never ran"
    assert {(r["model"], r["options"]["num_ctx"]) for r in states} == {("llama3.2:3b", 4096)}
    assert all(r["model"] == "llama3.2:3b" for r in fake.chat_requests)
