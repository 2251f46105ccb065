"""The store: everything roost keeps, as TinyDB JSON files under the state directory.

Layout::

    <state_dir>/
      roost.lock                    held by the one process that owns this directory
      index.json                    conversations, inbox, outbox, dedupe keys, migrations
      conversations/<id>/
        record.json                 who the conversation belongs to, written once at creation
        summary.json                the rolling summary state (rewritten by the fold)
        seg-000000001.json          messages 1.. ; a segment is closed when it holds
        seg-000000201.json          SEGMENT_MAX_MESSAGES or SEGMENT_MAX_BYTES, then never rewritten

Design:

* Every write is atomic (`AtomicJSONStorage`): temp file in the same folder, flush, fsync,
  `os.replace`, fsync of the folder. A crash leaves the old file or the new one, never half.
* TinyDB rewrites a whole file per write, so messages live in bounded segments: appending costs
  the same at message 10,000 as at message 100, and closed segments are never touched again.
* TinyDB is not thread-safe. All methods here are synchronous and serialised by one lock; the
  daemon's coroutines call them through `asyncio.to_thread` so disk waits stay off the event loop.
* A file that does not parse is moved aside (`<name>.corrupt-<time>`), never deleted, with a log
  line naming it; every other conversation keeps working. A lost index is rebuilt from the
  conversations' `record.json` files.
* Schema changes are numbered migrations recorded in the index, each run once.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from tinydb import Query, TinyDB
from tinydb.storages import Storage
from tinydb.table import Document

from daemon.conversations import Conversation, Message, Role, SummaryState, new_id
from daemon.errors import StoreError
from daemon.logs import store_log as log

SEGMENT_MAX_MESSAGES = 200
SEGMENT_MAX_BYTES = 512 * 1024
DEDUPE_KEEP_SECONDS = 14 * 24 * 3600
DEDUPE_PRUNE_EVERY = 3600.0
_CACHED_CONVERSATIONS = 32

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


class CorruptFile(StoreError):
    """A state file exists but does not hold valid JSON."""


class AtomicJSONStorage(Storage):
    """TinyDB storage that replaces its file atomically on every write (UTF-8 JSON)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, dict[str, Any]] | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if not raw.strip():
            raise CorruptFile(f"{self.path} is empty")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptFile(f"{self.path}: {exc}") from exc
        if not isinstance(data, dict):
            raise CorruptFile(f"{self.path}: top level is not an object")
        return data

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        atomic_write(self.path, payload)

    def close(self) -> None:
        pass


def atomic_write(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` so that a crash leaves either the old or the new bytes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        # The rename is durable only once the folder entry is on disk.
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _remove_stale_temp_files(state_dir: Path) -> None:
    """Temp files of writes a crash interrupted; the real files are intact without them."""
    for stale in state_dir.glob("**/.*.tmp"):
        stale.unlink(missing_ok=True)


def _locked(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        store = args[0]
        assert isinstance(store, Store)
        with store._lock:
            return method(*args, **kwargs)

    return wrapper


def _migration_1_tables(db: TinyDB) -> None:
    """Version 1: the tables of the index exist (TinyDB creates them lazily; this records it)."""
    for name in ("conversations", "inbox", "outbox", "dedupe"):
        db.table(name)


def _migration_2_channel_tables(db: TinyDB) -> None:
    """Version 2: raw platform updates awaiting translation, and per-chat flags."""
    for name in ("updates", "chats"):
        db.table(name)


MIGRATIONS: tuple[Callable[[TinyDB], None], ...] = (
    _migration_1_tables,
    _migration_2_channel_tables,
)


class Store:
    """All of roost's persistent state. See the module docstring for the design."""

    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        """Use `Store.open(path)`, which also takes the directory's lock and runs migrations."""
        self.state_dir = state_dir
        self.read_only = read_only
        self._lock = threading.RLock()
        self._lock_file: int | None = None
        self._dbs: dict[Path, TinyDB] = {}
        self._checked: set[Path] = set()
        self._pruned = 0.0  # when old dedupe keys were last removed
        # conversation id -> its messages, most recently used last (bounded LRU)
        self._messages: OrderedDict[str, list[Message]] = OrderedDict()
        self.index = self._index_db()

    # ---- opening and closing ---------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path, *, read_only: bool = False) -> Store:
        """Open (creating if needed) a state directory, owning it until `close()`.

        `read_only` is for looking while the daemon runs (`roost conversations`): no lock, no
        migrations, and a corrupt file is reported instead of moved. Reading is safe during
        writes because every write is an atomic rename.
        """
        if read_only:
            if not (state_dir / "index.json").exists():
                raise NoState(f"no roost state in {state_dir}")
            return cls(state_dir, read_only=True)
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
            _remove_stale_temp_files(state_dir)
            store = cls(state_dir)
            store._lock_file = lock_fd
            store._migrate()
            store._check_active_conversations()
        except BaseException:
            os.close(lock_fd)
            raise
        return store

    def close(self) -> None:
        """Release the state directory. Every write is already on disk; nothing to flush."""
        with self._lock:
            self._dbs.clear()
            self._messages.clear()
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
        folder = self._conversation_dir(conversation.id)
        folder.mkdir(parents=True, exist_ok=True)
        record = self._index_doc(conversation)
        atomic_write(folder / "record.json", json.dumps(record, ensure_ascii=False).encode("utf-8"))
        self._conversations().insert(self._index_doc(conversation))
        self._messages[conversation.id] = []
        return conversation

    @_locked
    def get_conversation(self, conversation_id: str) -> Conversation | None:
        # search, not get: TinyDB answers a repeated search from its query cache (cleared by
        # every write through it) instead of parsing the whole index again.
        docs = self._conversations().search(Query().id == conversation_id)
        return self._with_summary(docs[0]) if docs else None

    @_locked
    def active_conversation(self, chat_key: str) -> Conversation | None:
        """The chat's active conversation, if it has one."""
        q = Query()
        docs = self._conversations().search((q.chat_key == chat_key) & (q.status == "active"))
        if not docs:
            return None
        return self._with_summary(max(docs, key=lambda d: d["created"]))

    @_locked
    def list_conversations(
        self, chat_key: str | None = None, status: str | None = None
    ) -> list[Conversation]:
        """Conversations, oldest first, optionally of one chat or one status."""
        docs = self._conversations().all()
        found = [
            Conversation.from_doc(d)
            for d in docs
            if (chat_key is None or d["chat_key"] == chat_key)
            and (status is None or d["status"] == status)
        ]
        return sorted(found, key=lambda c: c.created)

    @_locked
    def save_conversation(self, conversation: Conversation) -> None:
        """Update a conversation's index record (status, last_active, token ratio)."""
        self._conversations().upsert(
            self._index_doc(conversation), Query().id == conversation.id
        )

    @_locked
    def save_summary(self, conversation_id: str, summary: SummaryState) -> None:
        """Replace the conversation's summary state (one summary per conversation)."""
        db = self._db(self._conversation_dir(conversation_id) / "summary.json")
        db.table("summary").upsert(Document(summary.to_doc(), doc_id=1))

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
        messages = self._load_messages(conversation_id)
        seq = messages[-1].seq + 1 if messages else 1
        message = Message(id=new_id(created), seq=seq, role=role, content=content,
                          created=created, **fields)
        try:
            self._write_to_segment(conversation_id, message)
        except StoreError:
            # The write may or may not have reached the disk: read it back next time.
            self._messages.pop(conversation_id, None)
            raise
        messages.append(message)
        return message

    @_locked
    def messages(
        self, conversation_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Message]:
        """The conversation's messages with `from_seq <= seq <= to_seq`, in order."""
        return [
            m
            for m in self._load_messages(conversation_id)
            if m.seq >= from_seq and (to_seq is None or m.seq <= to_seq)
        ]

    @_locked
    def message_count(self, conversation_id: str) -> int:
        return len(self._load_messages(conversation_id))

    @_locked
    def stats(self) -> StoreStats:
        """Counts for the memory map: conversations, messages, summaries, and the date span."""
        conversations = self.list_conversations()
        messages = summaries = 0
        for conversation in conversations:
            messages += self._count_messages(conversation.id)
            if (self._conversation_dir(conversation.id) / "summary.json").exists():
                summaries += 1
        return StoreStats(
            conversations=len(conversations),
            messages=messages,
            summaries=summaries,
            first=min((c.created for c in conversations), default=None),
            last=max((c.last_active for c in conversations), default=None),
        )

    # ---- inbox, outbox, dedupe -------------------------------------------------------------

    @_locked
    def inbox_add(self, item: Mapping[str, Any]) -> bool:
        """Persist an inbound message before it is acknowledged to the platform; False (and
        nothing written) when an item with its id was added before, so a channel that submits
        again after a crash does not make roost answer twice."""
        if self.inbox_known(item["id"]):
            return False
        self.index.table("inbox").insert(dict(item))
        self.dedupe_claim(f"inbox:{item['id']}", float(item.get("received", time.time())))
        return True

    @_locked
    def inbox_known(self, item_id: str) -> bool:
        """Whether an item with this id was ever added (pending, or answered since)."""
        return (self.index.table("inbox").contains(Query().id == item_id)
                or self._seen(f"inbox:{item_id}"))

    @_locked
    def inbox_pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        """Inbound messages not yet answered, oldest first."""
        return self._queued("inbox", "received", chat_key)

    @_locked
    def inbox_done(self, item_ids: list[str]) -> None:
        """Forget inbox items whose messages are now in their conversation."""
        wanted = set(item_ids)
        self.index.table("inbox").remove(Query().id.one_of(list(wanted)))

    @_locked
    def outbox_add(self, item: Mapping[str, Any]) -> None:
        """Persist a reply before it is sent, so a crash cannot lose it."""
        self.index.table("outbox").insert(dict(item))

    @_locked
    def outbox_pending(self, chat_key: str | None = None) -> list[dict[str, Any]]:
        """Replies and notices not yet delivered, oldest first."""
        return self._queued("outbox", "created", chat_key)

    @_locked
    def outbox_update(self, item_id: str, **fields: Any) -> None:
        """Record delivery progress on an outbox item (e.g. how many parts were sent)."""
        self.index.table("outbox").update(fields, Query().id == item_id)

    @_locked
    def updates_accept(self, channel: str, key: str, payload: Mapping[str, Any],
                       received: float) -> bool:
        """Persist a raw platform payload before the platform gets its 200, unless `key` was
        seen before (a redelivery): then False. The payload is translated into inbox messages
        afterwards (which may need downloads), and again after a crash.

        The payload is written before its dedupe key: a crash between the two leaves it
        pending, and a redelivery meanwhile is recognised by the pending payload itself.
        """
        if self.index.table("updates").contains(Query().key == key) or self._seen(key):
            return False
        self.updates_add(channel, key, payload, received)
        self.dedupe_claim(key, received)
        return True

    @_locked
    def updates_add(self, channel: str, key: str, payload: Mapping[str, Any],
                    received: float) -> None:
        """Persist a raw payload without the redelivery check (`updates_accept` has it)."""
        self.index.table("updates").insert(
            {"channel": channel, "key": key, "payload": dict(payload), "received": received})

    @_locked
    def updates_pending(self, channel: str) -> list[dict[str, Any]]:
        docs = self.index.table("updates").search(Query().channel == channel)
        return sorted((dict(d) for d in docs), key=lambda d: (d["received"], d["key"]))

    @_locked
    def updates_done(self, key: str) -> None:
        self.index.table("updates").remove(Query().key == key)

    @_locked
    def mark_sent(self, item_id: str, now: float) -> None:
        """An outbox item reached the platform: remember that, then forget the item. A crash
        between the two leaves the item queued but known as sent, so it is not sent again."""
        self.dedupe_claim(f"sent:{item_id}", now)
        self.outbox_done(item_id)

    @_locked
    def was_sent(self, item_id: str) -> bool:
        return self._seen(f"sent:{item_id}")

    @_locked
    def outbox_done(self, item_id: str) -> None:
        self.index.table("outbox").remove(Query().id == item_id)

    @_locked
    def set_chat_flag(self, chat_key: str, flag: str, value: Any) -> None:
        """Remember something about a chat (e.g. `blocked`: the user blocked the bot); None
        removes the flag."""
        table = self.index.table("chats")
        doc = table.get(Query().chat_key == chat_key) or {"chat_key": chat_key}
        flags = {k: v for k, v in dict(doc).items() if k != flag}
        if value is not None:
            flags[flag] = value
        # Replace the document: TinyDB's update merges and could not remove a flag.
        table.remove(Query().chat_key == chat_key)
        table.insert(flags)

    @_locked
    def chat_flags(self, chat_key: str) -> dict[str, Any]:
        doc = self.index.table("chats").get(Query().chat_key == chat_key)
        return {k: v for k, v in dict(doc or {}).items() if k != "chat_key"}

    @_locked
    def dedupe_claim(self, key: str, now: float) -> bool:
        """Record `key` as seen; False if it was seen before (a redelivery)."""
        table = self.index.table("dedupe")
        if table.contains(Query().key == key):
            return False
        if now - self._pruned >= DEDUPE_PRUNE_EVERY:
            # TinyDB rewrites the file even when nothing matches: prune now and then only.
            table.remove(Query().seen < now - DEDUPE_KEEP_SECONDS)
            self._pruned = now
        table.insert({"key": key, "seen": now})
        return True

    # ---- internals -------------------------------------------------------------------------

    def _seen(self, key: str) -> bool:
        return self.index.table("dedupe").contains(Query().key == key)

    def _queued(self, table: str, time_field: str, chat_key: str | None) -> list[dict[str, Any]]:
        docs = self.index.table(table)
        found = docs.all() if chat_key is None else docs.search(Query().chat_key == chat_key)
        return sorted((dict(d) for d in found), key=lambda d: (d[time_field], d["id"]))

    def _conversations(self) -> Any:
        return self.index.table("conversations")

    @staticmethod
    def _index_doc(conversation: Conversation) -> dict[str, Any]:
        return {k: v for k, v in conversation.to_doc().items() if k != "summary"}

    def _with_summary(self, doc: Mapping[str, Any]) -> Conversation:
        conversation = Conversation.from_doc(doc)
        path = self._conversation_dir(conversation.id) / "summary.json"
        found = self._db(path).table("summary").get(doc_id=1)
        summary = SummaryState.from_doc(found) if found else SummaryState()
        return replace(conversation, summary=summary)

    def _conversation_dir(self, conversation_id: str) -> Path:
        return self.state_dir / "conversations" / conversation_id

    def _index_db(self) -> TinyDB:
        path = self.state_dir / "index.json"
        try:
            AtomicJSONStorage(path).read()
        except CorruptFile as exc:
            self._move_aside(path, str(exc), "rebuilding the conversation list from disk")
            db = self._db(path)
            self._rebuild_index(db)
            return db
        return self._db(path)

    def _rebuild_index(self, db: TinyDB) -> None:
        """Recreate conversation records from each conversation's record.json, as archived."""
        table = db.table("conversations")
        for record_path in sorted((self.state_dir / "conversations").glob("*/record.json")):
            try:
                record = json.loads(record_path.read_text("utf-8"))
            except (OSError, ValueError):
                log.error("cannot read %s while rebuilding the index; skipped", record_path)
                continue
            record["status"] = "archived"
            table.insert(record)
        log.warning("rebuilt the index with %d conversations", len(table))

    def _db(self, path: Path) -> TinyDB:
        """The TinyDB for `path`, checked once per process; a corrupt file is moved aside."""
        db = self._dbs.get(path)
        if db is None:
            if path not in self._checked:
                try:
                    AtomicJSONStorage(path).read()
                except CorruptFile as exc:
                    self._move_aside(path, str(exc), "continuing without it")
                self._checked.add(path)
            db = TinyDB(path, storage=AtomicJSONStorage)
            self._dbs[path] = db
        return db

    def _move_aside(self, path: Path, reason: str, consequence: str) -> Path:
        if self.read_only:
            raise CorruptFile(reason)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        counter = 1
        while target.exists():  # never overwrite an earlier corrupt copy
            counter += 1
            target = path.with_name(f"{path.name}.corrupt-{stamp}-{counter}")
        os.replace(path, target)
        log.error("corrupt state file %s moved aside to %s (%s); %s",
                  path, target.name, reason, consequence)
        return target

    def _migrate(self) -> None:
        meta = self.index.table("_migrations")
        done = {doc["version"] for doc in meta.all()}
        for version, migration in enumerate(MIGRATIONS, start=1):
            if version not in done:
                migration(self.index)
                meta.insert({"version": version, "applied": time.time()})

    def _check_active_conversations(self) -> None:
        """Open the files of active conversations now, so corruption shows at startup."""
        for conversation in self.list_conversations(status="active"):
            self._with_summary(conversation.to_doc())
            self._load_messages(conversation.id)

    # Segments ------------------------------------------------------------------------------

    def _segments(self, conversation_id: str) -> list[tuple[int, Path]]:
        """(first seq, path) of each segment file, in order."""
        folder = self._conversation_dir(conversation_id)
        found = []
        for path in folder.glob("seg-*.json"):
            try:
                found.append((int(path.stem[4:]), path))
            except ValueError:
                continue
        return sorted(found)

    def _load_messages(self, conversation_id: str) -> list[Message]:
        cached = self._messages.get(conversation_id)
        if cached is not None:
            self._messages.move_to_end(conversation_id)
            return cached
        loaded: list[Message] = []
        for _, path in self._segments(conversation_id):
            docs = self._db(path).table("messages").all()
            loaded.extend(Message.from_doc(d) for d in docs)
        self._messages[conversation_id] = loaded
        while len(self._messages) > _CACHED_CONVERSATIONS:
            self._messages.popitem(last=False)
        return loaded

    def _count_messages(self, conversation_id: str) -> int:
        """Messages of a conversation without loading them: only its last segment is read."""
        cached = self._messages.get(conversation_id)
        if cached is not None:
            return len(cached)
        segments = self._segments(conversation_id)
        if not segments:
            return 0
        first_seq, path = segments[-1]
        return first_seq - 1 + len(self._db(path).table("messages"))

    def _write_to_segment(self, conversation_id: str, message: Message) -> None:
        segments = self._segments(conversation_id)
        path = segments[-1][1] if segments else None
        if path is None or self._segment_is_full(path, message.seq, segments[-1][0]):
            path = self._conversation_dir(conversation_id) / f"seg-{message.seq:09d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db(path).table("messages").insert(Document(message.to_doc(), doc_id=message.seq))

    @staticmethod
    def _segment_is_full(path: Path, next_seq: int, first_seq: int) -> bool:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return True  # moved aside since we listed it
        return next_seq - first_seq >= SEGMENT_MAX_MESSAGES or size >= SEGMENT_MAX_BYTES

