"""A model server that goes quiet mid-answer (stopped, then continued): the chat hears so at
`model.stall`, "typing…" goes on, /healthz agrees, and the answer still arrives.

roost's real app against the fake Bot API and the fake Ollama, which pauses its stream after a
few pieces until the test lets it go on (as a server stopped with SIGSTOP and continued).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from daemon.core.config import Settings
from daemon.turn.silence import stall_line
from tests.channels.telegram.test_telegram import Daemon, message, start_roost, texts
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

STALL = 0.5  # seconds: model.stall, short for the test
ANSWER = "The first half of the answer, and then the second half of it, after the pause."
Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    running: list[Daemon] = []

    async def run(**sections: dict[str, Any]) -> Daemon:
        telegram = {"draft_interval": 0.1} | sections.pop("telegram", {})

        def settings(**given: Any) -> Settings:
            return make_settings(**given | {"model": given["model"] | {"stall": STALL}})

        daemon = await start_roost(settings, fake_telegram, fake_ollama, telegram=telegram,
                                   **sections)
        running.append(daemon)
        return daemon

    yield run
    for daemon in reversed(running):
        await daemon.stop()


async def health(daemon: Daemon) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/healthz") as reply:
        body: dict[str, Any] = await reply.json()
        return body


def typing_after(fake: FakeTelegram, moment: float) -> int:
    return sum(1 for c in fake.calls_to("sendChatAction") if c.time > moment)


async def test_a_silent_model_is_said_in_the_draft_and_typing_goes_on(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.script(Reply(content=ANSWER, chunks=4, pause_after_chunks=2))
    daemon = await start()
    assert await daemon.post(message(1, "tell me")) == 200
    await wait_until(lambda: any("has not said anything" in d["text"]
                                 for d in fake_telegram.drafts), timeout=10)
    (said,) = [c for c in fake_telegram.calls_to("sendMessageDraft")
               if "has not said anything" in c.params["text"]]
    # What was written so far stays, with the line about the silence under it.
    assert stall_line(STALL) in said.params["text"]
    assert said.params["text"].startswith(ANSWER[:10])
    assert (await health(daemon))["reasons"] == ["model silent"]
    # "typing…" goes on while the model is silent, although a draft is showing.
    await wait_until(lambda: typing_after(fake_telegram, said.time) >= 3, timeout=10)

    fake_ollama.resume_paused()
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle()
    assert texts(fake_telegram) == [ANSWER]
    # The draft went on without the line once the model wrote again.
    assert "has not said anything" not in fake_telegram.drafts[-1]["text"]
    assert (await health(daemon))["status"] == "ok"


async def test_with_streaming_off_a_silent_model_is_said_once(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.script(Reply(content=ANSWER, chunks=4, pause_after_chunks=2))
    daemon = await start(telegram={"streaming": "off"})
    assert await daemon.post(message(1, "tell me")) == 200
    (notice,) = await fake_telegram.wait_for("sendMessage", timeout=10)
    assert notice.params["text"] == stall_line(STALL).capitalize() + "."
    # Typing goes on, over several more stall periods (0.1 s apart: 20 are 2 s), and the
    # notice is not repeated.
    await wait_until(lambda: typing_after(fake_telegram, notice.time) >= 20, timeout=10)
    assert len(fake_telegram.calls_to("sendMessage")) == 1

    fake_ollama.resume_paused()
    await fake_telegram.wait_for("sendMessage", count=2, timeout=10)
    await daemon.settle()
    assert texts(fake_telegram) == [stall_line(STALL).capitalize() + ".", ANSWER]
