"""The list of conversations: active ones in one small file, archived ones by month.

`conversations/active.json` holds only the conversations that are active now (at most one per
chat), so starting a turn rewrites a file the size of the active set. When a conversation is
archived its record moves to `conversations/archive-YYYY-MM.json` (the month it was created),
with its message count fixed, so the memory map never needs to open an archived conversation.
Every record is also in the conversation's own `record.json`, written at creation: a lost
`active.json` is rebuilt from those (the conversations it held come back as archived).

All records are read once at open and then served from memory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tinydb import Query, TinyDB

from daemon.core.conversations import Conversation
from daemon.core.logs import store_log as log
from daemon.store.files import CorruptFile, Files, dumps

ACTIVE = "active.json"


def index_doc(conversation: Conversation) -> dict[str, Any]:
    """The record as listed: everything but the summary (that has its own file)."""
    return {k: v for k, v in conversation.to_doc().items() if k != "summary"}


def _month(created: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(created))


class ConversationBook:
    def __init__(self, files: Files, folder: Path, *, read_only: bool = False) -> None:
        self.files = files
        self.folder = folder
        self.read_only = read_only
        self.docs: dict[str, dict[str, Any]] = {}
        self.newest: dict[str, str] = {}  # chat key -> id of its newest conversation
        self._archives: dict[str, TinyDB] = {}
        for path in files.glob(folder, "archive-*.json"):
            db = self._open(path, "its conversations are rebuilt from their records")
            self._archives[path.stem.removeprefix("archive-")] = db
            for doc in db.all():
                self.docs[doc["id"]] = dict(doc)
        active = folder / ACTIVE
        self.active = self._open(active, "rebuilding the conversation list from disk",
                                 on_corrupt=self.rebuild)
        for doc in self.active.all():
            self.docs[doc["id"]] = dict(doc)
        for doc in self.docs.values():
            self._note_newest(doc)

    def _open(self, path: Path, consequence: str, on_corrupt: Any = None) -> TinyDB:
        db = self.files.db(path)
        try:
            db.all()
        except CorruptFile as exc:
            if self.read_only:
                raise
            self.files.move_aside(path, str(exc), consequence)
            db = self.files.db(path)
            if on_corrupt is not None:
                on_corrupt()
        return db

    def rebuild(self) -> None:
        """Records not listed in any archive come back, as archived, from their record.json."""
        count = 0
        for record_path in self.files.glob(self.folder, "*/record.json"):
            try:
                record = json.loads(self.files.read_bytes(record_path).decode("utf-8"))
            except (OSError, ValueError):
                log.error("cannot read %s while rebuilding the index; skipped", record_path)
                continue
            if record.get("id") in self.docs:
                continue
            record["status"] = "archived"
            self._archive_db(record["created"]).insert(record)
            self.docs[record["id"]] = record
            self._note_newest(record)
            count += 1
        log.warning("rebuilt the conversation list with %d conversations", count)

    def _archive_db(self, created: float) -> TinyDB:
        month = _month(created)
        db = self._archives.get(month)
        if db is None:
            db = self.files.db(self.folder / f"archive-{month}.json")
            self._archives[month] = db
        return db

    def create(self, conversation: Conversation, folder: Path) -> None:
        self.files.mkdir(folder)
        doc = index_doc(conversation)
        self.files.write(folder / "record.json", dumps(doc))
        self.save(doc)

    def save(self, doc: Mapping[str, Any], **extra: Any) -> None:
        """Write a record where its status says it belongs (moving it when that changed)."""
        doc = {**doc, **extra}
        was = self.docs.get(doc["id"])
        q = Query().id == doc["id"]
        if doc["status"] == "active":
            self.active.upsert(doc, q)
        else:
            # Archive first: a crash between the two leaves it listed in both files; active.json
            # is read last and wins, so it is merely still active, and archived again later.
            self._archive_db(doc["created"]).upsert(doc, q)
            if was is not None and was.get("status") == "active":
                self.active.remove(q)
        self.docs[doc["id"]] = doc
        self._note_newest(doc)

    def _note_newest(self, doc: Mapping[str, Any]) -> None:
        known = self.docs.get(self.newest.get(doc["chat_key"], ""))
        if known is None or doc["created"] >= known["created"]:
            self.newest[doc["chat_key"]] = doc["id"]

    def newest_of(self, chat_key: str) -> dict[str, Any] | None:
        """The chat's most recent conversation, active or archived (without scanning)."""
        return self.docs.get(self.newest.get(chat_key, ""))

    def get(self, conversation_id: str) -> dict[str, Any] | None:
        return self.docs.get(conversation_id)

    def active_of(self, chat_key: str) -> dict[str, Any] | None:
        found = [d for d in self.active.all() if d["chat_key"] == chat_key]
        return max(found, key=lambda d: d["created"]) if found else None

    def active_docs(self) -> list[dict[str, Any]]:
        """The active records only (active.json): what the idle sweep needs, at the cost of
        the active set rather than of every conversation ever stored."""
        return [dict(doc) for doc in self.active.all()]

    def all(self) -> list[dict[str, Any]]:
        return list(self.docs.values())

    def load_legacy(self, docs: list[dict[str, Any]]) -> None:
        """Take over the records of a pre-split index.json (migration 3)."""
        for doc in docs:
            if doc["id"] not in self.docs:
                self.save(doc)
