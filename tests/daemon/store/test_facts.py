"""The facts files: Markdown a person can read, one dated fact a line, written atomically;
a chat that joins an identity brings its facts; a failed write changes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from daemon.core.errors import StoreError
from daemon.store.facts import (
    FACT_MAX_CHARS,
    FACTS_MAX,
    FactError,
    FactsBook,
    FrozenFacts,
    Person,
)
from daemon.store.files import MemoryFiles

ALICE = Person("telegram:1111111", ("telegram:1111111",))
WA = Person("whatsapp:972544401243", ("whatsapp:972544401243",))
LINKED = Person("alice", ("telegram:1111111", "whatsapp:972544401243"))
CONVERSATION = "01JDQ7ZB1N6V3W8X9Y0Z1A2B3C"


class FullDisk(MemoryFiles):
    """Files whose writes fail the way a full disk makes `atomic_write` fail."""

    full = False

    def write(self, path: Path, payload: bytes, *, durable_rename: bool = True) -> None:
        if self.full:
            raise StoreError(f"cannot write {path}: No space left on device")
        super().write(path, payload, durable_rename=durable_rename)


def test_a_facts_file_is_markdown_with_one_dated_fact_a_line(state_dir: Path) -> None:
    book = FactsBook.at(state_dir)
    book.add(ALICE, "My locker code\n is 4417.", "2026-12-01")
    book.add(ALICE, "- I prefer metric units", "2026-12-02")
    text = (state_dir / "facts" / "telegram_1111111.md").read_text("utf-8")
    assert text.startswith("# What roost keeps about telegram:1111111\n")
    assert text.endswith("- 2026-12-01: My locker code is 4417.\n"
                         "- 2026-12-02: I prefer metric units\n")
    assert list((state_dir / "facts").glob(".*.tmp")) == []  # written by rename


def test_a_hand_edited_file_is_read_line_by_line(state_dir: Path) -> None:
    folder = state_dir / "facts"
    folder.mkdir(parents=True)
    (folder / "telegram_1111111.md").write_text(
        "notes of mine\n- 2026-10-01: Allergic to peanuts\n  - 2026-10-02: Likes tea  \n"
        "- not a dated line\n\n", "utf-8")
    facts = FactsBook.at(state_dir).facts(ALICE)
    assert [(f.added, f.text) for f in facts] == [("2026-10-01", "Allergic to peanuts"),
                                                  ("2026-10-02", "Likes tea")]


def test_the_same_fact_is_kept_once_and_bad_ones_are_refused() -> None:
    book = FactsBook(MemoryFiles())
    assert book.add(ALICE, "Likes tea", "2026-12-01")[1] is True
    fact, new = book.add(ALICE, "likes tea.", "2026-12-03")
    assert not new and fact.added == "2026-12-01"
    with pytest.raises(FactError, match="needs some text"):
        book.add(ALICE, "  \n ", "2026-12-01")
    with pytest.raises(FactError, match=f"at most {FACT_MAX_CHARS} characters"):
        book.add(ALICE, "x" * (FACT_MAX_CHARS + 1), "2026-12-01")
    for i in range(FACTS_MAX - 1):
        book.add(ALICE, f"fact {i}", "2026-12-01")
    with pytest.raises(FactError, match="forget some first"):
        book.add(ALICE, "one too many", "2026-12-01")
    assert len(book.facts(ALICE)) == FACTS_MAX


def test_forgetting_by_number_and_by_words() -> None:
    book = FactsBook(MemoryFiles())
    for text in ("Likes tea", "Likes green tea", "Lives in Graz"):
        book.add(ALICE, text, "2026-12-01")
    assert book.remove(ALICE, 3).text == "Lives in Graz"
    with pytest.raises(FactError, match="numbered 1 to 2"):
        book.remove(ALICE, 3)
    with pytest.raises(FactError, match="2 facts match"):
        book.remove_text(ALICE, "tea")
    assert book.remove_text(ALICE, "likes tea").text == "Likes tea"
    with pytest.raises(FactError, match="no kept fact"):
        book.remove_text(ALICE, "coffee")
    assert [f.text for f in book.facts(ALICE)] == ["Likes green tea"]
    assert [f.text for f in book.facts(WA)] == []  # another person's file is another file


def test_linking_chats_merges_their_facts_into_the_identity(state_dir: Path) -> None:
    book = FactsBook.at(state_dir)
    book.add(ALICE, "Likes tea", "2026-12-02")
    book.add(WA, "Lives in Graz", "2026-12-01")
    book.add(WA, "likes tea", "2026-12-03")
    assert [(f.added, f.text) for f in book.facts(LINKED)] == [
        ("2026-12-01", "Lives in Graz"), ("2026-12-02", "Likes tea")]
    assert sorted(p.name for p in (state_dir / "facts").glob("*.md")) == ["identity_alice.md"]
    book.add(LINKED, "Has a cat", "2026-12-04")
    assert len(FactsBook.at(state_dir).facts(LINKED)) == 3


def test_a_failed_write_changes_nothing() -> None:
    files = FullDisk()
    book = FactsBook(files)
    book.add(ALICE, "Likes tea", "2026-12-01")
    files.full = True
    with pytest.raises(StoreError, match="No space left"):
        book.add(ALICE, "Lives in Graz", "2026-12-02")
    with pytest.raises(StoreError, match="No space left"):
        book.remove(ALICE, 1)
    assert [f.text for f in book.facts(ALICE)] == ["Likes tea"]


def test_a_frozen_block_round_trips_and_a_broken_one_is_made_again(state_dir: Path) -> None:
    book = FactsBook.at(state_dir)
    frozen = FrozenFacts(block="<user_facts>\n- x\n</user_facts>", known=("x",), fold_count=2,
                         person=ALICE.name, shown=1, tokens=9, cap=256)
    book.freeze(CONVERSATION, frozen)
    assert FactsBook.at(state_dir).frozen(CONVERSATION) == frozen
    (state_dir / "conversations" / CONVERSATION / "facts.json").write_text("{not json")
    assert book.frozen(CONVERSATION) is None
    with pytest.raises(ValueError, match="not a conversation id"):
        book.frozen("../../etc")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_facts_lock_root_makes_beside_the_service_stays_the_services(state_dir: Path) -> None:
    """`sudo roost memory add` next to the system service: the lock file root creates belongs
    to the state directory's owner, or the service could not take it (and keep no fact)."""
    service = 61234  # a DynamicUser-like uid owning the state directory
    folder = state_dir / "facts"
    folder.mkdir(parents=True)
    os.chown(folder, service, service)
    FactsBook.at(state_dir).add(ALICE, "My locker code is 4417.", "2026-12-01")
    lock = folder / ".lock"
    assert (lock.stat().st_uid, stat.S_IMODE(lock.stat().st_mode)) == (service, 0o600)
