"""Each conversation's rolling summary: `conversations/<id>/summary.json`, rewritten by the fold.

One TinyDB file per conversation with one document; the handles of the most recently used stay
open (a bounded LRU), so a turn does not parse its summary twice. A file that does not parse is
moved aside and the conversation goes on without a summary (its messages are all still there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from tinydb import TinyDB
from tinydb.table import Document

from daemon.core.conversations import SummaryState
from daemon.store.files import CorruptFile, Files
from daemon.store.segments import MessageLog

_CACHED_SUMMARIES = 64


class Summaries:
    """The summaries, beside the message segments of each conversation's folder."""

    def __init__(self, files: Files, log: MessageLog, *, read_only: bool = False) -> None:
        self.files = files
        self.log = log
        self.read_only = read_only
        self._open: OrderedDict[str, TinyDB] = OrderedDict()

    def path(self, conversation_id: str) -> Path:
        return self.log.folder(conversation_id) / "summary.json"

    def exists(self, conversation_id: str) -> bool:
        return self.files.exists(self.path(conversation_id))

    def get(self, conversation_id: str) -> SummaryState:
        found = self._db(conversation_id).table("summary").get(doc_id=1)
        return SummaryState.from_doc(found) if isinstance(found, Mapping) else SummaryState()

    def save(self, conversation_id: str, summary: SummaryState) -> None:
        """Replace the conversation's summary state (one summary per conversation)."""
        db = self._db(conversation_id)
        db.table("summary").upsert(Document(summary.to_doc(), doc_id=1))

    def forget(self) -> None:
        self._open.clear()

    def _db(self, conversation_id: str) -> TinyDB:
        db = self._open.get(conversation_id)
        if db is not None:
            self._open.move_to_end(conversation_id)
            return db
        path = self.path(conversation_id)
        db = self.files.db(path)
        try:
            db.table("summary").get(doc_id=1)
        except CorruptFile as exc:
            if self.read_only:
                raise
            self.files.move_aside(path, str(exc), "continuing without it")
            db = self.files.db(path)
        self._open[conversation_id] = db
        while len(self._open) > _CACHED_SUMMARIES:
            self._open.popitem(last=False)
        return db
