"""Tools and recall against the fake Ollama: the tool loop, failures, the in-turn safety net,
continuations, written-out tool calls, images, and finding folded facts again."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import Image

from daemon.app.assembly import assemble
from daemon.context.compact import STATE_REQUEST
from daemon.context.fold import FOLD_SYSTEM
from daemon.core.config import Settings
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.attachments import store_file, store_image
from daemon.tools.builtin import ToolContext, conversation_read, memory_search
from daemon.tools.registry import Capability, Tool
from daemon.turn.tool_loop import CONTEXT_FULL_NOTE, CUT_OFF_NOTE, TEXT_CALL_APOLOGY
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply, echo_reply

CHAT = "console:local"


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": tool, "arguments": arguments}}


def last_user(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


def is_fold(body: dict[str, Any]) -> bool:
    return str(body["messages"][0]["content"]).startswith(FOLD_SYSTEM)


@dataclass
class Setup:
    engine: Engine
    fake: FakeOllama
    channel: RecordingChannel

    @property
    def store(self) -> Store:
        return self.engine.store

    async def say(self, text: str, attachments: tuple[dict[str, Any], ...] = ()) -> None:
        assert await self.engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time(),
                                                attachments=attachments))
        await asyncio.wait_for(self.engine.wait_idle(CHAT), 30)

    def conversation_id(self) -> str:
        conversation = self.store.active_conversation(CHAT)
        assert conversation is not None
        return conversation.id

    def turn_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.chat_requests if not is_fold(r)]


@pytest.fixture
async def setup_for(make_settings: SettingsFactory) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[Engine, ModelClient, Store, FakeOllama]] = []

    async def make(*, capabilities: tuple[str, ...] = ("completion", "tools"),
                   **model: Any) -> Setup:
        fake = FakeOllama(models=[FakeModel(context_length=32768, capabilities=capabilities)])
        await fake.start()
        settings: Settings = make_settings(model={"host": fake.url, "retry_backoff": 0.01,
                                                  **model})
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        channel = RecordingChannel()
        engine = assemble(settings, store, llm, {"console": channel}).engine
        await engine.start()
        made.append((engine, llm, store, fake))
        return Setup(engine, fake, channel)

    yield make
    for engine, llm, store, fake in made:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
        await fake.stop()


def tool_messages(setup: Setup) -> list[tuple[str | None, str]]:
    return [(m.tool_name, m.content) for m in setup.store.messages(setup.conversation_id())
            if m.role == "tool"]


async def test_a_fact_folded_away_three_folds_ago_is_found_and_read_back_byte_for_byte(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for(window=4096)
    fact = "The spare key is under the blue flowerpot — 🌼 left of the door."

    def answer(body: dict[str, Any]) -> Reply:
        return Reply(content="Summary: chatting.") if is_fold(body) else echo_reply(body)

    setup.fake.default_reply = answer
    await setup.say(fact)
    cid = setup.conversation_id()
    turn = 0
    while (setup.store.get_conversation(cid) or pytest.fail("gone")).summary.fold_count < 3:
        turn += 1
        assert turn < 300, "three folds never happened"
        await setup.say(f"Filler message number {turn} about nothing in particular. " * 3)
        await setup.engine.parts.folder.wait(cid)
    # The fact's message is folded: the model no longer sees it verbatim.
    last_request = setup.turn_requests()[-1]
    assert not any(fact == m.get("content") for m in last_request["messages"])
    context = ToolContext(store=setup.store, settings=setup.engine.settings,
                          registry=setup.engine.parts.registry, conversation_id=cid,
                          clock=time.time, index=setup.engine.parts.index)
    found = await memory_search(context, "where is the spare key")
    assert f"msg:{cid}:1" in found.splitlines()[1]
    original = await conversation_read(context, cid, 1, 1)
    assert original.splitlines()[-1] == fact
    assert original.endswith("\n" + fact)


async def test_the_model_recalls_through_memory_search_in_a_turn(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    await setup.say("Remember: my bike lock combination is 7342.")
    setup.fake.script(Reply(tool_calls=[call("memory_search", query="bike lock combination")]),
                      Reply(content="It is 7342."))
    await setup.say("What was my bike lock combination?")
    [(name, result)] = tool_messages(setup)
    assert name == "memory_search" and "7342" in result
    assert setup.channel.texts("reply")[-1] == "It is 7342."
    # The result went back to the model in the same turn, after its call.
    second = setup.turn_requests()[-1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "memory_search"
    assert second[-1]["role"] == "tool" and "7342" in second[-1]["content"]


async def test_twelve_30kb_tool_results_in_one_turn_stay_within_the_budget(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for(max_calls=16)
    pages = {f"page{n}": (f"Page {n} line with facts. " * 1300)[:30_000] for n in range(12)}

    async def fetch_page(context: object, name: str) -> str:
        return pages[name]

    setup.engine.parts.registry.register(Capability(
        name="pages", core=True, description="fetch pages", tools=(Tool(
            "fetch_page", "Fetch a page by name.",
            {"type": "object", "properties": {"name": {"type": "string"}},
             "required": ["name"]}, fetch_page),)))
    plan = [Reply(tool_calls=[call("fetch_page", name=f"page{2 * i}"),
                              call("fetch_page", name=f"page{2 * i + 1}")]) for i in range(6)]

    def answer(body: dict[str, Any]) -> Reply:
        if STATE_REQUEST in last_user(body):
            return Reply(content="TASK: read 12 pages\nPROGRESS: some read\nREMAINING: the rest"
                                 "\nDATA: facts\nDECISIONS: none")
        return plan.pop(0) if plan else Reply(content="All 12 pages say: facts.")

    setup.fake.default_reply = answer
    await setup.say("Read the twelve pages and tell me what they say.")
    assert len(tool_messages(setup)) == 12
    assert all(len(content) == 30_000 for _, content in tool_messages(setup))  # store keeps all
    [reply] = setup.channel.texts("reply")
    assert reply.endswith("All 12 pages say: facts.") and "long turn:" in reply
    budget = 8192 - 1024
    for body in setup.fake.chat_requests:
        assert setup.fake.count_tokens(body["messages"], body.get("tools")) <= budget
    assert setup.fake.cuts == 0 and setup.fake.overflows == 0
    events = setup.engine.parts.records.events(time.strftime("%Y-%m-%d", time.gmtime()))
    assert any("compaction" in e and "targets cut" in e for e in events)


async def test_every_kind_of_tool_failure_is_an_error_result_and_the_turn_finishes(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()

    async def explode(context: object) -> str:
        raise RuntimeError("disk on fire")

    async def dawdle(context: object) -> str:
        await asyncio.sleep(10)
        return "too late"

    setup.engine.parts.registry.register(Capability(name="flaky", core=True, description="flaky",
                                              tools=(
        Tool("explode", "Raises.", {"type": "object", "properties": {}}, explode),
        Tool("dawdle", "Hangs.", {"type": "object", "properties": {}}, dawdle, timeout=0.1),
    )))
    setup.fake.script(
        Reply(tool_calls=[call("explode"), call("dawdle"), call("memory_search", limit=3),
                          call("memory_get", ref=42), call("no_such_tool", x=1),
                          call("file_read", path="attachments/x.txt")]),
        Reply(content="Sorry, my tools failed."))
    await setup.say("Try your tools")
    results = tool_messages(setup)
    assert [name for name, _ in results] == ["explode", "dawdle", "memory_search",
                                             "memory_get", "no_such_tool", "file_read"]
    assert all(content.startswith("ERROR: ") for _, content in results)
    assert "disk on fire" in results[0][1]
    assert "timed out" in results[1][1]
    assert "missing required argument(s): query" in results[2][1]
    assert "'ref' must be a string" in results[3][1]
    assert "no tool named 'no_such_tool'" in results[4][1]
    assert "not loaded: call tool_activate" in results[5][1]
    assert setup.channel.texts("reply") == ["Sorry, my tools failed."]


async def test_a_tool_that_raises_is_logged_with_its_traceback(
    setup_for: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    setup: Setup = await setup_for()

    async def explode(context: object) -> str:
        raise RuntimeError("disk on fire")

    setup.engine.parts.registry.register(Capability(name="flaky", core=True, description="flaky",
                                              tools=(
        Tool("explode", "Raises.", {"type": "object", "properties": {}}, explode),)))
    setup.fake.script(Reply(tool_calls=[call("explode")]), Reply(content="It broke."))
    with caplog.at_level(logging.WARNING, logger="roost"):
        await setup.say("Try it")
    assert setup.channel.texts("reply") == ["It broke."]
    assert any(r.exc_info and "disk on fire" in str(r.exc_info[1]) for r in caplog.records)


async def test_a_capability_is_activated_and_used_in_the_same_turn(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    # The user sent a file in an earlier conversation of this chat (file_read reads only files
    # the user sent); the new one starts without the files capability.
    notes = store_file(b"first line\nsecond line\nthird line\n",
                       setup.store.state_dir / "attachments", name="notes.txt", mime=None)
    await setup.say("hello, here are my notes", attachments=(notes.to_doc(),))
    setup.engine.parts.router.rotate(CHAT, time.time())
    setup.fake.script(Reply(tool_calls=[call("tool_activate", name="files")]),
                      Reply(tool_calls=[call("file_read", path=notes.ref,
                                             from_line=2, to_line=2)]),
                      Reply(content="The second line says: second line."))
    await setup.say("What is on line 2 of my notes?")
    results = tool_messages(setup)
    assert results[0] == ("tool_activate",
                          "Loaded files: you can call file_read, files_list, image_view now.")
    assert results[1][1].endswith("2: second line")
    conversation = setup.store.active_conversation(CHAT)
    assert conversation is not None and conversation.active_tools == ("files",)
    requests = setup.turn_requests()
    tools_of = [[t["function"]["name"] for t in r.get("tools", [])] for r in requests]
    assert "file_read" not in tools_of[1] and "file_read" in tools_of[2]
    # Another chat's prefix does not change.
    assert await setup.engine.submit(Inbound(chat_key="telegram:5", text="hi",
                                             received=time.time()))
    setup.engine.channels["telegram"] = setup.channel
    await asyncio.wait_for(setup.engine.wait_idle("telegram:5"), 10)
    other = setup.turn_requests()[-1]
    assert "- files [loaded]" not in other["messages"][0]["content"]
    assert "- files: " in other["messages"][0]["content"]


async def test_a_tool_call_written_as_text_is_not_run_and_not_shown(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    written = json.dumps({"name": "memory_search", "arguments": {"query": "cats"}})
    setup.fake.script(Reply(content=written, chunks=6), Reply(content="Cats: none found."))
    await setup.say("Do I have cats?")
    assert tool_messages(setup) == []
    assert setup.channel.texts("reply") == ["Cats: none found."]
    assert "memory_search" not in "".join(setup.channel.deltas)
    nudged = setup.turn_requests()[-1]["messages"][-1]["content"]
    assert "tool-calling interface" in nudged
    # A model that insists with a call that cannot be run gets the user a plain apology,
    # never the JSON (one it can run is run: tests/daemon/models/test_card_in_chats.py).
    unknown = json.dumps({"name": "cat_search", "arguments": {"query": "cats"}})
    setup.fake.script(Reply(content=unknown), Reply(content=f"```json\n{unknown}\n```"))
    await setup.say("Really?")
    assert setup.channel.texts("reply")[-1] == TEXT_CALL_APOLOGY
    assert "cat_search" not in "".join(setup.channel.deltas)


async def test_the_context_full_guard_stops_a_length_loop(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for(window=4096, response_reserve=512)
    setup.fake.default_reply = lambda body: Reply(content="word " * 2400, done_reason="length")
    await setup.say("Write me an endless poem")
    assert len(setup.turn_requests()) == 1
    reply = setup.channel.texts("reply")[0]
    assert reply.endswith(CONTEXT_FULL_NOTE) and reply.startswith("word word")
    events = setup.engine.parts.records.events(time.strftime("%Y-%m-%d", time.gmtime()))
    assert any("**context-full**" in e for e in events)


async def test_a_cut_off_answer_is_continued_a_bounded_number_of_times(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    setup.fake.default_reply = lambda body: Reply(content="part. ", done_reason="length")
    await setup.say("Go on and on")
    assert len(setup.turn_requests()) == 4  # the answer and three continuations
    assert setup.channel.texts("reply")[0].startswith("part. part. part. part.")
    assert setup.channel.texts("reply")[0].endswith(CUT_OFF_NOTE.strip())
    continued = setup.turn_requests()[1]["messages"]
    assert continued[-2] == {"role": "assistant", "content": "part. "}
    assert "Continue exactly where" in continued[-1]["content"]
    events = setup.engine.parts.records.events(time.strftime("%Y-%m-%d", time.gmtime()))
    assert sum("**continuation**" in e for e in events) == 3
    # The note is the user's only: the stored answer, replayed next turn, is the model's words.
    stored = [m.content for m in setup.store.messages(setup.conversation_id())
              if m.role == "assistant"]
    assert stored == ["part. part. part. part."]
    await setup.say("ok")
    replayed = json.dumps(setup.turn_requests()[-1]["messages"])
    assert "cut off" not in replayed and "part. part." in replayed


async def test_a_label_copied_at_the_end_of_a_cut_off_piece_is_not_in_the_reply(
    setup_for: Callable[..., Any],
) -> None:
    """Issue 43: the pieces of a continued answer were joined before roost's copied labels
    were taken off, which it did only at the reply's end: a label ending the first piece
    ("[… 60 characters left out: a") was delivered mid-reply, stored and replayed."""
    setup: Setup = await setup_for()
    setup.fake.script(
        Reply(content="The code is 4417.\n[… 60 characters left out: a", done_reason="length"),
        Reply(content="The account ends in 0091."))
    await setup.say("Remind me of my numbers")
    reply = setup.channel.texts("reply")[0]
    assert "left out" not in reply
    assert "4417" in reply and "0091" in reply
    stored = [m.content for m in setup.store.messages(setup.conversation_id())
              if m.role == "assistant"]
    assert not any("left out" in m for m in stored)


async def test_system_message_first_templates_are_adapted_and_remembered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory,
) -> None:
    llm = ModelClient(make_settings(model={"host": fake_ollama.url}).model)
    try:
        fake_ollama.script(Reply(status=500, error="template: System message must be at the "
                                                   "beginning"), "ok", "ok again")
        messages = [{"role": "system", "content": "prefix"}, {"role": "user", "content": "hi"},
                    {"role": "system", "content": "a late note"}]
        assert (await llm.chat(messages)).content == "ok"
        assert (await llm.chat(messages)).content == "ok again"
        sent = fake_ollama.chat_requests
        assert [m["role"] for m in sent[0]["messages"]] == ["system", "user", "system"]
        assert [m["role"] for m in sent[1]["messages"]] == ["system", "user", "user"]
        assert [m["role"] for m in sent[2]["messages"]] == ["system", "user", "user"]
    finally:
        await llm.close()


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "JPEG")
    return out.getvalue()


async def test_pixels_go_to_a_model_that_can_see(setup_for: Callable[..., Any]) -> None:
    seeing: Setup = await setup_for(capabilities=("completion", "tools", "vision"))
    image = store_image(jpeg(2048, 1024), seeing.store.state_dir / "attachments")
    await seeing.say("What is this?", attachments=(image.to_doc(),))
    last = seeing.turn_requests()[-1]["messages"][-1]
    assert len(last["images"]) == 1
    assert Image.open(io.BytesIO(base64.b64decode(last["images"][0]))).size == (1024, 512)
    assert seeing.channel.texts("notice") == []
    # Only the newest image is sent as pixels; the older one becomes a note.
    second = store_image(jpeg(300, 200), seeing.store.state_dir / "attachments")
    await seeing.say("And now this one?", attachments=(second.to_doc(),))
    messages = seeing.turn_requests()[-1]["messages"]
    assert [len(m.get("images", [])) for m in messages if m["role"] == "user"] == [0, 1]
    assert "image 1024x512 sent earlier" in messages[1]["content"]


async def test_a_model_that_cannot_see_gets_a_note_and_the_user_is_told(
    setup_for: Callable[..., Any],
) -> None:
    blind: Setup = await setup_for()
    image = store_image(jpeg(640, 480), blind.store.state_dir / "attachments")
    await blind.say("And this?", attachments=(image.to_doc(),))
    last = blind.turn_requests()[-1]["messages"][-1]
    assert "images" not in last and "cannot see images" in last["content"]
    [notice] = blind.channel.texts("notice")
    assert "cannot see images" in notice


async def test_a_model_that_cannot_see_is_told_of_once_per_photo_not_before_every_reply(
    setup_for: Callable[..., Any],
) -> None:
    blind: Setup = await setup_for()
    image = store_image(jpeg(640, 480), blind.store.state_dir / "attachments")
    await blind.say("And this?", attachments=(image.to_doc(),))
    for text in ("what else?", "and then?", "thanks"):
        await blind.say(text)
    # The photo stays the newest image in the request (noted, not shown), yet the user heard
    # about it once; the replies all came.
    assert len(blind.channel.texts("reply")) == 4
    assert len(blind.channel.texts("notice")) == 1
    second = store_image(jpeg(300, 200), blind.store.state_dir / "attachments")
    await blind.say("and this one?", attachments=(second.to_doc(),))
    await blind.say("ok")
    assert len(blind.channel.texts("notice")) == 2  # once for the second photo too


async def test_sending_a_file_loads_file_read_for_that_conversation(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    stored = store_file(b"alpha\nbeta\ngamma\n", setup.store.state_dir / "attachments",
                        name="list.txt", mime="text/plain", kind="document")
    setup.fake.script(Reply(tool_calls=[call("file_read", path=stored.ref, from_line=3)]),
                      Reply(content="Line 3 is gamma."))
    await setup.say("What is the third line?", attachments=(stored.to_doc(),))
    [(name, result)] = tool_messages(setup)
    assert name == "file_read" and result.endswith("3: gamma")
    first = setup.turn_requests()[0]
    assert "file_read" in [t["function"]["name"] for t in first["tools"]]
    assert "[document: list.txt" in first["messages"][-1]["content"]
    assert setup.channel.texts("reply") == ["Line 3 is gamma."]


async def test_the_next_turn_shows_a_long_tool_result_exactly_as_the_turn_did(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    page = ("A long page about compost. " * 2000)[:40_000]

    async def fetch(context: object) -> str:
        return page

    setup.engine.parts.registry.register(Capability(name="pages", core=True, description="pages",
                                              tools=(Tool("fetch", "Fetch the page.",
                                                          {"type": "object", "properties": {}},
                                                          fetch),)))
    setup.fake.script(Reply(tool_calls=[call("fetch")]), Reply(content="It is about compost."))
    await setup.say("What is on the page?")
    await setup.say("Thanks")
    follow_up, next_turn = setup.turn_requests()[1], setup.turn_requests()[2]
    shown = follow_up["messages"][-1]["content"]
    assert "characters left out:" in shown and len(shown) < len(page) // 3
    replayed = [m for m in next_turn["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in replayed] == [shown]
    # The store keeps every byte.
    [(_, stored)] = tool_messages(setup)
    assert stored == page


async def test_a_fold_never_slips_in_between_the_model_calls_of_a_turn(
    setup_for: Callable[..., Any],
) -> None:
    setup: Setup = await setup_for()
    for n in range(12):
        await setup.say(f"Some history, message {n}. " * 20)
    cid = setup.conversation_id()

    async def slow_tool(context: object) -> str:
        setup.engine.parts.folder.schedule(cid, urgent=True)  # a fold wants the model right now
        await asyncio.sleep(0.3)
        return "done"

    setup.engine.parts.registry.register(Capability(name="slow", core=True, description="slow",
                                              tools=(Tool("slow", "Takes a while.",
                                                          {"type": "object", "properties": {}},
                                                          slow_tool),)))
    setup.fake.default_reply = lambda body: (
        Reply(content="Summary.") if is_fold(body) else echo_reply(body))
    setup.fake.script(Reply(tool_calls=[call("slow")]), Reply(content="Finished."))
    before = len(setup.fake.chat_requests)
    await setup.say("Run the slow tool")
    await setup.engine.parts.folder.wait(cid)
    kinds = ["fold" if is_fold(r) else "turn" for r in setup.fake.chat_requests[before:]]
    assert kinds[:2] == ["turn", "turn"], kinds  # the turn's two calls back to back
    assert setup.channel.texts("reply")[-1] == "Finished."
