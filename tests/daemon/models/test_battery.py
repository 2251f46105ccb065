"""The battery on its own, against the fake Ollama: the quick battery, requests made through the
model gate (and a chat preempting them), what counts as seeing the picture, a model loaded
before the battery began, and reasoning written out in the content with and without tags."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from daemon.core.config import Settings
from daemon.core.errors import Preempted
from daemon.llm.gate import ModelGate
from daemon.models.card import Card
from daemon.models.probe import THINK_QUESTION, Battery, Through, reasons_in_plain_words
from tests.conftest import SettingsFactory
from tests.fakes.ollama import VERSION, FakeModel, FakeOllama, Reply, echo_reply

T = TypeVar("T")
MODELS = [
    FakeModel("native:4b", capabilities=("completion", "tools", "thinking"),
              tool_style="native", load_duration=3.2),
    FakeModel("eyes:4b", capabilities=("completion", "vision"), vision_reply="Red and blue."),
    FakeModel("plain:3b", capabilities=("completion",), thinking_style="plain"),
    FakeModel("plain-thinker:4b", capabilities=("completion", "thinking"),
              thinking_style="plain"),
    FakeModel("asked:3b", capabilities=("completion",), thinking_style="inline-when-asked"),
    FakeModel("short:1b", capabilities=("completion",)),
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOllama]:
    async with FakeOllama([dataclasses.replace(m) for m in MODELS]) as server:
        yield server


@pytest.fixture
def settings(fake: FakeOllama, make_settings: SettingsFactory) -> Settings:
    return make_settings(model={"host": fake.url, "window": 2048})


async def card_of(settings: Settings, name: str, *, quick: bool = False,
                  through: Through | None = None, version: str = VERSION) -> Card:
    battery = Battery(settings.model, through)
    try:
        return await battery.probe(await battery.target(name), version, quick=quick)
    finally:
        await battery.close()


async def test_the_quick_battery_skips_the_cache_truncation_and_vision_probes(
        fake: FakeOllama, settings: Settings) -> None:
    card = await card_of(settings, "native:4b", quick=True)
    assert card.quick and card.cached_share is None and card.vision is None
    assert card.tools == "native" and card.thinking == "separate"
    assert card.truncate == "refuses"  # 0.12.6 takes `truncate` (ollama/ollama#12582)
    assert card.load_s == 3.2 and card.tokens_per_s == 100.0
    assert card.memory == 2_600_000_000
    chats = fake.chat_requests
    assert len(chats) == 3  # speed, tools, thinking
    assert not [c for c in chats if c.get("truncate") is False]
    full = await card_of(settings, "native:4b")
    assert not full.quick and full.truncate == "refuses"


async def test_the_quick_battery_never_shows_a_picture_and_reads_truncation_off_the_version(
        fake: FakeOllama, settings: Settings) -> None:
    card = await card_of(settings, "eyes:4b", quick=True, version="0.12.5")
    assert card.vision is None and card.truncate == "cuts" and card.quick
    assert not [c for c in fake.chat_requests if any(m.get("images") for m in c["messages"])]
    unknown = await card_of(settings, "eyes:4b", quick=True, version="unknown")
    assert unknown.truncate == "cuts"  # a server that does not say: as roost's client assumes
    newer = await card_of(settings, "eyes:4b", quick=True, version="0.13.0-rc1")
    assert newer.truncate == "refuses"


async def test_every_request_goes_through_the_given_call(
        fake: FakeOllama, settings: Settings) -> None:
    made: list[str] = []

    async def through(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        made.append("request")
        return await make()

    await card_of(settings, "native:4b", through=through)
    await card_of(settings, "eyes:4b", through=through, quick=True)
    assert len(made) == len(fake.chat_requests) > 0


async def test_a_chat_that_wants_the_model_preempts_the_quiet_probe(
        fake: FakeOllama, settings: Settings) -> None:
    gate = ModelGate(concurrency=1)
    fake.hang = True  # the speed probe is under way when the chat comes
    probing = asyncio.create_task(card_of(
        settings, "native:4b", quick=True,
        through=lambda make: gate.call(make, background=True)))
    await fake.wait_for_chats(1)
    async with gate.turn():
        with pytest.raises(Preempted):  # as it is: the daemon tries again later
            await probing
        # A turn holds the model: the next quiet probe does not even start a request.
        with pytest.raises(Preempted):
            await card_of(settings, "native:4b", quick=True,
                          through=lambda make: gate.call(make, background=True))
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize(("reply", "sees"), [
    ("Red and blue.", True), ("BLUE", True), ("It is reddish.", True),
    ("I cannot see images.", False), ("Green.", False), ("", False),
    ("Bored.", False),  # "red" inside another word is no colour
])
async def test_vision_is_the_answer_naming_a_colour_of_the_picture(
        fake: FakeOllama, settings: Settings, reply: str, sees: bool) -> None:
    model = fake.find_model("eyes:4b")
    assert model is not None
    model.vision_reply = reply
    assert (await card_of(settings, "eyes:4b")).vision is sees


async def test_a_model_loaded_before_the_battery_has_no_load_time(
        fake: FakeOllama, settings: Settings) -> None:
    fake.loaded["native:4b"] = 2048  # a chat used it a moment ago
    card = await card_of(settings, "native:4b")
    assert card.load_s is None and card.already_loaded
    fake.loaded.clear()
    cold = await card_of(settings, "native:4b")
    assert cold.load_s == 3.2 and not cold.already_loaded


@pytest.mark.parametrize("quick", [False, True])
async def test_reasoning_in_the_content_is_inline_with_tags_or_without(
        fake: FakeOllama, settings: Settings, quick: bool) -> None:
    assert (await card_of(settings, "plain:3b", quick=quick)).thinking == "inline"
    assert (await card_of(settings, "asked:3b", quick=quick)).thinking == "inline"
    # With the thinking capability but nothing in `thinking`: its reasoning is in the content.
    assert (await card_of(settings, "plain-thinker:4b", quick=quick)).thinking == "inline"
    assert (await card_of(settings, "short:1b", quick=quick)).thinking == "none"


async def test_the_inline_check_is_one_request_and_short_answers_are_no_reasoning(
        fake: FakeOllama, settings: Settings) -> None:
    answers = iter(["42", "17 + 25 = 42", "The answer is 42.",
                    "42\n\nOkay, let me explain. First add the tens, then the ones, so 42."])

    def answer(body: dict[str, Any]) -> Reply:
        asked = body["messages"][-1]["content"] == THINK_QUESTION
        return Reply(content=next(answers)) if asked else echo_reply(body)

    fake.default_reply = answer
    for _ in range(4):
        before = len(fake.chat_requests)
        assert (await card_of(settings, "short:1b", quick=True)).thinking == "none"
        assert len(fake.chat_requests) - before == 2  # speed and the question


@pytest.mark.parametrize("text", [
    "Okay, let me work this out. 17 plus 25... First add the tens... So the answer is 42.",
    "Okay, so I need to figure out what 17 plus 25 is. Let me think. Hmm, 17 plus 20 is 37, "
    "then plus 5 more is 42. So the answer is 42.\n\n42",
    "Let’s break it down step by step. First, add the tens: 10 + 20 = 30. Next, add the ones: "
    "7 + 5 = 12. Then 30 + 12 = 42. Therefore the answer is 42.",
    "Alright, the user wants 17 + 25. Let me check: 17 and 25, the ones make 12, carry",
    "Okay, so first I take 17 and add 25. Let me think: the ones make 12, then the tens 30, so "
    "it is 41.",  # a wrong sum, worked out all the same
])
def test_plain_reasoning_before_the_answer(text: str) -> None:
    finished = not text.endswith("carry")  # the last one ran out of num_predict
    assert reasons_in_plain_words(text, finished=finished)


@pytest.mark.parametrize("text", [
    "42", "42.", "17 + 25 = 42", "The answer is 42.", "The sum of 17 and 25 is 42.",
    "Sure! Let me help you with that. The sum of 17 and 25 is 42.",
    "17 + 25 = 32.",  # what SmolLM2-135M says (tests/llama)
    "42\n\nOkay, let me explain. First add the tens, then the ones, so it is 42.",
    "32. Okay, let me explain. First add the tens, then the ones, so it is 32.",  # wrong, first
    "echo: What is 17 + 25? Answer with the number only.",
    "I'm sorry, I can't help with that.", "",
])
def test_no_reasoning_in_a_short_answer_or_one_explained_after(text: str) -> None:
    assert not reasons_in_plain_words(text)


def test_an_answer_cut_off_while_explaining_itself_is_no_reasoning() -> None:
    explained = "42. Okay, let me explain how: first add the tens, then the ones, and so we"
    assert not reasons_in_plain_words(explained, finished=False)
