"""A guest's day: `daily_messages` model turns, then one line saying when the day resets and no
model call; their messages are kept all the same, and a member has no cap."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from types import MappingProxyType

import pytest
from aiohttp import web

from daemon.app.serve import ENGINE, STORE, build_app
from daemon.core.config import PersonSettings
from daemon.core.messages import Inbound
from daemon.engine.guest_days import FLAG
from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.app.test_app import start
from tests.fakes.ollama import FakeOllama

SAM = "telegram:3333333"  # a guest, two turns a day
OMAR = "telegram:2222222"  # a member


@pytest.fixture
async def household(fake_ollama: FakeOllama, make_settings: SettingsFactory
                    ) -> AsyncIterator[tuple[web.Application, RecordingChannel]]:
    settings = dataclasses.replace(
        make_settings(model={"host": fake_ollama.url}, daemon={"timezone": "Europe/Berlin"}),
        people=MappingProxyType({"sam": PersonSettings((SAM,), "guest", 2),
                                 "omar": PersonSettings((OMAR,), "member")}))
    channel = RecordingChannel("telegram")
    app = build_app(settings, {"telegram": channel})
    runner, _ = await start(app)
    try:
        yield app, channel
    finally:
        await runner.cleanup()


async def say(app: web.Application, chat_key: str, text: str, sender: str | None = None) -> None:
    engine = app[ENGINE]
    assert await engine.submit(Inbound(chat_key=chat_key, text=text, received=time.time(),
                                       sender=sender))
    await asyncio.wait_for(engine.wait_idle(chat_key), 20)


async def test_a_guest_gets_their_days_turns_then_a_line_and_nothing_they_said_is_lost(
        household: tuple[web.Application, RecordingChannel], fake_ollama: FakeOllama) -> None:
    app, channel = household
    for n in range(3):
        await say(app, SAM, f"question {n}")
    assert len(fake_ollama.chat_requests) == 2  # the third reached no model
    assert channel.texts("reply") == ["echo: question 0", "echo: question 1"]
    (line,) = channel.texts("notice")
    assert "all 2 of today's messages" in line and "00:00" in line and "Europe/Berlin" in line
    store = app[STORE]
    (conversation,) = store.list_conversations()
    said = [m.content for m in store.messages(conversation.id) if m.role == "user"]
    assert said == ["question 0", "question 1", "question 2"]  # kept, answered or not
    # A member has no cap.
    for n in range(3):
        await say(app, OMAR, f"omar {n}")
    assert len(fake_ollama.chat_requests) == 5 and len(channel.texts("notice")) == 1
    # The next day (the count's day is yesterday's), the guest is answered again.
    store.set_chat_flag(SAM, FLAG, {"day": "2000-01-01", "count": 2})
    await say(app, SAM, "a new day")
    assert channel.texts("reply")[-1] == "echo: a new day"


async def test_a_guests_turns_in_a_group_count_against_their_day(
        household: tuple[web.Application, RecordingChannel], fake_ollama: FakeOllama) -> None:
    app, channel = household
    group = "telegram:-1001234567890"
    await say(app, group, "question in the group", sender="3333333")
    await say(app, SAM, "question in private")
    assert len(fake_ollama.chat_requests) == 2
    # Sam's day is used up, wherever he writes: the group declines his next message...
    await say(app, group, "another one", sender="3333333")
    assert len(fake_ollama.chat_requests) == 2
    assert "all 2 of today's messages" in channel.texts("notice")[-1]
    # ...and answers Omar's (a member) in the same group.
    await say(app, group, "omar asks", sender="2222222")
    assert len(fake_ollama.chat_requests) == 3
    assert channel.texts("reply")[-1] == "echo: omar asks"
