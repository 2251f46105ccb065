"""Overflows and cuts anywhere in a turn, against the fake Ollama: a prompt Ollama cut silently
is answered anew, an overflow is refitted and retried once, the user never reads a raw error."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.app.metrics import Metrics
from daemon.context.compact import STATE_REQUEST
from daemon.core.conversations import Message
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.tools.registry import Capability, Tool
from daemon.turn.parts import TurnParts
from daemon.turn.runner import REDONE_LINE
from tests.conftest import RecordingChannel, SettingsFactory, standard_registry
from tests.daemon.turn.test_context_lifecycle import (  # noqa: F401  (rig_for is a fixture)
    Rig,
    ratio_of,
    rig_for,
)
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

GARBLED = "🙂🙂🙂 sorry what"


async def underestimating(rig_for: Callable[..., Any]) -> Rig:  # noqa: F811
    """A rig whose conversation underestimates its tokens by far (ratio 0.5 against the
    fake's 1.33), on a server that cuts although told not to, with a 12 KB tool result."""
    rig: Rig = await rig_for(window=4096)
    rig.fake.predate_truncate()
    await rig.say("first")
    conversation = rig.store.get_conversation(rig.conversation_id())
    assert conversation is not None
    rig.store.save_conversation(replace(conversation, token_ratio=0.5))
    rig.tool_cycle(12_000)
    return rig


async def test_an_answer_to_a_silently_cut_prompt_is_discarded_and_asked_again(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig = await underestimating(rig_for)
    rig.fake.script(GARBLED)  # what the model says to a prompt without its system message
    await rig.say("What does it say?", wait_fold=False)
    # The user saw the dropped answer being written: the reply says why it replaces it.
    assert rig.channel.texts("reply") == ["echo: first",
                                          f"{REDONE_LINE}\n\necho: What does it say?"]
    stored = [m.content for m in rig.store.messages(rig.conversation_id())]
    assert GARBLED not in stored and REDONE_LINE not in stored
    assert rig.fake.cuts == 1  # the request sent again fitted
    assert len(rig.turn_requests()) == 3
    # The cut proves the size: the ratio moved past one step (x1.5), far enough to fit.
    assert ratio_of(rig) > 0.75
    events = rig.engine.parts.records.events("2026-12-01")
    assert sum("silent-cut" in e for e in events) == 1
    # What the console's request table says of it (daemon/console/views.py).
    reply = answer_of(rig)
    assert reply.meta["cut"] == 1 and reply.meta["redone"] == 1
    assert reply.meta["refused"] == 0 and reply.meta["estimate"] > 0


def answer_of(rig: Rig) -> Message:
    """The conversation's last reply, as stored."""
    return [m for m in rig.store.messages(rig.conversation_id()) if m.role == "assistant"][-1]


async def test_a_second_cut_gets_the_user_a_clear_line(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    rig = await underestimating(rig_for)
    # The model's real context is far smaller than /api/show said: every request is cut.
    rig.fake.models[0].context_length = 512
    rig.fake.script(GARBLED, GARBLED)
    await rig.say("What does it say?", wait_fold=False)
    assert rig.channel.texts("reply") == ["echo: first"]
    [notice] = rig.channel.texts("notice")
    assert "context window" in notice and "/compact" in notice
    assert "{" not in notice
    stored = [m.content for m in rig.store.messages(rig.conversation_id())]
    assert GARBLED not in stored and "What does it say?" in stored
    assert len(rig.turn_requests()) == 3


async def test_an_overflow_refused_without_sizes_is_refitted_from_the_window(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    # Ollama with Go runners (before #16031) refuses `truncate: false` over the window in plain
    # words, without the sizes: the prompt was over num_ctx, which is enough to refit.
    rig = await underestimating(rig_for)
    rig.fake.ignores_truncate, rig.fake.go_runner = False, True
    await rig.say("What does it say?", wait_fold=False)
    assert rig.channel.texts("reply") == ["echo: first", "echo: What does it say?"]
    assert rig.channel.texts("notice") == []
    assert rig.fake.overflows == 1 and rig.fake.cuts == 0
    events = rig.engine.parts.records.events("2026-12-01")
    assert sum("overflow-retry" in e for e in events) == 1
    reply = answer_of(rig)  # the refusal, for the console's request table
    assert reply.meta["refused"] == 1 and reply.meta["cut"] == 0
    assert 0 < reply.meta["estimate"] <= reply.meta["budget"]


def overflow(prompt_tokens: int, n_ctx: int) -> Reply:
    """Ollama's 400 for a prompt over num_ctx (llama-server's nested body), as the fake sends."""
    message = (f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx} "
               "tokens), try increasing it")
    return Reply(status=400, error=json.dumps({"error": {
        "code": 400, "message": message, "type": "exceed_context_size_error",
        "n_prompt_tokens": prompt_tokens, "n_ctx": n_ctx}}))


@dataclass
class Pages:
    """An engine with a `fetch_page` tool returning 30 KB pages, on a 4,096 window, whose
    /metrics counters are the daemon's own."""

    engine: Engine
    fake: FakeOllama
    channel: RecordingChannel
    metrics: Metrics
    on_fetch: list[Callable[[], None]]  # run as fetch_page runs

    async def say(self, text: str) -> None:
        assert await self.engine.submit(Inbound(chat_key="console:local", text=text,
                                                received=time.time()))
        await asyncio.wait_for(self.engine.wait_idle("console:local"), 20)

    def counted(self, kind: str) -> float:
        families = text_string_to_metric_families(self.metrics.exposition().decode())
        return sum(s.value for f in families for s in f.samples
                   if s.name == "roost_events_total" and s.labels.get("kind") == kind)

    def events(self, kind: str) -> list[str]:
        day = time.strftime("%Y-%m-%d", time.localtime())
        return [e for e in self.engine.parts.records.events(day) if f"**{kind}**" in e]


@pytest.fixture
async def pages(make_settings: SettingsFactory) -> AsyncIterator[Pages]:
    fake = FakeOllama(models=[FakeModel(context_length=4096,
                                        capabilities=("completion", "tools"))])
    await fake.start()
    settings = make_settings(model={"host": fake.url, "window": 4096, "max_calls": 12},
                             daemon={"timezone": "UTC"})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    metrics = Metrics()
    parts = TurnParts.build(settings=settings, store=store, llm=llm,
                            registry=standard_registry(settings),
                            on_event=lambda kind: metrics.events.labels(kind).inc())
    channel = RecordingChannel()
    engine = Engine(settings=settings, store=store, llm=llm, channels={"console": channel},
                    parts=parts)

    on_fetch: list[Callable[[], None]] = []

    async def fetch_page(context: object, name: str) -> str:
        for hook in on_fetch:
            hook()
        return (f"Page {name} line with facts. " * 1300)[:30_000]

    parts.registry.register(Capability(
        name="pages", core=True, description="fetch pages", tools=(Tool(
            "fetch_page", "Fetch a page by name.",
            {"type": "object", "properties": {"name": {"type": "string"}},
             "required": ["name"]}, fetch_page),)))
    await engine.start()
    try:
        yield Pages(engine, fake, channel, metrics, on_fetch)
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
        await fake.stop()


def fetch(n: int) -> Reply:
    return Reply(tool_calls=[{"function": {"name": "fetch_page", "arguments": {"name": f"p{n}"}}}])


def after_tools(body: dict[str, Any]) -> bool:
    return body["messages"][-1]["role"] == "tool"


async def test_an_overflow_after_a_tool_result_is_refitted_and_retried_once(
    pages: Pages,
) -> None:
    refused: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> Reply:
        if after_tools(body) and not refused:
            refused.append(body)  # Ollama's tokenizer makes twice what the fake counts
            return overflow(2 * pages.fake.count_tokens(body["messages"], body.get("tools")),
                            4096)
        return Reply("The page says: facts.") if after_tools(body) else fetch(0)

    pages.fake.default_reply = answer
    await pages.say("Read page p0 and tell me what it says.")
    assert pages.channel.texts("reply") == ["The page says: facts."]
    assert pages.channel.texts("notice") == []
    retried = pages.fake.chat_requests[-1]
    assert pages.fake.count_tokens(retried["messages"], retried.get("tools")) < \
        pages.fake.count_tokens(refused[0]["messages"], refused[0].get("tools"))
    assert len(pages.events("overflow-retry")) == 1
    assert pages.counted("overflow-retry") == 1


async def test_an_overflow_without_sizes_after_a_tool_result_is_refitted_and_retried(
    pages: Pages,
) -> None:
    refused: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> Reply:
        if after_tools(body) and not refused:
            refused.append(body)  # Ollama's Go runners (before #16031): no sizes in the 400
            return Reply(status=400, error="the input length exceeds the context length")
        return Reply("The page says: facts.") if after_tools(body) else fetch(0)

    pages.fake.default_reply = answer
    await pages.say("Read page p0 and tell me what it says.")
    assert pages.channel.texts("reply") == ["The page says: facts."]
    assert pages.channel.texts("notice") == []
    assert pages.counted("overflow-retry") == 1


async def test_an_overflow_twice_after_a_tool_result_gets_a_clear_line_not_the_raw_body(
    pages: Pages,
) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        return overflow(9000, 4096) if after_tools(body) else fetch(0)

    pages.fake.default_reply = answer
    await pages.say("Read page p0 and tell me what it says.")
    assert pages.channel.texts("reply") == []
    [notice] = pages.channel.texts("notice")
    assert "context window" in notice and "/compact" in notice
    assert "exceed_context_size_error" not in notice and "{" not in notice
    assert len([b for b in pages.fake.chat_requests if after_tools(b)]) == 2
    assert pages.counted("overflow-retry") == 1


async def test_an_overflow_of_the_safety_net_summary_is_retried_once(pages: Pages) -> None:
    queue = [fetch(n) for n in range(8)]
    states: list[int] = []

    def answer(body: dict[str, Any]) -> Reply:
        if any(STATE_REQUEST in str(m.get("content")) for m in body["messages"]):
            states.append(1)
            if len(states) == 1:
                return overflow(9000, 4096)
            return Reply("TASK: read pages\nPROGRESS: some\nREMAINING: more\nDATA: facts\n"
                         "DECISIONS: none")
        if queue and body.get("tools"):  # the last call goes without tools: it answers
            return queue.pop(0)
        return Reply("The pages say: facts.")

    pages.fake.default_reply = answer
    await pages.say("Read the pages and tell me what they say.")
    assert len(states) >= 2, "the safety net never ran"
    assert pages.channel.texts("reply") == [
        "(long turn: I condensed earlier tool results)\n\nThe pages say: facts."]
    assert pages.counted("overflow-retry") == 1


def shrinking_page(pages: Pages, context_length: int) -> None:
    """`fetch_page` that, as it runs, makes the model's real window `context_length`: the next
    request (the one after its result) is cut by a server that ignores `truncate`."""
    pages.fake.predate_truncate()

    def shrink() -> None:
        pages.fake.models[0].context_length = context_length

    pages.on_fetch.append(shrink)


async def test_an_answer_to_a_prompt_cut_after_a_tool_result_is_discarded_and_asked_again(
    pages: Pages,
) -> None:
    # A cut the count proves: under half of what the leanest tokenizer makes of the request.
    shrinking_page(pages, 500)
    answered: list[int] = []

    def answer(body: dict[str, Any]) -> Reply:
        if not after_tools(body):
            return fetch(0)
        pages.fake.models[0].context_length = 4096  # only the first request after it is cut
        answered.append(1)
        return Reply(GARBLED if len(answered) == 1 else "The page says: facts.")

    pages.fake.default_reply = answer
    await pages.say("Read page p0 and tell me what it says.")
    assert pages.channel.texts("reply") == [f"{REDONE_LINE}\n\nThe page says: facts."]
    cid = pages.engine.store.active_conversation("console:local").id  # type: ignore[union-attr]
    assert GARBLED not in [m.content for m in pages.engine.store.messages(cid)]
    assert pages.fake.cuts == 1 and len(answered) == 2
    assert len(pages.events("silent-cut")) == 1


async def test_a_second_cut_after_a_tool_result_gets_a_clear_line(pages: Pages) -> None:
    # Far enough below the shrunk request that the count proves the cut again.
    shrinking_page(pages, 300)
    pages.fake.default_reply = lambda body: Reply(GARBLED) if after_tools(body) else fetch(0)
    await pages.say("Read page p0 and tell me what it says.")
    assert pages.channel.texts("reply") == []
    [notice] = pages.channel.texts("notice")
    assert "context window" in notice and "/compact" in notice
    cid = pages.engine.store.active_conversation("console:local").id  # type: ignore[union-attr]
    assert GARBLED not in [m.content for m in pages.engine.store.messages(cid)]
    assert pages.fake.cuts == 2


def events_of(rig: Rig) -> list[str]:
    return list(rig.engine.parts.records.events("2026-12-01"))


async def test_a_model_without_tools_is_not_judged_cut_by_schemas_it_never_got(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    """Issue 43: a continuation on a model without tools was compared with its prompt plus
    the tool schemas the client never sent (~400 tokens): "Ollama evaluated 301 tokens of
    about 691 sent", the answer the user had seen discarded, the turn ended as too large."""
    rig: Rig = await rig_for(window=2048, capabilities=("completion",))
    rig.fake.predate_truncate()  # a server that could cut: only what was sent may decide
    rig.fake.script(Reply(content="The first half of the answer", done_reason="length"),
                    Reply(content=" and its second half."))
    await rig.say("Tell me a story.", wait_fold=False)
    assert rig.channel.texts("reply") == ["The first half of the answer and its second half."]
    assert not any("silent-cut" in e for e in events_of(rig))
    assert all(not r.get("tools") for r in rig.turn_requests())


async def test_a_low_count_from_a_server_that_refuses_is_no_cut(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    """A server told `truncate: false` refuses an over-window prompt; it never cuts one. A
    count far below roost's estimate (digits the model's vocabulary packs three to a token)
    is the truth there, not a cut: the answer is delivered and the ratio is not raised."""
    rig: Rig = await rig_for(window=32768)
    await rig.say("first")
    before = ratio_of(rig)
    await rig.say("Here are my numbers: " + "7" * 20_000)
    assert rig.channel.texts("reply")[-1].startswith("echo: Here are my numbers")
    assert not any("silent-cut" in e for e in events_of(rig))
    assert ratio_of(rig) <= before


async def test_a_refused_paste_goes_as_its_handle_and_stays_so(
    rig_for: Callable[..., Any],  # noqa: F811
) -> None:
    """Issue 43: a dense paste at a 2K window was refused (`truncate: false`, no sizes said);
    roost raised the ratio 1.00 -> 3.11, could not fit its refit and told the user the
    conversation's setup was too large, and the next turn was refused the same way. The
    paste is what changed since the last request that fitted: it goes as its handle, the
    turn is answered, and later turns replay it so."""
    rig: Rig = await rig_for(window=2048)
    await rig.say("first")
    before = ratio_of(rig)
    paste = "Account export, October\n" + "\n".join(
        f"{n:06d};DE89370400440532013{n:03d};{n * 7.5:.2f}" for n in range(40))
    rig.fake.script(Reply(status=400, error="the input length exceeds the context length"))
    await rig.say(paste, wait_fold=False)
    assert rig.channel.texts("notice") == []
    assert rig.channel.texts("reply")[-1] == "echo: Account export, October"
    refit = rig.turn_requests()[-1]["messages"][-1]["content"]
    assert "left out" in refit and "DE89370400440532013007" not in refit
    assert ratio_of(rig) < before * 1.5  # the ratio was not thrown up for the paste's sake
    await rig.say("thanks")
    replayed = json.dumps(rig.turn_requests()[-1]["messages"])
    assert "Account export, October" in replayed
    assert "DE89370400440532013007" not in replayed
