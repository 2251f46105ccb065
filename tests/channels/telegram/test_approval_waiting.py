"""Messages that come while an approval question waits: an immediate hint, nothing lost.

The same real parts as test_telegram_approvals (a stdio MCP server built with the SDK, roost
polling the Bot API fake, the Ollama fake scripting the model's calls).
"""

from __future__ import annotations

from typing import Any

from tests.channels.telegram.test_telegram import message
from tests.channels.telegram.test_telegram import start as start
from tests.channels.telegram.test_telegram_approvals import (
    USER,
    button,
    calls,
    mcp,
    question,
)
from tests.channels.telegram.test_telegram_approvals import roost as roost
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

HINT = "I'm waiting for your answer to the question above; tap a button, or /stop."


def sent(fake: FakeTelegram) -> list[str]:
    return [str(m.get("text")) for m in fake.sent_messages]


async def test_a_message_while_a_question_waits_gets_a_hint_and_is_answered_after(
    roost: Any, fake_telegram: FakeTelegram, fake_ollama: FakeOllama
) -> None:
    await roost(mcp=mcp())
    fake_ollama.script(*calls(("tool_activate", {"name": "fake"}),
                              ("fake__echo", {"text": "hi"})), Reply("Done: echoed."),
                       Reply("Yes, still here."))
    fake_telegram.queue_update(message(1, "echo hi"))
    await wait_until(lambda: any("reply_markup" in m for m in fake_telegram.messages.values()),
                     30)
    asked = question(fake_telegram)
    fake_telegram.queue_update(message(2, "hello? are you there?"))
    await wait_until(lambda: any(HINT in t for t in sent(fake_telegram)), 20)
    assert not any("Done" in t for t in sent(fake_telegram))  # the question still waits
    fake_telegram.queue_update(message(3, "hello??"))
    await wait_until(lambda: sum(HINT in t for t in sent(fake_telegram)) == 2, 20)
    fake_telegram.tap(USER, USER, asked["message_id"], button(asked, "Allow once"))
    await wait_until(lambda: any("Yes, still here." in t for t in sent(fake_telegram)), 30)
    # Nothing was lost: the next turn answers both messages.
    last = [m["content"] for m in fake_ollama.chat_requests[-1]["messages"] if m["role"] == "user"]
    assert any("hello? are you there?" in c for c in last) and any("hello??" in c for c in last)
    texts = sent(fake_telegram)
    assert texts.index(next(t for t in texts if "Done: echoed." in t)) < texts.index(
        next(t for t in texts if "Yes, still here." in t))
