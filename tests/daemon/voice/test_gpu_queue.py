"""Transcription shares the one GPU with Ollama: it takes a model slot (`ModelClient.slot`)
in the order model calls do. A chat's transcription waits for the call in flight, goes ahead
of an automation's next call and stops a fold; an automation's own waits behind chats."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from daemon.core.config import ModelSettings
from daemon.core.errors import Preempted
from daemon.llm.client import ChatResult, ModelClient
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama


@pytest.fixture
async def llm(fake_ollama: FakeOllama) -> AsyncIterator[ModelClient]:
    client = ModelClient(ModelSettings(host=fake_ollama.url, concurrency=1))
    yield client
    await client.close()


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_chats_transcription_waits_for_the_call_in_flight_then_goes_before_an_automation(
        llm: ModelClient, fake_ollama: FakeOllama) -> None:
    order: list[str] = []

    async def automation(text: str) -> ChatResult:
        with llm.scheduled():
            result = await llm.chat(ask(text))
        order.append(text)
        return result

    async def transcribe() -> None:
        async with llm.slot():
            order.append("transcription")

    fake_ollama.hang = True
    first = asyncio.create_task(automation("automation call 1"))
    await fake_ollama.wait_for_chats(1, timeout=10)
    second = asyncio.create_task(automation("automation call 2"))
    hearing = asyncio.create_task(transcribe())
    await wait_until(lambda: llm.waiting == 1 and llm.scheduled_waiting == 1)
    assert order == []  # the GPU is busy with the call in flight
    fake_ollama.hang = False
    await asyncio.gather(first, second, hearing)
    assert order == ["automation call 1", "transcription", "automation call 2"]


async def test_a_fold_running_on_the_gpu_gives_way_to_a_transcription(
        llm: ModelClient, fake_ollama: FakeOllama) -> None:
    fake_ollama.hang = True
    fold = asyncio.create_task(llm.chat(ask("summarise"), background=True))
    await fake_ollama.wait_for_chats(1, timeout=10)
    async with asyncio.timeout(10), llm.slot():
        with pytest.raises(Preempted):
            await fold
    fake_ollama.hang = False


async def test_an_automations_transcription_waits_behind_a_chat_turn(
        llm: ModelClient) -> None:
    order: list[str] = []

    async def transcribe() -> None:
        with llm.scheduled():
            async with llm.slot():
                order.append("automation's transcription")

    async with llm.turn():  # a chat's turn, between its model calls
        waiting = asyncio.create_task(transcribe())
        await wait_until(lambda: llm.scheduled_waiting == 1)
        await llm.chat(ask("turn"))
        order.append("turn")
    await asyncio.wait_for(waiting, 10)
    assert order == ["turn", "automation's transcription"]
