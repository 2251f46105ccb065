"""Poison updates through the real webhook route and a restart: whatever Telegram delivers with
the right secret gets a 200 (never a 400/500 that Telegram would resend for ever), costs no
lasting state, and cannot stop the next start; the chat goes on being answered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from daemon.intake.quarantine import UNREADABLE
from daemon.store import Store
from tests.channels.telegram.test_telegram import (  # noqa: F401  (start is a fixture)
    CHAT_KEY,
    USER,
    Start,
    message,
    start,
    texts,
)
from tests.fakes.ollama import FakeOllama
from tests.fakes.telegram import FakeTelegram

PERSON = {"id": USER, "is_bot": False, "first_name": "Test"}


def deeply_nested(update_id: int, depth: int = 490) -> dict[str, Any]:
    update = message(update_id, "deep")
    inner: dict[str, Any] = update["message"]
    for _ in range(depth):
        inner["reply_to_message"] = dict(message(update_id, "deeper")["message"])
        inner = inner["reply_to_message"]
    return update


POISON: dict[str, Any] = {
    "deep nesting": deeply_nested(50),
    "no chat": {"update_id": 51, "message": {"message_id": 1, "date": int(time.time()),
                                             "text": "no chat", "from": PERSON}},
    "string chat id": message(52, "string id", chat={"id": "abc", "type": "private"}),
    # A size without width and height (file_unique_id alone is filled in: Bot API < 4.5).
    "unparseable photo": message(53, None, photo=[{"file_id": "F", "file_unique_id": "F"}]),
    "callback query": {"update_id": 54, "callback_query": {"id": "7", "from": PERSON,
                                                           "data": "pressed"}},
    "unknown future kind": {"update_id": 55, "hologram": {"id": 1, "from": PERSON}},
}

SET_ASIDE = {"unparseable photo"}  # let in at the door, unreadable after it


def hot_files(state_dir: Path) -> dict[str, int]:
    """Every state file but the logs and request snapshots, with its size."""
    return {str(p.relative_to(state_dir)): p.stat().st_size for p in state_dir.rglob("*")
            if p.is_file() and p.parts[len(state_dir.parts)] not in ("corpus", "debug")}


@pytest.mark.parametrize("name", list(POISON))
async def test_a_poison_update_gets_200_and_the_chat_survives_a_restart(
        name: str, start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:  # noqa: F811
    # One the door lets in but python-telegram-bot cannot read is set aside, and its sender
    # told so once (issue 48); the others leave nothing behind.
    told = [UNREADABLE] if name in SET_ASIDE else []
    daemon = await start()
    assert await daemon.post(POISON[name]) == 200
    assert await daemon.post(POISON[name]) == 200  # and again when Telegram resends it
    assert await daemon.post(message(1, "before the restart")) == 200
    await fake_telegram.wait_for("sendMessage", count=len(told) + 1)
    await daemon.settle()
    await daemon.stop()

    again = await start()
    assert await again.post(message(2, "after the restart")) == 200
    await fake_telegram.wait_for("sendMessage", count=len(told) + 2)
    await again.settle()
    assert texts(fake_telegram) == [*told, "echo: before the restart", "echo: after the restart"]
    assert again.store.updates_pending("telegram") == []
    assert again.store.inbox_pending() == []


async def test_stored_poison_is_quarantined_and_cannot_stop_a_start(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:  # noqa: F811
    # As an earlier version could have left them: accepted, then never processed.
    with Store.open(state_dir) as store:
        store.updates_add("telegram", "telegram:update:50", deeply_nested(50), time.time())
        store.updates_add("telegram", "telegram:update:52", POISON["string chat id"],
                          time.time())
        store.updates_add("telegram", "telegram:update:3", message(3, "left behind"),
                          time.time() + 1)
    daemon = await start()
    await fake_telegram.wait_for("sendMessage", count=2)
    await daemon.settle()
    # The one python-telegram-bot cannot read: its sender is told, and the owner keeps it.
    assert texts(fake_telegram) == [UNREADABLE, "echo: left behind"]
    (quarantined,) = daemon.store.quarantined()
    assert quarantined["key"] == "telegram:update:50" and "nested" in quarantined["error"]
    assert daemon.store.updates_pending("telegram") == []


async def test_strangers_leave_the_stores_files_as_they_were(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:  # noqa: F811
    daemon = await start(access={"unknown_senders": "ignore"})
    assert await daemon.post(message(1, "hello")) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle()
    before = hot_files(state_dir)
    for i in range(40):
        assert await daemon.post(message(100 + i, "let me in", user=9_000_000 + i)) == 200
    await daemon.telegram.intake.idle()  # type: ignore[union-attr]
    assert hot_files(state_dir) == before
    assert texts(fake_telegram) == ["echo: hello"]


async def test_strangers_asking_to_pair_cost_a_bounded_state(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:  # noqa: F811
    daemon = await start(access={"unknown_senders": "pair"})

    async def strangers(first: int) -> dict[str, int]:
        for i in range(40):
            user = 9_000_000 + first + i
            assert await daemon.post(message(first + i, "let me in", user=user)) == 200
        await daemon.telegram.intake.idle()  # type: ignore[union-attr]
        for i in range(3):  # the three that got a code (the first batch's first three)
            await daemon.settle(f"telegram:{9_000_100 + i}")
        return hot_files(state_dir)

    after_first = await strangers(100)
    assert len(fake_telegram.calls_to("sendMessage")) == 3  # three codes wait at most
    assert await strangers(200) == after_first
    assert len(fake_telegram.calls_to("sendMessage")) == 3


async def test_typing_is_shown_only_for_the_chat_whose_turn_holds_the_model(
        start: Start, fake_telegram: FakeTelegram, fake_ollama: FakeOllama) -> None:  # noqa: F811
    other = 2222222
    daemon = await start(telegram={"allow": (USER, other)})
    fake_ollama.hang = True  # the first chat's turn holds the model until released
    assert await daemon.post(message(1, "first", user=USER)) == 200
    await fake_ollama.wait_for_chats(1, timeout=5)
    assert await daemon.post(message(2, "second", user=other)) == 200
    await daemon.telegram.intake.idle()  # type: ignore[union-attr]
    assert daemon.engine.queue_depths().get(f"telegram:{other}") == 1  # waiting for the model
    shown = len(fake_telegram.calls_to("sendChatAction"))
    await fake_telegram.wait_for("sendChatAction", count=shown + 3)  # time passes meanwhile
    typing = fake_telegram.calls_to("sendChatAction")
    assert {c.params["chat_id"] for c in typing} == {USER}
    fake_ollama.hang = False
    await fake_telegram.wait_for("sendMessage", count=2)
    await daemon.settle(f"telegram:{other}")


async def test_32_concurrent_updates_share_fsyncs_and_are_all_remembered(
        start: Start, fake_telegram: FakeTelegram, state_dir: Path) -> None:  # noqa: F811
    users = [3_000_000 + i for i in range(32)]
    daemon = await start(telegram={"allow": tuple(users)})
    intake = daemon.telegram.intake
    assert intake is not None
    statuses = await asyncio.gather(*(daemon.post(message(200 + i, f"n{i}", user=u))
                                      for i, u in enumerate(users)))
    assert statuses == [200] * 32
    assert intake.intake.commit.writes < 32  # one write (one fsync) served several acks
    await fake_telegram.wait_for("sendMessage", count=32, timeout=30)
    await daemon.stop()
    with Store.open(state_dir) as store:  # a redelivery of any of them is recognised
        assert not any(store.updates_accept("telegram", f"telegram:update:{200 + i}", {}, 0.0)
                       for i in range(32))
