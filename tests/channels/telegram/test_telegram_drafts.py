"""Replies that appear as they are written: drafts in private chats, end to end.

roost's real app against the fake Bot API and the fake Ollama pacing its answer like a GPU;
the final reply is still the outbox's, sent once. Nothing is patched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from channels.formatting import TELEGRAM_LIMIT
from daemon.core.config import Settings
from daemon.engine.answering import NOTHING_TO_STOP
from daemon.turn.streaming import STOPPED_MARK, THINKING
from tests.channels.telegram.test_telegram import (
    CHAT_KEY,
    USER,
    Daemon,
    message,
    start_roost,
    texts,
)
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeModel, FakeOllama, Reply
from tests.fakes.telegram import FakeTelegram

INTERVAL = 0.2
Start = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start(fake_telegram: FakeTelegram, fake_ollama: FakeOllama,
                make_settings: SettingsFactory) -> AsyncIterator[Start]:
    running: list[Daemon] = []

    async def run(**sections: dict[str, Any]) -> Daemon:
        telegram = {"draft_interval": INTERVAL} | sections.pop("telegram", {})
        model = sections.pop("model", {})

        def settings(**given: Any) -> Settings:
            return make_settings(**given | {"model": given["model"] | model})

        daemon = await start_roost(settings, fake_telegram, fake_ollama,
                                   telegram=telegram, **sections)
        running.append(daemon)
        return daemon

    yield run
    for daemon in reversed(running):
        await daemon.stop()


def paragraphs(count: int, words: int = 40) -> str:
    return "\n\n".join(" ".join(f"word{p}-{w}" for w in range(words)) for p in range(count))


def sent_after_the_last_draft(fake: FakeTelegram) -> bool:
    finals = fake.calls_to("sendMessage")
    drafts = fake.calls_to("sendMessageDraft")
    return bool(finals) and all(d.time <= finals[0].time for d in drafts)


async def test_a_draft_reaches_telegram_before_the_model_has_finished(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    answer = paragraphs(4)  # ~1,000 bytes: ~340 tokens, over a second at 250 tokens/s
    fake_ollama.script(Reply(content=answer, tokens_per_second=250))
    daemon = await start()
    assert await daemon.post(message(1, "tell me a story")) == 200
    (first, *_) = await fake_telegram.wait_for("sendMessageDraft", timeout=10)
    # The model is still writing, and nothing has been sent as a message yet.
    assert fake_ollama.streaming == 1
    assert fake_telegram.calls_to("sendMessage") == []
    assert first.params["chat_id"] == USER and first.params["draft_id"] != 0
    assert fake_telegram.drafts[0]["text"] and fake_telegram.drafts[0]["text"] in answer

    await fake_telegram.wait_for("sendMessage", timeout=20)
    await daemon.settle()
    # The reply arrives whole, once, from the outbox, after every draft of it.
    assert texts(fake_telegram) == [answer]
    assert sent_after_the_last_draft(fake_telegram)
    drafts = fake_telegram.calls_to("sendMessageDraft")
    assert {d.params["draft_id"] for d in drafts} == {first.params["draft_id"]}
    # At most one draft per interval while the model wrote (and the first at once).
    writing = drafts[-1].time - drafts[0].time
    assert len(drafts) <= 1 + writing / INTERVAL + 1
    assert [d["text"] for d in fake_telegram.drafts] == sorted(
        (d["text"] for d in fake_telegram.drafts), key=len)  # each shows more than the last


async def test_a_draft_telegram_refuses_never_stops_the_final_reply(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_telegram.fail_next("sendMessageDraft", status=400,
                            description="Bad Request: can't parse entities", times=100)
    answer = "Here is **bold** and `code` and a list:\n\n- one\n- two"
    fake_ollama.script(Reply(content=answer, tokens_per_second=60))
    daemon = await start()
    assert await daemon.post(message(1, "format something")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=20)
    await daemon.settle()
    assert len(fake_telegram.calls_to("sendMessageDraft")) >= 1
    assert len(texts(fake_telegram)) == 1
    assert "bold" in texts(fake_telegram)[0]


async def test_a_draft_of_an_unclosed_code_fence_is_taken(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    """A preview cut inside a fence or emphasis is still valid HTML: Telegram takes every
    draft (the fake parses HTML as Telegram does and would answer 400)."""
    answer = "Look:\n\n```python\n" + "\n".join(f"x{i} = {i} * 2" for i in range(60)) + \
        "\n```\n\nand *that* is **all**."
    fake_ollama.script(Reply(content=answer, tokens_per_second=150))
    daemon = await start()
    assert await daemon.post(message(1, "code please")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=20)
    await daemon.settle()
    drafts = fake_telegram.calls_to("sendMessageDraft")
    assert len(drafts) >= 2
    assert len(fake_telegram.drafts) == len(drafts)  # none refused
    assert all(d.params.get("parse_mode") == "HTML" for d in drafts)


async def test_a_10000_character_answer_streams_and_arrives_whole_in_parts(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    answer = paragraphs(40, words=30)
    assert len(answer) > 10_000
    fake_ollama.script(Reply(content=answer, tokens_per_second=2000))
    daemon = await start()
    assert await daemon.post(message(1, "a long one")) == 200
    # The first part is finished long before the answer: it is there to read meanwhile.
    await fake_telegram.wait_for("sendMessage", timeout=20)
    assert fake_ollama.streaming == 1
    await wait_until(lambda: len(fake_telegram.sent_messages) >= 3, timeout=30)
    await daemon.settle()
    parts = texts(fake_telegram)
    assert len(parts) >= 3 and all(len(p) <= TELEGRAM_LIMIT for p in parts)
    # Whole, and each part once: the parts sent early are the reply's first parts.
    assert " ".join(" ".join(parts).split()) == " ".join(answer.split())
    # Every draft was taken (none over the limit), and each shows a part being written, from
    # its first word (which part the last draft caught depends on the machine's pace).
    drafts = fake_telegram.drafts
    assert len(drafts) == len(fake_telegram.calls_to("sendMessageDraft")) >= 2
    assert all(len(d["text"]) <= TELEGRAM_LIMIT for d in drafts)
    starts = [part.split()[0] for part in parts]  # the very first draft may hold "wor" only
    assert all(any(start.startswith(d["text"].split()[0]) for start in starts)
               for d in drafts), [d["text"][:20] for d in drafts]
    assert daemon.store.outbox_pending() == []
    assert daemon.store.chat_flags(CHAT_KEY) == {}  # the early parts were handed over


async def test_early_parts_of_a_turn_that_fails_are_deleted(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    answer = paragraphs(40, words=30)
    fake_ollama.script(Reply(content=answer, tokens_per_second=2000, error_after_chunks=2000,
                             error="an error was encountered while running the model"),
                       Reply(content=answer, tokens_per_second=2000, error_after_chunks=2000,
                             error="an error was encountered while running the model"))
    daemon = await start()
    assert await daemon.post(message(1, "a long one")) == 200
    await fake_telegram.wait_for("deleteMessage", timeout=30)
    await daemon.settle()
    # The parts sent early are gone; the user has the notice, not half an answer, and the
    # answer itself once the model works again (an error twice running is an outage).
    assert fake_telegram.messages and all(
        "word0-" not in m.get("text", "") for m in fake_telegram.messages.values())
    shown = texts(fake_telegram)
    assert any("keeps failing" in t for t in shown), shown
    await wait_until(lambda: texts(fake_telegram)[-1] == "echo: a long one", 30)
    await daemon.settle()
    assert daemon.store.chat_flags(CHAT_KEY) == {}


async def test_groups_get_typing_and_no_drafts(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    group = {"id": -100123, "type": "supergroup", "title": "G"}
    fake_ollama.script(Reply(content=paragraphs(2), tokens_per_second=200))
    daemon = await start(access={"unknown_senders": "ignore"})
    assert await daemon.post(message(1, "/start@roost_test_bot hi", chat=group)) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle("telegram:-100123")
    assert fake_telegram.calls_to("sendMessageDraft") == []


async def test_streaming_off_sends_no_drafts(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.script(Reply(content=paragraphs(2), tokens_per_second=200))
    daemon = await start(telegram={"streaming": "off"})
    assert await daemon.post(message(1, "hi")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle()
    assert fake_telegram.calls_to("sendMessageDraft") == []
    assert fake_telegram.calls_to("sendChatAction")  # "typing…" as before


async def test_the_draft_says_what_the_model_is_doing(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.script(
        Reply(tool_calls=[{"function": {"name": "memory_search",
                                        "arguments": {"query": "holiday"}}}],
              thinking="Let me look that up.", delay=0.3),
        Reply(content="You went to Crete.", delay=0.5, thinking="Found it."))
    daemon = await start(model={"think": True})
    assert await daemon.post(message(1, "where did I go on holiday?")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle()
    shown = [d["text"] for d in fake_telegram.drafts]
    assert THINKING in shown
    assert "searching your conversations…" in shown  # the tool's own line
    assert texts(fake_telegram) == ["You went to Crete."]


# ---- /stop ------------------------------------------------------------------------------------


async def test_stop_in_the_middle_of_an_answer_keeps_what_was_written(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    answer = paragraphs(30)  # minutes at this pace: only /stop ends it
    fake_ollama.script(Reply(content=answer, tokens_per_second=40))
    daemon = await start()
    assert await daemon.post(message(1, "write a lot")) == 200
    await wait_until(lambda: any(len(d["text"]) > 30 for d in fake_telegram.drafts))
    assert await daemon.post(message(2, "/stop")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await wait_until(lambda: fake_ollama.cancelled == 1)  # the request to Ollama was closed
    (kept,) = texts(fake_telegram)
    assert kept.endswith(STOPPED_MARK)
    written = kept.removesuffix(STOPPED_MARK).strip()
    assert len(written) > 30 and answer.startswith(written)
    assert sent_after_the_last_draft(fake_telegram)

    # The next message is answered at once: the model is free.
    assert await daemon.post(message(3, "and now?")) == 200
    await wait_until(lambda: len(fake_telegram.sent_messages) == 2)
    await daemon.settle()
    assert texts(fake_telegram)[1] == "echo: and now?"
    conversation = daemon.store.active_conversation(CHAT_KEY)
    assert conversation is not None
    replies = [m.content for m in daemon.store.messages(conversation.id)
               if m.role == "assistant"]
    assert replies[0].endswith(STOPPED_MARK)  # the model sees it was stopped
    assert daemon.store.inbox_pending() == []


async def test_stop_with_nothing_running_says_so(
        start: Start, fake_telegram: FakeTelegram) -> None:
    daemon = await start()
    assert await daemon.post(message(1, "/stop")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    assert texts(fake_telegram) == [NOTHING_TO_STOP]


async def test_stop_before_the_first_word_keeps_only_the_mark(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.script(Reply(content="too late", delay=30))
    daemon = await start()
    assert await daemon.post(message(1, "think hard")) == 200
    await fake_ollama.wait_for_chats(1, timeout=10)
    assert await daemon.post(message(2, "/stop")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle()
    assert texts(fake_telegram) == [STOPPED_MARK]


async def test_switching_models_keeps_drafts_for_the_new_model(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_ollama.models.append(FakeModel(name="llama3.2:3b", context_length=4096,
                                        capabilities=("completion", "tools")))
    daemon = await start()
    assert await daemon.post(message(1, "/model llama3.2:3b")) == 200
    await fake_telegram.wait_for("sendMessage")
    fake_ollama.script(Reply(content=paragraphs(2), tokens_per_second=200))
    assert await daemon.post(message(2, "hi")) == 200
    await fake_telegram.wait_for("sendMessage", count=2, timeout=10)
    await daemon.settle()
    assert fake_ollama.chat_requests[-1]["model"] == "llama3.2:3b"
    assert fake_telegram.calls_to("sendMessageDraft")


async def test_a_chat_that_takes_no_drafts_is_not_asked_again(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:
    fake_telegram.fail_next("sendMessageDraft", status=400,
                            description="Bad Request: TEXTDRAFT_PEER_INVALID")
    fake_ollama.script(Reply(content=paragraphs(2), tokens_per_second=200),
                       Reply(content=paragraphs(2), tokens_per_second=200))
    daemon = await start()
    assert await daemon.post(message(1, "one")) == 200
    await fake_telegram.wait_for("sendMessage", timeout=10)
    await daemon.settle()
    assert await daemon.post(message(2, "two")) == 200
    await fake_telegram.wait_for("sendMessage", count=2, timeout=10)
    await daemon.settle()
    assert len(fake_telegram.calls_to("sendMessageDraft")) == 1
    assert len(texts(fake_telegram)) == 2
