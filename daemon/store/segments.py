"""A conversation's messages: bounded segment files, appended to, closed, never rewritten.

`conversations/<id>/seg-<first seq>.json` holds up to `SEGMENT_MAX_MESSAGES` messages or
`SEGMENT_MAX_BYTES`; then the next message opens a new segment. TinyDB rewrites a whole file per
write, so this keeps an append at message 10,000 as cheap as at message 10. The messages of
recently used conversations stay in memory (a bounded LRU), and so do the TinyDB handles of
their open segments: nothing a turn reads is parsed twice.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from tinydb import TinyDB
from tinydb.table import Document

from daemon.core.conversations import Message
from daemon.core.errors import StoreError
from daemon.core.ids import is_id
from daemon.store.files import CorruptFile, Files

SEGMENT_MAX_MESSAGES = 100
SEGMENT_MAX_BYTES = 128 * 1024  # an append rewrites at most this much
_CACHED_CONVERSATIONS = 32


@dataclass
class _Log:
    messages: list[Message]
    segments: list[tuple[int, Path]]  # (first seq, path), in order
    last: TinyDB | None  # the open (last) segment's database


class MessageLog:
    def __init__(self, files: Files, root: Path, *, read_only: bool = False) -> None:
        self.files = files
        self.root = root
        self.read_only = read_only
        self._logs: OrderedDict[str, _Log] = OrderedDict()

    def folder(self, conversation_id: str) -> Path:
        """The conversation's folder; only ever for an id of roost's own form, so that no
        string from outside (a tool's arguments) can make it a path elsewhere."""
        if not is_id(conversation_id):
            raise ValueError(f"not a conversation id: {conversation_id!r}")
        return self.root / conversation_id

    def created(self, conversation_id: str) -> None:
        self._logs[conversation_id] = _Log([], [], None)
        self._evict()

    def messages(self, conversation_id: str) -> list[Message]:
        return self._load(conversation_id).messages

    def count(self, conversation_id: str) -> int:
        """Messages of a conversation; without loading them, only its last segment is read."""
        cached = self._logs.get(conversation_id)
        if cached is not None:
            return len(cached.messages)
        segments = self._segments(conversation_id)
        if not segments:
            return 0
        first_seq, path = segments[-1]
        return first_seq - 1 + len(self._open_db(path).table("messages"))

    def append(self, conversation_id: str, message: Message) -> None:
        log = self._load(conversation_id)
        try:
            db = self._segment_for(conversation_id, log, message.seq)
            db.table("messages").insert(Document(message.to_doc(), doc_id=message.seq))
        except StoreError:
            # The write may or may not have reached the disk: read it back next time.
            self._logs.pop(conversation_id, None)
            raise
        log.messages.append(message)

    def forget(self) -> None:
        self._logs.clear()

    # ---- internals ---------------------------------------------------------------------------

    def _segment_for(self, conversation_id: str, log: _Log, seq: int) -> TinyDB:
        if log.segments and log.last is not None:
            first_seq, path = log.segments[-1]
            if not self._full(path, seq, first_seq):
                return log.last
        path = self.folder(conversation_id) / f"seg-{seq:09d}.json"
        self.files.mkdir(path.parent)
        log.segments.append((seq, path))
        log.last = self.files.db(path)
        return log.last

    def _load(self, conversation_id: str) -> _Log:
        cached = self._logs.get(conversation_id)
        if cached is not None:
            self._logs.move_to_end(conversation_id)
            return cached
        segments = self._segments(conversation_id)
        messages: list[Message] = []
        db: TinyDB | None = None
        for _, path in segments:
            db = self._open_db(path)
            messages.extend(Message.from_doc(d) for d in db.table("messages").all())
        log = _Log(messages, segments, db)
        self._logs[conversation_id] = log
        self._evict()
        return log

    def _evict(self) -> None:
        while len(self._logs) > _CACHED_CONVERSATIONS:
            self._logs.popitem(last=False)

    def _open_db(self, path: Path) -> TinyDB:
        """The segment's database, checked once; a corrupt file is moved aside."""
        db = self.files.db(path)
        try:
            db.table("messages").all()
        except CorruptFile as exc:
            if self.read_only:
                raise
            self.files.move_aside(path, str(exc), "continuing without it")
            db = self.files.db(path)
        return db

    def _segments(self, conversation_id: str) -> list[tuple[int, Path]]:
        found = []
        for path in self.files.glob(self.folder(conversation_id), "seg-*.json"):
            try:
                found.append((int(path.stem[4:]), path))
            except ValueError:
                continue
        return sorted(found)

    def _full(self, path: Path, next_seq: int, first_seq: int) -> bool:
        size = self.files.size(path)
        if size is None:
            return True  # moved aside since we listed it
        return next_seq - first_seq >= SEGMENT_MAX_MESSAGES or size >= SEGMENT_MAX_BYTES
