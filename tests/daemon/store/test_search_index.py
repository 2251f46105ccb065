"""The memory index as memory_search sees it: facts found in other words, sensible ranking,
summaries and archived conversations searched, incremental sync, hostile queries, and an index
file that is lost or corrupt being rebuilt from the store."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.core.conversations import Role, SummaryState
from daemon.store import Store, search_index
from daemon.store.search_index import SearchIndex, query_terms

T0 = 1_700_000_000.0
CHAT = "telegram:1111111"
OTHER = "whatsapp:972544401243"

FILLER = [
    "Can you suggest a recipe for a quick vegetable soup tonight?",
    "Sure: onions, carrots, celery and stock, simmered for twenty minutes.",
    "What is the weather like in Berlin tomorrow?",
    "Mostly cloudy with light rain in the afternoon.",
    "Remind me to call the bank about the card.",
    "Noted. Anything else for today?",
]


@pytest.fixture
def store(state_dir: Path) -> Iterator[Store]:
    with Store.open(state_dir) as opened:
        yield opened


@pytest.fixture
def index(tmp_path: Path) -> Iterator[SearchIndex]:
    opened = SearchIndex.open(tmp_path / "index" / "memory.sqlite3")
    yield opened
    opened.close()


def conversation(store: Store, texts: list[str], chat: str = CHAT, start: float = T0) -> str:
    """A conversation with `texts` as alternating user and assistant messages."""
    created = store.create_conversation(chat, start)
    for n, text in enumerate(texts):
        role: Role = "user" if n % 2 == 0 else "assistant"
        store.append_message(created.id, role, text, created=start + n)
    return created.id


def refs(index: SearchIndex, query: str, store: Store | None = None) -> list[str]:
    return [hit.ref for hit in index.search(query, 8, store)]


def test_a_fact_is_found_by_a_differently_worded_question(store: Store,
                                                          index: SearchIndex) -> None:
    cid = conversation(store, [*FILLER, "My sister's wedding is in Porto on the 14th of June.",
                               "Lovely, I will remember that.", *FILLER])
    index.sync(store)

    hits = index.search("when is the wedding?")

    assert hits[0].ref == f"msg:{cid}:7"
    assert (hits[0].kind, hits[0].seq, hits[0].role, hits[0].chat_key) == (
        "message", 7, "user", CHAT)
    assert hits[0].created == T0 + 6
    assert "wedding is in Porto" in hits[0].snippet


def test_stemming_matches_other_forms_of_a_word(store: Store, index: SearchIndex) -> None:
    cid = conversation(store, [*FILLER, "We parked the camper on level three of the garage.",
                               *FILLER])
    index.sync(store)

    assert refs(index, "where did I park the campers")[0] == f"msg:{cid}:7"


def test_a_message_with_two_query_words_ranks_above_one_with_one(store: Store,
                                                                 index: SearchIndex) -> None:
    # bm25 alone favours the short one-word message; holding both words matters more.
    cid = conversation(store, [
        "Budget!",
        "I put the holiday budget for Lisbon into a long shared spreadsheet with every cost, "
        "flights, hotel, food, museums and a margin for surprises along the way.",
        "The spreadsheet is shared.",
    ])
    index.sync(store)

    hits = index.search("budget spreadsheet")

    assert [h.ref for h in hits] == [f"msg:{cid}:2", f"msg:{cid}:1", f"msg:{cid}:3"]
    assert hits[0].score > hits[1].score > 0


def test_summaries_are_found_and_replaced_when_they_change(store: Store,
                                                           index: SearchIndex) -> None:
    cid = conversation(store, FILLER)
    store.save_summary(cid, SummaryState(summary="The user is planning a kayak trip to Norway.",
                                         user_notes="bring the dry bags", through_seq=4,
                                         fold_count=1, folded_at=T0 + 10))
    index.sync(store)

    hits = index.search("kayak norway")
    assert hits[0].ref == f"summary:{cid}"
    assert (hits[0].kind, hits[0].seq, hits[0].role, hits[0].created) == (
        "summary", None, None, T0 + 10)
    assert refs(index, "dry bags") == [f"summary:{cid}"]  # the user's notes are indexed too

    store.save_summary(cid, SummaryState(summary="The trip moved to Scotland.", through_seq=6,
                                         fold_count=2, folded_at=T0 + 20))
    assert index.sync(store, [cid]) == 1
    assert refs(index, "kayak norway") == []
    assert refs(index, "scotland") == [f"summary:{cid}"]
    assert index.stats()["summaries"] == 1


def test_archived_conversations_and_every_chat_are_searched(store: Store,
                                                            index: SearchIndex) -> None:
    old = conversation(store, ["The garage door code is 4817.", "Got it."])
    archived = store.get_conversation(old)
    assert archived is not None
    store.save_conversation(archived.archived("idle"))
    other = conversation(store, ["The garage needs a new lamp."], chat=OTHER, start=T0 + 100)

    index.sync(store)

    assert refs(index, "garage door code") == [f"msg:{old}:1", f"msg:{other}:1"]
    assert index.search("garage lamp")[0].chat_key == OTHER


def test_a_scoped_search_returns_only_those_chats_however_many_others_match(
        store: Store, index: SearchIndex) -> None:
    theirs = [conversation(store, [f"Garage code {n} for the other chat.", "Noted."],
                           chat=OTHER, start=T0 + n) for n in range(30)]
    mine = conversation(store, ["My garage code is 4817.", "Got it."], start=T0 + 100)
    store.save_summary(theirs[0], SummaryState(summary="They talked about the garage code.",
                                               through_seq=2, fold_count=1, folded_at=T0 + 50))
    automation = conversation(store, ["Check the garage code."], chat="automation:brief",
                              start=T0 + 200)
    index.sync(store)

    hits = index.search("garage code", 3, chats={CHAT})
    assert [h.ref for h in hits] == [f"msg:{mine}:1"]
    # A single conversation besides the chats (an automation's own run).
    hits = index.search("garage code", 3, chats=set(), conversations={automation})
    assert [h.ref for h in hits] == [f"msg:{automation}:1"]
    assert index.search("garage code", 3, chats=set()) == []
    # Unscoped (the index's own callers), every chat's rows rank as before.
    assert {h.chat_key for h in index.search("garage code", 40)} == {
        CHAT, OTHER, "automation:brief"}


def test_a_scoped_search_finds_an_old_message_of_its_own_among_many_newer_of_others(
        store: Store, index: SearchIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past BUDGET matching rows a query ranks only the newest ones: the newest in scope, not
    # the newest of everybody's. A small BUDGET stands for the 5,000 rows of heavy traffic.
    monkeypatch.setattr(search_index, "BUDGET", 20)
    mine = conversation(store, ["My garage code is 4817.", "Got it."])
    for n in range(5):
        conversation(store, [f"Garage code {n}{m} for the other chat." for m in range(10)],
                     chat=OTHER, start=T0 + 100 + n)
    index.sync(store)
    assert f"msg:{mine}:1" not in refs(index, "garage code")  # unscoped, it is too old
    hits = index.search("garage code", 3, chats={CHAT})
    assert [h.ref for h in hits] == [f"msg:{mine}:1"]


def test_a_fact_only_in_early_messages_is_found_after_the_summary_moved_on(
        store: Store, index: SearchIndex) -> None:
    cid = conversation(store, ["My passport number is X1234567, keep it for the visa form.",
                               "Saved.", *FILLER * 4])
    # Three folds later the summary no longer mentions it.
    store.save_summary(cid, SummaryState(summary="Soup recipes and the weather in Berlin.",
                                         through_seq=24, fold_count=3, folded_at=T0 + 30))
    index.sync(store)

    hits = index.search("what was my passport number?")

    assert hits[0].ref == f"msg:{cid}:1"
    assert store.messages(cid, 1, 1)[0].content.startswith("My passport number is X1234567")


def test_sync_is_incremental_and_search_syncs_dirty_conversations(store: Store,
                                                                 index: SearchIndex) -> None:
    cid = conversation(store, FILLER)
    assert index.sync(store) == len(FILLER)
    assert index.sync(store) == 0
    assert index.sync(store, [cid]) == 0

    store.append_message(cid, "user", "The spare key is under the blue flowerpot.",
                         created=T0 + 50)
    assert refs(index, "spare key flowerpot") == []  # not synced, not marked
    index.mark_dirty(cid)
    assert index.stats()["dirty"] == 1

    assert refs(index, "where is the spare key?", store) == [f"msg:{cid}:{len(FILLER) + 1}"]
    assert index.stats() == {"messages": len(FILLER) + 1, "summaries": 0, "conversations": 1,
                             "dirty": 0}
    assert index.sync(store) == 0


def test_a_freshly_opened_index_syncs_everything_on_its_first_search(
        store: Store, tmp_path: Path) -> None:
    cid = conversation(store, ["Grandma's lasagne needs nutmeg."])
    index = SearchIndex.open(tmp_path / "memory.sqlite3")
    try:
        assert refs(index, "lasagne", store) == [f"msg:{cid}:1"]
    finally:
        index.close()


def test_tool_results_are_indexed_but_recall_tool_echoes_are_not(store: Store,
                                                                 index: SearchIndex) -> None:
    cid = conversation(store, ["What is the weather in Oslo?"])
    store.append_message(cid, "tool", '{"city": "Oslo", "forecast": "sleet"}', created=T0 + 1,
                         tool_name="weather")
    store.append_message(cid, "tool", "1 result: msg:x:1 [telegram] sleet in Oslo",
                         created=T0 + 2, tool_name="memory_search")
    store.append_message(cid, "assistant", "", created=T0 + 3)  # a bare tool call
    assert index.sync(store) == 2

    hits = index.search("sleet")
    assert [(h.ref, h.role) for h in hits] == [(f"msg:{cid}:2", "tool")]
    assert index.sync(store) == 0  # skipped messages are not read again


@pytest.mark.parametrize("query", [
    '"', "*", "NEAR(", "AND OR", "-", "", "   ", "^", "(", ")", ":", "{}", "NOT", "'",
    "🦜🦜", "the of and is", "x" * 5_000, '" OR 1=1 --', "body:*", "a*b*c",
])
def test_queries_without_searchable_words_return_nothing(store: Store, index: SearchIndex,
                                                         query: str) -> None:
    conversation(store, FILLER)
    index.sync(store)

    assert index.search(query) == []


@pytest.mark.parametrize("query", [
    'wedding"', '"wedding', "wedding*", "NEAR(wedding", "wedding AND OR", "-wedding",
    "wedding NOT porto", "body:wedding", "(wedding", "wedding^2", "{wedding}",
    "WEDDING", "Wédding", "wedding " * 700, "x" * 5_000 + " wedding",
])
def test_hostile_queries_never_raise_and_still_find_the_word(store: Store, index: SearchIndex,
                                                             query: str) -> None:
    cid = conversation(store, [*FILLER, "The wedding is in Porto."])
    index.sync(store)

    assert refs(index, query)[0] == f"msg:{cid}:7"


def test_unicode_words_are_folded_and_found(store: Store, index: SearchIndex) -> None:
    cid = conversation(store, ["Grüße aus Köln! Wir treffen uns am Café Müller.",
                               "Ελληνικά κείμενα και 日本語 text 🦜"])
    index.sync(store)

    assert refs(index, "koln") == [f"msg:{cid}:1"]
    assert refs(index, "KÖLN cafe") == [f"msg:{cid}:1"]
    assert refs(index, "ΕΛΛΗΝΙΚΆ") == [f"msg:{cid}:2"]  # case folds in any script
    assert refs(index, "日本語") == [f"msg:{cid}:2"]


def test_query_terms_drop_operators_and_stop_words() -> None:
    assert query_terms('what did "Anna" say NEAR(the) AND about Porto?') == [
        "Anna", "say", "Porto"]
    assert query_terms("the and of") == []
    assert query_terms("Porto porto PORTO") == ["Porto"]
    assert len(query_terms(" ".join(f"w{n}" for n in range(1_000)))) == 12


def test_snippets_are_one_short_line(store: Store, index: SearchIndex) -> None:
    long = "\n".join(f"Line {n} of the report about nothing much." for n in range(400))
    conversation(store, [long + "\nThe turbine failed at 03:00.\n" + long])
    index.sync(store)

    (hit,) = index.search("turbine failed")
    assert "turbine failed" in hit.snippet
    assert "\n" not in hit.snippet
    assert len(hit.snippet) <= 240


def test_a_deleted_index_file_is_rebuilt_from_the_store(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    cid = conversation(store, [*FILLER, "The boiler service is booked for March."])
    index = SearchIndex.open(path)
    index.sync(store)
    index.close()
    for part in tmp_path.glob("memory.sqlite3*"):
        part.unlink()

    index = SearchIndex.open(path)
    try:
        assert index.search("boiler") == []
        assert index.sync(store) == len(FILLER) + 1
        assert refs(index, "boiler service") == [f"msg:{cid}:7"]
    finally:
        index.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other schema"])
def test_a_corrupt_or_outdated_index_file_is_rebuilt(store: Store, tmp_path: Path,
                                                     damage: str) -> None:
    path = tmp_path / "memory.sqlite3"
    cid = conversation(store, [*FILLER, "The boiler service is booked for March."])
    index = SearchIndex.open(path)
    index.sync(store)
    index.close()
    if damage == "garbage":
        path.write_bytes(b"\x00not a database\xff" * 512)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:1500])
    else:  # written by another version of roost
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 99")
        db.close()

    index = SearchIndex.open(path)
    try:
        moved = list(tmp_path.glob("memory.sqlite3.corrupt-*"))
        assert bool(moved) == (damage != "other schema")  # kept for a look, not deleted
        assert index.sync(store) == len(FILLER) + 1
        assert refs(index, "boiler service") == [f"msg:{cid}:7"]
    finally:
        index.close()


def test_searches_from_many_threads_during_a_sync(store: Store, index: SearchIndex) -> None:
    cids = [conversation(store, [*FILLER, f"Locker number {n} belongs to Quentin."],
                         start=T0 + n * 100) for n in range(4)]
    errors: list[BaseException] = []

    def search() -> None:
        try:
            for _ in range(20):
                for hit in index.search("locker quentin"):
                    assert hit.ref.startswith("msg:")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    index.sync(store)
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(refs(index, "locker quentin")) == sorted(f"msg:{c}:7" for c in cids)


def test_an_index_corrupted_while_open_is_rebuilt_on_the_next_search(store: Store,
                                                                     tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    cid = conversation(store, [" ".join(f"w{n}x{m}" for m in range(200)) for n in range(60)])
    index = SearchIndex.open(path)
    try:
        index.sync(store)
        # Another connection moves everything into the main file, which then gets damaged.
        other = sqlite3.connect(path)
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        other.close()
        with open(path, "r+b") as handle:
            handle.seek(4096)
            handle.write(b"\xff" * (path.stat().st_size - 4096))

        assert refs(index, "w57x100", store) == [f"msg:{cid}:58"]
        assert list(tmp_path.glob("memory.sqlite3.corrupt-*"))
    finally:
        index.close()
