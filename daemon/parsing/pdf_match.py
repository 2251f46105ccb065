"""Finding words in a page as a reader would: the query and the page are both folded (Unicode
NFKC, case folded, combining marks and the Arabic tatweel left out), so "حبيبي" finds "حَبيبي"
and "STRASSE" finds "Straße"; what is shown is the page's own text at the place found.

Spacing marks (Unicode's Mc: the vowel signs of Indic scripts) are letters in their own
right and stay; a mark that combines into an accented letter under NFKC (e + ◌́ = é) is part
of that letter, so "é" and "e" stay apart as the user wrote them.
"""

from __future__ import annotations

import re
import unicodedata

TATWEEL = "\u0640"  # stretches Arabic words in justified text; never a letter


def fold(text: str) -> str:
    """`text` as it is compared."""
    return _fold_piece(text)


def folded_with_places(text: str) -> tuple[str, list[int]]:
    """`text` folded, and for each folded character the index in `text` it came from."""
    if text.isascii():  # nearly every page: nothing to compose, mark or stretch
        return text.lower(), list(range(len(text)))
    out: list[str] = []
    places: list[int] = []
    for start, piece in _segments(text):
        folded = _fold_piece(piece)
        out.append(folded)
        places += [start] * len(folded)
    return "".join(out), places


def find(text: str, words: list[str]) -> tuple[int, int] | None:
    """Where in `text` the folded `words` are found: the whole phrase if it is there, else
    the first word; (start, end) in `text` itself, or None when a word is missing."""
    whole = fold(text)  # most pages are decided on this, at once, with no places kept
    if not words or not all(word in whole for word in words):
        return None
    folded, places = folded_with_places(text)
    phrase = re.compile(r"\s+".join(re.escape(word) for word in words))
    hit = phrase.search(folded)
    start, end = hit.span() if hit else _span(folded, words[0])
    if start < 0:  # composed only across the pieces of `text`: point at its start
        return 0, 0
    return places[start], places[end - 1] + 1


def _span(folded: str, word: str) -> tuple[int, int]:
    at = folded.find(word)
    return at, at + len(word)


def _fold_piece(text: str) -> str:
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return "".join(c for c in text
                   if c != TATWEEL and unicodedata.category(c) not in ("Mn", "Me"))


def _segments(text: str) -> list[tuple[int, str]]:
    """`text` cut before each character that does not combine with the one before it, so that
    NFKC composes within a piece and a piece's folded characters all point at its start."""
    pieces: list[tuple[int, str]] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or not unicodedata.combining(text[i]):
            pieces.append((start, text[start:i]))
            start = i
    return pieces
