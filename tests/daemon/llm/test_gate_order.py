"""Who the model serves next: a chat waiting goes before the folds other chats land.

Against the fake Ollama: one chat's answer holds the model (paused mid-answer), folds that
turns must land queue, then another chat's message arrives. The order in which the fake saw
the requests is the order the model served them.
"""

from __future__ import annotations

import asyncio

from daemon.core.config import ModelSettings
from daemon.llm.client import ChatResult, ModelClient
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama, Reply


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_waiting_chat_goes_before_the_folds_waiting(fake_ollama: FakeOllama) -> None:
    llm = ModelClient(ModelSettings(host=fake_ollama.url, concurrency=1))
    fake_ollama.script(Reply(content="first answer", chunks=2, pause_after_chunks=1))

    async def fold(n: int) -> ChatResult:
        with llm.gate.folding():  # as BackgroundFold.land runs a fold a turn owes
            return await llm.chat(said(f"fold {n}"), think=False)

    try:
        first = asyncio.create_task(llm.chat(said("chat A"), think=False))
        await wait_until(lambda: fake_ollama.paused == 1)
        folds = [asyncio.create_task(fold(n)) for n in range(3)]
        await wait_until(lambda: llm.gate.folds_waiting == 3)
        second = asyncio.create_task(llm.chat(said("chat B"), think=False))
        await wait_until(lambda: llm.gate.waiting == 1)
        fake_ollama.resume_paused()
        await asyncio.wait_for(asyncio.gather(first, second, *folds), 10)
    finally:
        await llm.close()
    served = [body["messages"][-1]["content"] for body in fake_ollama.chat_requests]
    # Chat B waited behind the one call running, not behind three folds.
    assert served == ["chat A", "chat B", "fold 0", "fold 1", "fold 2"]
