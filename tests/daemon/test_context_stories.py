"""Issue 11's stories, as a user lives them: through the engine (the intake every channel uses)
against a fake Ollama that behaves like Ollama 0.12.6. Each one wedged a chat, lost a fold or left
a message unanswered before; each asserts what the user would notice."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from bench.scenario import WORDS
from channels.base import Inbound
from daemon.context.budget import estimate_tokens
from daemon.context.fold import FOLD_SYSTEM
from daemon.engine import Engine
from daemon.llm import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT = "telegram:1111111"
PLAIN = ("completion", "tools")  # a model that does not think


def is_fold(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM)


def words(size: int, seed: int, head: str = "") -> str:
    """`size` bytes of English-like words (the fake counts a token per 3 bytes)."""
    rng = random.Random(seed)
    out = [head] if head else []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(WORDS))
    return " ".join(out)[:size]


@dataclass
class Story:
    engine: Engine
    fake: FakeOllama
    channel: RecordingChannel
    window: int
    reserve: int = 1024
    fold_text: str = "The user talks about the garden and servers."

    @property
    def store(self) -> Store:
        return self.engine.store

    async def say(self, text: str, chat: str = CHAT) -> None:
        assert await self.engine.submit(Inbound(chat_key=chat, text=text, received=time.time()))
        await asyncio.wait_for(self.engine.wait_idle(chat), 30)
        conversation = self.store.active_conversation(chat)
        if conversation is not None:
            await self.engine.folder.wait(conversation.id)

    def turns(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.chat_requests if not is_fold(r)]

    def folds(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.chat_requests if is_fold(r)]

    def real_tokens(self, body: dict[str, Any]) -> int:
        return self.fake.count_tokens(body["messages"], body.get("tools"))

    def assert_nothing_cut_or_over_budget(self) -> None:
        assert self.fake.cuts == 0 and self.fake.overflows == 0
        over = [self.real_tokens(b) for b in self.turns()
                if self.real_tokens(b) > self.window - self.reserve]
        assert over == []

    def notices(self) -> list[str]:
        return self.channel.texts("notice")


@pytest.fixture
async def story_for(make_settings: SettingsFactory) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Engine, ModelClient, Store, FakeOllama]] = []

    async def make(*, window: int = 8192, model: FakeModel | None = None,
                   **settings: Any) -> Story:
        fake = FakeOllama(models=[model or FakeModel(capabilities=PLAIN)])
        await fake.start()
        config = make_settings(
            model={"host": fake.url, "name": (model.name if model else "qwen3:4b"),
                   "window": window, "retry_backoff": 0.01, "retry_attempts": 2, **settings},
            daemon={"timezone": "UTC"})
        store = Store.open(config.daemon.state_dir)
        llm = ModelClient(config.model)
        channel = RecordingChannel("telegram")
        engine = Engine(settings=config, store=store, llm=llm, channels={"telegram": channel})
        story = Story(engine, fake, channel, window)

        def answer(body: dict[str, Any]) -> Reply:
            return Reply(content=story.fold_text) if is_fold(body) else echo_reply(body)

        fake.default_reply = answer
        await engine.start()
        made.append((engine, llm, store, fake))
        return story

    yield make
    for engine, llm, store, fake in made:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
        await fake.stop()


async def test_two_long_pastes_then_thanks_are_all_answered(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=8192)
    first, second = words(12_000, 1, "PASTE ONE"), words(12_000, 2, "PASTE TWO")  # ~4,000 tokens
    for text in (first, second, "thanks"):
        await story.say(text)
    assert story.notices() == []
    assert story.channel.texts("reply") == ["echo: " + first[:200].rstrip(),
                                            "echo: " + second[:200].rstrip(), "echo: thanks"]
    story.assert_nothing_cut_or_over_budget()
    # The newest paste went whole; the older one as an excerpt that says how to read it all.
    last = story.turns()[1]["messages"]
    assert last[-1]["content"].startswith(second)
    older = next(m["content"] for m in last if m["content"].startswith("PASTE ONE"))
    assert "conversation_read(" in older and len(older) < len(first)


async def test_one_long_answer_then_three_short_messages_at_4096(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=4096)
    story.fake.script(Reply(content=words(8_700, 3, "LONG ANSWER")))  # ~2,900 tokens
    await story.say("explain the whole backup setup in detail")
    for text in ("ok", "and the raid?", "thanks"):
        await story.say(text)
    assert story.notices() == []
    assert story.channel.texts("reply")[1:] == ["echo: ok", "echo: and the raid?",
                                                "echo: thanks"]
    story.assert_nothing_cut_or_over_budget()


async def test_a_message_larger_than_the_window_is_answered_from_an_excerpt_and_a_file(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=4096)
    paste = words(30_000, 4, "HUGE LOG")  # ~10,000 tokens: more than the whole window
    await story.say(paste)
    assert story.notices() == []
    assert story.channel.texts("reply") == ["echo: " + paste[:200].rstrip()]
    story.assert_nothing_cut_or_over_budget()
    [request] = story.turns()
    last = request["messages"][-1]["content"]
    assert last.startswith(paste[:100]) and "[TRUNCATED" in last
    found = re.search(r'file_read\("(attachments/[^"]+)"', last)
    assert found is not None
    assert "file_read" in {t["function"]["name"] for t in request["tools"]}
    stored = story.store.state_dir / found.group(1)
    assert stored.read_text("utf-8") == paste
    conversation = story.store.active_conversation(CHAT)
    assert conversation is not None
    assert story.store.messages(conversation.id)[0].content == paste  # kept whole, as always


async def test_200_long_turns_with_a_model_that_ignores_the_notes_format(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=8192)
    for turn in range(200):
        await story.say(words(870, turn, f"(turn {turn})"))  # ~290 tokens
    replies = story.channel.texts("reply")
    assert len(replies) == 200 and story.notices() == []
    assert replies[-1].startswith("echo: (turn 199)")
    story.assert_nothing_cut_or_over_budget()
    conversation = story.store.active_conversation(CHAT)
    assert conversation is not None
    summary = conversation.summary
    ratio = conversation.token_ratio
    assert summary.fold_count >= 10
    # The caps the README states: summary window/32 tokens, user notes window/16.
    assert estimate_tokens(summary.summary, ratio) <= 8192 // 32
    assert estimate_tokens(summary.user_notes, ratio) <= 8192 // 16
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert any("notes-trimmed" in e for e in story.engine.records.events(day))
    # Folds stay rare: the cost of a turn does not creep up as the conversation grows.
    assert len(story.folds()) <= 30


async def test_a_thinking_model_folds_and_never_thinks_in_the_background(
    story_for: Callable[..., Any],
) -> None:
    thinker = FakeModel(capabilities=("completion", "tools", "thinking"),
                        default_thinking="Hmm, let me weigh every message in turn. " * 40)
    story: Story = await story_for(window=4096, model=thinker)
    for turn in range(12):
        await story.say(words(870, turn, f"(turn {turn})"))
    conversation = story.store.active_conversation(CHAT)
    assert conversation is not None and conversation.summary.fold_count >= 1
    assert conversation.summary.summary == story.fold_text
    assert story.folds() and all(f["think"] is False for f in story.folds())
    assert all(t["think"] is False for t in story.turns())  # model.think defaults to false
    assert story.notices() == []


async def test_model_think_lets_the_turn_think_but_never_shows_it(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(model=FakeModel(capabilities=("completion", "thinking")),
                                   think=True)
    await story.say("hello")
    assert story.turns()[0]["think"] is True
    assert story.channel.texts("reply") == ["echo: hello"]


async def test_a_model_without_tools_is_answered_and_status_says_so(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(model=FakeModel(name="gemma3:4b",
                                                   capabilities=("completion",)))
    await story.say("hello")
    await story.say("what did I say?")
    assert story.notices() == []
    assert story.channel.texts("reply") == ["echo: hello", "echo: what did I say?"]
    for body in story.turns():
        assert not body.get("tools") and "think" not in body
        system = body["messages"][0]["content"]
        assert "<capabilities>" not in system and "your tools" not in system
    await story.say("/status")
    assert "Tools: none" in story.notices()[-1]


async def test_a_503_is_an_outage_told_once_and_answered_when_ollama_is_back(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for()
    story.fake.busy = True
    assert await story.engine.submit(Inbound(chat_key=CHAT, text="are you there?",
                                             received=time.time()))
    # Tried, told, parked and tried again: the third try comes after the notice.
    await story.fake.wait_for_chats(3, timeout=10)
    assert len(story.notices()) == 1
    story.fake.busy = False
    await asyncio.wait_for(story.engine.wait_idle(CHAT), 10)
    assert story.channel.texts("reply") == ["echo: are you there?"]
    [notice] = story.notices()
    assert "not answering" in notice and "saved" in notice


async def test_20_busy_chats_each_get_their_folds(story_for: Callable[..., Any]) -> None:
    story: Story = await story_for(window=4096)
    chats = [f"telegram:{n}" for n in range(1, 21)]

    async def chat(key: str) -> None:
        for turn in range(6):
            text = words(1_500, turn, f"({key} turn {turn})")  # ~500 tokens
            assert await story.engine.submit(Inbound(chat_key=key, text=text,
                                                     received=time.time()))
            await asyncio.wait_for(story.engine.wait_idle(key), 60)

    async with asyncio.timeout(120):
        await asyncio.gather(*(chat(key) for key in chats))
    assert len(story.channel.texts("reply")) == 20 * 6 and story.notices() == []
    for key in chats:
        conversation = story.store.active_conversation(key)
        assert conversation is not None and conversation.summary.fold_count >= 1, key
    story.assert_nothing_cut_or_over_budget()
