"""A reminder asked for in a group is for the one who asked: it arrives in their private chat
with roost, not in the group; when roost cannot write to them there, it stays in the group and
the model is told why. Through the real webhook, reminder tools and delivery, on the fake Bot API
and the fake Ollama."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from daemon.app.serve import AUTOMATIONS
from tests.channels.telegram.test_telegram import (
    CHAT_KEY,
    USER,
    Daemon,
    message,
    start_roost,
    texts,
)
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

FAMILY_ID = -1001234567890
FAMILY = {"id": FAMILY_ID, "type": "supergroup", "title": "Family"}
FAMILY_KEY = f"telegram:{FAMILY_ID}"
OMAR = 2222222  # in the group and on the allow list, but never wrote to roost privately


def call(tool: str, **arguments: str) -> Reply:
    return Reply(tool_calls=[{"function": {"name": tool, "arguments": arguments}}])


@pytest.fixture
async def roost(make_settings: SettingsFactory, fake_telegram: FakeTelegram,
                fake_ollama: FakeOllama) -> AsyncIterator[Daemon]:
    daemon = await start_roost(make_settings, fake_telegram, fake_ollama,
                               telegram={"allow": (USER, OMAR)})
    yield daemon
    await daemon.stop()


async def ask_in_the_group(daemon: Daemon, fake: FakeTelegram, fake_ollama: FakeOllama,
                           update_id: int, sender: int) -> tuple[dict[str, Any], str]:
    """`sender` asks roost in the family group for a reminder in two hours: the reminder
    set, and what the tool answered the model."""
    fake_ollama.script(call("tool_activate", name="reminders"),
                       call("schedule_reminder", when="in 2h", text="call the plumber"),
                       "I will remind you.")
    assert await daemon.post(message(update_id, "@roost_test_bot remind me in 2 hours to call "
                                     "the plumber", user=sender, chat=FAMILY)) == 200
    reminders = daemon.app[AUTOMATIONS].reminders
    await wait_until(lambda: "I will remind you." in texts_to(fake, FAMILY_ID))
    await daemon.settle(FAMILY_KEY)
    (pending,) = await reminders.pending()
    answers = [m["content"] for m in fake_ollama.chat_requests[-1]["messages"]
               if m["role"] == "tool" and "Reminder" in m["content"]]
    return pending, answers[-1]


def texts_to(fake: FakeTelegram, chat_id: int) -> list[str]:
    """What the chat saw of roost's messages."""
    return [text for params, text in zip(fake.sent_messages, texts(fake), strict=True)
            if params["chat_id"] == chat_id]


async def fire(daemon: Daemon, reminder: dict[str, Any]) -> None:
    """The reminder's time came (the scheduler's call, made at once)."""
    await daemon.app[AUTOMATIONS].reminders.fire(reminder["id"], daemon.engine)
    await daemon.engine.wait_idle(reminder["chat_key"])


async def test_a_reminder_set_in_a_group_arrives_in_the_askers_private_chat(
        roost: Daemon, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    assert await roost.post(message(1, "hi")) == 200  # Dana has written to roost privately
    await wait_until(lambda: len(texts_to(fake_telegram, USER)) == 1)
    await roost.settle()

    reminder, answer = await ask_in_the_group(roost, fake_telegram, fake_ollama, 2, USER)
    assert "private chat of the one who asked, not to this group" in answer
    assert reminder["chat_key"] == CHAT_KEY
    # Listed where it was asked for, and in her own chat.
    assert [d["id"] for d in await roost.app[AUTOMATIONS].reminders.pending(FAMILY_KEY)] == [
        reminder["id"]]

    await fire(roost, reminder)
    assert texts_to(fake_telegram, USER)[-1] == "⏰ Reminder: call the plumber"
    assert not any("call the plumber" in text for text in texts_to(fake_telegram, FAMILY_ID))


async def test_one_roost_cannot_write_to_privately_is_reminded_in_the_group(
        roost: Daemon, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    reminder, answer = await ask_in_the_group(roost, fake_telegram, fake_ollama, 3, OMAR)
    assert "It goes to this group" in answer and "never written to me privately" in answer
    assert reminder["chat_key"] == FAMILY_KEY

    await fire(roost, reminder)
    assert texts_to(fake_telegram, FAMILY_ID)[-1] == "⏰ Reminder: call the plumber"
    assert texts_to(fake_telegram, OMAR) == []
