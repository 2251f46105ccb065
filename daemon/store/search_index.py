"""A derived full-text index of every message and summary, for `memory_search`.

The TinyDB files stay the source of truth: this SQLite file (FTS5, standard library) may be
deleted at any time and `sync` rebuilds it from the store. A corrupt file is moved aside and
rebuilt; a file of another schema version is emptied and rebuilt. Nothing here is repaired.

* FTS5 table `memory` holds the searchable `body` and, unindexed, what a hit needs; `indexed`
  keeps per conversation the highest seq indexed and a hash of the summary text, so `sync`
  reads only what is new.
* Tokenizer: unicode61 folds case (and Latin diacritics) in any script it can split on spaces
  and punctuation; Porter stemming lets "parked" find "park". On bench/memory_search.py it
  finds 91% of facts asked about in another form of the key word (unicode61 alone: 3%), with
  the same query times.
* A query is never FTS5 syntax: its words are quoted and OR-ed, stop words dropped. bm25
  costs about 3 us per matching row, so a query ranks at most BUDGET rows to stay inside the
  50 ms target: its rarest words first, or if even the rarest alone is in more rows than that,
  the newest BUDGET rows holding one of its four rarest words. The best candidates are then
  ordered by how many distinct query words they hold, then by bm25: a message holding two of
  the words beats one holding one.
* A tool's search is scoped (`chats`, `conversations`): the ranking query holds the condition
  on each row's chat key and conversation, so other people's rows never show and never take
  the place of the person's own among the top `k`. Rarity is counted over all rows (posting
  lists only), which keeps the bound on rows ranked; the BUDGET floor is counted within the
  scope, so other people's newer rows never push the person's own older ones out of reach.
* One connection behind one lock, since the daemon calls in through `asyncio.to_thread`.
  `sync` takes the lock per conversation, so searches go on during a rebuild.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import os
import re
import shutil
import sqlite3
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

from daemon.core.conversations import Conversation, Message
from daemon.core.errors import StoreError
from daemon.core.logs import store_log as log
from daemon.store import Store

SCHEMA_VERSION = 2  # 2: file notes indexed with their message
TOKENIZER = "porter unicode61 remove_diacritics 2"
BUDGET = 5_000  # rows bm25 may rank per query: about 15 ms here
MAX_QUERY_CHARS = 20_000  # bounds the work on a pasted document; the terms are capped anyway
MAX_TERMS = 12  # bm25 costs more per row with every word (16 words: 2.4 times one)
MAX_WORD_CHARS = 64  # longer runs are hashes or noise, not words anyone asks about
SNIPPET_TOKENS = 24
SNIPPET_CHARS = 240
# Free bytes below which a disk error at open counts as a full disk (the health monitor's
# threshold; SQLite needs room for its -wal and -shm files).
FULL_BELOW = 1024 * 1024
# These tools return text that is already indexed where it was first said; indexing the copies
# would make every past search answer the same question again.
ECHO_TOOLS = frozenset({"memory_search", "memory_get", "conversation_read"})
OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})  # typed in capitals, they mean the syntax
STOPWORDS = frozenset("""
a about above after again all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has
have having he her here hers him his how i if in into is it its just me more most my no nor not
now of off on once only or other our ours out over own same she should so some such than that
the their them then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours
""".split())

_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_FIELDS = "ref, kind, conversation_id, seq, role, created, chat_key"
_TABLE = (f"USING fts5(body, ref UNINDEXED, kind UNINDEXED, conversation_id UNINDEXED, "
          f"seq UNINDEXED, role UNINDEXED, created UNINDEXED, chat_key UNINDEXED, "
          f"tokenize = '{TOKENIZER}')")
_SCHEMA = f"""
CREATE VIRTUAL TABLE IF NOT EXISTS memory {_TABLE};
CREATE TABLE IF NOT EXISTS indexed (
    conversation_id TEXT PRIMARY KEY, max_seq INTEGER NOT NULL, summary_hash TEXT NOT NULL,
    summary_rowid INTEGER, status TEXT NOT NULL, last_active REAL NOT NULL);
"""
_INSERT = f"INSERT INTO memory (body, {_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


@dataclass(frozen=True)
class Hit:
    """One search result; `ref` is what `memory_get` takes."""

    ref: str  # "msg:<conversation_id>:<seq>" or "summary:<conversation_id>"
    kind: str  # "message" | "summary"
    conversation_id: str
    seq: int | None
    role: str | None
    created: float | None
    chat_key: str
    snippet: str  # one line around the match
    score: float  # query words matched, plus bm25 squashed into [0, 1): higher is better


@dataclass(frozen=True)
class _Scope:
    """The rows a search may return, as an SQL condition on the row's chat and conversation."""

    sql: str
    args: tuple[str, ...]

    @classmethod
    def of(cls, chats: Collection[str] | None, conversations: Collection[str]) -> _Scope:
        if chats is None:
            return cls("", ())
        keys, ids = sorted(set(chats)), sorted(set(conversations))
        # `IN ()` is valid in SQLite and matches nothing: an empty scope finds nothing.
        return cls(f" AND (chat_key IN ({','.join('?' * len(keys))}) OR conversation_id IN "
                   f"({','.join('?' * len(ids))}))", (*keys, *ids))


def query_terms(text: str) -> list[str]:
    """The distinct searchable words of a natural-language query, in order."""
    words: dict[str, str] = {}
    for word in _WORD.findall(unicodedata.normalize("NFC", text[:MAX_QUERY_CHARS])):
        if word not in OPERATORS and len(word) <= MAX_WORD_CHARS and any(map(str.isalnum, word)):
            words.setdefault(word.lower(), word)
    # Stop words and single Latin letters ("sister's" -> "s") match nearly every row.
    return [w for key, w in words.items()
            if key not in STOPWORDS and not (len(key) == 1 and key.isascii())][:MAX_TERMS]


def _any_of(terms: Iterable[str]) -> str:
    # A quoted FTS5 string is always a literal phrase, and \w+ holds no quote to escape.
    return " OR ".join(f'"{t}"' for t in terms)


class SearchIndex:
    """A derived full-text index of every message and summary; rebuildable from the store."""

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        """Use `SearchIndex.open(path)`."""
        self.path = path
        self._db = db
        self._lock = threading.Lock()
        # Its own lock: mark_dirty is called from the event loop and must never wait for a
        # sync that holds `_lock` while it reads the store and writes SQLite.
        self._dirty_lock = threading.Lock()
        self._dirty: set[str] = set()
        # Anything may have changed while we were not running (a crash between an append and
        # its sync), so the first search with a store checks every conversation.
        self._all_dirty = True
        self._closing = threading.Event()

    @classmethod
    def open(cls, path: Path) -> SearchIndex:
        """Open or create the index; a corrupt file is moved aside and a new one started.

        A disk that cannot take the index (full, read-only, failing) raises StoreError, as the
        store itself does: the daemon then stops with one line instead of a traceback.
        """
        try:
            try:
                db = _connect(path)
            except sqlite3.DatabaseError as exc:
                if not _is_corrupt(exc):  # e.g. locked or unwritable: not a reason to discard it
                    raise
                log.warning("memory index %s is corrupt (%s); rebuilding it", path, exc)
                _move_aside(path)
                db = _connect(path)
        except sqlite3.OperationalError as exc:
            error, cause = _disk_error(path, exc)
            raise error from cause or exc
        except OSError as exc:  # the directory or the moved-aside files
            raise StoreError(f"cannot open the memory index {path}: {exc}") from exc
        return cls(path, db)

    def close(self) -> None:
        """Close the index; a full sync running in another thread stops at the next
        conversation."""
        self._closing.set()
        with self._lock:
            self._db.close()

    def mark_dirty(self, conversation_id: str) -> None:
        """Remember that a conversation changed; the next `search` with a store syncs it."""
        with self._dirty_lock:
            self._dirty.add(conversation_id)

    def sync(self, store: Store, conversation_ids: Iterable[str] | None = None) -> int:
        """Index what is new since the last sync; None means every conversation in the store.

        Returns the rows written. Cheap when nothing changed: an archived conversation already
        indexed as archived is not read again unless it was marked dirty.
        """
        if conversation_ids is not None:
            return sum(self._sync_one(store, cid) for cid in dict.fromkeys(conversation_ids))
        conversations = store.list_conversations()
        with self._dirty_lock:
            dirty = set(self._dirty)
        with self._lock:
            known = {c.id for c in conversations}
            for (cid,) in self._db.execute("SELECT conversation_id FROM indexed").fetchall():
                if cid not in known:
                    self._forget(cid)
        written = 0
        for conversation in conversations:
            if self._closing.is_set():  # shutting down: the next start carries on
                return written
            written += self._sync_one(store, conversation.id,
                                      None if conversation.id in dirty else conversation)
        with self._lock:
            self._all_dirty = False
        return written

    def _sync_one(self, store: Store, cid: str, listed: Conversation | None = None) -> int:
        # One conversation per lock hold and per transaction: searches interleave with a full
        # rebuild, and a crash loses at most one conversation's progress.
        with self._lock:
            row = self._db.execute("SELECT max_seq, summary_hash, summary_rowid, status, "
                                   "last_active FROM indexed WHERE conversation_id = ?",
                                   (cid,)).fetchone()
            max_seq, old_hash, summary_rowid, status, last_active = row or (0, "", None, "", 0)
            if (listed is not None and status == listed.status == "archived"
                    and last_active == listed.last_active):
                # Sealed: an archived conversation gets no messages, and a fold finishing after
                # archiving calls mark_dirty. So a full sync reads a list, not every message.
                return 0
            with self._dirty_lock:
                self._dirty.discard(cid)
            conversation = store.get_conversation(cid)
            if conversation is None:
                return 0
            messages = store.messages(cid, max(max_seq, 1))
            if max_seq and (not messages or messages[0].seq != max_seq):
                # The store lost the last message we indexed (a corrupt segment moved aside):
                # start this conversation over rather than point at what is gone.
                self._forget(cid)
                max_seq, old_hash, summary_rowid = 0, "", None
                messages = store.messages(cid)
            new = [m for m in messages if m.seq > max_seq]
            summary = conversation.summary
            text = f"{summary.summary}\n\n{summary.user_notes}".strip()
            new_hash = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
            chat = conversation.chat_key
            rows = [(body, f"msg:{cid}:{m.seq}", "message", cid, m.seq, m.role, m.created,
                     chat) for m in new if (body := _searchable(m)).strip()
                    and not (m.role == "tool" and m.tool_name in ECHO_TOOLS)]
            written = len(rows)
            with self._db:
                self._db.executemany(_INSERT, rows)
                if new_hash != old_hash:
                    self._db.execute("DELETE FROM memory WHERE rowid = ?", (summary_rowid,))
                    summary_rowid = None
                    if text:
                        summary_rowid = self._db.execute(_INSERT, (
                            text, f"summary:{cid}", "summary", cid, None, None,
                            summary.folded_at, chat)).lastrowid
                        written += 1
                self._db.execute("INSERT OR REPLACE INTO indexed VALUES (?, ?, ?, ?, ?, ?)",
                                 (cid, new[-1].seq if new else max_seq, new_hash, summary_rowid,
                                  conversation.status, conversation.last_active))
            return written

    def _forget(self, cid: str) -> None:
        """Drop a conversation's rows (scans the table: only when the store lost data)."""
        with self._db:
            self._db.execute("DELETE FROM memory WHERE conversation_id = ?", (cid,))
            self._db.execute("DELETE FROM indexed WHERE conversation_id = ?", (cid,))

    def search(self, query: str, limit: int = 8, store: Store | None = None, *,
               chats: Collection[str] | None = None,
               conversations: Collection[str] = ()) -> list[Hit]:
        """Messages and summaries sharing words with `query`, best first. Given the store,
        conversations marked dirty are indexed first.

        `chats` limits the search to the conversations of those chat keys, plus the single
        `conversations` named (a tool's recall scope); None searches every conversation."""
        terms = query_terms(query)
        scope = _Scope.of(chats, conversations)
        try:
            return self._search(terms, limit, store, scope)
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise
            # The file went bad while open: start a fresh one (filled first if given a store).
            log.error("memory index %s is corrupt (%s); rebuilding it", self.path, exc)
            with self._lock:
                self._db.close()
                _move_aside(self.path)
                self._db = _connect(self.path)
                self._all_dirty = True
            return self._search(terms, limit, store, scope)

    def _search(self, terms: list[str], limit: int, store: Store | None,
                scope: _Scope) -> list[Hit]:
        if store is not None:
            with self._dirty_lock:
                everything, dirty = self._all_dirty, sorted(self._dirty)
            try:
                self.sync(store, None if everything else dirty)
            except StoreError as exc:  # search what is indexed; the next search retries
                log.warning("memory index cannot read the store (%s); searching anyway", exc)
        if not terms or limit <= 0:
            return []
        with self._lock:
            ranks = self._candidates(terms, max(4 * limit, 32), scope)
            if not ranks:
                return []
            # Which query words each candidate holds: FTS5 cannot test a term against a few
            # rowids of a large table cheaply (it walks the whole posting list), so the
            # candidates are copied into a scratch table and matched there.
            marks = ",".join("?" * len(ranks))
            self._db.execute("DELETE FROM temp.scratch")
            self._db.execute(f"INSERT INTO temp.scratch (rowid, body, {_FIELDS}) SELECT rowid, "
                             f"body, {_FIELDS} FROM memory WHERE rowid IN ({marks})", [*ranks])
            words = Counter(r for t in terms for (r,) in self._db.execute(
                "SELECT rowid FROM temp.scratch WHERE scratch MATCH ?", (_any_of([t]),)))
            best = sorted(ranks, key=lambda r: (-words[r], ranks[r]))[:limit]
            found = {r[0]: r[1:] for r in self._db.execute(
                f"SELECT rowid, {_FIELDS}, snippet(scratch, 0, '', '', '…', {SNIPPET_TOKENS}) "
                "FROM temp.scratch WHERE scratch MATCH ?", (_any_of(terms),))}
        hits = []
        for rowid in best:
            ref, kind, cid, seq, role, created, chat_key, snippet = found[rowid]
            snippet = _SPACE.sub(" ", snippet).strip()
            if len(snippet) > SNIPPET_CHARS:
                snippet = snippet[: SNIPPET_CHARS - 1] + "…"
            relevance = -ranks[rowid]  # FTS5's bm25 is negative: lower is better
            hits.append(Hit(ref, kind, cid, seq, role, created, chat_key, snippet,
                            words[rowid] + relevance / (1 + relevance)))
        return hits

    def _candidates(self, terms: list[str], k: int, scope: _Scope) -> dict[int, float]:
        """Rowid -> bm25 of the top `k` rows in scope, ranking at most BUDGET rows (see module
        doc). Rarity is counted over every row, in scope or not: that reads posting lists only,
        where testing the scope reads each row (5 times slower on bench/memory_search.py), and
        it keeps the bound on the rows ranked. The floor is the BUDGET-th newest row in scope,
        so that it cannot leave the scope's own rows out."""
        rows = {t: self._db.execute("SELECT count(*) FROM (SELECT 1 FROM memory WHERE memory "
                                    "MATCH ? LIMIT ?)", (_any_of([t]), BUDGET + 1)).fetchone()[0]
                for t in terms}
        by_rarity = sorted(terms, key=rows.__getitem__)  # rare words say the most
        chosen: list[str] = []
        total = 0
        for term in by_rarity:
            total += rows[term]
            if total > BUDGET:
                break
            chosen.append(term)
        match, floor = _any_of(chosen or by_rarity[:4]), 0
        if not chosen and scope.sql:
            # Every word is in thousands of rows and says little: rank the newest BUDGET rows
            # in scope (of every row's, other people's newer rows would push this person's own
            # out of reach). One walk, newest first, finds and ranks them: a floor counted
            # first would walk them twice (p99 twice as long on bench/memory_search.py).
            newest = self._db.execute(f"SELECT rowid, rank FROM memory WHERE memory MATCH ?"
                                      f"{scope.sql} ORDER BY rowid DESC LIMIT ?",
                                      (match, *scope.args, BUDGET)).fetchall()
            return dict(heapq.nsmallest(k, newest, key=itemgetter(1)))
        if not chosen:  # the same, unscoped: the floor reads posting lists only
            newest = self._db.execute("SELECT rowid FROM memory WHERE memory MATCH ? ORDER BY "
                                      "rowid DESC LIMIT 1 OFFSET ?", (match, BUDGET)).fetchone()
            floor = newest[0] if newest else 0
        return dict(self._db.execute(f"SELECT rowid, rank FROM memory WHERE memory MATCH ?"
                                     f"{scope.sql} AND rowid >= ? ORDER BY rank LIMIT ?",
                                     (match, *scope.args, floor, k)))

    def stats(self) -> dict[str, int]:
        """Rows by kind, conversations indexed, and conversations waiting to be synced."""
        with self._lock:
            kinds = dict(self._db.execute("SELECT kind, count(*) FROM memory GROUP BY kind"))
            conversations = self._db.execute("SELECT count(*) FROM indexed").fetchone()[0]
            return {"messages": kinds.get("message", 0), "summaries": kinds.get("summary", 0),
                    "conversations": conversations, "dirty": len(self._dirty)}


def _searchable(message: Message) -> str:
    """The text and the file notes (name, kind, reference): a file's name finds it."""
    notes = [str(doc["note"]) for doc in message.attachments if doc.get("note")]
    return "\n".join([message.content, *notes]) if notes else message.content


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # Derived data: a power cut costing the last commits only means indexing them again.
        db.execute("PRAGMA synchronous=NORMAL")
        # Posting lists of common words are read by every query: keep them in memory (32 MB;
        # the default 2 MB made p99 a third slower on 100,000 messages).
        db.execute("PRAGMA cache_size=-32000")
        if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            # New, or written by another version of roost: derived data is rebuilt, not migrated.
            db.executescript("DROP TABLE IF EXISTS memory; DROP TABLE IF EXISTS indexed;")
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute(f"CREATE VIRTUAL TABLE temp.scratch {_TABLE}")
        db.execute("SELECT max_seq FROM indexed LIMIT 1").fetchall()  # touches the file's pages
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def _disk_error(path: Path, exc: sqlite3.OperationalError) -> tuple[StoreError, OSError | None]:
    """A StoreError for SQLite's own error code, and the OSError behind it where one is known.

    SQLite hides errno, and a full disk often surfaces as a plain I/O error (writing the -shm
    or -wal file), so the free space decides whether the disk is full.
    """
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
    number: int | None = None
    if code == sqlite3.SQLITE_FULL or (code == sqlite3.SQLITE_IOERR and _nearly_full(path)):
        number = errno.ENOSPC
    elif code == sqlite3.SQLITE_IOERR:
        number = errno.EIO
    elif code == sqlite3.SQLITE_READONLY:
        number = errno.EROFS
    if number is None:
        return StoreError(f"cannot open the memory index {path}: {exc}"), None
    cause = OSError(number, os.strerror(number), str(path))
    return StoreError(f"cannot open the memory index {path}: {cause}"), cause


def _nearly_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.parent).free < FULL_BELOW
    except OSError:
        return False


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _move_aside(path: Path) -> None:
    """Keep the bad file for a look (it may say what went wrong); the index starts empty."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            part.replace(part.with_name(f"{part.name}.corrupt-{stamp}"))
