"""The one gate every channel's door goes through, and the one quarantine of the stored queues,
as a channel (or the engine) uses them: allowed and approved senders pass, a stranger gets one
pairing code in a private chat and nothing in a group, and what cannot be set aside stays."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from daemon.core.config import AccessSettings
from daemon.core.errors import StoreError
from daemon.intake.gate import Access, Gate
from daemon.intake.pairing import PairingBook
from daemon.intake.quarantine import error_text, set_aside
from daemon.store import Store

log = logging.getLogger("roost.test")


class Told:
    """The engine's `notify`: what each chat was told."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def __call__(self, chat_key: str, text: str) -> None:
        self.sent.append((chat_key, text))


def gate(state_dir: Path, told: Told, unknown_senders: str = "pair") -> tuple[Gate, PairingBook]:
    book = PairingBook(state_dir)
    access = Access(AccessSettings(unknown_senders=unknown_senders), book, clock=lambda: 1000.0)
    return Gate("test", "Test", [42], access, told, log), book


async def test_allowed_and_approved_senders_pass_and_nobody_is_told(state_dir: Path) -> None:
    told = Told()
    door, book = gate(state_dir, told)
    assert await door.door("42", "test:42", "Owner")  # allow lists hold ints, senders are str
    made = book.request("test", "7", "test:7", "Seven", now=1000.0)
    assert made is not None and book.approve(made.code, now=1000.0) is not None
    assert await door.door("7", "test:7", "Seven")
    assert told.sent == []


async def test_a_stranger_gets_one_code_in_private_and_none_in_a_group(state_dir: Path) -> None:
    told = Told()
    door, book = gate(state_dir, told)
    assert not await door.door("9", "test:-100", "Nine", private=False)
    assert told.sent == [] and book.pending(1000.0) == []  # a group's chatter asks nothing
    assert not await door.door("9", "test:9", "Nine")
    assert not await door.door("9", "test:9", "Nine")  # writing again brings no second code
    ((chat, text),) = told.sent
    assert chat == "test:9" and "pairing code is" in text


async def test_without_pairing_a_stranger_is_only_logged(
        state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    told = Told()
    door, _ = gate(state_dir, told, unknown_senders="ignore")
    with caplog.at_level(logging.WARNING, "roost.test"):
        assert not await door.door("9", "test:9", "Nine")
    assert told.sent == []
    assert any("unknown Test user 9" in r.getMessage() for r in caplog.records)


async def test_what_the_store_refuses_to_set_aside_stays_where_it_was(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        store.updates_add("test", "test:1", {"chat": "a"}, 1.0)
        error = error_text(RuntimeError("cannot translate this"))

        def done() -> None:
            raise StoreError("cannot write: No space left on device")

        assert not await set_aside(store, "update", [("test:1", {"chat": "a"})], error, 2.0,
                                   done, "test test:1", log)
        assert [d["key"] for d in store.updates_pending("test")] == ["test:1"]
        assert await set_aside(store, "update", [("test:1", {"chat": "a"})], error, 3.0,
                               lambda: store.updates_done("test:1"), "test test:1", log)
        assert store.updates_pending("test") == []
        assert any(q["key"] == "test:1" and q["error"] == "RuntimeError: cannot translate this"
                   for q in store.quarantined())
