"""The store: everything roost keeps, as TinyDB JSON files under the state directory.

Layout (docs/how-it-works.md, "Where roost keeps things", explains it for operators)::

    <state_dir>/
      roost.lock                     held by the one process that owns this directory
      meta.json                      schema migrations applied
      chats.json                     flags per chat (e.g. undeliverable)
      intake/<time>-<n>.json         raw platform payloads acknowledged together, until done
      inbox/<id>.json                one inbound message each, until answered
      outbox/<id>.json               one reply or notice each, until delivered
      quarantine/<kind>_<id>.json    items that failed twice, with their error (roost doctor)
      dedupe/<n>.json                up to 256 keys seen; dropped whole 14 days after the newest
      conversations/
        active.json                  the active conversations (at most one per chat)
        archive-YYYY-MM.json         archived conversations, by month of creation
        <id>/record.json             the conversation's record, written at creation
        <id>/summary.json            its rolling summary (rewritten by the fold)
        <id>/deliveries.json         voice notes sent for its replies (for the console)
        <id>/seg-000000001.json      its messages in bounded segments, never rewritten once closed

Design:

* Cost follows the active set, not history: acking an update, starting a turn and recording a
  reply write only files whose size is bounded by what is pending or active now. Archived
  conversations, old dedupe keys and closed segments are never rewritten on that path.
* Every write is atomic (temp file, fsync, rename, folder fsync). A crash leaves the old file or
  the new one, never half; each step writes its record before the one that marks it done, so
  a crash between them is recognised at the next open (see `queues`).
* The process is the only writer (it holds `roost.lock`), so every file is parsed at most once
  and then served from memory.
* TinyDB is not thread-safe. The `Store` facade is synchronous and serialised by one lock; the
  daemon's coroutines call it through `asyncio.to_thread` so disk waits stay off the event loop.
* A file that does not parse is moved aside (`<name>.corrupt-<time>`), never deleted, with a log
  line naming it; everything else keeps working. No file can stop the daemon from starting.
* Schema changes are named, numbered migration functions recorded in `meta.json`, each run
  once (see `migrate`); migration 3 splits the single `index.json` of earlier versions into this
  layout (and keeps it, renamed).
* The store is handed its files: `Store.open(state_dir)` is the state directory on disk (with
  its lock); `Store.over(MemoryFiles())` is the same store with every file kept in memory, for
  tests that need nothing on disk.
"""

from __future__ import annotations

import fcntl
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from daemon.core.conversations import Conversation, Message, Role, SummaryState
from daemon.core.errors import StoreError
from daemon.core.ids import is_id, new_id
from daemon.store.book import ConversationBook, index_doc
from daemon.store.deliveries import Deliveries
from daemon.store.files import (
    AtomicJSONStorage,
    CorruptFile,
    DiskFiles,
    Files,
    MemoryFiles,
    atomic_write,
)
from daemon.store.migrate import MIGRATIONS, SCHEMA_VERSION, Keepers, Migration, migrate
from daemon.store.queues import (
    DEDUPE_KEEP_SECONDS,
    ChatFlags,
    Dedupe,
    ItemFolder,
    UpdateBatches,
)
from daemon.store.segments import SEGMENT_MAX_BYTES, SEGMENT_MAX_MESSAGES, MessageLog
from daemon.store.summaries import Summaries

__all__ = [
    "DEDUPE_KEEP_SECONDS",
    "SCHEMA_VERSION",
    "SEGMENT_MAX_BYTES",
    "SEGMENT_MAX_MESSAGES",
    "AtomicJSONStorage",
    "CorruptFile",
    "DiskFiles",
    "Files",
    "MemoryFiles",
    "Store",
    "StoreStats",
    "atomic_write",
    "quarantined_items",
]

QUARANTINE_FIELDS = ("kind", "key", "chat_key", "error", "quarantined")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class StoreStats:
    conversations: int
    messages: int
    summaries: int
    first: float | None
    last: float | None


class NoState(StoreError):
    """The state directory holds no roost state yet (a fresh install)."""


def in_use(state_dir: Path) -> bool:
    """Whether a roost process holds the state directory (a daemon that died holds nothing:
    the kernel drops its lock). A lock taken here to find out is let go at once."""
    try:
        fd = os.open(state_dir / "roost.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of the lock, if it was taken
    return False


def quarantined_items(state_dir: Path) -> list[dict[str, Any]]:
    """The quarantine of a state directory, read without opening (or locking) the store: for
    `roost doctor` while the daemon runs."""
    return ItemFolder(DiskFiles(state_dir), state_dir / "quarantine", QUARANTINE_FIELDS,
                      read_only=True).pending("quarantined")


def _locked(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        store = args[0]
        assert isinstance(store, Store)
        with store._lock:
            return method(*args, **kwargs)

    return wrapper


class _Queues:
    """The work in flight: inbox, outbox, quarantine, raw updates, dedupe keys, chat flags.
    Part of the `Store` facade (its record keepers are made in `Store.__init__`), kept apart
    from the conversations so that neither half is a long read."""

    _lock: threading.RLock
    _updates_lock: threading.Lock
    inbox: ItemFolder
    outbox: ItemFolder
    quarantine: ItemFolder
    updates: UpdateBatches
    dedupe: Dedupe
    flags: ChatFlags

    # ---- inbox, outbox, quarantine ---------------------------------------------------------

    @_locked
    def inbox_add(self, item: Mapping[str, Any]) -> bool:
        """Persist an inbound message before it is acknowledged to the platform; False (and
        nothing written) when an item with its id was added before, so a channel that submits
        again after a crash does not make roost answer twice."""
        if self.inbox_known(item["id"]):
            return False
        self.inbox.add(item)
        return True

    @_locked
    def inbox_known(self, item_id: str) -> bool:
        """Whether an item with this id was ever added (pending, or answered since)."""
        return item_id in self.inbox.items or f"inbox:{item_id}" in self.dedupe

    @_locked
    def inbox_pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        """Inbound messages not yet answered, oldest first."""
        return self.inbox.pending("received", chat_key)

    @_locked
    def inbox_update(self, item_id: str, **fields: Any) -> None:
        """Rewrite fields of a pending inbound message (its transcript, before its turn), so a
        turn tried again after a restart or an outage does not do that work twice."""
        self.inbox.update(item_id, fields)

    @_locked
    def inbox_done(self, item_ids: list[str]) -> None:
        """Forget inbox items whose messages are now in their conversation (remembering their
        ids first, so that the same message submitted again is recognised)."""
        self.dedupe.claim((f"inbox:{i}" for i in item_ids), time.time())
        for item_id in item_ids:
            self.inbox.remove(item_id)

    @_locked
    def outbox_add(self, item: Mapping[str, Any]) -> None:
        """Persist a reply before it is sent, so a crash cannot lose it."""
        self.outbox.add(item)

    @_locked
    def outbox_pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        """Replies and notices not yet delivered, oldest first."""
        return self.outbox.pending("created", chat_key)

    @_locked
    def outbox_update(self, item_id: str, *, durable_rename: bool = True, **fields: Any) -> None:
        """Record delivery progress on an outbox item (e.g. how many parts were sent).

        `durable_rename=False` is for the record after each part: it is the window in which a
        crash sends a part twice, and the folder's fsync was most of it (see `atomic_write`).
        A power cut that undoes it brings back the item's previous progress: one part is sent
        again, as after a crash in that window, and nothing is lost.
        """
        self.outbox.update(item_id, fields, durable_rename=durable_rename)

    @_locked
    def outbox_done(self, item_id: str) -> None:
        self.outbox.remove(item_id)

    @_locked
    def mark_sent(self, item_id: str, now: float) -> None:
        """An outbox item reached the platform: remember that, then forget the item. A crash
        between the two leaves the item queued but known as sent, so it is not sent again."""
        self.dedupe.claim([f"sent:{item_id}"], now)
        self.outbox.remove(item_id)

    @_locked
    def was_sent(self, item_id: str) -> bool:
        return f"sent:{item_id}" in self.dedupe

    @_locked
    def quarantine_add(self, kind: str, key: str, item: Mapping[str, Any], error: str,
                       now: float) -> None:
        """Keep an item that failed twice, with its error, out of the way of its chat; `roost
        doctor` lists it. Written before the caller removes the item from its queue."""
        self.quarantine.add({"id": f"{kind}:{key}", "kind": kind, "key": key,
                             "chat_key": str(item.get("chat_key", "")), "error": error,
                             "quarantined": now, "item": dict(item)})

    @_locked
    def quarantined(self) -> list[dict[str, Any]]:
        """Items set aside after failing, oldest first."""
        return self.quarantine.pending("quarantined")

    # ---- raw updates, dedupe, chat flags ----------------------------------------------------

    # The raw updates have a lock of their own: the intake's group commit must not wait for a
    # turn's writes. Marking one done takes the main lock for its dedupe key, then this one;
    # never both at once.

    def updates_accept(self, channel: str, key: str, payload: Mapping[str, Any],
                       received: float) -> bool:
        """Persist a raw platform payload before the platform gets its 200, unless `key` was
        seen before (a redelivery): then False."""
        return self.updates_accept_many(channel, [(key, payload, received)])[0]

    def updates_accept_many(
        self, channel: str, items: Iterable[tuple[str, Mapping[str, Any], float]]
    ) -> list[bool]:
        """The group commit: persist every payload whose key is new in one file, one fsync;
        for each item, whether it was new. A key is new when it is neither pending nor done
        (remembered) nor earlier in the same call."""
        with self._updates_lock:
            fresh: list[dict[str, Any]] = []
            taken: set[str] = set()
            answers = []
            for key, payload, received in items:
                new = key not in taken and not self.updates.known(key)
                answers.append(new)
                if new:
                    taken.add(key)
                    fresh.append({"channel": channel, "key": key, "payload": dict(payload),
                                  "received": received})
            self.updates.add(fresh)
            return answers

    def updates_add(self, channel: str, key: str, payload: Mapping[str, Any],
                    received: float) -> None:
        """Persist a raw payload without the redelivery check (`updates_accept` has it)."""
        with self._updates_lock:
            self.updates.add([{"channel": channel, "key": key, "payload": dict(payload),
                               "received": received}])

    def updates_pending(self, channel: str) -> list[dict[str, Any]]:
        with self._updates_lock:
            return self.updates.of_channel(channel)

    def updates_done(self, key: str, *, remember: bool = True) -> None:
        """A payload is handled. Its key is remembered for the keep period so a redelivery is
        dropped; `remember=False` for payloads that left nothing behind (a stranger's message),
        which then cost no lasting state: a redelivery is simply dropped again."""
        if remember:
            with self._lock:
                self.dedupe.claim([key], time.time())
        with self._updates_lock:
            self.updates.done(key)

    @_locked
    def dedupe_claim(self, key: str, now: float) -> bool:
        """Record `key` as seen; False if it was seen before (a redelivery)."""
        return bool(self.dedupe.claim([key], now))

    @_locked
    def set_chat_flag(self, chat_key: str, flag: str, value: Any) -> None:
        """Remember something about a chat (e.g. `blocked`: the user blocked the bot); None
        removes the flag."""
        self.flags.set(chat_key, flag, value)

    @_locked
    def chat_flags(self, chat_key: str) -> dict[str, Any]:
        return self.flags.get(chat_key)

    @_locked
    def chats_with_flag(self, flag: str) -> dict[str, Any]:
        """Each chat that has `flag`, with its value."""
        return self.flags.having(flag)

    @_locked
    def chats_flagged(self, flag: str) -> int:
        """How many chats have `flag` now (e.g. undeliverable, for /metrics)."""
        return self.flags.count(flag)


class Store(_Queues):
    """All of roost's persistent state, one facade over the record keepers; see the module
    docstring for the design."""

    def __init__(self, files: Files, *, read_only: bool = False) -> None:
        """Use `Store.open(path)`, which also takes the directory's lock and runs migrations,
        or `Store.over(files)`."""
        self.files = files
        self.state_dir = state_dir = files.root
        self.read_only = read_only
        self._lock = threading.RLock()
        self._updates_lock = threading.Lock()
        self._lock_file: int | None = None
        self.meta = files.db(state_dir / "meta.json")
        self.book = ConversationBook(files, state_dir / "conversations", read_only=read_only)
        self.log = MessageLog(files, state_dir / "conversations", read_only=read_only)
        self.dedupe = Dedupe(files, state_dir / "dedupe", read_only=read_only)
        self.updates = UpdateBatches(files, state_dir / "intake", self.dedupe,
                                     read_only=read_only)
        self.inbox = ItemFolder(files, state_dir / "inbox", ("chat_key", "received"),
                                read_only=read_only)
        self.outbox = ItemFolder(files, state_dir / "outbox", ("chat_key", "created"),
                                 read_only=read_only)
        self.quarantine = ItemFolder(files, state_dir / "quarantine", QUARANTINE_FIELDS,
                                     read_only=read_only)
        self.flags = ChatFlags(files, state_dir / "chats.json")
        self.summaries = Summaries(files, self.log, read_only=read_only)
        self.deliveries = Deliveries(files, self.log, read_only=read_only)

    # ---- opening and closing ---------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, *, read_only: bool = False) -> Store:
        """Open (creating if needed) a state directory, owning it until `close()`.

        `read_only` is for looking while the daemon runs (`roost conversations`): no lock, no
        migrations, and a corrupt file is reported instead of moved. Reading is safe during
        writes because every write is an atomic rename.
        """
        if read_only:
            if not (state_dir / "meta.json").exists():
                if (state_dir / "index.json").exists():
                    raise StoreError(f"the state in {state_dir} is from an earlier version of "
                                     "roost; start the daemon once to convert it")
                raise NoState(f"no roost state in {state_dir}")
            return cls(DiskFiles(state_dir), read_only=True)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            for sub in ("conversations", "attachments", "corpus", "debug"):
                (state_dir / sub).mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create state directory {state_dir}: {exc}") from exc
        lock_fd = os.open(state_dir / "roost.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StoreError(
                f"another roost process is using {state_dir}; stop it first "
                "(or give this one its own daemon.state_dir)"
            ) from None
        try:
            store = cls.over(DiskFiles(state_dir))
        except BaseException:
            os.close(lock_fd)
            raise
        store._lock_file = lock_fd
        return store

    @classmethod
    def over(cls, files: Files, *, migrations: tuple[Migration, ...] = MIGRATIONS) -> Store:
        """Open a store over `files` (`MemoryFiles()` in tests) as `open` does, without the
        directory lock: migrations run, finished work is dropped, active conversations are
        checked. `migrations` is for a test of one migration: the schema up to it."""
        files.remove_stale_temp_files()
        store = cls(files)
        store._migrate(migrations)
        store._drop_finished()
        store._check_active_conversations()
        return store

    def close(self) -> None:
        """Release the state directory. Every write is already on disk; nothing to flush."""
        with self._lock:
            self.log.forget()
            self.summaries.forget()
            if self._lock_file is not None:
                os.close(self._lock_file)
                self._lock_file = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- conversations ---------------------------------------------------------------------

    @_locked
    def create_conversation(
        self, chat_key: str, now: float, *, after_idle: bool = False, token_ratio: float = 1.0
    ) -> Conversation:
        """Start a new active conversation for `chat_key`."""
        conversation = Conversation.start(chat_key, now, after_idle=after_idle,
                                          token_ratio=token_ratio)
        self.book.create(conversation, self.log.folder(conversation.id))
        self.log.created(conversation.id)
        return conversation

    @_locked
    def get_conversation(self, conversation_id: str) -> Conversation | None:
        """The conversation with its summary; an active one as recent as its newest message
        (see `active_conversation`)."""
        doc = self.book.get(conversation_id)
        return self._current(doc) if doc else None

    @_locked
    def active_conversation(self, chat_key: str) -> Conversation | None:
        """The chat's active conversation, if it has one.

        Its `last_active` counts its newest message too: a turn saves the record once, with
        the reply, and the user messages it appended before are activity all the same (when a
        crash cuts the turn short, idle rotation still counts from them). Callers read the
        messages next, so loading them here costs nothing extra."""
        doc = self.book.active_of(chat_key)
        return self._current(doc) if doc else None

    @_locked
    def newest_conversation(self, chat_key: str) -> Conversation | None:
        """The chat's most recent conversation, active or archived, found without going
        through the others (a new conversation starts from its token ratio)."""
        doc = self.book.newest_of(chat_key)
        return Conversation.from_doc(doc) if doc else None

    @_locked
    def list_conversations(
        self, chat_key: str | None = None, status: str | None = None
    ) -> list[Conversation]:
        """Conversations, oldest first, optionally of one chat or one status. The active ones
        come from the active list alone, so listing them costs the active set, not history."""
        docs = self.book.active_docs() if status == "active" else self.book.all()
        found = [
            Conversation.from_doc(d)
            for d in docs
            if (chat_key is None or d["chat_key"] == chat_key)
            and (status is None or d["status"] == status)
        ]
        return sorted(found, key=lambda c: c.created)

    @_locked
    def save_conversation(self, conversation: Conversation) -> None:
        """Update a conversation's record (status, last_active, token ratio). Archiving fixes
        its message count and whether it has a summary in the archive, for the memory map."""
        extra: dict[str, Any] = {}
        if conversation.status != "active":
            extra = {"messages": self.log.count(conversation.id),
                     "summarised": self.summaries.exists(conversation.id)}
        self.book.save(index_doc(conversation), **extra)

    @_locked
    def save_summary(self, conversation_id: str, summary: SummaryState) -> None:
        """Replace the conversation's summary state (one summary per conversation)."""
        self.summaries.save(conversation_id, summary)

    @_locked
    def note_delivery(self, conversation_id: str, doc: Mapping[str, Any]) -> None:
        """Keep what became of one of the conversation's replies (a voice note sent for it)."""
        self.deliveries.add(conversation_id, doc)

    @_locked
    def deliveries_of(self, conversation_id: str) -> list[dict[str, Any]]:
        return self.deliveries.of(conversation_id) if is_id(conversation_id) else []

    # ---- messages --------------------------------------------------------------------------

    @_locked
    def append_message(
        self,
        conversation_id: str,
        role: Role,
        content: str,
        *,
        created: float,
        **fields: Any,
    ) -> Message:
        """Append one message; it is on disk when this returns. Returns it with id and seq."""
        messages = self.log.messages(conversation_id)
        seq = messages[-1].seq + 1 if messages else 1
        message = Message(id=new_id(created), seq=seq, role=role, content=content,
                          created=created, **fields)
        self.log.append(conversation_id, message)
        return message

    @_locked
    def messages(
        self, conversation_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Message]:
        """The conversation's messages with `from_seq <= seq <= to_seq`, in order; none for
        an id that is not one of roost's (nothing on disk is looked up for it)."""
        if not is_id(conversation_id):
            return []
        loaded = self.log.messages(conversation_id)
        if not loaded:
            return []
        # Seqs run 1, 2, 3...: slice instead of filtering every message.
        base = loaded[0].seq
        start = max(from_seq - base, 0)
        stop = len(loaded) if to_seq is None else max(to_seq - base + 1, 0)
        return loaded[start:stop]

    @_locked
    def message_count(self, conversation_id: str) -> int:
        return len(self.log.messages(conversation_id))

    @_locked
    def stats(self, before: float | None = None) -> StoreStats:
        """Counts for the memory map: conversations, messages, summaries, and the date span.
        Archived conversations carry their counts; only active ones are looked at.

        With `before`, only what was stored before that time counts (a summary counts from
        its first fold), so every process on a day counts the same however much is written
        that day: the memory map is the day's, not the process's."""
        cutoff = float("inf") if before is None else before
        docs = [d for d in self.book.all() if d["created"] < cutoff]
        messages = summaries = 0
        last: float | None = None
        for doc in docs:
            if "messages" in doc and doc["last_active"] < cutoff:  # archived before the cutoff
                messages += doc["messages"]
                summaries += bool(doc.get("summarised"))
                ended = doc["last_active"]
            elif before is None:
                messages += self.log.count(doc["id"])
                summaries += self.summaries.exists(doc["id"])
                ended = doc["last_active"]
            else:
                stored = [m.created for m in self.log.messages(doc["id"]) if m.created < cutoff]
                messages += len(stored)
                summary = self._with_summary(doc).summary
                first_fold = summary.first_folded_at or summary.folded_at
                summaries += bool(summary.through_seq and first_fold is not None
                                  and first_fold < cutoff)
                ended = max(stored, default=doc["created"])
            last = ended if last is None else max(last, ended)
        return StoreStats(
            conversations=len(docs),
            messages=messages,
            summaries=summaries,
            first=min((d["created"] for d in docs), default=None),
            last=last,
        )

    # ---- internals -------------------------------------------------------------------------

    def _current(self, doc: Mapping[str, Any]) -> Conversation:
        conversation = self._with_summary(doc)
        if conversation.status != "active":
            return conversation  # archived with its last activity fixed
        messages = self.log.messages(conversation.id)
        if messages and messages[-1].created > conversation.last_active:
            conversation = replace(conversation, last_active=messages[-1].created)
        return conversation

    def _with_summary(self, doc: Mapping[str, Any]) -> Conversation:
        conversation = Conversation.from_doc(doc)
        return replace(conversation, summary=self.summaries.get(conversation.id))

    def _migrate(self, migrations: tuple[Migration, ...]) -> None:
        keepers = Keepers(files=self.files, state_dir=self.state_dir, book=self.book,
                          dedupe=self.dedupe, updates=self.updates, inbox=self.inbox,
                          outbox=self.outbox, flags=self.flags)
        migrate(self.meta, keepers, migrations)

    def _drop_finished(self) -> None:
        """Inbox items answered just before a crash (their id remembered, the file not yet
        removed) are done."""
        for item_id in [i for i in self.inbox.items if f"inbox:{i}" in self.dedupe]:
            self.inbox.remove(item_id)

    def _check_active_conversations(self) -> None:
        """Open the files of active conversations now, so corruption shows at startup."""
        for conversation in self.list_conversations(status="active"):
            self._with_summary(conversation.to_doc())
            self.log.messages(conversation.id)

