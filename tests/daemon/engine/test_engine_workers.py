"""A chat's worker survives whatever an item does: what fails twice is quarantined (and listed
by `roost doctor`), and the chat carries on with its next message."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from daemon.app.assembly import assemble
from daemon.cli.main import main as roost
from daemon.core.messages import Inbound, Outbound
from daemon.engine.delivery import DeliveryHooks
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import RecordingChannel, SettingsFactory, standard_parts
from tests.fakes.ollama import FakeOllama

CHAT = "console:local"


class Flaky(RecordingChannel):
    """Sending a reply with `poison` in it raises (a bug, not a delivery error); the first
    `broken_turns` turns fail inside the model call (where "typing…" is entered)."""

    def __init__(self, broken_turns: int = 0) -> None:
        super().__init__()
        self.broken_turns = broken_turns

    @contextlib.asynccontextmanager
    async def _working(self) -> AsyncIterator[None]:
        if self.broken_turns:
            self.broken_turns -= 1
            raise RuntimeError("the channel broke while the model was held")
        yield

    def working(self, chat_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._working()

    async def send(self, outbound: Outbound) -> None:
        if "poison" in outbound.text:
            raise RuntimeError(f"cannot render {outbound.text!r}")
        await super().send(outbound)


async def run_engine(make_settings: SettingsFactory, fake: FakeOllama, channel: Flaky,
                     *texts: str) -> Store:
    settings = make_settings(model={"host": fake.url, "retry_backoff": 0.02})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    engine = assemble(settings, store, llm, {"console": channel}).engine
    await engine.start()
    try:
        for text in texts:
            assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
            await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    finally:
        await engine.stop(grace=0)
        await llm.close()
    return store


async def test_a_reply_that_makes_the_channel_raise_is_quarantined_and_the_chat_goes_on(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    channel = Flaky()
    store = await run_engine(make_settings, fake_ollama, channel, "poison pill", "and then?")
    try:
        assert channel.texts("reply") == ["echo: and then?"]
        (item,) = store.quarantined()
        assert item["kind"] == "outbox" and item["item"]["text"] == "echo: poison pill"
        assert "RuntimeError: cannot render" in item["error"]
        assert store.outbox_pending() == []
    finally:
        store.close()


async def test_a_turn_that_fails_twice_is_quarantined_the_user_told_and_the_chat_goes_on(
        make_settings: SettingsFactory, fake_ollama: FakeOllama, state_dir) -> None:
    channel = Flaky(broken_turns=2)
    store = await run_engine(make_settings, fake_ollama, channel, "first", "second")
    try:
        assert channel.texts("reply") == ["echo: second"]
        assert any("went wrong" in t for t in channel.texts("notice"))
        (item,) = store.quarantined()
        assert item["kind"] == "inbox" and item["item"]["text"] == "first"
        assert store.inbox_pending() == []
    finally:
        store.close()
    config = state_dir.parent / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n')
    lines: list[str] = []
    with contextlib.redirect_stdout(_Lines(lines)):
        await asyncio.to_thread(roost, ["doctor", "--config", str(config)])
    listed = [line for line in lines if "inbox" in line and "the channel broke" in line]
    assert listed, lines


class _Lines:
    def __init__(self, into: list[str]) -> None:
        self.into = into

    def write(self, text: str) -> int:
        self.into.extend(text.splitlines())
        return len(text)

    def flush(self) -> None:
        pass


async def test_an_idle_chat_leaves_no_worker_behind_and_is_served_again(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.02})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    channel = Flaky()
    engine = assemble(settings, store, llm, {"console": channel}).engine
    engine.worker_idle_exit = 0.1  # ten minutes in the daemon

    def workers() -> list[str]:
        return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("roost-chat")]

    await engine.start()
    try:
        for text in ("once", "and again"):
            assert await engine.submit(Inbound(chat_key=CHAT, text=text, received=time.time()))
            await asyncio.wait_for(engine.wait_idle(CHAT), 10)
            async with asyncio.timeout(10):
                while workers():  # noqa: ASYNC110  (tasks have no event to wait on)
                    await asyncio.sleep(0.05)
        assert channel.texts("reply") == ["echo: once", "echo: and again"]
        assert engine.queue_depths() == {}
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


class Gated(RecordingChannel):
    """Each send waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sending = asyncio.Event()

    async def send(self, outbound: Outbound) -> None:
        self.sending.set()
        await self.gate.wait()
        await super().send(outbound)


async def test_a_chat_is_idle_only_once_a_message_queued_during_a_delivery_is_sent_too(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    channel = Gated()
    engine = assemble(settings, store, llm, {"console": channel}).engine
    await engine.start()
    try:
        assert await engine.deliver(Outbound(chat_key=CHAT, text="first", created=1.0))
        await asyncio.wait_for(channel.sending.wait(), 10)  # the worker is sending it...
        assert await engine.deliver(Outbound(chat_key=CHAT, text="second", created=2.0))
        channel.gate.set()  # ...and the second came after that pass read the outbox
        await asyncio.wait_for(engine.wait_idle(CHAT), 10)
        assert channel.texts() == ["first", "second"]
        assert store.outbox_pending(CHAT) == []
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()


async def test_every_listener_given_at_construction_hears_of_each_message_sent(
        make_settings: SettingsFactory, fake_ollama: FakeOllama) -> None:
    settings = make_settings(model={"host": fake_ollama.url, "retry_backoff": 0.02})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    heard: dict[str, list[str]] = {"metrics": [], "automations": []}

    def listener(name: str) -> Callable[[Outbound], Awaitable[None]]:
        async def sent(outbound: Outbound) -> None:
            heard[name].append(outbound.text)
        return sent

    hooks = DeliveryHooks(sent=[listener("metrics"), listener("automations")])
    engine = Engine(settings=settings, store=store, llm=llm, channels={"console": Flaky()},
                    parts=standard_parts(settings, store, llm), hooks=hooks)
    await engine.start()
    try:
        assert await engine.submit(Inbound(chat_key=CHAT, text="hi", received=time.time()))
        await asyncio.wait_for(engine.wait_idle(CHAT), 10)
        assert await engine.deliver(Outbound(chat_key=CHAT, text="a report", created=time.time()))
        await asyncio.wait_for(engine.wait_idle(CHAT), 10)
    finally:
        await engine.stop(grace=0)
        await llm.close()
        store.close()
    assert heard == {"metrics": ["echo: hi", "a report"], "automations": ["echo: hi", "a report"]}
