"""The context lifecycle end to end, against the fake Ollama: what the model is sent over many
turns, the background fold, calibration, the overflow retry and idle rotation."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.context.budget import RATIO_MAX
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.conversations import SummaryState
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.turn.runner import NEW_CONVERSATION_LINE
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT = "telegram:1111111"
DAY0 = 1_796_112_000.0  # 2026-12-01 08:00 UTC
OVERFLOW_BODY = json.dumps({"error": {
    "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192,
    "message": "request (9000 tokens) exceeds the available context size (8192 tokens), "
               "try increasing it"}})


@dataclass
class Clock:
    now: float = DAY0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    """An engine on a fake clock, with the fake model answering turns and folds."""

    engine: Engine
    fake: FakeOllama
    channel: RecordingChannel
    clock: Clock
    fold_delay: float = 0.0
    fold_calls: int = 0
    summaries: list[str] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return self.engine.store

    async def say(self, text: str, *, wait_fold: bool = True) -> None:
        assert await self.engine.submit(Inbound(chat_key=CHAT, text=text, received=self.clock()))
        await asyncio.wait_for(self.engine.wait_idle(CHAT), 20)
        if wait_fold:
            await self.engine.parts.folder.wait(self.conversation_id())
        self.clock.now += 30

    def conversation_id(self) -> str:
        conversation = self.store.active_conversation(CHAT)
        assert conversation is not None
        return conversation.id

    def tool_cycle(self, size: int, name: str = "web_fetch") -> None:
        """A tool call and its result, as the tool loop will store them."""
        cid = self.conversation_id()
        self.store.append_message(cid, "assistant", "", created=self.clock(), tool_calls=(
            {"function": {"name": name, "arguments": {"url": f"https://example.org/{size}"}}},))
        body = (f"Result line for a {size} character page. " * (size // 40 + 1))[:size]
        self.store.append_message(cid, "tool", body, created=self.clock(), tool_name=name)

    def turn_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.chat_requests if not is_fold(r)]


def is_fold(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and str(messages[0].get("content", "")).startswith(FOLD_SYSTEM)


@pytest.fixture
async def rig_for(make_settings: SettingsFactory) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Engine, ModelClient, Store, FakeOllama]] = []

    async def make(*, window: int = 8192, concurrency: int = 1,
                   capabilities: tuple[str, ...] = FakeModel.capabilities, **daemon: Any) -> Rig:
        fake = FakeOllama(models=[FakeModel(context_length=32768, capabilities=capabilities)])
        await fake.start()
        settings: Settings = make_settings(
            model={"host": fake.url, "window": window, "concurrency": concurrency,
                   "retry_backoff": 0.01, "retry_attempts": 2},
            daemon={"timezone": "UTC", **daemon},
        )
        clock = Clock()
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        channel = RecordingChannel("telegram")
        engine = assemble(settings, store, llm, {"telegram": channel}, clock=clock).engine
        rig = Rig(engine, fake, channel, clock)

        def answer(body: dict[str, Any]) -> Reply:
            if is_fold(body):
                rig.fold_calls += 1
                # Distinct per fold, its count in letters: a number none of the folded
                # messages holds is no summary of them (fold_problem).
                count = "".join(chr(ord("a") + int(d)) for d in str(rig.fold_calls))
                summary = f"Summary {count}: the user chats and reads pages."
                rig.summaries.append(summary)
                return Reply(content=summary, delay=rig.fold_delay)
            return echo_reply(body)

        fake.default_reply = answer
        await engine.start()
        made.append((engine, llm, store, fake))
        return rig

    yield make
    for engine, llm, store, fake in made:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
        await fake.stop()


async def test_system_message_is_byte_identical_for_a_day_across_stubs_and_folds(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    for turn in range(50):
        if turn % 5 == 4:
            rig.tool_cycle(6_000)  # becomes a stub two exchanges later
        await rig.say(f"Turn {turn}: tell me something short.")
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None and conversation.summary.fold_count >= 1
    requests = rig.turn_requests()
    assert len(requests) == 50
    stubs = [m for r in requests for m in r["messages"]
             if "not repeated here" in m.get("content", "")]
    assert stubs, "the run crossed no stub boundary"
    systems = {r["messages"][0]["content"] for r in requests}
    assert len(systems) == 1
    # A new calendar day may change it (the memory map is recounted once per day).
    rig.clock.now += 24 * 3600
    await rig.say("Good morning")
    assert rig.turn_requests()[-1]["messages"][0]["content"] != systems.pop()


async def test_300_turns_with_40kb_tool_outputs_never_exceed_the_budget(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    for turn in range(300):
        if turn % 3 == 1:
            rig.tool_cycle(40_000)
        await rig.say(f"Turn {turn}: what does the page say about item {turn}?")
    budget = 8192 - 1024
    real = [rig.fake.count_tokens(r["messages"], r.get("tools")) for r in rig.turn_requests()]
    assert len(real) == 300
    assert max(real) <= budget, f"largest request {max(real)} tokens, budget {budget}"
    assert rig.fake.cuts == 0 and rig.fake.overflows == 0
    last = rig.channel.texts("reply")[-1]
    assert last == "echo: Turn 299: what does the page say about item 299?"
    # One model call per fold, never one per message.
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None
    assert rig.fold_calls == conversation.summary.fold_count


async def test_a_user_fact_from_turn_one_survives_three_folds_word_for_word(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=4096)
    fact = "My locker code is 4921 and the cat is called Miso."
    await rig.say(fact)
    turn = 0
    while (rig.store.get_conversation(rig.conversation_id()) or
           pytest.fail("no conversation")).summary.fold_count < 3:
        turn += 1
        assert turn < 200, "three folds never happened"
        if turn % 2:
            rig.tool_cycle(3_000)
        await rig.say(f"Another thing, number {turn}.")
    summary = rig.store.get_conversation(rig.conversation_id()).summary  # type: ignore[union-attr]
    assert fact in rig.turn_requests()[-1]["messages"][1]["content"]
    assert summary.summary == rig.summaries[-1]
    # The fold was told the previous summary each time, so the model can merge into one.
    folds = [r for r in rig.fake.chat_requests if is_fold(r)]
    assert rig.summaries[-2] in folds[-1]["messages"][1]["content"]


async def test_at_a_2k_window_the_first_message_survives_five_folds_of_trivia(
    rig_for: Callable[..., Any],
) -> None:
    # As with SmolLM2 at 2,048: no tools, and a fold model that never writes the notes.
    rig: Rig = await rig_for(window=2048, capabilities=("completion",))
    fact = "My name is Dana, my cat is Pickle, I live in Lisbon."
    await rig.say(fact)
    turn = 0
    while (rig.store.get_conversation(rig.conversation_id()) or
           pytest.fail("no conversation")).summary.fold_count < 5:
        turn += 1
        assert turn < 300, "five folds never happened"
        await rig.say(f"Tell me a short joke about the number {turn}, " + "please " * 12)
    requests = rig.turn_requests()
    assert all(fact in json.dumps(r["messages"], ensure_ascii=False) for r in requests)
    assert rig.fake.cuts == 0 and rig.fake.overflows == 0


async def test_after_folds_the_newest_tool_call_and_its_result_are_still_sent_verbatim(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=4096)
    await rig.say("Look up the opening hours of the library.")
    rig.tool_cycle(600, name="web_search")
    stored = rig.store.messages(rig.conversation_id())[-1].content
    turn = 0
    while (rig.store.get_conversation(rig.conversation_id()) or
           pytest.fail("no conversation")).summary.fold_count < 2:
        turn += 1
        assert turn < 200, "two folds never happened"
        await rig.say(f"Something else, number {turn}: " + "words " * 40)
    await rig.say("And when does it close?")
    last = rig.turn_requests()[-1]["messages"]
    calls = [m for m in last if m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["name"] for c in calls] == ["web_search"]
    after = last[last.index(calls[0]) + 1]
    assert after["role"] == "tool" and after["content"] == stored


async def test_a_fold_stuck_on_a_slow_model_does_not_delay_a_turn(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=8192)
    # The fold's model call does not answer within the test: a turn that waited for it would
    # never be answered (say waits for the worker idle, bounded).
    rig.fold_delay = 3600.0
    # The fake's bytes/3 is twice the estimate for prose: the ratio takes a few turns to learn
    # it, and a request that nearly filled its budget meanwhile would owe the fold to the next
    # turn (which then waits for it, as it should): a warm-up, and a window with room.
    for _ in range(4):
        await rig.say("Hello", wait_fold=False)
    for turn in range(12):
        rig.tool_cycle(4_000)
        await rig.say(f"Filling turn {turn}", wait_fold=False)
        if rig.fold_calls:
            break
    assert rig.fold_calls, "no fold was started"
    await rig.fake.wait_for_chats(len(rig.fake.chat_requests))
    await rig.say("Are you still quick?", wait_fold=False)
    assert rig.channel.texts("reply")[-1] == "echo: Are you still quick?"
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None and conversation.summary.fold_count == 0  # preempted


async def test_a_turn_saved_during_a_fold_is_intact_and_the_boundary_is_the_pinned_id(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=4096, concurrency=2)
    rig.fold_delay = 0.5
    await rig.say("Hello", wait_fold=False)
    for turn in range(12):
        rig.tool_cycle(4_000)
        await rig.say(f"Filling turn {turn}", wait_fold=False)
        if rig.engine.parts.folder.busy(rig.conversation_id()):
            break
    cid = rig.conversation_id()
    assert rig.engine.parts.folder.busy(cid), "no fold in flight"
    before = rig.store.messages(cid)
    await rig.say("Saved while the fold runs", wait_fold=False)
    await rig.engine.parts.folder.wait(cid)
    after = rig.store.messages(cid)
    assert after[: len(before)] == before
    assert [m.content for m in after[len(before):]] == [
        "Saved while the fold runs", "echo: Saved while the fold runs"]
    summary = rig.store.get_conversation(cid).summary  # type: ignore[union-attr]
    assert summary.fold_count == 1
    pinned = [m for m in after if m.seq == summary.through_seq]
    assert pinned and pinned[0].id == summary.through_id
    assert summary.through_seq < len(before)


async def test_an_overflow_is_retried_once_after_recalibrating(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    await rig.say("hello")
    ratio_before = rig.store.get_conversation(rig.conversation_id()).token_ratio  # type: ignore[union-attr]
    rig.fake.script(Reply(status=400, error=OVERFLOW_BODY))
    await rig.say("and now?")
    assert rig.channel.texts("reply")[-1] == "echo: and now?"
    assert len(rig.turn_requests()) == 3  # hello, the refused one, the retry
    ratio_after = rig.store.get_conversation(rig.conversation_id()).token_ratio  # type: ignore[union-attr]
    assert ratio_after != ratio_before
    events = rig.engine.parts.records.events("2026-12-01")
    assert sum("overflow-retry" in e for e in events) == 1


async def test_an_overflow_is_retried_a_bounded_number_of_times(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    rig.fake.script(*(Reply(status=400, error=OVERFLOW_BODY) for _ in range(3)))
    await rig.say("too big every time")
    assert len(rig.turn_requests()) == 3  # the request and two refits
    [notice] = rig.channel.texts("notice")
    assert "context window" in notice and "/compact" in notice
    assert "exceed_context_size_error" not in notice and "{" not in notice  # no raw body
    assert rig.channel.texts("reply") == []
    # The message is kept and the next one is answered normally.
    await rig.say("smaller now")
    assert rig.channel.texts("reply") == ["echo: smaller now"]


async def test_a_silent_cut_is_noticed_and_the_ratio_raised(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=4096)
    rig.fake.predate_truncate()  # a server that cuts although told not to
    await rig.say("first")
    cid = rig.conversation_id()
    # Pretend calibration went badly wrong: roost now underestimates by far.
    conversation = rig.store.get_conversation(cid)
    assert conversation is not None
    rig.store.save_conversation(conversation.__class__(**{**conversation.__dict__,
                                                          "token_ratio": 0.5}))
    rig.tool_cycle(12_000)
    await rig.say("What does it say?", wait_fold=False)
    assert rig.fake.cuts == 1
    events = rig.engine.parts.records.events("2026-12-01")
    assert any("silent-cut" in e for e in events)
    assert rig.store.get_conversation(cid).token_ratio > 0.5  # type: ignore[union-attr]


def ratio_of(rig: Rig) -> float:
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None
    return conversation.token_ratio


async def test_a_server_counting_only_uncached_tokens_makes_no_false_cuts(
    rig_for: Callable[..., Any],
) -> None:
    # Ollama 0.30.x before ollama/ollama#16428: prompt_eval_count leaves out the cached part,
    # so every turn after the first reads far below what was sent.
    rig: Rig = await rig_for()
    rig.fake.uncached_only = True
    rig.fake.version = "0.30.1"
    for turn in range(13):
        await rig.say(f"Turn {turn}: " + "tell me about the weather and the sea. " * 40)
    assert len(rig.channel.texts("reply")) == 13
    assert rig.fake.cuts == 0
    events = rig.engine.parts.records.events("2026-12-01")
    assert not [e for e in events if "silent-cut" in e]
    # The fake's tokenizer takes bytes/3: the true ratio is about 1.33, not the cap of 4.
    assert ratio_of(rig) < 2.0


async def test_the_cached_count_is_read_when_the_server_reports_it(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    rig.fake.report_cached = True
    for turn in range(4):
        await rig.say(f"Turn {turn}: " + "tell me about the weather and the sea. " * 40)
    replies = [m for m in rig.store.messages(rig.conversation_id()) if m.role == "assistant"]
    cached = [m.meta.get("prompt_eval_cached_count") for m in replies]
    # The first request met an empty cache; each later one found the one before it there.
    assert cached[0] == 0 and all(isinstance(c, int) and c > 0 for c in cached[1:])
    assert all(c < m.meta["prompt_eval_count"] for c, m in zip(cached, replies, strict=True))
    assert 1.0 <= ratio_of(rig) < 2.0


async def test_a_ratio_at_its_cap_with_a_pinned_tool_call_does_not_lock_the_conversation(
    rig_for: Callable[..., Any],
) -> None:
    # The wedge: false silent cuts pushed the ratio to its cap while the newest tool call (long
    # arguments, a long error) was pinned, and the summary is at its size limit. Every message
    # then got "context window is too small", after a restart too, until /new.
    rig: Rig = await rig_for()
    await rig.say("hello")
    cid = rig.conversation_id()
    history = rig.store.messages(cid)
    rig.store.save_summary(cid, SummaryState(
        summary="The user talks about the sea. " * 200, user_notes="- likes boats",
        through_seq=history[-1].seq, through_id=history[-1].id))
    rig.store.append_message(cid, "user", "save this for me", created=rig.clock())
    rig.store.append_message(cid, "assistant", "", created=rig.clock(), tool_calls=(
        {"function": {"name": "file_write", "arguments": {"text": "a long note " * 500}}},))
    rig.store.append_message(cid, "tool", "Error: " + "no such directory\n" * 1_500,
                             created=rig.clock(), tool_name="file_write",
                             meta={"error": True, "shown_chars": 4_000})
    conversation = rig.store.get_conversation(cid)
    assert conversation is not None
    rig.store.save_conversation(replace(conversation, token_ratio=RATIO_MAX))
    for text in ("did it work?", "try again later", "thanks"):
        await rig.say(text, wait_fold=False)
    assert rig.channel.texts("reply")[-3:] == [
        "echo: did it work?", "echo: try again later", "echo: thanks"]
    assert not [n for n in rig.channel.texts("notice") if "too small" in n]
    for body in rig.turn_requests():  # and roost sent nothing Ollama had to cut
        assert rig.fake.count_tokens(body["messages"], body.get("tools")) \
            <= body["options"]["num_ctx"]
    assert ratio_of(rig) < RATIO_MAX - 1  # Ollama's counts bring it back down


async def test_idle_chat_rotates_on_the_timer_and_the_next_reply_says_so(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    await rig.say("morning")
    first = rig.conversation_id()
    rig.clock.now += 3 * 3600 - 60
    assert await rig.engine.upkeep.rotate_idle() == []
    rig.clock.now += 120
    assert await rig.engine.upkeep.rotate_idle() == [first]
    assert rig.store.active_conversation(CHAT) is None
    assert rig.store.get_conversation(first).status == "archived"  # type: ignore[union-attr]
    await rig.say("evening")
    await rig.say("and again")
    replies = rig.channel.texts("reply")
    assert replies[1] == f"{NEW_CONVERSATION_LINE}\n\necho: evening"
    assert replies[2] == "echo: and again"
    second = rig.store.get_conversation(rig.conversation_id())
    assert second is not None and second.id != first
    # The stored reply is the model's words alone.
    assert [m.content for m in rig.store.messages(second.id)][1] == "echo: evening"
    events = rig.engine.parts.records.events("2026-12-01")
    assert any("rotation" in e and first in e for e in events)


async def test_status_and_compact(rig_for: Callable[..., Any]) -> None:
    rig: Rig = await rig_for()
    for turn in range(10):
        await rig.say(f"Message {turn} " + "words " * 40, wait_fold=False)
    await rig.say("/status")
    status = rig.channel.texts("notice")[-1]
    assert "Window: 8,192 tokens" in status and "20 messages" in status
    # The budget shown is the one the turns' requests are fitted to (window less the reply's
    # reserve less the tool schemas), as recorded with the last request (the schemas' estimate
    # moves a few tokens with the calibration).
    last = json.loads(max((rig.store.state_dir / "debug").glob("*.json")).read_text("utf-8"))
    found = re.search(r"of ([\d,]+) tokens", status)
    assert found is not None and "Summary: none yet" in status
    assert abs(int(found.group(1).replace(",", "")) - last["budget"]) <= 12 < 7_168 - last["budget"]
    await rig.say("/compact")
    # Everything but the newest exchange: 18 of the 20 messages.
    assert rig.channel.texts("notice")[-1].startswith("Folded 18 messages")
    await rig.say("/status")
    status = rig.channel.texts("notice")[-1]
    assert "Summary: " in status and "covering messages 1-18;" in status and "1 folds" in status


async def test_compact_folds_until_nothing_is_left_at_most_12_folds_and_says_so(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for(window=2048, capabilities=("completion",))
    await rig.say("Hello there.")
    cid = rig.conversation_id()
    for n in range(200):  # 400 messages: 25 a fold at 2,048, so more than 12 folds' worth
        rig.store.append_message(cid, "user", f"Question {n} about the allotment.",
                                 created=rig.clock())
        rig.store.append_message(cid, "assistant", f"Answer {n}: water the beans.",
                                 created=rig.clock())
    await rig.say("/compact")
    said = rig.channel.texts("notice")[-1]
    summary = (rig.store.get_conversation(cid) or pytest.fail("gone")).summary
    assert rig.fold_calls == 12 == summary.fold_count
    assert said.startswith(f"Folded {summary.through_seq} messages in 12 folds")
    assert "/compact again" in said
    await rig.say("/compact")
    said = rig.channel.texts("notice")[-1]
    summary = (rig.store.get_conversation(cid) or pytest.fail("gone")).summary
    # Everything but the newest exchange (the /compact commands are not messages).
    assert summary.through_seq == 400
    assert said.startswith("Folded ") and " folds" in said
    assert said.endswith("the last few stay word for word.")
    await rig.say("/compact")
    assert rig.channel.texts("notice")[-1].startswith("Nothing folded")


async def test_debug_keeps_the_last_50_requests_with_their_parts(
    rig_for: Callable[..., Any],
) -> None:
    rig: Rig = await rig_for()
    for turn in range(53):
        await rig.say(f"Turn {turn}", wait_fold=False)
    snapshots = sorted((rig.store.state_dir / "debug").glob("*.json"))
    assert len(snapshots) == 50
    last = json.loads(snapshots[-1].read_text("utf-8"))
    assert set(last["parts"]) == {"prefix", "summary", "tail", "tools"}
    # The budget is the window less the reply's reserve less the tool schemas, less a 2% margin
    # for what the calibrated estimate may still miss.
    assert last["estimate"] <= last["budget"]
    room = 8192 - 1024 - last["parts"]["tools"]
    assert last["budget"] == room - room // 50
    assert last["parts"]["tools"] > 0
    assert last["messages"][-1]["content"].startswith("Turn 52")


async def test_a_turn_cancelled_while_it_waits_for_an_owed_fold_stops_there(
    rig_for: Callable[..., Any],
) -> None:
    # Shutdown cancels a chat's worker; one waiting for an owed fold must not go on into a
    # fold of its own (a model call nobody waits for, holding the stop).
    rig: Rig = await rig_for(window=4096)
    rig.fold_delay = 30.0
    await rig.say("Hello", wait_fold=False)
    for turn in range(2):  # something to fold, short of a fold of its own
        rig.tool_cycle(1_000)
        await rig.say(f"Filling turn {turn}", wait_fold=False)
    cid = rig.conversation_id()
    assert rig.fold_calls == 0
    rig.engine.parts.folder.schedule(cid, urgent=True)  # owed, and its background try hangs
    await rig.fake.wait_for_chats(len(rig.fake.chat_requests) + 1, timeout=10)
    assert rig.fold_calls == 1
    landing = asyncio.create_task(rig.engine.parts.folder.land(cid))
    async with asyncio.timeout(10):  # cancelled only once it waits for the fold in flight
        while not rig.engine.parts.folder.waiting_to_land(cid):  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.01)
    assert not landing.done() and rig.engine.parts.folder.busy(cid)
    landing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(landing, 10)
    assert not rig.engine.parts.folder.waiting_to_land(cid)
    assert rig.fold_calls == 1  # no foreground fold was started
