"""The daemon's chat socket: what is sent to console:local while no terminal is connected (an
automation's report, a notice) waits in the outbox and is shown when one connects."""

from __future__ import annotations

import asyncio
import json

from daemon.app.assembly import assemble
from daemon.app.chat_socket import ChatSocket
from daemon.llm.client import ModelClient
from daemon.store import Store
from tests.conftest import SettingsFactory, wait_until
from tests.fakes.ollama import FakeOllama

CHAT = "console:local"


async def test_a_report_sent_while_no_terminal_is_connected_is_shown_when_one_connects(
    make_settings: SettingsFactory, fake_ollama: FakeOllama
) -> None:
    settings = make_settings(model={"host": fake_ollama.url})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    chat = ChatSocket(settings.daemon.state_dir)
    engine = assemble(settings, store, llm, {"console": chat}).engine
    await engine.start()
    await chat.start(engine)
    try:
        await engine.notify(CHAT, "Your 7:00 report: all quiet.")
        # Nobody to show it to: it is kept, held for a terminal, not marked sent.
        await wait_until(lambda: any(d.get("held") for d in store.outbox_pending(CHAT)),
                         timeout=10)
        reader, writer = await asyncio.open_unix_connection(chat.path)
        try:
            async with asyncio.timeout(10):
                assert json.loads(await reader.readline()) == {"ready": True}
                shown = json.loads(await reader.readline())
            assert shown == {"send": {"kind": "notice", "text": "Your 7:00 report: all quiet."}}
            await wait_until(lambda: store.outbox_pending(CHAT) == [], timeout=10)
        finally:
            writer.close()
    finally:
        await chat.stop()
        await engine.stop(grace=0)
        await llm.close()
        store.close()
