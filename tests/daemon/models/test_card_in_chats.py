"""roost acts on a model's card in every chat (issue 44, part 2): a model that writes its tool
calls as text has them run, one that answers empty when it thinks with tools gets no thinking
then, one that reasons in its answer has that taken out, a server seen cutting gets a wider
margin, the measured estimate error starts a new chat's calibration, and a model without a
card is probed quietly once a chat has used it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from daemon.app.assembly import Core, assemble
from daemon.core.messages import Inbound
from daemon.llm.client import ModelClient
from daemon.models.card import Card, load_card, store_cards
from daemon.store import Store
from daemon.turn.tool_loop import TEXT_CALL_APOLOGY, TEXT_CALL_NUDGE
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.fakes.ollama import VERSION, FakeModel, FakeOllama, Reply

CHAT = "console:local"
TEXTY = FakeModel(name="texty:1b", capabilities=("completion", "tools"), tool_style="text")
THINKER = FakeModel(name="thinker:4b", capabilities=("completion", "tools", "thinking"),
                    thinking_style="empty-with-tools")
REASONER = FakeModel(name="reasoner:7b", capabilities=("completion",), thinking_style="inline")
PLAIN = FakeModel(name="plain:3b", capabilities=("completion", "tools"))
SEARCH = {"name": "memory_search", "arguments": {"query": "hedge"}}


def card(name: str, **kinds: Any) -> Card:
    values: dict[str, Any] = dict(
        name=name, ollama_version=VERSION, probed_at="2026-12-01T10:00:00Z", context=32768,
        num_ctx=8192, tools="native", thinking="none", truncate="refuses", estimate_error=0.0,
        load_s=1.0, first_token_s=0.2, tokens_per_s=40.0, cached_share=0.9, vision=None,
        memory=None, memory_vram=None)
    return Card(**(values | kinds))


@dataclass
class Rig:
    core: Core
    fake: FakeOllama
    channel: RecordingChannel

    async def say(self, text: str) -> None:
        engine = self.core.engine
        assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
        await asyncio.wait_for(engine.wait_idle(CHAT), 20)

    def replies(self) -> list[str]:
        return self.channel.texts("reply")

    def stored(self) -> list[Any]:
        conversation = self.core.engine.store.active_conversation(CHAT)
        assert conversation is not None
        return self.core.engine.store.messages(conversation.id)


RigOf = Callable[..., Any]


@pytest.fixture
async def rig_of(make_settings: SettingsFactory) -> AsyncIterator[RigOf]:
    """Builds the daemon's core over a fake Ollama serving `model`, with `cards` stored."""
    opened: list[tuple[Core, FakeOllama, ModelClient, Store]] = []

    async def build(model: FakeModel, cards: tuple[Card, ...] = (), probe: bool = False,
                    **model_settings: Any) -> Rig:
        fake = FakeOllama(models=[model])
        await fake.start()
        settings = make_settings(model={"host": fake.url, "name": model.name,
                                        "retry_backoff": 0.01, "probe_new": probe,
                                        **model_settings})
        own = settings.daemon.state_dir.with_name(f"state{len(opened)}")  # one per rig
        settings = replace(settings, daemon=replace(settings.daemon, state_dir=own))
        if cards:
            store_cards(settings.daemon.state_dir, cards)
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        channel = RecordingChannel()
        core = assemble(settings, store, llm, {"console": channel}, probe=probe)
        core.cards.start()
        llm.habits_of = core.cards.habits
        await core.engine.start()
        opened.append((core, fake, llm, store))
        await wait_until(lambda: core.cards.version is not None)
        return Rig(core, fake, channel)

    yield build
    for core, fake, llm, store in opened:
        await core.engine.stop(grace=0)
        await core.cards.close()
        await llm.close()
        store.close()
        await fake.stop()


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m.get("role") == "tool"]


async def test_a_text_model_has_its_written_call_run_and_never_shown(rig_of: RigOf) -> None:
    rig = await rig_of(TEXTY, (card(TEXTY.name, tools="text"),))
    rig.fake.script(Reply(json.dumps(SEARCH)), Reply("The hedge is by the shed."))
    await rig.say("Use the tool: where is the hedge?")
    assert rig.replies() == ["The hedge is by the shed."]
    second = rig.fake.chat_requests[1]
    assert tool_messages(second) and tool_messages(second)[0]["tool_name"] == "memory_search"
    assert TEXT_CALL_NUDGE not in json.dumps(second)  # run at once, not nudged first
    assert [m.role for m in rig.stored()][-3:] == ["assistant", "tool", "assistant"]
    assert '"name"' not in "".join(rig.channel.deltas)
    await rig.say("/status")
    assert "Card: texty:1b: tools text" in rig.channel.texts()[-1]


async def test_a_text_models_malformed_call_goes_back_as_a_tool_error(rig_of: RigOf) -> None:
    rig = await rig_of(TEXTY, (card(TEXTY.name, tools="text"),))
    rig.fake.script(Reply('<tool_call>{"name": "memory_search", "arguments": {"query": '
                          "</tool_call>"),
                    Reply("<tool_call>" + json.dumps(SEARCH) + "</tool_call>"),
                    Reply("Found it: the hedge is by the shed."))
    await rig.say("Use the tool: where is the hedge?")
    assert rig.replies() == ["Found it: the hedge is by the shed."]
    error = tool_messages(rig.fake.chat_requests[1])[0]["content"]
    assert error.startswith("ERROR: your tool call could not be read")
    assert "memory_search" in error  # the tools it may call, named
    ran = tool_messages(rig.fake.chat_requests[2])
    assert len(ran) == 2 and not ran[1]["content"].startswith("ERROR")


async def test_any_model_that_writes_its_call_again_after_the_nudge_has_it_run(
    rig_of: RigOf,
) -> None:
    rig = await rig_of(PLAIN)  # no card: nudged once, as before
    rig.fake.script(Reply(json.dumps(SEARCH)), Reply(json.dumps(SEARCH)),
                    Reply("The hedge is by the shed."))
    await rig.say("Use the tool: where is the hedge?")
    assert TEXT_CALL_NUDGE in rig.fake.chat_requests[1]["messages"][-1]["content"]
    assert tool_messages(rig.fake.chat_requests[2])
    assert rig.replies() == ["The hedge is by the shed."]


async def test_a_call_that_cannot_be_read_after_the_nudge_still_gets_the_apology(
    rig_of: RigOf,
) -> None:
    rig = await rig_of(PLAIN)
    broken = Reply('{"name": "no_such_tool", "arguments": {}}')
    rig.fake.script(broken, replace(broken))
    await rig.say("Use the tool: where is the hedge?")
    assert rig.replies() == [TEXT_CALL_APOLOGY]


async def test_empty_with_tools_model_gets_no_thinking_with_tools_even_with_think_on(
    rig_of: RigOf,
) -> None:
    rig = await rig_of(THINKER, (card(THINKER.name, thinking="empty-with-tools"),), think=True)
    await rig.say("hello there")
    request = rig.fake.chat_requests[0]
    assert request["tools"] and request["think"] is False
    assert rig.replies() == ["echo: hello there"]


async def test_an_empty_answer_after_thinking_is_asked_again_without_thinking(
    rig_of: RigOf,
) -> None:
    rig = await rig_of(THINKER, think=True)  # no card yet: the first answer comes back empty
    await rig.say("hello there")
    first, again = rig.fake.chat_requests[:2]
    assert first["think"] is True and again["think"] is False
    assert rig.replies() == ["echo: hello there"]


async def test_inline_reasoning_is_neither_shown_nor_stored(rig_of: RigOf) -> None:
    rig = await rig_of(REASONER)  # a <think> block first is reasoning for any model
    await rig.say("hello there")
    assert rig.replies() == ["echo: hello there"]
    assert "<think>" not in "".join(rig.channel.deltas)
    assert all("think>" not in m.content for m in rig.stored())
    # Not replayed either: the next request carries the answer alone.
    await rig.say("and again")
    answers = [m for m in rig.fake.chat_requests[1]["messages"] if m["role"] == "assistant"]
    assert answers == [{"role": "assistant", "content": "echo: hello there"}]


async def test_an_inline_models_unopened_reasoning_is_taken_out_too(rig_of: RigOf) -> None:
    rig = await rig_of(replace(REASONER, thinking_style="separate"),
                       (card(REASONER.name, thinking="inline"),))
    rig.fake.script(Reply("The user greets me, so I greet back.</think>\n\nHello!"))
    await rig.say("hello there")
    assert rig.replies() == ["Hello!"]
    assert "greet back" not in "".join(rig.channel.deltas)


async def test_a_server_seen_cutting_gets_a_wider_margin_and_its_counts_checked(
    rig_of: RigOf,
) -> None:
    plain = await rig_of(PLAIN)
    cutting = await rig_of(PLAIN, (card(PLAIN.name, truncate="cuts"),))
    budgets = []
    for rig in (plain, cutting):
        conversation = await asyncio.to_thread(rig.core.parts.router.conversation_for, CHAT,
                                               time.time())
        prepared = await rig.core.parts.prompting.prepare(conversation, [])
        budgets.append(prepared.budget)
    assert budgets[1] < budgets[0] * 0.93  # 10% kept free instead of 2%
    assert not await plain.core.parts.llm.cuts_silently(PLAIN.name)  # 0.12.6 refuses
    assert await cutting.core.parts.llm.cuts_silently(PLAIN.name)


async def test_a_new_chat_starts_from_the_cards_estimate_error(rig_of: RigOf) -> None:
    rig = await rig_of(PLAIN, (card(PLAIN.name, estimate_error=-0.2),))
    conversation = await asyncio.to_thread(rig.core.parts.router.conversation_for, CHAT,
                                           time.time())
    assert conversation.token_ratio == pytest.approx(1.25)


async def test_a_model_without_a_card_is_probed_quietly_after_its_first_chat(
    rig_of: RigOf,
) -> None:
    rig = await rig_of(TEXTY, probe=True)
    await rig.say("hello there")
    assert rig.replies() == ["echo: hello there"]
    assert rig.fake.chat_requests[0]["messages"][-1]["content"].startswith("hello there")
    await wait_until(lambda: rig.core.cards.card(TEXTY.name) is not None, 20)
    made = rig.core.cards.card(TEXTY.name)
    assert made is not None and made.quick and made.tools == "text"
    state_dir = rig.core.parts.store.state_dir
    assert load_card(state_dir, TEXTY.name, VERSION) == made  # kept for the next start
    # From now on its written calls run at once.
    rig.fake.script(Reply(json.dumps(SEARCH)), Reply("The hedge is by the shed."))
    before = len(rig.fake.chat_requests)
    await rig.say("Use the tool: where is the hedge?")
    assert rig.replies()[-1] == "The hedge is by the shed."
    assert tool_messages(rig.fake.chat_requests[before + 1])


async def test_a_model_that_never_calls_gets_no_tools_and_no_word_of_them(
    rig_of: RigOf,
) -> None:
    offered = await rig_of(PLAIN)
    await offered.say("hello there")
    assert offered.fake.chat_requests[0].get("tools")
    quiet = await rig_of(PLAIN, (card(PLAIN.name, tools="none"),))
    await quiet.say("hello there")
    request = quiet.fake.chat_requests[0]
    assert not request.get("tools")
    assert "tool_search" not in request["messages"][0]["content"]
    assert quiet.replies() == ["echo: hello there"]
