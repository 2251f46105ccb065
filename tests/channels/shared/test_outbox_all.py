"""The outbox on every platform: a reply roost cannot deliver while the platform is away
waits, and reaches the person exactly once when the platform is back."""

from __future__ import annotations

import asyncio

from daemon.core.messages import Outbound
from tests.channels.shared.drivers import WAIT, Driver, wait_seen
from tests.conftest import wait_until
from tests.fakes.ollama import FakeOllama, Reply


async def test_a_reply_the_platform_cannot_take_waits_and_arrives_once(
        driver: Driver, fake_ollama: FakeOllama) -> None:
    alice = await driver.person("alice")
    async with driver.roost(allow=[alice]) as daemon:
        await driver.send(alice, "first")
        await wait_seen(driver, alice, lambda seen: seen == ["echo: first"])
        await daemon.settle(alice)

        fake_ollama.hang = True  # the answer is being thought about...
        await driver.send(alice, "second")
        await fake_ollama.wait_for_chats(2, timeout=WAIT)
        await driver.break_delivery()  # ...when the platform goes away
        fake_ollama.hang = False
        # Tried, refused, tried again: and the reply is still in the outbox.
        await wait_until(lambda: daemon.deliveries("failed") >= 2, WAIT)
        waiting = [Outbound.from_doc(d) for d in daemon.store.outbox_pending(alice.chat_key)]
        assert [(o.kind, o.text) for o in waiting] == [("reply", "echo: second")]

        await driver.mend_delivery()
        await wait_seen(driver, alice, lambda seen: "echo: second" in seen)
        await daemon.settle(alice)  # the worker idle, nothing left to send: no copy to come
        assert await driver.seen(alice) == ["echo: first", "echo: second"]
        assert daemon.store.outbox_pending() == []
        assert len(fake_ollama.chat_requests) == 2  # the reply was sent again, not rewritten


async def test_a_reply_whose_platform_goes_away_while_it_is_written_arrives_once(
        driver: Driver, fake_ollama: FakeOllama) -> None:
    alice = await driver.person("alice")
    answer = "Here is the whole answer, in four pieces, none of them lost or doubled."
    async with driver.roost(allow=[alice]) as daemon:
        await driver.send(alice, "first")
        await wait_seen(driver, alice, lambda seen: seen == ["echo: first"])
        await daemon.settle(alice)

        fake_ollama.script(Reply(content=answer, chunks=4, pause_after_chunks=2))
        await driver.send(alice, "tell me")
        await wait_until(lambda: fake_ollama.paused == 1, WAIT)  # half written...
        async with asyncio.timeout(WAIT):
            while not await driver.writing(alice):  # noqa: ASYNC110 (the phone is read)
                await asyncio.sleep(0.05)
        await driver.break_delivery()  # ...and shown as written, when the platform goes away
        fake_ollama.resume_paused()
        await wait_until(lambda: daemon.deliveries("failed") >= 2, WAIT)
        assert [d["text"] for d in daemon.store.outbox_pending(alice.chat_key)] == [answer]

        await driver.mend_delivery()
        await wait_seen(driver, alice, lambda seen: answer in seen)
        await daemon.settle(alice)
        assert await driver.seen(alice) == ["echo: first", answer]
        assert daemon.store.outbox_pending() == []
