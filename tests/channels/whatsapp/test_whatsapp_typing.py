"""WhatsApp has no drafts, and drops "typing…" after 25 seconds: it is refreshed for the whole
turn, the tools between its model calls included, and never shown after the turn ended. A
60-second turn at a 20-second refresh, scaled down to a 0.05-second refresh here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.whatsapp.api import GraphClient
from channels.whatsapp.delivery import WhatsAppChannel
from channels.whatsapp.platform import WhatsAppSettings
from daemon.store import Store
from tests.conftest import wait_until
from tests.fakes.graph import API_VERSION, PHONE_NUMBER_ID, FakeGraph

USER = "972544401243"
KEY = f"whatsapp:{USER}"
OTHER = "whatsapp:972500000001"
REFRESH = 0.05


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[tuple[WhatsAppChannel, FakeGraph]]:
    async with FakeGraph() as graph:
        settings = WhatsAppSettings(enabled=True, phone_number_id=PHONE_NUMBER_ID,
                                    api_base=graph.url, api_version=API_VERSION,
                                    token=graph.token)
        client = GraphClient(settings, timeout=5)
        await client.start()
        store = Store.open(tmp_path / "state")
        try:
            whatsapp = WhatsAppChannel(client, store, settings, typing_refresh=REFRESH,
                                       read_delay=60)
            whatsapp.last_received[KEY] = "wamid.asked"
            yield whatsapp, graph
        finally:
            await client.close()
            store.close()


def typing_calls(graph: FakeGraph, wamid: str = "wamid.asked") -> int:
    return sum("typing_indicator" in c.body and c.body["message_id"] == wamid
               for c in graph.calls_of("read"))


async def test_typing_is_kept_up_for_the_whole_turn_tools_included(
        channel: tuple[WhatsAppChannel, FakeGraph]) -> None:
    whatsapp, graph = channel
    async with whatsapp.streaming(KEY):
        assert typing_calls(graph) == 0  # not while the turn waits for the model
        async with whatsapp.working(KEY):  # the first model call holds the model
            await wait_until(lambda: typing_calls(graph) >= 1)
        # A tool runs between the model calls, for many times WhatsApp's 25 seconds: the
        # indicator is refreshed all along (before, it ended with the model call).
        during_tool = typing_calls(graph)
        await wait_until(lambda: typing_calls(graph) >= during_tool + 5)
        async with whatsapp.working(KEY):  # the second call: the same indicator, kept up
            shown = typing_calls(graph)
            await wait_until(lambda: typing_calls(graph) >= shown + 2)
    # The refresh is gone with the turn: no indicator follows the reply. Another chat's turn,
    # refreshed every REFRESH, keeps the time: three of its refreshes go by, none of this one.
    ended = typing_calls(graph)
    whatsapp.last_received[OTHER] = "wamid.other"
    async with whatsapp.streaming(OTHER), whatsapp.working(OTHER):
        await wait_until(lambda: typing_calls(graph, "wamid.other") >= 3)
    assert typing_calls(graph) == ended
