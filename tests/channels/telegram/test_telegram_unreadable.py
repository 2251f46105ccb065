"""An update roost cannot read (issue 48 item 5): its sender gets one short line instead of
silence, and the update is still kept in the quarantine for the owner, as before.

Both shapes come from the field: a message whose `text` is an object, and a poll without the
`persistent_id` python-telegram-bot requires since Bot API 9.6 (an older local Bot API server).
"""

from __future__ import annotations

from typing import Any

import pytest

from daemon.intake.quarantine import UNREADABLE
from tests.channels.telegram.test_telegram import (  # noqa: F401  (start is a fixture)
    Start,
    message,
    start,
    texts,
)
from tests.fakes.telegram import FakeTelegram

STRANGER = 2222222
POLL = {"id": "5", "question": "Lunch?", "options": [{"text": "yes", "voter_count": 0}],
        "total_voter_count": 0, "is_closed": False, "is_anonymous": True, "type": "regular",
        "allows_multiple_answers": False}


def text_object(update_id: int, **where: Any) -> dict[str, Any]:
    update = message(update_id, "placeholder", **where)
    update["message"]["text"] = {"unexpected": "shape"}
    return update


def old_poll(update_id: int, **where: Any) -> dict[str, Any]:
    return message(update_id, None, poll=POLL, **where)


@pytest.mark.parametrize("unreadable", [text_object, old_poll])
async def test_the_sender_is_told_and_the_update_kept_for_the_owner(
        unreadable: Any, start: Start, fake_telegram: FakeTelegram) -> None:  # noqa: F811
    daemon = await start()
    assert await daemon.post(unreadable(7)) == 200
    assert await daemon.post(message(8, "and this?")) == 200
    await fake_telegram.wait_for("sendMessage", count=2)
    await daemon.settle()
    assert texts(fake_telegram) == [UNREADABLE, "echo: and this?"]
    (kept,) = daemon.store.quarantined()
    assert kept["key"] == "telegram:update:7"
    assert kept["item"]["payload"]["message"]["message_id"] == 7


async def test_a_stranger_gets_what_strangers_get_and_a_group_no_chatter(
        start: Start, fake_telegram: FakeTelegram) -> None:  # noqa: F811
    daemon = await start(access={"unknown_senders": "pair"})
    assert await daemon.post(text_object(7, user=STRANGER)) == 200
    await fake_telegram.wait_for("sendMessage")
    group = {"id": -100123, "type": "group", "title": "Family"}
    assert await daemon.post(old_poll(8, chat=group)) == 200
    assert await daemon.post(message(9, "hello")) == 200
    await fake_telegram.wait_for("sendMessage", count=2)
    await daemon.settle()
    await daemon.settle("telegram:-100123")
    sent = [(c.params["chat_id"], str(c.params["text"]))
            for c in fake_telegram.calls_to("sendMessage")]
    assert [chat for chat, _ in sent] == [STRANGER, 1111111]  # nothing to the group
    assert "pairing code" in sent[0][1] and UNREADABLE not in sent[0][1]
    assert texts(fake_telegram) == ["echo: hello"]
    assert [q["key"] for q in daemon.store.quarantined()] == ["telegram:update:8"]
