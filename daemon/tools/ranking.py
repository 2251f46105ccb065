"""Which capabilities a `tool_search` query means, best first (pure).

A small model asks in everyday words ("current time in Tokyo"); each capability answers in its
own: its name, its index line, its tools' names and descriptions. Each capability is one
document of those four fields, ranked by BM25F (BM25 with weighted fields): a word in the name
or the index line says more than one deep in a long description, a word few capabilities use
says more than one they all use, and a long description does not win by length alone.

Words are lower-cased, split at camelCase and snake_case, and stemmed by a small suffix stripper
(`stem`): tool descriptions are short English, where what matters is that "files", "fetches",
"thinking" and "directories" meet "file", "fetch", "think" and "directory". A stemmer package
would do the same for these words and cost every start its import (the Snowball one, 44 ms).

A `Ranking` is built once for a set of capabilities (the registry keeps it until one is
registered or replaced) and answers any number of queries.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.tools.registry import Capability

# BM25's usual constants: how fast repeats of a word stop counting, how much length weighs.
K1 = 1.2
B = 0.75
# How much a word counts by where it stands.
NAME_WEIGHT = 3.0
ABOUT_WEIGHT = 2.0
TOOL_NAME_WEIGHT = 2.0
TOOL_TEXT_WEIGHT = 1.0

_TOKEN = re.compile(r"[^\W_]+")  # letters and digits, in any script
_CAMEL = re.compile("(?<=[a-z0-9])(?=[A-Z])")  # nextThoughtNeeded; not SQLite or URLs
# Words that say nothing about what a capability does.
STOP = frozenset("""
a about after all also am an and any are as at be been before being both but by can could
did do does doing done each either else for from had has have having he her here hers him his
how i if in into is it its itself just may me might more most must my no nor not now of off
on once only or other our ours out over own please same shall she should so some such than
that the their theirs them then there these they this those through to too under until up
upon us very via was we were what when where which while who whom whose why will with within
without would you your yours
""".split())


def surface_words(text: str) -> list[str]:
    """The words of `text` as written, split at camelCase and snake_case."""
    return [part for token in _TOKEN.findall(text) for part in _CAMEL.split(token)]


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased, without stop words, single letters and numbers."""
    found = (w.lower() for w in surface_words(text))
    return [w for w in found if len(w) > 1 and not w.isdigit() and w not in STOP]


def stem(word: str) -> str:
    """A word's stem: plural, -ing, -ed, -er and a final e stripped, a doubled consonant
    undoubled ("committed", "commits" and "commit" all give "commit")."""
    word = word.lower()
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "zes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed", "er"):
        base = word[:-len(suffix)]
        if word.endswith(suffix) and len(base) >= 3 and re.search("[aeiouy]", base):
            word = _undoubled(base)
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def _undoubled(base: str) -> str:
    if len(base) > 3 and base[-1] == base[-2] and base[-1] not in "aeioulsz":
        return base[:-1]
    return base


def terms(text: str) -> list[str]:
    return [stem(w) for w in words(text)]


def tool_words(name: str) -> str:
    """A tool's own name as words: without its server's `server__` prefix."""
    return name.split("__", 1)[-1]


@dataclass(frozen=True)
class Hit:
    """A capability a query matched: how well, and why, in a few words."""

    capability: Capability
    score: float
    why: str


@dataclass(frozen=True)
class _Document:
    capability: Capability
    weights: dict[str, float]  # term -> weighted count over the fields
    length: float
    # Where the terms stand, for saying why: (a tool's name, or "" for the capability itself,
    # the terms of that name, the terms of the description).
    places: tuple[tuple[str, frozenset[str], frozenset[str]], ...]


class Ranking:
    """BM25F over a set of capabilities; see the module docstring."""

    def __init__(self, capabilities: Iterable[Capability]) -> None:
        self.documents = [_document(c) for c in capabilities]
        count = len(self.documents) or 1
        self.average = sum(d.length for d in self.documents) / count or 1.0
        held = Counter(t for d in self.documents for t in d.weights)
        self.idf = {t: math.log(1 + (count - n + 0.5) / (n + 0.5)) for t, n in held.items()}

    def search(self, query: str, skip: Collection[str] = (),
               limit: int | None = None) -> list[Hit]:
        """The capabilities not in `skip` that `query` matches, best first (ties by name)."""
        asked: dict[str, str] = {}  # stem -> the query's own word, for saying why
        for word in words(query):
            asked.setdefault(stem(word), word)
        hits = []
        for document in self.documents:
            if document.capability.name in skip:
                continue
            norm = K1 * (1 - B + B * document.length / self.average)
            score = sum(self.idf[t] * w * (K1 + 1) / (w + norm)
                        for t in asked if (w := document.weights.get(t, 0.0)))
            if score > 0:
                hits.append(Hit(document.capability, score, self._why(document, asked)))
        hits.sort(key=lambda h: (-h.score, h.capability.name))
        return hits[:limit]

    def _why(self, document: _Document, asked: dict[str, str]) -> str:
        """"matched time, current in clock__get_current_time": the query's words the tool
        holding most of them has (a word in its name counting double), then any others."""
        held = [t for t in asked if t in document.weights]
        best, best_weight, in_best = "", 0.0, held
        for place, named, said in document.places[1:]:
            weight = sum(self.idf[t] * (TOOL_NAME_WEIGHT if t in named else TOOL_TEXT_WEIGHT)
                         for t in held if t in named or t in said)
            if weight > best_weight:
                best, best_weight = place, weight
                in_best = [t for t in held if t in named or t in said]
        why = f"matched {', '.join(asked[t] for t in in_best)}"
        others = [asked[t] for t in held if t not in in_best]
        return (why + (f" in {best}" if best else "")
                + (f"; also {', '.join(others)}" if others else ""))


def _document(capability: Capability) -> _Document:
    weights: dict[str, float] = {}
    length = 0.0
    fields: list[tuple[float, Sequence[str]]] = [
        (NAME_WEIGHT, terms(capability.name)), (ABOUT_WEIGHT, terms(capability.description))]
    places = [("", frozenset(fields[0][1]), frozenset(fields[1][1]))]
    for tool in capability.tools:
        named, said = terms(tool_words(tool.name)), terms(tool.description)
        fields += [(TOOL_NAME_WEIGHT, named), (TOOL_TEXT_WEIGHT, said)]
        places.append((tool.name, frozenset(named), frozenset(said)))
    for weight, field in fields:
        for term in field:
            weights[term] = weights.get(term, 0.0) + weight
        length += weight * len(field)
    return _Document(capability, weights, length, tuple(places))
