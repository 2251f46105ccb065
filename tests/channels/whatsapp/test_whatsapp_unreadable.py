"""A WhatsApp message roost cannot read (issue 48 item 5): its sender gets one short line instead
of silence, and the message is still kept in the quarantine for the owner, as before."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.intake.quarantine import UNREADABLE
from tests.channels.whatsapp.test_whatsapp import KEY, USER, Start
from tests.channels.whatsapp.test_whatsapp import graph as graph  # a fixture
from tests.channels.whatsapp.test_whatsapp import start as start  # a fixture
from tests.conftest import wait_until
from tests.fakes.graph import FakeGraph, sent_now, text_message, webhook

STRANGER = "15550001111"


def contact_named_by_a_string(wamid: str, sender: str) -> dict[str, Any]:
    # `name` is an object ({"formatted_name": ...}) in every contact Meta documents.
    return {"from": sender, "id": wamid, "timestamp": sent_now(), "type": "contacts",
            "contacts": [{"name": "Ann", "phones": [{"phone": "+1 555 0100"}]}]}


def timestamp_not_a_number(wamid: str, sender: str) -> dict[str, Any]:
    return text_message(wamid, sender, "hello", timestamp="soon")


@pytest.mark.parametrize("unreadable", [contact_named_by_a_string, timestamp_not_a_number])
async def test_the_sender_is_told_and_the_message_kept_for_the_owner(
        unreadable: Any, start: Start, graph: FakeGraph) -> None:
    daemon = await start()
    assert await daemon.post(webhook(unreadable("wamid.odd", USER))) == 200
    assert await daemon.post(webhook(text_message("wamid.next", USER, "and this?"))) == 200
    await wait_until(lambda: len(graph.texts(USER)) >= 2, 20)
    await daemon.settle()
    assert graph.texts(USER) == [UNREADABLE, "echo: and this?"]
    (kept,) = daemon.store.quarantined()
    assert kept["key"] == "whatsapp:msg:wamid.odd" and kept["chat_key"] == KEY


async def test_a_stranger_gets_what_strangers_get(start: Start, graph: FakeGraph) -> None:
    daemon = await start(access={"unknown_senders": "pair"})
    assert await daemon.post(webhook(contact_named_by_a_string("wamid.s", STRANGER))) == 200
    await wait_until(lambda: bool(graph.texts(STRANGER)), 20)
    await daemon.settle(f"whatsapp:{STRANGER}")
    (told,) = graph.texts(STRANGER)
    assert "pairing code" in told
    assert daemon.store.quarantined() == []  # never stored: nothing to read or to keep
