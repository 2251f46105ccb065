"""Schema migrations: named, numbered functions, each run once, recorded in `meta.json`.

The state directory has one schema version: the migrations recorded in the `_migrations` table
of `meta.json`, one row each (`version`, `name`, `applied`). At open, every migration whose
number is not recorded runs, in order, and is recorded as soon as it has run; a crash before the
record makes it run again at the next open, so every migration is written to be run twice.
A new schema change is one more function appended to `MIGRATIONS`, with a test that a store
at the version before it is brought to it, and that opening again changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tinydb import TinyDB

from daemon.core.logs import store_log as log
from daemon.store.book import ConversationBook
from daemon.store.files import CorruptFile, Files
from daemon.store.queues import ChatFlags, Dedupe, ItemFolder, UpdateBatches

TABLE = "_migrations"


@dataclass(frozen=True)
class Keepers:
    """What a migration may read and change: the state directory's files and its keepers."""

    files: Files
    state_dir: Path
    book: ConversationBook
    dedupe: Dedupe
    updates: UpdateBatches
    inbox: ItemFolder
    outbox: ItemFolder
    flags: ChatFlags


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    run: Callable[[Keepers], None]


def index_tables(keepers: Keepers) -> None:
    """Version 1 created the tables of the single `index.json`; migration 3 replaced that file,
    so there is nothing left to do (kept so that its number stays taken)."""


def channel_tables(keepers: Keepers) -> None:
    """Version 2 added the raw-update and chat-flag tables to `index.json`; as version 1."""


def split_legacy_index(keepers: Keepers) -> None:
    """Version 3: what `index.json` of earlier versions holds, moved to the per-record layout.

    Each record is written before the old file is renamed (to `index.json.v2`, never deleted),
    and written again, idempotently, if a crash makes the migration run once more.
    """
    files = keepers.files
    legacy = keepers.state_dir / "index.json"
    try:
        data = files.read_json(legacy)
    except CorruptFile as exc:
        files.move_aside(legacy, str(exc), "rebuilding the conversation list from disk")
        data = None
        keepers.book.rebuild()
    if not isinstance(data, dict):
        return
    tables = {name: list(rows.values()) for name, rows in data.items()
              if isinstance(rows, dict)}
    keepers.book.load_legacy(tables.get("conversations", []))
    # The old index claimed an update's key when it was accepted; now a remembered key
    # means done, so the keys of updates still pending are not carried over.
    pending = {d["key"] for d in tables.get("updates", [])}
    keepers.dedupe.remember([(d["key"], d["seen"]) for d in tables.get("dedupe", [])
                             if d["key"] not in pending], time.time())
    for doc in tables.get("inbox", []):
        if doc["id"] not in keepers.inbox.items:
            keepers.inbox.add(doc)
    for doc in tables.get("outbox", []):
        if doc["id"] not in keepers.outbox.items:
            keepers.outbox.add(doc)
    stored = tables.get("updates", [])
    keepers.updates.add([d for d in stored if d["key"] not in keepers.updates.pending])
    for doc in tables.get("chats", []):
        for flag, value in doc.items():
            if flag != "chat_key":
                keepers.flags.set(doc["chat_key"], flag, value)
    files.replace(legacy, legacy.with_name("index.json.v2"))
    log.info("moved the state in index.json to the per-record layout (kept as index.json.v2)")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "index_tables", index_tables),
    Migration(2, "channel_tables", channel_tables),
    Migration(3, "split_legacy_index", split_legacy_index),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def applied(meta: TinyDB) -> set[int]:
    """The versions recorded in `meta`."""
    return {int(doc["version"]) for doc in meta.table(TABLE).all()}


def migrate(meta: TinyDB, keepers: Keepers,
            migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """Run the migrations not recorded in `meta`, in order, recording each after it ran;
    the names of those that ran."""
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise ValueError("migrations must be numbered 1, 2, 3... in order")
    done = applied(meta)
    ran = []
    for migration in migrations:
        if migration.version in done:
            continue
        migration.run(keepers)
        meta.table(TABLE).insert({"version": migration.version, "name": migration.name,
                                  "applied": time.time()})
        ran.append(migration.name)
        # With nothing recorded the state is new (made at this version; an older layout's
        # migration says what it converted), so only a change to a kept state is news.
        log.log(logging.INFO if done else logging.DEBUG, "state in %s: migration %d (%s) "
                "applied", keepers.state_dir, migration.version, migration.name)
    return ran
