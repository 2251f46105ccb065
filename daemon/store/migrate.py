"""Migration 3: the single `index.json` of earlier versions, split into the per-record layout.

Each record is written before the old file is renamed (to `index.json.v2`, never deleted), and
written again, idempotently, if a crash makes the migration run once more.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from daemon.core.logs import store_log as log
from daemon.store.book import ConversationBook
from daemon.store.files import CorruptFile, move_aside, read_json
from daemon.store.queues import ChatFlags, Dedupe, ItemFolder, UpdateBatches


def split_legacy_index(state_dir: Path, *, book: ConversationBook, dedupe: Dedupe,
                       updates: UpdateBatches, inbox: ItemFolder, outbox: ItemFolder,
                       flags: ChatFlags) -> None:
    """Move what `state_dir/index.json` holds to the record keepers; rename the file."""
    legacy = state_dir / "index.json"
    try:
        data = read_json(legacy)
    except CorruptFile as exc:
        move_aside(legacy, str(exc), "rebuilding the conversation list from disk")
        data = None
        book.rebuild()
    if not isinstance(data, dict):
        return
    tables = {name: list(rows.values()) for name, rows in data.items()
              if isinstance(rows, dict)}
    book.load_legacy(tables.get("conversations", []))
    # The old index claimed an update's key when it was accepted; now a remembered key
    # means done, so the keys of updates still pending are not carried over.
    pending = {d["key"] for d in tables.get("updates", [])}
    dedupe.remember([(d["key"], d["seen"]) for d in tables.get("dedupe", [])
                     if d["key"] not in pending], time.time())
    for doc in tables.get("inbox", []):
        if doc["id"] not in inbox.items:
            inbox.add(doc)
    for doc in tables.get("outbox", []):
        if doc["id"] not in outbox.items:
            outbox.add(doc)
    stored = tables.get("updates", [])
    updates.add([d for d in stored if d["key"] not in updates.pending])
    for doc in tables.get("chats", []):
        for flag, value in doc.items():
            if flag != "chat_key":
                flags.set(doc["chat_key"], flag, value)
    os.replace(legacy, legacy.with_name("index.json.v2"))
    log.info("moved the state in index.json to the per-record layout (kept as index.json.v2)")
