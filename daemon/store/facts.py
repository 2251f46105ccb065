"""The facts roost keeps about each person: one Markdown file a person, one fact a line.

Layout::

    <state_dir>/facts/telegram_1111111.md      a person's facts (one chat, not linked)
    <state_dir>/facts/identity_owner.md         the facts of `[identities] owner = [...]`
    <state_dir>/facts/household.md              the household's facts, shared by its members
    <state_dir>/conversations/<id>/facts.json   what one conversation's prompt froze of them

A facts file is for people too: `- 2026-12-01: My locker code is 4417.` a line, oldest first;
other lines (the heading) are ignored when it is read, so a hand edit cannot break it. Every
write replaces the file atomically (`Files.write`) under a lock, which the daemon and
`roost memory` on the command line both take (`flock` on `facts/.lock`), so neither loses the
other's change. A chat that joins an identity brings its facts along: the first time the
identity is read, the chat's own file is merged into the identity's and then removed (a crash
in between leaves a copy that the next read merges again, without duplicates).

A conversation's prompt shows the facts as they were when it started (`FrozenFacts`): the
block stays the same bytes on every turn, so Ollama's prompt cache holds; it is made again at a
fold or when the chat rotates to a new conversation (see `daemon.turn.prompting`).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.core.errors import StoreError
from daemon.core.ids import is_id
from daemon.core.logs import store_log as log
from daemon.store.files import CorruptFile, DiskFiles, Files, dumps, exclusive, file_name

FACT_MAX_CHARS = 300  # one fact is a sentence or two, not a document
FACTS_MAX = 200  # per person; past it the oldest must be forgotten before more are kept
_LINE = re.compile(r"^- (\d{4}-\d{2}-\d{2}): (.+)$")


class FactError(StoreError):
    """A fact that cannot be kept (empty, too long, too many) or removed (no such number)."""


@dataclass(frozen=True)
class Fact:
    """One fact: its text (one line) and the day it was added (YYYY-MM-DD)."""

    text: str
    added: str


@dataclass(frozen=True)
class Person:
    """Whose facts: `name` is an identity of `[identities]` or a chat key; `chats` are every
    chat of theirs (one, unless an identity links several)."""

    name: str
    chats: tuple[str, ...]
    household: bool = False  # the household's shared facts (HOUSEHOLD), nobody's own

    @property
    def linked(self) -> bool:
        return ":" not in self.name and not self.household

    def label(self) -> str:
        if self.household:
            return "the household"
        return f"{self.name} ({', '.join(self.chats)})" if self.linked else self.name


HOUSEHOLD = Person("*household", (), household=True)  # no person's name or chat has a "*"


@dataclass(frozen=True)
class FrozenFacts:
    """What a conversation's prompt carries of its person's facts: the block, byte for byte;
    the facts it knows of (those in the block, those left out of it for room, and those
    announced in a message since); and the fold it was made at."""

    block: str
    known: tuple[str, ...] = ()
    fold_count: int = 0
    person: str = ""
    shown: int = 0
    left_out: int = 0
    tokens: int = 0
    cap: int = 0
    # The household's block, when the conversation shares it (an owner's, a member's, a
    # group's), and the household facts it knows of; `shares` says whether it was to.
    household: str = ""
    household_known: tuple[str, ...] = ()
    shares: bool = False

    def to_doc(self) -> dict[str, Any]:
        return {"block": self.block, "known": list(self.known), "fold_count": self.fold_count,
                "person": self.person, "shown": self.shown, "left_out": self.left_out,
                "tokens": self.tokens, "cap": self.cap, "household": self.household,
                "household_known": list(self.household_known), "shares": self.shares}

    @classmethod
    def from_doc(cls, doc: Any) -> FrozenFacts | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("block"), str):
            return None
        return cls(block=doc["block"], known=_strings(doc.get("known")),
                   **{k: doc[k] for k in ("fold_count", "shown", "left_out", "tokens", "cap")
                      if isinstance(doc.get(k), int)},
                   person=str(doc.get("person", "")),
                   household=doc["household"] if isinstance(doc.get("household"), str) else "",
                   household_known=_strings(doc.get("household_known")),
                   shares=doc.get("shares") is True)

    @property
    def blocks(self) -> str:
        """The facts part of the system message: the household's block, then the person's."""
        return "\n\n".join(b for b in (self.household, self.block) if b)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def clean_fact(text: str) -> str:
    """A fact as it is kept: one line, single spaces, no list marker; FactError when empty or
    longer than FACT_MAX_CHARS."""
    line = " ".join(text.split()).strip()
    line = re.sub(r"^[-*]\s+", "", line)
    if not line:
        raise FactError("a fact needs some text")
    if len(line) > FACT_MAX_CHARS:
        raise FactError(f"a fact is at most {FACT_MAX_CHARS} characters ({len(line)} given); "
                        "keep the gist")
    return line


def same_fact(a: str, b: str) -> bool:
    return a.casefold().rstrip(". ") == b.casefold().rstrip(". ")


def parse_facts(text: str) -> list[Fact]:
    """The facts of a file's text; lines that are not facts are ignored."""
    facts = []
    for line in text.splitlines():
        if match := _LINE.match(line.strip()):
            facts.append(Fact(text=match[2].strip(), added=match[1]))
    return facts


def matching(facts: Sequence[Fact], query: str, limit: int = 10) -> list[Fact]:
    """The facts that contain the most words of `query` (words of three letters or more, or
    numbers), oldest first, at most `limit`."""
    words = {w for w in re.findall(r"\w+", query.casefold()) if len(w) >= 3 or w.isdigit()}
    scored = [(sum(w in f.text.casefold() for w in words), f) for f in facts]
    best = max((score for score, _ in scored), default=0)
    return [f for score, f in scored if best and score == best][:limit]


def render_facts(person: Person, facts: Sequence[Fact]) -> str:
    lines = [f"# What roost keeps about {person.label()}", "",
             "<!-- One fact a line, oldest first: `- YYYY-MM-DD: text`. Change them with "
             "/remember, /forget N or `roost memory`. -->", ""]
    lines += [f"- {f.added}: {f.text}" for f in facts]
    return "\n".join(lines) + "\n"


@dataclass
class FactsBook:
    """The facts files of one state directory, and the frozen blocks of its conversations.
    Synchronous: the daemon calls it from worker threads."""

    files: Files
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def at(cls, state_dir: Path) -> FactsBook:
        """The facts of a state directory on disk (for `roost memory` while the daemon runs)."""
        return cls(DiskFiles(state_dir))

    @property
    def folder(self) -> Path:
        return self.files.root / "facts"

    def path(self, person: Person) -> Path:
        if person.household:
            return self.folder / "household.md"
        name = f"identity_{person.name}" if person.linked else file_name(person.name)
        return self.folder / f"{name}.md"

    # ---- a person's facts -------------------------------------------------------------------

    def facts(self, person: Person) -> list[Fact]:
        """The person's facts, oldest first."""
        with self._exclusive():
            return self._load(person)

    def add(self, person: Person, text: str, day: str) -> tuple[Fact, bool]:
        """Keep a fact (added on `day`); returns it and whether it is new (the same words kept
        before are not kept twice). FactError when it cannot be kept."""
        line = clean_fact(text)
        with self._exclusive():
            facts = self._load(person)
            for fact in facts:
                if same_fact(fact.text, line):
                    return fact, False
            if len(facts) >= FACTS_MAX:
                raise FactError(f"{len(facts)} facts are kept already, the most there may be; "
                                "forget some first (/memory lists them)")
            fact = Fact(text=line, added=day)
            self._write(person, [*facts, fact])
            return fact, True

    def remove(self, person: Person, number: int) -> Fact:
        """Forget fact `number` (1 is the oldest, as /memory numbers them)."""
        with self._exclusive():
            facts = self._load(person)
            if not 1 <= number <= len(facts):
                raise FactError(f"there is no fact {number}" + (
                    f"; the facts are numbered 1 to {len(facts)}" if facts
                    else "; no facts are kept"))
            gone = facts.pop(number - 1)
            self._write(person, facts)
            return gone

    def remove_text(self, person: Person, text: str) -> Fact:
        """Forget the one fact whose text is `text` (or alone contains it)."""
        with self._exclusive():
            facts = self._load(person)
            wanted = " ".join(text.split()).casefold().rstrip(". ")
            exact = [f for f in facts if same_fact(f.text, wanted)]
            found = exact or [f for f in facts if wanted and wanted in f.text.casefold()]
            if len(found) != 1:
                raise FactError("no kept fact matches that" if not found else
                                f"{len(found)} facts match that; name one of them exactly")
            facts.remove(found[0])
            self._write(person, facts)
            return found[0]

    def people(self) -> list[str]:
        """The names of the people's facts files there are (for `roost memory list` without
        --person); the household's is not a person's."""
        return [p.stem for p in self.files.glob(self.folder, "*.md") if p.stem != "household"]

    # ---- frozen blocks -----------------------------------------------------------------------

    def frozen(self, conversation_id: str) -> FrozenFacts | None:
        path = self._frozen_path(conversation_id)
        try:
            doc = self.files.read_json(path)
        except (CorruptFile, OSError) as exc:
            # Made again from the facts: the cache misses once, nothing else is lost.
            log.warning("frozen facts of %s unreadable (%s); made again", conversation_id, exc)
            return None
        return FrozenFacts.from_doc(doc)

    def freeze(self, conversation_id: str, frozen: FrozenFacts) -> None:
        path = self._frozen_path(conversation_id)
        self.files.mkdir(path.parent)
        self.files.write(path, dumps(frozen.to_doc()))

    def _frozen_path(self, conversation_id: str) -> Path:
        # Only an id of roost's own form names a folder (as `MessageLog.folder`).
        if not is_id(conversation_id):
            raise ValueError(f"not a conversation id: {conversation_id!r}")
        return self.files.root / "conversations" / conversation_id / "facts.json"

    # ---- inside the lock ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._lock:
            if not isinstance(self.files, DiskFiles):
                yield
                return
            with exclusive(self.folder / ".lock"):
                yield

    def _read(self, path: Path) -> list[Fact]:
        try:
            raw = self.files.read_bytes(path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return parse_facts(raw.decode("utf-8", errors="replace"))

    def _load(self, person: Person) -> list[Fact]:
        facts = self._read(self.path(person))
        if not person.linked:
            return facts
        merged = False
        for chat in person.chats:
            own = self.path(Person(chat, (chat,)))
            for fact in self._read(own):
                merged = True
                if not any(same_fact(fact.text, f.text) for f in facts):
                    facts.append(fact)
        if merged:
            facts.sort(key=lambda f: f.added)  # stable: same-day facts keep their order
            self._write(person, facts)
            for chat in person.chats:
                self.files.remove(self.path(Person(chat, (chat,))))
            log.info("facts of %s merged into identity %s", ", ".join(person.chats),
                     person.name)
        return facts

    def _write(self, person: Person, facts: Sequence[Fact]) -> None:
        self.files.mkdir(self.folder)
        self.files.write(self.path(person), render_facts(person, facts).encode("utf-8"))
