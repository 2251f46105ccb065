"""The excerpt of a message too long to carry whole: the lines that hold its names and numbers.

A head-and-tail excerpt of a long first message (a locker code, then a bank export) kept its
first 50 characters and its last ones: the code survived, the export's first id, which the user
asked about later, was in no request (issue 43). A person asks later about what a message
named: its numbers, identifiers and names. So the excerpt keeps its opening, then the pieces
that carry an identifier (a digit, a code in capitals, an address, a name inside a sentence),
first ones first, then the ones that carry an instruction, then the rest, within `keep`
characters; gaps show as a line "…", and one label says how much was left out.

Pure and deterministic: the same text and `keep` give the same bytes, so a replayed excerpt
keeps the prompt cache.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence

from daemon.context.fold import carries_facts

PIECE_MAX = 240  # characters: a longer line is taken in pieces of about this size
GAP = "…"
# A digit, an address or link, or a code in capitals (IBAN, XK-77): what a person asks about.
_IDENTIFIER = re.compile(r"\d|@|://|\b[A-Z]{2,}")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


def key_lines(text: str, keep: int, label: str) -> str:
    """`text` whole when it is at most `keep` characters; else its opening and the pieces that
    carry names, numbers and identifiers (see the module docstring), in their order, with a
    label after the opening naming how much was left out and `label` (what and how to read
    it), so that the label is never the last line a small model continues."""
    if len(text) <= keep:
        return text
    pieces, order = _ranked(text)
    if pieces and len(pieces[0][0]) > keep:  # the opening alone is too long: its start
        pieces = ((_clip(pieces[0][0], keep), True), *pieces[1:])
    chosen = _choose(pieces, order, keep)
    kept = sum(len(pieces[i][0]) for i in chosen)
    lines: list[str] = []
    previous = -1
    for index in chosen:
        piece, starts_line = pieces[index]
        if previous >= 0 and index > previous + 1:
            lines.append(GAP)
        if lines and index == previous + 1 and not starts_line:
            lines[-1] += " " + piece  # the next sentence of the same line stays on it
        else:
            lines.append(piece)
        previous = index
    if previous < len(pieces) - 1:
        lines.append(GAP)
    lines.insert(1, f"[… {len(text) - kept:,} characters left out: {label}]")
    return "\n".join(lines)


@functools.lru_cache(maxsize=16)
def _ranked(text: str) -> tuple[tuple[tuple[str, bool], ...], tuple[int, ...]]:
    """The text's pieces, and the indexes of all but the opening in the order they are
    taken: by rank, then position. Memoised: a replay excerpts the same first message on
    every request, at several sizes while it looks for the one that fits."""
    pieces = _pieces(text)
    return tuple(pieces), tuple(sorted(range(1, len(pieces)),
                                       key=lambda i: (_rank(pieces[i][0]), i)))


def _pieces(text: str) -> list[tuple[str, bool]]:
    """The text's non-empty lines split at their sentences (the opening's first sentence
    may be all there is room for), a long one at spaces into pieces of at most PIECE_MAX
    characters; each with whether it starts a line."""
    pieces: list[tuple[str, bool]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        parts = [chunk for sentence in _SENTENCE_END.split(line) for chunk in _chunks(sentence)]
        pieces.extend((part, i == 0) for i, part in enumerate(parts) if part)
    return pieces


def _clip(piece: str, keep: int) -> str:
    """The start of `piece` within `keep` characters, ending on a whole word when one ends in
    its second half."""
    start = piece[: max(keep - 1, 1)]
    space = start.rfind(" ", len(start) // 2)
    return (start[:space] if space > 0 else start).rstrip() + GAP


def _chunks(sentence: str) -> list[str]:
    """`sentence` in pieces of at most PIECE_MAX characters, broken at a space when one is
    in the second half of the piece."""
    chunks = []
    rest = sentence.strip()
    while len(rest) > PIECE_MAX:
        cut = rest.rfind(" ", PIECE_MAX // 2, PIECE_MAX + 1)
        cut = cut if cut > 0 else PIECE_MAX
        chunks.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    chunks.append(rest)
    return chunks


def _choose(pieces: Sequence[tuple[str, bool]], order: Sequence[int], keep: int) -> list[int]:
    """Indexes of the pieces kept, in order: the opening, then by rank and position while
    they fit; a piece too long for what is left gives way to a shorter one after it."""
    if not pieces:
        return []
    used = len(pieces[0][0])
    chosen = [0]
    for index in order:
        cost = len(pieces[index][0]) + 1 + len(GAP) + 1  # the piece, its line, a gap line
        if used + cost <= keep:
            chosen.append(index)
            used += cost
    return sorted(chosen)


def _rank(piece: str) -> int:
    """0: it carries an identifier or a name; 1: an instruction or a fact about the person
    (`carries_facts`); 2: the rest."""
    if _IDENTIFIER.search(piece) or _has_name(piece):
        return 0
    return 1 if carries_facts(piece) else 2


def _has_name(piece: str) -> bool:
    """A capitalised word inside a sentence (not after its end, not "I")."""
    words = piece.split()
    return any(word[:1].isupper() and word not in ("I", "I'm", "I've", "I'd", "I'll")
               and not before.endswith((".", "!", "?", ":"))
               for before, word in itertools.pairwise(words))
