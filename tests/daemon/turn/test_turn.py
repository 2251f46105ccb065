"""The turn engine against the fake Ollama: num_ctx, outages, ordering, batching, errors."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.core.config import Settings
from daemon.core.errors import DeliveryError, StoreError
from daemon.core.messages import Inbound, Outbound
from daemon.engine.workers import Engine
from daemon.llm.client import ChatResult, ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory, wait_until
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

CHAT = "console:local"


@pytest.fixture
async def engine_for(
    recording_channel: RecordingChannel,
) -> AsyncIterator[Callable[..., Awaitable[Engine]]]:
    """Start an engine for settings; everything started is stopped and closed afterwards."""
    started: list[tuple[Engine, ModelClient, Store]] = []

    async def start(settings: Settings, channel: RecordingChannel | None = None) -> Engine:
        store = Store.open(settings.daemon.state_dir)
        llm = ModelClient(settings.model)
        engine = assemble(settings, store, llm, {"console": channel or recording_channel}).engine
        await engine.start()
        started.append((engine, llm, store))
        return engine

    yield start
    for engine, llm, store in started:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


def typed(content: str) -> str:
    """A sent user message without what roost appends to it: the time stamp, and on the
    conversation's first, the channel's note."""
    return content.split("\n\n[sent ", 1)[0].split("\n\n<channel>\n", 1)[0]


def inbound(text: str) -> Inbound:
    return Inbound(chat_key=CHAT, text=text, received=time.time())


async def say(engine: Engine, text: str) -> None:
    assert await engine.submit(inbound(text))
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)


class TurnCount:
    """Told by the model client of each turn it finished (answered or not), like the metrics."""

    def __init__(self) -> None:
        self.done = 0

    def model_call(self, messages: Sequence[Mapping[str, Any]], result: ChatResult,
                   background: bool, seconds: float | None = None) -> None:
        pass

    def model_failed(self, host: str, seconds: float | None = None) -> None:
        pass

    def turn_done(self, seconds: float) -> None:
        self.done += 1


def count_turns(engine: Engine) -> TurnCount:
    engine.parts.llm.observer = counter = TurnCount()
    return counter




def fast(make_settings: SettingsFactory, fake: FakeOllama, **model: object) -> Settings:
    return make_settings(model={"host": fake.url, "retry_backoff": 0.02, "retry_attempts": 3,
                                **model})


async def test_num_ctx_and_keep_alive_are_identical_on_every_request(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama, window=8192))
    for text in ("one", "two", "three"):
        await say(engine, text)
    assert recording_channel.texts("reply") == ["echo: one", "echo: two", "echo: three"]
    options = [r["options"] for r in fake_ollama.chat_requests]
    assert options == [{"num_ctx": 8192}] * 3
    assert {r["keep_alive"] for r in fake_ollama.chat_requests} == {"30m"}
    assert fake_ollama.reloads == 0


async def test_num_ctx_is_capped_at_the_models_context_length(
    make_settings: SettingsFactory, engine_for
) -> None:
    async with FakeOllama(models=[FakeModel(context_length=4096)]) as fake:
        engine = await engine_for(fast(make_settings, fake, window=8192))
        await say(engine, "hello")
        await say(engine, "again")
        assert [r["options"]["num_ctx"] for r in fake.chat_requests] == [4096, 4096]


async def test_streamed_deltas_are_saved_as_one_message(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(content="The quick brown fox jumps", chunks=5))
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "tell me")
    assert len(recording_channel.deltas) == 5
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    roles = [(m.role, m.content) for m in engine.store.messages(conversation.id)]
    assert roles == [("user", "tell me"), ("assistant", "The quick brown fox jumps")]


async def test_user_message_survives_an_outage_and_is_answered_when_the_model_is_back(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    settings = fast(make_settings, fake_ollama)
    engine = await engine_for(settings)
    await say(engine, "warm up")  # the model info is cached; now take the server away
    await fake_ollama.refuse_connections()
    turns = count_turns(engine)
    assert await engine.submit(inbound("are you there?"))
    # Every retry of the turn fails, the chat is parked, and the parked chat tries once more.
    await wait_until(lambda: turns.done >= 2)
    [notice] = recording_channel.texts("notice")  # told once
    assert "not answering" in notice and fake_ollama.url in notice and "saved" in notice
    # The message is on disk while the model is away.
    reopened = Store.open(settings.daemon.state_dir, read_only=True)
    conversation = reopened.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in reopened.messages(conversation.id)][-1] == "are you there?"
    await fake_ollama.accept_connections()
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: warm up", "echo: are you there?"]
    assert len(recording_channel.texts("notice")) == 1  # no repeated notices while parked




@pytest.mark.parametrize("outage", ["refused", "gateway 503"])
async def test_the_first_message_after_a_start_with_ollama_down_is_told_and_answered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel,
    outage: str,
) -> None:
    # Nothing has asked /api/show yet in this process: building the request is what fails.
    if outage == "refused":
        await fake_ollama.refuse_connections()
    else:
        fake_ollama.gateway_status = 503
    engine = await engine_for(fast(make_settings, fake_ollama))
    assert await engine.submit(inbound("hello after a reboot"))
    await wait_until(lambda: bool(recording_channel.texts("notice")))
    [notice] = recording_channel.texts("notice")
    assert "not answering" in notice and fake_ollama.url in notice and "saved" in notice
    if outage == "refused":
        await fake_ollama.accept_connections()
    else:
        fake_ollama.gateway_status = None
    await wait_until(lambda: bool(recording_channel.texts("reply")))
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: hello after a reboot"]
    assert len(recording_channel.texts("notice")) == 1


async def test_five_messages_during_a_turn_are_answered_together_in_order(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(content="first answer", delay=0.3), "second answer")
    engine = await engine_for(fast(make_settings, fake_ollama))
    assert await engine.submit(inbound("first"))
    await fake_ollama.wait_for_chats(1)
    for n in range(2, 7):
        assert await engine.submit(inbound(f"message {n}"))
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert len(fake_ollama.chat_requests) == 2
    second = [typed(m["content"]) for m in fake_ollama.chat_requests[1]["messages"]
              if m["role"] == "user"]
    assert second == ["first"] + [f"message {n}" for n in range(2, 7)]
    assert recording_channel.texts("reply") == ["first answer", "second answer"]
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    stored = [m.content for m in engine.store.messages(conversation.id)]
    assert stored == ["first", "first answer", *[f"message {n}" for n in range(2, 7)],
                      "second answer"]


async def test_model_not_found_names_the_model_and_the_pull_command(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama, name="llama9:70b"))
    await say(engine, "hello")
    [notice] = recording_channel.texts("notice")
    assert "'llama9:70b'" in notice and "ollama pull llama9:70b" in notice
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == ["hello"]


async def test_other_ollama_errors_give_a_clear_message_and_keep_the_conversation(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    # A 500 that names the request (the template cannot render it) is reported at once.
    fake_ollama.script(Reply(status=500, error="template: :3:10: executing \"\" at <.Messages>"))
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "first")
    [notice] = recording_channel.texts("notice")
    assert "template" in notice and "saved" in notice
    await say(engine, "second")
    assert recording_channel.texts("reply") == ["echo: second"]
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == [
        "first", "second", "echo: second"]


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_a_gateway_error_is_an_outage_and_the_message_is_answered(
    status: int, fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for,
    recording_channel,
) -> None:
    fake_ollama.script(Reply(status=status, error="upstream went away"))
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "still there?")
    assert recording_channel.texts("reply") == ["echo: still there?"]
    [notice] = recording_channel.texts("notice")
    assert "not answering" in notice


async def test_one_500_is_retried_and_answered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(status=500, error="llama runner process has terminated"))
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "first")
    assert recording_channel.texts("notice") == []
    assert recording_channel.texts("reply") == ["echo: first"]


RUNNER_FAILED = "an error was encountered while running the model: unexpected EOF"


async def test_an_error_inside_a_200_stream_is_tried_again_and_answered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(content="The answer begins and", chunks=4, error_after_chunks=2,
                             error=RUNNER_FAILED), "The whole answer.")
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "tell me")
    assert recording_channel.texts("reply") == ["The whole answer."]
    assert recording_channel.texts("notice") == []


async def test_an_error_inside_a_200_stream_twice_is_an_outage_told_in_words_and_answered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    broken = Reply(content="The answer begins and", chunks=4, error_after_chunks=1,
                   error=RUNNER_FAILED)
    fake_ollama.script(broken, broken)
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "first")
    [notice] = recording_channel.texts("notice")
    assert "keeps failing" in notice and "saved" in notice
    assert "-1" not in notice and RUNNER_FAILED not in notice
    assert recording_channel.texts("reply") == ["echo: first"]
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == [
        "first", "echo: first"]


async def test_a_connection_dropped_in_the_middle_of_the_answer_is_retried_and_answered(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(content="The answer begins and", chunks=4, drop_after_chunks=2),
                       "The whole answer.")
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "tell me")
    assert recording_channel.texts("reply") == ["The whole answer."]
    assert len(fake_ollama.chat_requests) == 2


async def test_an_answer_that_stalls_halfway_is_given_up_and_asked_again(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(Reply(content="The answer begins and", chunks=4, stall_after_chunks=2),
                       "The whole answer.")
    engine = await engine_for(fast(make_settings, fake_ollama, timeout=0.5))
    await say(engine, "tell me")
    assert recording_channel.texts("reply") == ["The whole answer."]
    assert len(fake_ollama.chat_requests) == 2


async def test_concurrency_gate_limits_requests_in_flight(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    fake_ollama.script(*[Reply(content=f"r{n}", delay=0.15) for n in range(3)])
    engine = await engine_for(fast(make_settings, fake_ollama, concurrency=1))
    chats = ["console:local", "telegram:1", "telegram:2"]
    engine.channels["telegram"] = recording_channel
    for chat in chats:
        assert await engine.submit(Inbound(chat_key=chat, text="hi", received=time.time()))
    for chat in chats:
        await asyncio.wait_for(engine.wait_idle(chat), 10)
    assert len(fake_ollama.chat_requests) == 3
    assert fake_ollama.most_answered_at_once == 1  # Ollama was asked one at a time
    assert sorted(recording_channel.texts("reply")) == ["r0", "r1", "r2"]


async def test_pending_inbox_is_answered_after_a_restart(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    settings = fast(make_settings, fake_ollama)
    store = Store.open(settings.daemon.state_dir)
    store.inbox_add(inbound("left over from before the crash").to_doc())
    store.close()
    engine = await engine_for(settings)
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: left over from before the crash"]
    assert engine.store.inbox_pending() == []


def crashed_after_the_reply(store: Store, *, sent: bool) -> tuple[str, str]:
    """The state a crash leaves when it comes after a reply was saved, before the inbox item
    was cleared: the user's message and the reply are in the conversation, the item pending;
    the reply was delivered (`sent`) or never queued. Returns the conversation and reply ids."""
    now = time.time()
    item = Inbound(chat_key=CHAT, text="hello", received=now)
    assert store.inbox_add(item.to_doc())
    conversation = store.create_conversation(CHAT, now)
    store.append_message(conversation.id, "user", "hello", created=now,
                         meta={"inbox_id": item.id})
    reply = store.append_message(conversation.id, "assistant", "saved before the crash",
                                 created=now + 1, meta={"inbox_ids": [item.id]})
    if sent:
        store.mark_sent(reply.id, now + 2)
    return conversation.id, reply.id


async def test_a_reply_saved_before_a_crash_is_sent_once_not_asked_again(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    settings = fast(make_settings, fake_ollama)
    store = Store.open(settings.daemon.state_dir)
    conversation_id, _ = crashed_after_the_reply(store, sent=False)
    store.close()
    engine = await engine_for(settings)
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["saved before the crash"]
    assert fake_ollama.chat_requests == []
    assert engine.store.message_count(conversation_id) == 2
    assert engine.store.inbox_pending() == [] and engine.store.outbox_pending() == []


async def test_a_reply_delivered_before_a_crash_is_not_sent_again(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    settings = fast(make_settings, fake_ollama)
    store = Store.open(settings.daemon.state_dir)
    crashed_after_the_reply(store, sent=True)
    store.close()
    engine = await engine_for(settings)
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.sent == [] and fake_ollama.chat_requests == []
    assert engine.store.inbox_pending() == [] and engine.store.outbox_pending() == []


async def test_the_same_inbound_submitted_twice_is_answered_once(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama))
    item = inbound("only once")
    assert await engine.submit(item)
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert await engine.submit(item)  # a channel resubmitting after a crash
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: only once"]
    assert len(fake_ollama.chat_requests) == 1


async def test_commands_run_in_order_with_messages(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "before")
    first = engine.store.active_conversation(CHAT)
    await say(engine, "/new")
    await say(engine, "after")
    second = engine.store.active_conversation(CHAT)
    assert first is not None and second is not None and first.id != second.id
    assert engine.store.get_conversation(first.id).status == "archived"  # type: ignore[union-attr]
    assert [m.content for m in engine.store.messages(second.id)] == ["after", "echo: after"]
    await say(engine, "/status")
    status = recording_channel.texts("notice")[-1]
    assert "qwen3:4b" in status and "8,192" in status and "2 messages" in status


async def test_idle_chat_rotates_to_a_new_conversation(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, recording_channel
) -> None:
    now = [1_000_000.0]
    settings = fast(make_settings, fake_ollama)
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": recording_channel},
                      clock=lambda: now[0]).engine
    await engine.start()
    try:
        await say(engine, "morning")
        first = store.active_conversation(CHAT)
        now[0] += 3 * 3600 - 1
        await say(engine, "still here")
        still = store.active_conversation(CHAT)
        assert first is not None and still is not None and still.id == first.id
        now[0] += 3 * 3600
        await say(engine, "evening")
        second = store.active_conversation(CHAT)
        assert second is not None and second.id != first.id
        assert store.get_conversation(first.id).status == "archived"  # type: ignore[union-attr]
        assert [m.content for m in store.messages(second.id)] == ["evening", "echo: evening"]
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


async def test_a_model_that_stops_answering_is_retried_and_answered_once_it_responds(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama, timeout=0.2, retry_attempts=2))
    await say(engine, "warm up")
    fake_ollama.hang = True
    turns = count_turns(engine)
    assert await engine.submit(inbound("slow day?"))
    await wait_until(lambda: turns.done >= 1)  # both tries time out and the chat is parked
    [notice] = recording_channel.texts("notice")
    assert "not answering" in notice
    fake_ollama.hang = False
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert recording_channel.texts("reply") == ["echo: warm up", "echo: slow day?"]


class FlakyChannel(RecordingChannel):
    """Fails its first `failures` sends, permanently or not."""

    def __init__(self, failures: int, permanent: bool, chat_blocked: bool = False) -> None:
        super().__init__("console")
        self.failures = failures
        self.permanent = permanent
        self.chat_blocked = chat_blocked
        self.attempts = 0

    async def send(self, outbound: Outbound) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise DeliveryError("platform said no", permanent=self.permanent,
                                chat_blocked=self.chat_blocked)
        await super().send(outbound)


async def test_a_failed_delivery_stays_queued_and_is_retried(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for
) -> None:
    channel = FlakyChannel(failures=2, permanent=False)
    engine = await engine_for(fast(make_settings, fake_ollama), channel)
    assert await engine.submit(inbound("hello"))
    # Idle once the reply went out and its outbox item was marked done (the platform's answer
    # comes first, then the record: polling for the send alone could assert in between).
    await asyncio.wait_for(engine.wait_idle(CHAT), 20)
    assert channel.texts("reply") == ["echo: hello"]
    assert channel.attempts == 3
    assert engine.store.outbox_pending() == []


async def test_a_refused_reply_is_reported_and_the_chat_goes_on(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for
) -> None:
    channel = FlakyChannel(failures=1, permanent=True)
    engine = await engine_for(fast(make_settings, fake_ollama), channel)
    await say(engine, "hello")
    for _ in range(250):
        if channel.sent:
            break
        await asyncio.sleep(0.02)
    assert channel.attempts == 2
    assert channel.texts() == ["A reply could not be delivered (platform said no). Ask again "
                               "if you need it; the conversation goes on."]
    assert "undeliverable" not in engine.store.chat_flags(CHAT)
    await say(engine, "again")
    assert channel.texts()[-1] == "echo: again"


async def test_a_blocked_chat_is_marked_and_retrying_stops(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for
) -> None:
    channel = FlakyChannel(failures=1, permanent=True, chat_blocked=True)
    engine = await engine_for(fast(make_settings, fake_ollama), channel)
    store = engine.store
    await say(engine, "hello")
    assert channel.attempts == 1 and channel.sent == []
    assert store.outbox_pending() == []
    assert "undeliverable" in store.chat_flags(CHAT)
    conversation = store.active_conversation(CHAT)
    assert conversation is not None  # the reply itself is kept in the conversation
    assert [m.content for m in store.messages(conversation.id)] == ["hello", "echo: hello"]
    # Nothing more is tried while the chat is marked.
    await engine.notify(CHAT, "a notice nobody can receive")
    await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    assert channel.attempts == 1 and store.outbox_pending() == []


async def test_a_failing_disk_delays_a_turn_but_loses_nothing(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for, recording_channel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = await engine_for(fast(make_settings, fake_ollama))
    real = engine.store.append_message
    failures = [StoreError("cannot write seg-000000001.json: No space left on device")] * 2

    def full_disk(*args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.store, "append_message", full_disk)
    assert await engine.submit(inbound("written when the disk has room"))
    for _ in range(300):
        if recording_channel.sent:
            break
        await asyncio.sleep(0.02)
    assert recording_channel.texts("reply") == ["echo: written when the disk has room"]
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == [
        "written when the disk has room", "echo: written when the disk has room"]


async def test_a_call_is_in_its_working_context_only_while_it_holds_the_model(
    fake_ollama: FakeOllama, make_settings: SettingsFactory
) -> None:
    """The context the turn hands the model client (the channel's "typing…") is entered by the
    call holding the model, and only then: a call that waits for the model shows nothing."""
    fake_ollama.script(Reply(content="slow", delay=0.5), "fast")
    llm = ModelClient(fast(make_settings, fake_ollama, concurrency=1).model)
    inside: list[str] = []
    entered = {"first": asyncio.Event(), "second": asyncio.Event()}

    def working(name: str) -> Callable[[], contextlib.AbstractAsyncContextManager[None]]:
        @contextlib.asynccontextmanager
        async def held() -> AsyncIterator[None]:
            inside.append(name)
            entered[name].set()
            try:
                yield
            finally:
                inside.remove(name)
        return held

    try:
        first = asyncio.create_task(llm.chat([{"role": "user", "content": "first"}],
                                             while_held=working("first")))
        await asyncio.wait_for(entered["first"].wait(), 5)
        second = asyncio.create_task(llm.chat([{"role": "user", "content": "second"}],
                                              while_held=working("second")))
        async with asyncio.timeout(5):
            while not llm.waiting:  # noqa: ASYNC110 (a counter, no event to wait on)
                await asyncio.sleep(0.01)
        assert inside == ["first"]  # the second waits at the gate, outside its context
        assert (await first).content == "slow"
        await asyncio.wait_for(entered["second"].wait(), 5)
        assert inside == ["second"]
        assert (await second).content == "fast"
        assert inside == []
    finally:
        await llm.close()


def suspended_in(task: asyncio.Task[Any], function: Callable[..., Any]) -> bool:
    """Whether `task` waits inside a call of `function` (a coroutine function)."""
    coroutine: Any = task.get_coro()
    while coroutine is not None:
        if getattr(coroutine, "cr_code", None) is function.__code__:
            return True
        coroutine = getattr(coroutine, "cr_await", None)
    return False


@pytest.mark.parametrize("kind", ["turn", "fold"])
async def test_a_call_cancelled_while_it_waits_for_the_model_leaves_nothing_behind(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, kind: str
) -> None:
    """A shutdown cancels calls still queued for the model: no call is left half made (Python
    warns of a coroutine never awaited, at whatever moment it is collected)."""
    fake_ollama.script(Reply(content="slow", delay=1.0))
    llm = ModelClient(fast(make_settings, fake_ollama, concurrency=1).model)
    try:
        holding = asyncio.create_task(llm.chat([{"role": "user", "content": "first"}]))
        await fake_ollama.wait_for_chats(1)
        queued = asyncio.create_task(llm.chat([{"role": "user", "content": "second"}],
                                              background=kind == "fold"))
        at_the_gate = functools.partial(suspended_in, queued, asyncio.Semaphore.acquire)
        await wait_until(at_the_gate)
        del at_the_gate
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)
            del queued
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
        assert (await holding).content == "slow"
        assert len(fake_ollama.chat_requests) == 1
    finally:
        await llm.close()
