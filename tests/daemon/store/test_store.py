"""The store as a user would notice it: messages kept byte for byte, bounded segments that are
never rewritten once closed, UTF-8 files replaced atomically, the inbox, outbox and dedupe keys,
the directory lock, and what happens when a file is corrupt or the disk is full."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from daemon.core.conversations import Message, SummaryState
from daemon.core.errors import StoreError
from daemon.store import (
    DEDUPE_KEEP_SECONDS,
    SEGMENT_MAX_BYTES,
    SEGMENT_MAX_MESSAGES,
    Store,
)
from daemon.store.files import MemoryFiles, dumps
from daemon.store.migrate import MIGRATIONS, TABLE, Keepers, Migration, applied, migrate
from daemon.turn.router import Router

T0 = 1_700_000_000.0
CHAT = "telegram:1111111"
OTHER = "whatsapp:4915112345678"
ENOSPC = "No space left on device"


def forty_kb_text() -> str:
    line = "The quick brown fox 🦊 jumps over the lazy dog — über den Zaun, 日本語.\n"
    text = line * (40 * 1024 // len(line.encode("utf-8")) + 1)
    assert len(text.encode("utf-8")) >= 40 * 1024
    return text


SAMPLES = [
    "plain ascii",
    "Grüße aus Köln, ça va? Ünïcödé ß",
    "emoji 🦜 with joiners 👩🏽‍💻 🏳️‍🌈 and a flag 🇩🇪",
    "line one\nline two\r\nline three\n\n\ttabbed\n",
    "日本語のテキスト、中文、한국어, Ελληνικά, עברית, العربية",
    '  spaces kept  , "quotes", \\backslashes\\, {"json": [1, 2]} and </script>  ',
    "",
    forty_kb_text(),
]


def all_files(root: Path) -> Iterator[Path]:
    """Every file under root, hidden ones included."""
    for folder, _, names in os.walk(root):
        for name in names:
            yield Path(folder) / name


# 2001-09-09: a file set back to this and then written shows a new mtime on any filesystem,
# however coarse its timestamps (FAT keeps 2 s, some network mounts 1 s).
LONG_AGO_NS = 1_000_000_000 * 10**9


def backdated(paths: Iterable[Path]) -> dict[Path, tuple[int, int]]:
    """Each file's mtime set back years, then its (inode, mtime): a write in place changes the
    mtime, a replacing write (temp file and rename, as the store writes) the inode as well."""
    seen = {}
    for path in paths:
        os.utime(path, ns=(LONG_AGO_NS, LONG_AGO_NS))
        info = path.stat()
        seen[path] = (info.st_ino, info.st_mtime_ns)
    return seen


def written_since(seen: dict[Path, tuple[int, int]], root: Path) -> list[Path]:
    """The files under root written since `backdated` saw them (new files included)."""
    return [p for p in all_files(root)
            if seen.get(p) != (p.stat().st_ino, p.stat().st_mtime_ns)]


def segment_files(state_dir: Path, conversation_id: str) -> list[Path]:
    return sorted((state_dir / "conversations" / conversation_id).glob("seg-*.json"))


def temp_files(state_dir: Path) -> list[Path]:
    return [p for p in all_files(state_dir) if p.name.endswith(".tmp") or p.name.startswith(".")]


def corrupt_copies(state_dir: Path) -> list[Path]:
    return [p for p in all_files(state_dir) if ".corrupt-" in p.name]


def append_many(store: Store, conversation_id: str, count: int, start: int = 0) -> list[Message]:
    return [
        store.append_message(conversation_id, "user", f"message {i} 🦜", created=T0 + i)
        for i in range(start, start + count)
    ]


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """caplog for `roost.store`, also when another test ran `core.logs.configure()`, which stops
    roost's loggers from propagating to the root logger where caplog listens."""
    monkeypatch.setattr(logging.getLogger("roost"), "propagate", True)
    caplog.set_level(logging.INFO, logger="roost.store")
    return caplog


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "roost.store" and r.levelno >= logging.ERROR
    ]


class FullDisk:
    """Wraps an `os` function so that, while armed, it fails as on a full disk."""

    def __init__(self, real: Callable[..., Any], only: Callable[..., bool] | None = None) -> None:
        self.real = real
        self.only = only
        self.armed = False
        self.failures = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed and (self.only is None or self.only(*args)):
            self.failures += 1
            raise OSError(errno.ENOSPC, ENOSPC)
        return self.real(*args, **kwargs)


# ---- messages ------------------------------------------------------------------------------


def test_messages_round_trip_byte_for_byte_through_reopen(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        written = [
            store.append_message(conversation.id, "user" if i % 2 else "assistant", text,
                                 created=T0 + i)
            for i, text in enumerate(SAMPLES)
        ]
        written.append(store.append_message(
            conversation.id, "tool", "ok", created=T0 + len(SAMPLES),
            channel_message_ids=("4711",), tool_name="clock",
            tool_calls=({"function": {"name": "clock", "arguments": {"tz": "Europe/Berlin"}}},),
            meta={"inbox_id": "in-1", "note": "nötig 🦜"},
        ))

    with Store.open(state_dir) as store:
        read = store.messages(conversation.id)

    assert [m.content.encode("utf-8") for m in read[: len(SAMPLES)]] == [
        s.encode("utf-8") for s in SAMPLES
    ]
    assert [m.to_doc() for m in read] == [m.to_doc() for m in written]
    assert [m.seq for m in read] == list(range(1, len(written) + 1))
    ids = [m.id for m in read]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids


def test_messages_from_seq_to_seq_and_count(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        written = append_many(store, conversation.id, 12)
    with Store.open(state_dir) as store:
        assert store.message_count(conversation.id) == len(written)
        assert store.messages(conversation.id, from_seq=4, to_seq=6) == written[3:6]
        assert store.messages(conversation.id, from_seq=10) == written[9:]


def test_ids_sort_in_creation_order_within_one_millisecond(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        ids = [
            store.append_message(conversation.id, "user", f"burst {i}", created=T0 + 5).id
            for i in range(20)
        ]
    assert sorted(ids) == ids


# ---- segments ------------------------------------------------------------------------------


def test_segments_close_at_the_message_limit_and_are_never_rewritten(state_dir: Path) -> None:
    count = 2 * SEGMENT_MAX_MESSAGES + 50
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        written = append_many(store, conversation.id, count)

        segments = segment_files(state_dir, conversation.id)
        assert len(segments) == math.ceil(count / SEGMENT_MAX_MESSAGES) == 3
        per_segment = [len(json.loads(p.read_bytes())["messages"]) for p in segments]
        assert per_segment == [SEGMENT_MAX_MESSAGES, SEGMENT_MAX_MESSAGES, 50]

        closed = backdated(segments)  # the open one too: it shows that a write is seen
        written += append_many(store, conversation.id, 5, start=count)

    changed = set(written_since(closed, segments[0].parent)) & set(segments)
    assert changed == {segments[-1]}  # the appends went to the open segment, and only there

    closed = backdated(segments)
    with Store.open(state_dir) as store:  # loading from disk, not from the in-memory cache
        written += append_many(store, conversation.id, 5, start=count + 5)
        assert store.messages(conversation.id) == written
    changed = set(written_since(closed, segments[0].parent)) & set(segments)
    assert changed == {segments[-1]}
    assert segment_files(state_dir, conversation.id) == segments


def test_segment_closes_at_the_byte_limit_with_big_messages(state_dir: Path) -> None:
    # Two bytes per character: each message is about 40% of the byte limit.
    big = "é" * (SEGMENT_MAX_BYTES // 5)
    big_bytes = len(big.encode("utf-8"))
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        written = [
            store.append_message(conversation.id, "user", f"{i}:{big}", created=T0 + i)
            for i in range(7)
        ]

    segments = segment_files(state_dir, conversation.id)
    assert len(segments) > 1
    for path in segments[:-1]:
        size = path.stat().st_size
        held = len(json.loads(path.read_bytes())["messages"])
        assert held < SEGMENT_MAX_MESSAGES
        # Closed because of its size, and only once it reached the limit: without its last
        # message it was still below.
        assert size >= SEGMENT_MAX_BYTES
        assert size - big_bytes < SEGMENT_MAX_BYTES
    with Store.open(state_dir) as store:
        assert store.messages(conversation.id) == written


# ---- files on disk -------------------------------------------------------------------------


def test_files_are_utf8_json_and_no_temp_files_are_left(state_dir: Path) -> None:
    text = "Grüße 🦜 日本語 — «ok»"
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        store.append_message(conversation.id, "user", text, created=T0, meta={"note": text})
        store.save_summary(conversation.id, SummaryState(summary=text, user_notes=text))
        store.inbox_add({"id": "in-1", "chat_key": CHAT, "received": T0, "text": text})
        store.outbox_add({"id": "out-1", "chat_key": CHAT, "created": T0, "text": text})
        store.save_conversation(conversation.touched(T0 + 1))

    jsons = [p for p in all_files(state_dir) if p.suffix == ".json"]
    assert {p.name for p in jsons} >= {"active.json", "record.json", "summary.json",
                                       "seg-000000001.json"}
    for path in jsons:
        raw = path.read_bytes()
        json.loads(raw.decode("utf-8"))
        assert b"\\u" not in raw, path
    for name in ("in-1.json", "out-1.json", "summary.json", "seg-000000001.json"):
        (path,) = [p for p in jsons if p.name == name]
        assert text.encode("utf-8") in path.read_bytes(), name
    assert temp_files(state_dir) == []


def test_record_of_a_non_ascii_chat_key_is_utf8(state_dir: Path) -> None:
    chat_key = "automation:café-morgen"
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(chat_key, T0)
    raw = (state_dir / "conversations" / conversation.id / "record.json").read_bytes()
    assert json.loads(raw)["chat_key"] == chat_key
    assert chat_key.encode("utf-8") in raw


# ---- inbox, outbox, dedupe -----------------------------------------------------------------


def test_inbox_keeps_items_in_received_order_until_done(state_dir: Path) -> None:
    items = [
        {"id": "in-b", "chat_key": CHAT, "received": T0 + 2, "text": "second"},
        {"id": "in-a", "chat_key": CHAT, "received": T0 + 1, "text": "first 🦜"},
        {"id": "in-z", "chat_key": OTHER, "received": T0 + 1, "text": "same time, later id"},
        {"id": "in-c", "chat_key": OTHER, "received": T0 + 0, "text": "earliest"},
    ]
    with Store.open(state_dir) as store:
        for item in items:
            store.inbox_add(item)
    by_id = {i["id"]: i for i in items}
    with Store.open(state_dir) as store:
        assert store.inbox_pending() == [by_id[k] for k in ("in-c", "in-a", "in-z", "in-b")]
        assert [i["id"] for i in store.inbox_pending(CHAT)] == ["in-a", "in-b"]
        assert [i["id"] for i in store.inbox_pending(OTHER)] == ["in-c", "in-z"]
        store.inbox_done(["in-a", "in-c"])
        assert [i["id"] for i in store.inbox_pending()] == ["in-z", "in-b"]
    with Store.open(state_dir) as store:
        assert [i["id"] for i in store.inbox_pending()] == ["in-z", "in-b"]


def test_outbox_keeps_items_in_created_order_until_done(state_dir: Path) -> None:
    items = [
        {"id": "out-2", "chat_key": CHAT, "created": T0 + 2, "text": "reply two"},
        {"id": "out-1", "chat_key": CHAT, "created": T0 + 1, "text": "reply one ✓"},
        {"id": "out-3", "chat_key": OTHER, "created": T0 + 3, "text": "elsewhere"},
    ]
    with Store.open(state_dir) as store:
        for item in items:
            store.outbox_add(item)
    with Store.open(state_dir) as store:
        assert store.outbox_pending() == [items[1], items[0], items[2]]
        assert [i["id"] for i in store.outbox_pending(CHAT)] == ["out-1", "out-2"]
        store.outbox_done("out-1")
    with Store.open(state_dir) as store:
        assert [i["id"] for i in store.outbox_pending()] == ["out-2", "out-3"]


def test_dedupe_claim_is_true_once_then_false_also_after_reopen(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        assert store.dedupe_claim("telegram:update:1", T0) is True
        assert store.dedupe_claim("telegram:update:1", T0 + 1) is False
        assert store.dedupe_claim("telegram:update:2", T0 + 1) is True
    with Store.open(state_dir) as store:
        assert store.dedupe_claim("telegram:update:1", T0 + 2) is False
        assert store.dedupe_claim("telegram:update:2", T0 + 2) is False
        assert store.dedupe_claim("telegram:update:3", T0 + 2) is True


def test_dedupe_keys_are_forgotten_after_the_keep_period(state_dir: Path) -> None:
    # Keys are dropped ten minutes at a time: kept at least the period, not much longer.
    assert store_kept_at_least_the_period(state_dir)
    later = T0 + DEDUPE_KEEP_SECONDS + 2 * 3600
    with Store.open(state_dir) as store:
        assert store.dedupe_claim("old", T0) is True
        assert store.dedupe_claim("new", later) is True  # prunes keys older than the period
        assert store.dedupe_claim("old", later) is True
        assert store.dedupe_claim("new", later) is False


def store_kept_at_least_the_period(state_dir: Path) -> bool:
    with Store.open(state_dir / "kept") as store:
        store.dedupe_claim("old", T0)
        store.dedupe_claim("new", T0 + DEDUPE_KEEP_SECONDS - 1)
        return store.dedupe_claim("old", T0 + DEDUPE_KEEP_SECONDS - 1) is False


# ---- conversations -------------------------------------------------------------------------


def test_conversations_per_chat_archiving_and_listing(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        first = store.create_conversation(CHAT, T0)
        other = store.create_conversation(OTHER, T0 + 1)
        assert store.active_conversation(CHAT) == first
        assert store.active_conversation(OTHER) == other
        assert store.active_conversation("telegram:999") is None

        store.save_conversation(first.archived("new"))
        assert store.active_conversation(CHAT) is None
        second = store.create_conversation(CHAT, T0 + 2)
        store.save_conversation(second.touched(T0 + 3))

    with Store.open(state_dir) as store:
        active = store.active_conversation(CHAT)
        assert active is not None
        assert (active.id, active.last_active, active.status) == (second.id, T0 + 3, "active")
        assert active.kind == "telegram"
        assert [c.id for c in store.list_conversations()] == [first.id, other.id, second.id]
        assert [c.id for c in store.list_conversations(chat_key=CHAT)] == [first.id, second.id]
        assert [c.id for c in store.list_conversations(status="archived")] == [first.id]
        assert [c.id for c in store.list_conversations(chat_key=CHAT, status="active")] == [
            second.id
        ]
        archived = store.get_conversation(first.id)
        assert archived is not None and archived.status == "archived"
        assert store.get_conversation("no-such-id") is None


class CountingRecords(dict[str, dict[str, Any]]):
    """The book's records in memory, counting each one handed out."""

    reads = 0

    def values(self) -> Any:
        self.reads += len(self)
        return super().values()

    def items(self) -> Any:
        self.reads += len(self)
        return super().items()

    def __iter__(self) -> Any:
        self.reads += len(self)
        return super().__iter__()

    def __getitem__(self, key: str) -> dict[str, Any]:
        self.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def test_the_idle_sweep_reads_the_active_conversations_not_history(state_dir: Path) -> None:
    """Cost follows the active set: the rotation timer's sweep, every few minutes for a year,
    must not go through every conversation ever stored."""
    history = 200
    with Store.open(state_dir) as store:
        for n in range(history):
            old = store.create_conversation(f"telegram:{2000 + n}", T0 + n)
            store.save_conversation(old.archived("idle"))
        idle = store.create_conversation(CHAT, T0)
        fresh = store.create_conversation(OTHER, T0 + 10_000)
        records = CountingRecords(store.book.docs)
        store.book.docs = records
        router = Router(store, idle_rotation=3 * 3600)
        archived = router.rotate_idle(T0 + 3 * 3600 + 1, busy=set())
        assert [c.id for c in archived] == [idle.id]
        assert [c.id for c in store.list_conversations(status="active")] == [fresh.id]
        assert records.reads <= 4, f"{records.reads} records read for 2 active conversations"
        # The chat's next message starts a conversation from the one the sweep archived,
        # found without going through the others either.
        records.reads = 0
        store.save_conversation(store.get_conversation(fresh.id).touched(T0 + 3 * 3600))  # type: ignore[union-attr]
        following = router.conversation_for(CHAT, T0 + 3 * 3600 + 2)
        assert following.id != idle.id and following.after_idle
        assert records.reads <= 8, f"{records.reads} records read to start one conversation"
    with Store.open(state_dir) as store:  # what the sweep did is on disk
        assert [c.id for c in store.list_conversations(status="active")] == [fresh.id,
                                                                               following.id]
        assert store.newest_conversation(CHAT) == following
        assert len(store.list_conversations(status="archived")) == history + 1


def test_an_active_conversation_is_as_recent_as_its_newest_message(state_dir: Path) -> None:
    """A turn saves the record once, with its reply; a message appended before a crash counts
    as activity all the same, so idle rotation does not start from the reply before it."""
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        store.append_message(conversation.id, "user", "hello", created=T0 + 50)
    with Store.open(state_dir) as store:
        active = store.active_conversation(CHAT)
        assert active is not None and active.last_active == T0 + 50
        store.save_conversation(active.touched(T0 + 60))
        active = store.active_conversation(CHAT)
        assert active is not None and active.last_active == T0 + 60


def test_summary_round_trips_through_reopen_and_is_replaced(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        messages = append_many(store, conversation.id, 4)
        first = SummaryState(summary="Sie sprachen über 🦜\nund Tee.", user_notes="mag Tee",
                             through_seq=3, through_id=messages[2].id, fold_count=1,
                             folded_at=T0 + 10)
        store.save_summary(conversation.id, first)
    with Store.open(state_dir) as store:
        loaded = store.get_conversation(conversation.id)
        assert loaded is not None and loaded.summary == first
        active = store.active_conversation(CHAT)
        assert active is not None and active.summary == first
        second = SummaryState(summary="shorter", through_seq=4, through_id=messages[3].id,
                              fold_count=2, folded_at=T0 + 20)
        store.save_summary(conversation.id, second)
    with Store.open(state_dir) as store:
        loaded = store.get_conversation(conversation.id)
        assert loaded is not None and loaded.summary == second
        assert store.messages(conversation.id) == messages  # the fold does not touch messages


# ---- the lock ------------------------------------------------------------------------------


def test_second_open_is_refused_while_read_only_open_sees_the_data(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        store.append_message(conversation.id, "user", "hallo 🦜", created=T0)

        with pytest.raises(StoreError, match="another roost process") as refused:
            Store.open(state_dir)
        assert str(state_dir) in str(refused.value)

        with Store.open(state_dir, read_only=True) as reader:
            assert [c.id for c in reader.list_conversations()] == [conversation.id]
            assert [m.content for m in reader.messages(conversation.id)] == ["hallo 🦜"]

        # The writer still works after the refused attempt and the reader.
        store.append_message(conversation.id, "assistant", "hallo zurück", created=T0 + 1)

    with Store.open(state_dir) as store:  # released on close
        assert store.message_count(conversation.id) == 2


def test_second_daemon_process_is_refused_with_a_clear_message(state_dir: Path) -> None:
    script = (
        "import sys; from pathlib import Path\n"
        "from daemon.store import Store, StoreError\n"
        "try:\n"
        "    Store.open(Path(sys.argv[1]))\n"
        "except StoreError as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    with Store.open(state_dir):
        held = subprocess.run([sys.executable, "-c", script, str(state_dir)],
                              capture_output=True, text=True, timeout=30)
    assert held.returncode == 3, held.stderr
    assert "another roost process is using" in held.stdout
    assert str(state_dir) in held.stdout

    free = subprocess.run([sys.executable, "-c", script, str(state_dir)],
                          capture_output=True, text=True, timeout=30)
    assert free.returncode == 0, free.stdout + free.stderr


def test_read_only_open_of_a_missing_state_directory_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(StoreError, match="no roost state"):
        Store.open(missing, read_only=True)
    assert not missing.exists()


# ---- corruption at startup -----------------------------------------------------------------


def test_truncated_index_is_moved_aside_and_rebuilt_from_the_records(
    state_dir: Path, store_log: pytest.LogCaptureFixture
) -> None:
    with Store.open(state_dir) as store:
        first = store.create_conversation(CHAT, T0)
        first_messages = append_many(store, first.id, 3)
        other = store.create_conversation(OTHER, T0 + 1)
        other_messages = append_many(store, other.id, 2, start=10)
    index = state_dir / "conversations" / "active.json"
    truncated = index.read_bytes()[: index.stat().st_size // 2]
    index.write_bytes(truncated)

    with Store.open(state_dir) as store:
        (aside,) = index.parent.glob("active.json.corrupt-*")
        assert aside.read_bytes() == truncated
        assert any(str(index) in line and aside.name in line for line in error_lines(store_log))

        conversations = store.list_conversations()
        assert [c.id for c in conversations] == [first.id, other.id]
        assert [c.chat_key for c in conversations] == [CHAT, OTHER]
        assert {c.status for c in conversations} == {"archived"}
        assert store.active_conversation(CHAT) is None
        assert store.messages(first.id) == first_messages
        assert store.messages(other.id) == other_messages

        fresh = store.create_conversation(CHAT, T0 + 5)
        store.append_message(fresh.id, "user", "after the rebuild", created=T0 + 5)

    json.loads(index.read_bytes())
    with Store.open(state_dir) as store:
        active = store.active_conversation(CHAT)
        assert active is not None and active.id == fresh.id
        assert len(store.list_conversations()) == 3
    assert corrupt_copies(state_dir) == [aside]


def test_corrupt_last_segment_is_moved_aside_and_other_conversations_keep_working(
    state_dir: Path, store_log: pytest.LogCaptureFixture
) -> None:
    with Store.open(state_dir) as store:
        broken = store.create_conversation(CHAT, T0)
        broken_messages = append_many(store, broken.id, SEGMENT_MAX_MESSAGES + 10)
        healthy = store.create_conversation(OTHER, T0 + 1)
        healthy_messages = append_many(store, healthy.id, 5, start=1000)
    last = segment_files(state_dir, broken.id)[-1]
    truncated = last.read_bytes()[:-20]
    last.write_bytes(truncated)

    with Store.open(state_dir) as store:
        # Found at startup, before anyone asks for the messages.
        (aside,) = last.parent.glob(f"{last.name}.corrupt-*")
        assert aside.read_bytes() == truncated
        assert any(str(last) in line for line in error_lines(store_log))

        assert store.messages(healthy.id) == healthy_messages
        assert store.messages(broken.id) == broken_messages[:SEGMENT_MAX_MESSAGES]
        new_broken = store.append_message(broken.id, "user", "still here", created=T0 + 500)
        new_healthy = store.append_message(healthy.id, "user", "me too", created=T0 + 500)
        assert new_broken.seq == SEGMENT_MAX_MESSAGES + 1
        assert new_healthy.seq == len(healthy_messages) + 1

    with Store.open(state_dir) as store:
        assert store.messages(broken.id) == [*broken_messages[:SEGMENT_MAX_MESSAGES], new_broken]
        assert store.messages(healthy.id) == [*healthy_messages, new_healthy]
    assert corrupt_copies(state_dir) == [aside]
    for path in all_files(state_dir):
        if path.suffix == ".json":
            json.loads(path.read_bytes())


def test_corrupt_summary_is_moved_aside_and_the_conversation_keeps_working(
    state_dir: Path, store_log: pytest.LogCaptureFixture
) -> None:
    kept = SummaryState(summary="the other one", through_seq=1, fold_count=1)
    with Store.open(state_dir) as store:
        broken = store.create_conversation(CHAT, T0)
        messages = append_many(store, broken.id, 3)
        store.save_summary(broken.id, SummaryState(summary="lost", through_seq=2, fold_count=1))
        healthy = store.create_conversation(OTHER, T0 + 1)
        store.save_summary(healthy.id, kept)
    summary = state_dir / "conversations" / broken.id / "summary.json"
    truncated = summary.read_bytes()[:10]
    summary.write_bytes(truncated)

    with Store.open(state_dir) as store:
        (aside,) = summary.parent.glob("summary.json.corrupt-*")
        assert aside.read_bytes() == truncated
        assert any(str(summary) in line for line in error_lines(store_log))

        loaded = store.get_conversation(broken.id)
        assert loaded is not None and loaded.summary == SummaryState()  # folds again from 0
        assert store.messages(broken.id) == messages
        other = store.get_conversation(healthy.id)
        assert other is not None and other.summary == kept
        refolded = SummaryState(summary="refolded", through_seq=3, fold_count=1)
        store.save_summary(broken.id, refolded)
        store.append_message(broken.id, "user", "next", created=T0 + 9)

    with Store.open(state_dir) as store:
        loaded = store.get_conversation(broken.id)
        assert loaded is not None and loaded.summary == refolded
        assert store.message_count(broken.id) == len(messages) + 1
    assert corrupt_copies(state_dir) == [aside]


def test_two_corruptions_in_one_second_keep_both_copies(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        store.create_conversation(CHAT, T0)
    while time.time() % 1 > 0.5:  # start early in a second so both opens fall into it
        time.sleep(0.05)
    index = state_dir / "conversations" / "active.json"
    index.write_bytes(b'{"first corruption')
    Store.open(state_dir).close()
    index.write_bytes(b'{"second corruption')
    Store.open(state_dir).close()
    kept = sorted(p.read_bytes() for p in corrupt_copies(state_dir))
    assert kept == [b'{"first corruption', b'{"second corruption']


# ---- a full disk ---------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["fsync", "replace"])
@pytest.mark.parametrize("where", ["open segment", "new segment"])
def test_append_on_a_full_disk_fails_cleanly_and_recovers(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, call: str, where: str
) -> None:
    disk = FullDisk(getattr(os, call))
    monkeypatch.setattr(os, call, disk)
    before_count = SEGMENT_MAX_MESSAGES if where == "new segment" else 5
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        earlier = append_many(store, conversation.id, before_count)
        segments = {p: p.read_bytes() for p in segment_files(state_dir, conversation.id)}
        target = conversation.id + (
            f"/seg-{before_count + 1:09d}.json" if where == "new segment"
            else "/seg-000000001.json"
        )

        disk.armed = True
        with pytest.raises(StoreError) as failed:
            store.append_message(conversation.id, "user", "lost to the full disk", created=T0 + 1e5)
        disk.armed = False

        assert disk.failures == 1
        assert target in str(failed.value) and ENOSPC in str(failed.value)
        # Nothing half-written: the files are as before and no temp file is left.
        assert {p: p.read_bytes() for p in segment_files(state_dir, conversation.id)} == segments
        assert temp_files(state_dir) == []
        assert store.messages(conversation.id) == earlier

        recovered = store.append_message(conversation.id, "user", "disk has room again",
                                         created=T0 + 2e5)
        assert recovered.seq == before_count + 1

    with Store.open(state_dir) as store:
        assert store.messages(conversation.id) == [*earlier, recovered]


def test_failed_folder_fsync_leaves_the_conversation_usable(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def is_folder(fd: int) -> bool:
        return stat.S_ISDIR(os.fstat(fd).st_mode)

    disk = FullDisk(os.fsync, only=is_folder)
    monkeypatch.setattr(os, "fsync", disk)
    with Store.open(state_dir) as store:
        conversation = store.create_conversation(CHAT, T0)
        append_many(store, conversation.id, 3)
        disk.armed = True
        with pytest.raises(StoreError):
            store.append_message(conversation.id, "user", "maybe saved", created=T0 + 10)
        disk.armed = False
        store.append_message(conversation.id, "user", "the next one", created=T0 + 11)
    with Store.open(state_dir) as store:
        stored = store.messages(conversation.id)
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    assert stored[-1].content == "the next one"


def test_open_that_fails_on_a_full_disk_releases_the_directory(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(os.fsync)
    monkeypatch.setattr(os, "fsync", disk)
    disk.armed = True
    with pytest.raises(StoreError, match=r"meta\.json"):
        Store.open(state_dir)
    disk.armed = False
    Store.open(state_dir).close()


def test_raw_updates_outbox_progress_and_chat_flags_survive_a_reopen(state_dir: Path) -> None:
    with Store.open(state_dir) as store:
        store.updates_add("telegram", "telegram:update:2", {"update_id": 2}, received=20.0)
        store.updates_add("telegram", "telegram:update:1", {"update_id": 1}, received=10.0)
        store.updates_add("whatsapp", "whatsapp:wamid.A", {"id": "wamid.A"}, received=5.0)
        store.outbox_add({"id": "o1", "chat_key": "telegram:1", "text": "hi", "created": 1.0})
        store.outbox_update("o1", parts_sent=2)
        store.set_chat_flag("telegram:1", "blocked", 123.0)
    with Store.open(state_dir) as store:
        pending = store.updates_pending("telegram")
        assert [u["payload"]["update_id"] for u in pending] == [1, 2]
        store.updates_done("telegram:update:1")
        assert [u["key"] for u in store.updates_pending("telegram")] == ["telegram:update:2"]
        assert [u["key"] for u in store.updates_pending("whatsapp")] == ["whatsapp:wamid.A"]
        assert store.outbox_pending()[0]["parts_sent"] == 2
        assert store.chat_flags("telegram:1") == {"blocked": 123.0}
        store.set_chat_flag("telegram:1", "blocked", None)
        assert store.chat_flags("telegram:1") == {}
        assert store.chat_flags("telegram:2") == {}


def test_a_state_directory_of_the_single_index_layout_is_taken_over_whole(
        state_dir: Path) -> None:
    """Migration 3: what an earlier roost kept in index.json is found in the new layout."""
    from daemon.core.conversations import Conversation
    from daemon.store.book import index_doc

    active = Conversation.start(CHAT, T0)
    archived = Conversation.start(OTHER, T0 - 10).archived("idle")
    with Store.open(state_dir) as store:  # the conversation folders exist in both layouts
        for conversation in (active, archived):
            (state_dir / "conversations" / conversation.id).mkdir()
            store.log.created(conversation.id)
            store.append_message(conversation.id, "user", "kept", created=T0)
    for name in ("meta.json", "conversations/active.json"):
        (state_dir / name).unlink(missing_ok=True)
    for stale in (state_dir / "conversations").glob("archive-*.json"):
        stale.unlink()

    def table(*docs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {str(i): doc for i, doc in enumerate(docs, 1)}

    legacy = {
        "_migrations": table({"version": 1, "applied": T0}, {"version": 2, "applied": T0}),
        "conversations": table(index_doc(active), index_doc(archived)),
        "inbox": table({"id": "in-1", "chat_key": CHAT, "received": T0, "text": "waiting"}),
        "outbox": table({"id": "out-1", "chat_key": CHAT, "created": T0, "text": "unsent",
                         "parts_sent": 1}),
        "updates": table({"channel": "telegram", "key": "telegram:update:7",
                          "payload": {"update_id": 7}, "received": T0}),
        "dedupe": table({"key": "telegram:update:7", "seen": time.time()},
                        {"key": "telegram:update:6", "seen": time.time()},
                        {"key": "sent:out-0", "seen": time.time()}),
        "chats": table({"chat_key": CHAT, "undeliverable": T0}),
    }
    (state_dir / "index.json").write_text(json.dumps(legacy), "utf-8")

    for _ in range(2):  # and once more: the migration ran once and is recorded
        with Store.open(state_dir) as store:
            assert [c.id for c in store.list_conversations()] == [archived.id, active.id]
            now_active = store.active_conversation(CHAT)
            assert now_active is not None and now_active.id == active.id
            assert [m.content for m in store.messages(active.id)] == ["kept"]
            assert [i["id"] for i in store.inbox_pending()] == ["in-1"]
            assert store.outbox_pending()[0]["parts_sent"] == 1
            assert [u["key"] for u in store.updates_pending("telegram")] == ["telegram:update:7"]
            assert store.dedupe_claim("telegram:update:6", time.time()) is False
            assert store.was_sent("out-0")
            assert store.chat_flags(CHAT) == {"undeliverable": T0}
    assert not (state_dir / "index.json").exists()
    assert json.loads((state_dir / "index.json.v2").read_text("utf-8")) == legacy


def test_what_a_message_writes_does_not_grow_with_history(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Acking an update, recording an exchange and delivering it write only small files, after
    2,000 remembered keys and 150 archived conversations as on the first day."""
    def written_during(step: Callable[[Store], None], store: Store) -> dict[str, int]:
        before = backdated(all_files(state_dir))
        step(store)
        return {str(p.relative_to(state_dir)): p.stat().st_size
                for p in written_since(before, state_dir)}

    def exchange(store: Store) -> None:
        now = time.time()
        store.updates_accept("telegram", f"telegram:update:{now}", {"update_id": 1}, now)
        store.updates_done(f"telegram:update:{now}")
        store.inbox_add({"id": f"in-{now}", "chat_key": CHAT, "received": now, "text": "hi"})
        conversation = store.active_conversation(CHAT)
        assert conversation is not None
        store.append_message(conversation.id, "user", "hi", created=now)
        store.save_conversation(conversation.touched(now))
        reply = store.append_message(conversation.id, "assistant", "hello", created=now)
        store.outbox_add({"id": reply.id, "chat_key": CHAT, "created": now, "text": "hello"})
        store.inbox_done([f"in-{now}"])
        store.mark_sent(reply.id, now)

    with Store.open(state_dir) as store:
        store.create_conversation(CHAT, time.time())
        first_day = written_during(exchange, store)
        with monkeypatch.context() as building:  # a year of use, quickly
            building.setattr(os, "fsync", lambda fd: None)
            for i in range(150):
                old = store.create_conversation(f"telegram:{i}", T0 + i * 86400)
                append_many(store, old.id, 3)
                store.save_conversation(old.archived("idle"))
            for i in range(2000):
                store.dedupe_claim(f"telegram:update:{i}", time.time())
        a_year_later = written_during(exchange, store)

    history = sum(p.stat().st_size for p in all_files(state_dir))
    assert history > 200 * 1024
    assert max(a_year_later.values()) < 24 * 1024, a_year_later
    assert len(a_year_later) <= len(first_day) + 1, (first_day, a_year_later)


def test_stats_before_a_time_count_only_what_was_stored_by_then(state_dir: Path) -> None:
    """The day's memory map: what is written after the cutoff (today) changes nothing."""
    cutoff = T0 + 100
    with Store.open(state_dir) as store:
        old = store.create_conversation("telegram:1", T0)
        append_many(store, old.id, 3)
        store.save_conversation(replace(old, status="archived", last_active=T0 + 2))
        open_ = store.create_conversation("telegram:2", T0 + 10)
        store.append_message(open_.id, "user", "before midnight", created=T0 + 20)
        store.save_summary(open_.id, SummaryState(summary="s", through_seq=1, fold_count=1,
                                                  folded_at=T0 + 30, first_folded_at=T0 + 30))
        counted = store.stats(cutoff)
        # After the cutoff: more messages, a refold, a new conversation.
        store.append_message(open_.id, "user", "after midnight", created=cutoff + 5)
        store.save_summary(open_.id, SummaryState(summary="t", through_seq=2, fold_count=2,
                                                  folded_at=cutoff + 6, first_folded_at=T0 + 30))
        store.create_conversation("telegram:3", cutoff + 7)
        assert store.stats(cutoff) == counted
        assert store.stats() != counted
    assert (counted.conversations, counted.messages, counted.summaries) == (2, 4, 1)
    assert counted.first == T0 and counted.last == T0 + 20


# ---- handed its files: in memory ----------------------------------------------------------


def forbid_disk_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way roost's store writes to disk (a file, a rename, a folder, the lock) fails, and is
    noted: a store in memory must use none of them."""
    used: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            used.append(f"{name}{args}")
            raise OSError(errno.EROFS, "a store in memory touched the disk")

        return call

    for name in ("open", "replace", "rename", "mkdir", "unlink", "fsync"):
        monkeypatch.setattr(os, name, refuse(name))
    return used


def test_a_whole_store_runs_in_memory_with_nothing_written_to_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages past a segment, idle rotation, inbox, outbox, raw updates, summary and flags,
    then a second store over the same files finds it all, as after a restart."""
    root = tmp_path / "in-memory"
    files = MemoryFiles(root)
    used = forbid_disk_writes(monkeypatch)

    store = Store.over(files)
    router = Router(store, idle_rotation=3 * 3600)
    first = router.conversation_for(CHAT, T0)
    sent = append_many(store, first.id, SEGMENT_MAX_MESSAGES + 5)
    assert store.updates_accept("telegram", "telegram:update:1", {"update_id": 1}, T0)
    assert not store.updates_accept("telegram", "telegram:update:1", {"update_id": 1}, T0)
    assert store.inbox_add({"id": "in-1", "chat_key": CHAT, "received": T0, "text": "hi"})
    assert not store.inbox_add({"id": "in-1", "chat_key": CHAT, "received": T0, "text": "hi"})
    store.inbox_done(["in-1"])
    store.outbox_add({"id": "out-1", "chat_key": CHAT, "created": T0, "text": "sent"})
    store.outbox_add({"id": "out-2", "chat_key": CHAT, "created": T0 + 1, "text": "waiting"})
    store.outbox_update("out-2", parts_sent=1, durable_rename=False)
    store.mark_sent("out-1", T0 + 2)
    store.save_summary(first.id, SummaryState(summary="so far", through_seq=3, fold_count=1))
    store.set_chat_flag(CHAT, "undeliverable", T0)
    later = T0 + SEGMENT_MAX_MESSAGES + 4 * 3600
    second = router.conversation_for(CHAT, later)  # the first went idle: rotated
    store.append_message(second.id, "user", "after the break", created=later)
    store.close()

    again = Store.over(files)
    assert again.messages(first.id) == sent
    assert again.get_conversation(first.id).status == "archived"  # type: ignore[union-attr]
    assert again.get_conversation(first.id).summary.summary == "so far"  # type: ignore[union-attr]
    active = again.active_conversation(CHAT)
    assert active is not None and active.id == second.id and active.after_idle
    assert [m.content for m in again.messages(second.id)] == ["after the break"]
    assert again.inbox_pending() == [] and again.inbox_known("in-1")
    assert [(o["id"], o.get("parts_sent")) for o in again.outbox_pending()] == [("out-2", 1)]
    assert again.was_sent("out-1") and not again.was_sent("out-2")
    assert [u["key"] for u in again.updates_pending("telegram")] == ["telegram:update:1"]
    assert again.chat_flags(CHAT) == {"undeliverable": T0}
    stats = again.stats()
    assert (stats.conversations, stats.messages, stats.summaries) == (
        2, SEGMENT_MAX_MESSAGES + 6, 1)
    again.close()

    assert used == []
    assert not root.exists() and list(tmp_path.iterdir()) == []
    # The same files the disk would hold: segments closed at the limit, one record each.
    folder = root / "conversations" / first.id
    assert sorted(p.name for p in files.glob(folder, "*")) == [
        "record.json", "seg-000000001.json", f"seg-{SEGMENT_MAX_MESSAGES + 1:09d}.json",
        "summary.json"]


# ---- migrations ---------------------------------------------------------------------------


def meta_at(version: int) -> bytes:
    """meta.json as a roost at `version` wrote it (its rows had no name then)."""
    rows = {str(v): {"version": v, "applied": T0} for v in range(1, version + 1)}
    return dumps({TABLE: rows})


def test_migrations_are_numbered_from_one_in_order_with_distinct_names() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert len({m.name for m in MIGRATIONS}) == len(MIGRATIONS)


@pytest.mark.parametrize("version", [1, 2])
def test_migrations_of_the_single_index_tables_only_record_themselves(
        tmp_path: Path, version: int) -> None:
    """Versions 1 and 2 made tables in the old index.json, which version 3 replaced: taking a
    store from the version before them to them writes nothing but their record."""
    root = tmp_path / "in-memory"
    files = MemoryFiles(root)
    files.write(root / "meta.json", meta_at(version - 1))
    Store.over(files, migrations=MIGRATIONS[:version - 1]).close()
    before = dict(files.files)

    store = Store.over(files, migrations=MIGRATIONS[:version])
    assert applied(store.meta) == set(range(1, version + 1))
    row = store.meta.table(TABLE).get(doc_id=version)
    assert row is not None and row["name"] == MIGRATIONS[version - 1].name
    store.close()
    changed = {p for p in files.files if files.files[p] != before.get(p)}
    assert changed == {root / "meta.json"}

    after = dict(files.files)
    Store.over(files, migrations=MIGRATIONS[:version]).close()  # again: nothing to do
    assert files.files == after


def test_migration_3_splits_the_single_index_once(tmp_path: Path) -> None:
    """A store at version 2 (everything in index.json) is taken to version 3; opening it again
    changes nothing."""
    root = tmp_path / "in-memory"
    files = MemoryFiles(root)
    with Store.over(files) as store:  # conversation folders and records exist in both layouts
        kept = store.create_conversation(CHAT, T0)
        store.append_message(kept.id, "user", "kept", created=T0)
        records = store.book.all()
    for path in [*files.glob(root, "*.json"), *files.glob(root / "conversations", "*.json")]:
        files.remove(path)
    legacy = {
        TABLE: {"1": {"version": 1, "applied": T0}, "2": {"version": 2, "applied": T0}},
        "conversations": {str(i): doc for i, doc in enumerate(records, 1)},
        "outbox": {"1": {"id": "out-1", "chat_key": CHAT, "created": T0, "text": "unsent"}},
        "dedupe": {"1": {"key": "sent:out-0", "seen": time.time()}},
        "chats": {"1": {"chat_key": CHAT, "undeliverable": T0}},
    }
    files.write(root / "meta.json", meta_at(2))
    files.write(root / "index.json", dumps(legacy))

    store = Store.over(files)
    assert applied(store.meta) == {1, 2, 3}
    active = store.active_conversation(CHAT)
    assert active is not None and active.id == kept.id
    assert [m.content for m in store.messages(kept.id)] == ["kept"]
    assert [o["id"] for o in store.outbox_pending()] == ["out-1"]
    assert store.was_sent("out-0")
    assert store.chat_flags(CHAT) == {"undeliverable": T0}
    store.close()
    assert not files.exists(root / "index.json")
    assert json.loads(files.read_bytes(root / "index.json.v2")) == legacy

    after = dict(files.files)
    Store.over(files).close()
    assert files.files == after


def test_a_brand_new_state_directory_logs_no_migration(
        state_dir: Path, store_log: pytest.LogCaptureFixture) -> None:
    """A new state is made at the current version: there was nothing to migrate."""
    with Store.open(state_dir) as store:
        assert applied(store.meta) == {m.version for m in MIGRATIONS}
    said = [r.getMessage() for r in store_log.records if r.levelno >= logging.INFO]
    assert not [line for line in said if "migration" in line], said
    # One more schema change later is said, on a state that had the earlier ones.
    extra = Migration(len(MIGRATIONS) + 1, "later_change", lambda keepers: None)
    with Store.open(state_dir) as store:
        migrate(store.meta, Keepers(store.files, store.state_dir, store.book, store.dedupe,
                                    store.updates, store.inbox, store.outbox, store.flags),
                (*MIGRATIONS, extra))
    assert any("later_change" in r.getMessage() for r in store_log.records)


def test_a_state_directory_of_the_previous_version_opens_unchanged(state_dir: Path) -> None:
    """meta.json as the previous roost wrote it (version 3, rows without names): nothing runs
    again; an index.json lying there (were migration 3 to run again, it would take it) stays."""
    state_dir.mkdir()
    (state_dir / "meta.json").write_bytes(meta_at(3))
    (state_dir / "index.json").write_text('{"conversations": {}}', "utf-8")
    with Store.open(state_dir) as store:
        assert applied(store.meta) == {1, 2, 3}
    assert (state_dir / "meta.json").read_bytes() == meta_at(3)
    assert (state_dir / "index.json").read_text("utf-8") == '{"conversations": {}}'
