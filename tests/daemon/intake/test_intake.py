"""The shared intake as any channel sees it: persisted before `accept` returns, redeliveries
dropped (also after a restart), order kept per chat, groups processed together, a failing
payload retried once and then quarantined while its chat carries on, and a stored payload that
cannot even be routed quarantined at resume."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from daemon.core.errors import StoreError
from daemon.intake.durable import Intake, Outcome, Pending
from daemon.store import Store


class Recorder:
    """A channel's side: the chat is `payload["chat"]`; `boom` fails while `fail` lasts."""

    def __init__(self, fail: int = 0) -> None:
        self.processed: list[list[str]] = []
        self.unread: list[list[str]] = []  # batches whose sender was told they were not read
        self.fail = fail

    def route(self, payload: Mapping[str, Any]) -> str | None:
        if payload.get("unroutable"):
            raise ValueError("no idea where this goes")
        return str(payload["chat"]) if "chat" in payload else None

    def group(self, item: Pending) -> str | None:
        album = item.payload.get("album")
        return str(album) if album else None

    async def process(self, batch: list[Pending]) -> Outcome:
        if any(i.payload.get("boom") for i in batch) and self.fail:
            self.fail -= 1
            raise RuntimeError("cannot translate this")
        self.processed.append([str(i.payload["text"]) for i in batch])
        return Outcome.DONE

    async def unreadable(self, batch: list[Pending]) -> None:
        self.unread.append([i.key for i in batch])


async def feed(intake: Intake, *payloads: dict[str, Any]) -> list[bool]:
    answers = await asyncio.gather(*(intake.accept(f"test:{p['id']}", str(p["chat"]), p)
                                     for p in payloads))
    await asyncio.wait_for(intake.idle(), 10)
    return list(answers)


async def test_order_per_chat_groups_and_redeliveries(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        handler = Recorder()
        intake = Intake(store=store, channel="test", handler=handler, group_window=0.2)
        payloads = [{"id": i, "chat": "a" if i % 2 else "b", "text": f"m{i}"} for i in range(10)]
        payloads += [{"id": 20 + i, "chat": "c", "album": "x", "text": f"p{i}"} for i in range(3)]
        assert await feed(intake, *payloads) == [True] * 13
        assert await feed(intake, payloads[0], payloads[5]) == [False, False]
        await intake.stop()
    by_chat = {chat: [t for batch in handler.processed for t in batch if t in texts]
               for chat, texts in (("a", {f"m{i}" for i in range(1, 10, 2)}),
                                   ("b", {f"m{i}" for i in range(0, 10, 2)}))}
    assert by_chat == {"a": ["m1", "m3", "m5", "m7", "m9"], "b": ["m0", "m2", "m4", "m6", "m8"]}
    assert ["p0", "p1", "p2"] in handler.processed
    with Store.open(state_dir) as store:  # remembered after a restart too
        again = Intake(store=store, channel="test", handler=Recorder())
        assert await feed(again, payloads[3]) == [False]
        await again.stop()


async def test_a_payload_failing_twice_is_quarantined_and_its_chat_goes_on(
        state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        handler = Recorder(fail=2)
        intake = Intake(store=store, channel="test", handler=handler)
        await feed(intake, {"id": 1, "chat": "a", "text": "poison", "boom": True},
                   {"id": 2, "chat": "a", "text": "fine"})
        await intake.stop()
        assert handler.processed == [["fine"]]
        (item,) = store.quarantined()
        assert item["key"] == "test:1" and "cannot translate this" in item["error"]
        assert store.updates_pending("test") == []
        assert handler.unread == [["test:1"]]  # its sender is told, once


async def test_a_payload_failing_once_is_processed_on_the_retry(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        handler = Recorder(fail=1)
        intake = Intake(store=store, channel="test", handler=handler)
        await feed(intake, {"id": 1, "chat": "a", "text": "flaky", "boom": True})
        await intake.stop()
        assert handler.processed == [["flaky"]] and store.quarantined() == []
        assert handler.unread == []


async def test_resume_processes_what_was_left_and_quarantines_what_cannot_be_routed(
        state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        store.updates_add("test", "test:1", {"chat": "a", "text": "left"}, 1.0)
        store.updates_add("test", "test:2", {"unroutable": True}, 2.0)
        store.updates_add("test", "test:3", {"text": "no chat"}, 3.0)
    with Store.open(state_dir) as store:
        handler = Recorder()
        intake = Intake(store=store, channel="test", handler=handler)
        assert await intake.resume() == 3
        await asyncio.wait_for(intake.idle(), 10)
        await intake.stop()
        assert handler.processed == [["left"]]
        assert [q["key"] for q in store.quarantined()] == ["test:2"]
        assert store.updates_pending("test") == []


class FullDisk(Recorder):
    """Processing cannot store anything while `full` lasts (a full disk)."""

    def __init__(self, full: int) -> None:
        super().__init__()
        self.full = full

    async def process(self, batch: list[Pending]) -> Outcome:
        if self.full:
            self.full -= 1
            raise StoreError("cannot write inbox/x.json: No space left on device")
        return await super().process(batch)


async def test_a_disk_full_for_a_while_delays_a_payload_and_loses_nothing(
        state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        handler = FullDisk(full=8)  # more tries than a start-up's patience would allow
        intake = Intake(store=store, channel="test", handler=handler)
        intake.store_retry_delay = 0.001
        await feed(intake, {"id": 1, "chat": "a", "text": "first"},
                   {"id": 2, "chat": "a", "text": "second"})
        await intake.stop()
        assert handler.processed == [["first"], ["second"]]  # in order, neither left behind
        assert store.updates_pending("test") == [] and store.quarantined() == []


class NoSpace(Recorder):
    """A channel whose attachment folder cannot be made once: mkdir raises ENOSPC itself."""

    def __init__(self) -> None:
        super().__init__()
        self.full = 1

    async def process(self, batch: list[Pending]) -> Outcome:
        if self.full:
            self.full -= 1
            raise OSError(errno.ENOSPC, "No space left on device", "attachments/2026-12")
        return await super().process(batch)


async def test_an_out_of_space_error_is_one_line_and_the_payload_is_kept(
        state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Store.open(state_dir) as store:
        handler = NoSpace()
        intake = Intake(store=store, channel="test", handler=handler)
        intake.store_retry_delay = 0.001
        with caplog.at_level(logging.INFO, logger="roost"):
            await feed(intake, {"id": 1, "chat": "a", "text": "photo"})
        await intake.stop()
        assert handler.processed == [["photo"]]
        assert store.quarantined() == []
    (line,) = [r for r in caplog.records if "No space left" in r.getMessage()]
    assert line.exc_info is None  # no traceback: the disk, not roost, is at fault


async def test_a_payload_that_cannot_be_routed_at_resume_is_logged_with_its_traceback(
        state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Store.open(state_dir) as store:
        store.updates_add("test", "test:1", {"unroutable": True}, 1.0)
        intake = Intake(store=store, channel="test", handler=Recorder())
        with caplog.at_level(logging.ERROR, logger="roost"):
            assert await intake.resume() == 1
        await intake.stop()
        assert [q["key"] for q in store.quarantined()] == ["test:1"]
    assert any(r.exc_info and "no idea where this goes" in str(r.exc_info[1])
               for r in caplog.records)
