"""Pending work and what roost remembers about it: each kind of record in its own small files.

* `ItemFolder`: one file per item (inbox, outbox, quarantine), removed when the item is done.
  Adding or finishing an item costs one small file, however many items came before.
* `UpdateBatches`: raw platform payloads awaiting translation. Payloads acknowledged together
  share one file and one fsync (the intake's group commit); the file is removed once every
  payload in it is done.
* `Dedupe`: keys seen (platform update ids, answered inbox items, sent replies), in files of
  at most 256 keys, each dropped whole when its newest key is older than the keep period.
  Queries are answered from an in-memory map rebuilt from the files at open.
* `ChatFlags`: a few flags per chat (e.g. `undeliverable`), one small file.

All are synchronous and unlocked: the `Store` facade holds the lock around them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinydb import Query, TinyDB

from daemon.store.files import CorruptFile, Files, dumps, file_name

DEDUPE_KEEP_SECONDS = 14 * 24 * 3600
DEDUPE_FILE_KEYS = 256  # keys per dedupe file: the most one claim rewrites
_TABLE = "_default"  # TinyDB's default table: every file here is a valid TinyDB database


def _wrap(doc: Mapping[str, Any]) -> bytes:
    return dumps({_TABLE: {"1": dict(doc)}})


def _unwrap(path: Path, data: Any) -> dict[str, Any]:
    try:
        doc = data[_TABLE]["1"]
    except (KeyError, TypeError) as exc:
        raise CorruptFile(f"{path}: not a one-item file") from exc
    if not isinstance(doc, dict):
        raise CorruptFile(f"{path}: the item is not an object")
    return doc


class ItemFolder:
    """Items with an `id`, one file each, all held in memory (the folder is the active set)."""

    def __init__(self, files: Files, folder: Path, required: tuple[str, ...], *,
                 read_only: bool = False) -> None:
        self.files = files
        self.folder = folder
        self.items: dict[str, dict[str, Any]] = {}
        if not read_only:
            files.mkdir(folder)
        for path in files.glob(folder, "*.json"):
            try:
                doc = _unwrap(path, files.read_json(path))
                missing = [k for k in ("id", *required) if k not in doc]
                if missing:  # listing or sorting it would fail at every start
                    raise CorruptFile(f"{path}: the item has no {', '.join(missing)}")
                self.items[str(doc["id"])] = doc
            except CorruptFile as exc:
                if read_only:
                    raise CorruptFile(str(exc)) from exc
                files.move_aside(path, str(exc), "that item is skipped")

    def add(self, item: Mapping[str, Any], *, durable_rename: bool = True) -> None:
        doc = dict(item)
        self.files.write(self._path(str(doc["id"])), _wrap(doc), durable_rename=durable_rename)
        self.items[str(doc["id"])] = doc

    def update(self, item_id: str, fields: Mapping[str, Any], *,
               durable_rename: bool = True) -> None:
        if item_id in self.items:
            self.add({**self.items[item_id], **fields}, durable_rename=durable_rename)

    def remove(self, item_id: str) -> None:
        # No folder fsync: an unlink a crash undoes brings back an item that its dedupe key
        # (written before) marks as done, and the owner drops it again.
        if self.items.pop(item_id, None) is not None:
            self.files.remove(self._path(item_id))

    def pending(self, time_field: str, chat_key: str | None = None) -> list[dict[str, Any]]:
        found = (d for d in self.items.values() if chat_key is None or d["chat_key"] == chat_key)
        return sorted((dict(d) for d in found), key=lambda d: (d[time_field], d["id"]))

    def _path(self, item_id: str) -> Path:
        return self.folder / f"{file_name(item_id)}.json"


@dataclass
class _KeyFile:
    db: TinyDB
    path: Path
    count: int
    newest: float


class Dedupe:
    """Keys seen, kept at least `DEDUPE_KEEP_SECONDS`, in files of at most `DEDUPE_FILE_KEYS`
    keys: a claim rewrites one small file however busy the hour, and a file goes whole once
    its newest key is older than the keep period."""

    def __init__(self, files: Files, folder: Path, *, read_only: bool = False) -> None:
        self.files = files
        self.folder = folder
        self.seen: dict[str, float] = {}
        self._files: list[_KeyFile] = []
        self._serial = 0
        if not read_only:
            files.mkdir(folder)
        for path in files.glob(folder, "*.json"):
            try:
                serial = int(path.stem)
                db = files.db(path)
                docs = db.all()
                seen = {str(doc["key"]): float(doc["seen"]) for doc in docs}
            except (ValueError, CorruptFile, KeyError, TypeError) as exc:
                if not read_only:
                    files.move_aside(path, str(exc), "its keys are forgotten")
                continue
            self.seen.update(seen)
            self._serial = max(self._serial, serial)
            self._files.append(_KeyFile(db, path, len(docs), max(seen.values(), default=0.0)))

    def __contains__(self, key: str) -> bool:
        return key in self.seen

    def claim(self, keys: Iterable[str], now: float) -> list[str]:
        """Record the keys not seen before; returns those."""
        return self.remember([(k, now) for k in keys], now)

    def remember(self, pairs: Iterable[tuple[str, float]], now: float) -> list[str]:
        """Record (key, seen) pairs not seen before, filling files up; returns the new keys."""
        new: dict[str, float] = {}
        for key, seen in pairs:
            if key not in self.seen and key not in new:
                new[key] = seen
        if not new:
            return []
        self._prune(now)
        todo = list(new.items())
        while todo:
            current = self._files[-1] if self._files else None
            if current is None or current.count >= DEDUPE_FILE_KEYS:
                self._serial += 1
                path = self.folder / f"{self._serial:09d}.json"
                current = _KeyFile(self.files.db(path), path, 0, 0.0)
                self._files.append(current)
            chunk, todo = (todo[:DEDUPE_FILE_KEYS - current.count],
                           todo[DEDUPE_FILE_KEYS - current.count:])
            current.db.insert_multiple({"key": k, "seen": t} for k, t in chunk)
            current.count += len(chunk)
            current.newest = max(current.newest, *(t for _, t in chunk))
            for key, seen in chunk:
                self.seen[key] = seen
        return list(new)

    def _prune(self, now: float) -> None:
        """Whole files whose every key is older than the keep period go at once."""
        cutoff = now - DEDUPE_KEEP_SECONDS
        for old in [f for f in self._files if f.newest < cutoff]:
            self._files.remove(old)
            for doc in old.db.all():
                if self.seen.get(doc["key"]) == doc["seen"]:
                    del self.seen[doc["key"]]
            old.db.close()
            self.files.remove(old.path)


@dataclass
class _Batch:
    path: Path
    pending: set[str]


class UpdateBatches:
    """Raw payloads in batch files; `pending` maps each key to its stored doc."""

    def __init__(self, files: Files, folder: Path, dedupe: Dedupe, *,
                 read_only: bool = False) -> None:
        self.files = files
        self.folder = folder
        self.dedupe = dedupe
        self.pending: dict[str, dict[str, Any]] = {}
        self._batch_of: dict[str, _Batch] = {}
        self._counter = 0
        if not read_only:
            files.mkdir(folder)
        for path in files.glob(folder, "*.json"):
            try:
                data = files.read_json(path)
                docs = list(data[_TABLE].values())
                keys = {str(d["key"]) for d in docs}
            except (CorruptFile, KeyError, TypeError, AttributeError) as exc:
                if read_only:
                    continue
                files.move_aside(path, str(exc), "its updates are not resumed")
                continue
            batch = _Batch(path, {k for k in keys if k not in dedupe})
            if not batch.pending and not read_only:
                files.remove(path)  # everything in it was done before the crash
                continue
            for doc in docs:
                if doc["key"] in batch.pending:
                    self.pending[doc["key"]] = doc
                    self._batch_of[doc["key"]] = batch

    def known(self, key: str) -> bool:
        # Read without the main lock: a dict lookup is atomic, and a key being remembered
        # meanwhile was pending (so known) until then.
        return key in self.pending or key in self.dedupe

    def add(self, docs: list[dict[str, Any]]) -> None:
        """One file and one fsync for all of `docs` (keys the caller checked as new)."""
        if not docs:
            return
        self._counter += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{self._counter}.json"
        path = self.folder / name
        self.files.write(path, dumps({_TABLE: {str(i): d for i, d in enumerate(docs, 1)}}))
        batch = _Batch(path, {d["key"] for d in docs})
        for doc in docs:
            self.pending[doc["key"]] = doc
            self._batch_of[doc["key"]] = batch

    def done(self, key: str) -> None:
        """Forget one payload (the caller remembered its key first, where it should be); its
        file goes with its last payload."""
        self.pending.pop(key, None)
        batch = self._batch_of.pop(key, None)
        if batch is None:
            return
        batch.pending.discard(key)
        if not batch.pending:
            self.files.remove(batch.path)

    def of_channel(self, channel: str) -> list[dict[str, Any]]:
        docs = (dict(d) for d in self.pending.values() if d["channel"] == channel)
        return sorted(docs, key=lambda d: (d["received"], d["key"]))


class ChatFlags:
    """Flags per chat, in one small TinyDB file (only chats that have a flag are in it)."""

    def __init__(self, files: Files, path: Path) -> None:
        self.path = path
        try:
            self.db = files.db(path)
            self.db.all()
        except CorruptFile as exc:
            files.move_aside(path, str(exc), "chat flags are forgotten")
            self.db = files.db(path)

    def get(self, chat_key: str) -> dict[str, Any]:
        doc = self.db.get(Query().chat_key == chat_key)
        return {k: v for k, v in dict(doc or {}).items() if k != "chat_key"}  # type: ignore[arg-type]

    def having(self, flag: str) -> dict[str, Any]:
        return {doc["chat_key"]: doc[flag] for doc in self.db.search(Query()[flag].exists())}

    def count(self, flag: str) -> int:
        return self.db.count(Query()[flag].exists())

    def set(self, chat_key: str, flag: str, value: Any) -> None:
        flags = self.get(chat_key)
        if flags.get(flag) == value and (value is not None or flag not in flags):
            return
        flags.pop(flag, None)
        if value is not None:
            flags[flag] = value
        q = Query().chat_key == chat_key
        if not flags:
            self.db.remove(q)
        elif self.db.contains(q):
            def replace(doc: dict[str, Any]) -> None:
                # TinyDB's update merges and could not remove a flag: replace in place.
                doc.clear()
                doc.update({"chat_key": chat_key, **flags})

            self.db.update(replace, q)
        else:
            self.db.insert({"chat_key": chat_key, **flags})
