"""One PDF page's text in reading rows, from PDFium's characters and where they sit.

PDFium (pypdfium2) gives a page's characters in the order the page draws them. A table drawn a
column at a time comes out a column at a time, a date far from its company; so the words are
put back where they sit: words whose middles share a line's height make one row, left to right,
and a gap wider than about a character's height between two of them is a cell boundary, written
" | " (no run of padding spaces). A page that is two columns of prose (long cells side by side)
keeps PDFium's order instead, which follows the page's own column by column.

Where the file and PDFium disagree with a reader, the reader wins: words of a right-to-left
script drawn left to right (visual order) are turned back to reading order, and characters
whose font does not say which letters they are (no Unicode map: PDFium flags them, or they come
out as control characters) are left out and counted, so the caller can say what was not read.

Boxes are read for the first and last character of each word only (a PDFium call costs about
as much as the rest of the work on that character); a word whose ends do not sit where one
word would is read character by character.
"""

from __future__ import annotations

import re
import statistics
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pypdfium2.raw as pdfium_c  # type: ignore[import-untyped]

CELL_GAP = 1.0  # a gap wider than this many character heights between two words: a new cell
GLUE_GAP = 0.1  # narrower than this: the same word, a glyph or a word part placed on its own
WIDE = 1.3  # a word wider than this many heights per character is not one word as drawn
PROSE_CELL = 30  # median characters of the cells side by side at which a page is prose columns
PROSE_ROWS = 5  # rows of cells side by side needed before a page is taken for prose columns
SEPARATOR = " | "
_WORD = re.compile(r"\S+")
# What may be a font's own codes: control characters and anything past printable ASCII.
_SUSPECT = re.compile("[^\t\n\r\x20-\x7e\ufffe\x02]")
# Hebrew, Arabic, Syriac, Thaana, NKo, Samaritan and their presentation forms.
_RTL = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]")
_HYPHEN = "\x02"  # PDFium's mark of a hyphen that breaks a word at the end of a line


@dataclass(frozen=True)
class PageText:
    """A page's text and how many of its characters could not be read as letters."""

    text: str
    unreadable: int


class _Word:
    """A word as drawn: its text and box (y upwards), its middle and height worked out once
    (they are asked for on every comparison)."""

    __slots__ = ("bottom", "height", "left", "middle", "right", "text", "top")

    def __init__(self, text: str, left: float, bottom: float, right: float, top: float) -> None:
        self.text, self.left, self.bottom, self.right, self.top = text, left, bottom, right, top
        self.middle = (bottom + top) / 2
        self.height = max(top - bottom, 1.0)


class _Boxes:
    """Character boxes of one text page, turned as the page is shown (its /Rotate)."""

    def __init__(self, textpage: Any, rotation: int) -> None:
        self._handle = textpage.raw
        self._rect = pdfium_c.FS_RECTF()
        self._rotation = rotation % 360

    def box(self, index: int) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) of the character at `index`, y upwards."""
        pdfium_c.FPDFText_GetLooseCharBox(self._handle, index, self._rect)
        r = self._rect
        if self._rotation == 90:  # shown turned clockwise: the page's y runs left to right
            return r.bottom, -r.right, r.top, -r.left
        if self._rotation == 180:
            return -r.right, -r.top, -r.left, -r.bottom
        if self._rotation == 270:
            return -r.top, r.left, -r.bottom, r.right
        return r.left, r.bottom, r.right, r.top


def page_text(page: Any) -> PageText:
    """The text of a pypdfium2 page, rows kept (see the module's docstring)."""
    textpage = page.get_textpage()
    try:
        chars, unreadable = _characters(textpage)
        boxes = _Boxes(textpage, page.get_rotation())
        words = list(_words(chars, boxes))
    finally:
        textpage.close()
    rows = [_cells(row) for row in _rows(words)]
    if _prose_columns(rows):
        return PageText(_drawn_order(chars), unreadable)
    text = "\n".join(SEPARATOR.join(cells) for cells in rows)
    return PageText(text.replace(_HYPHEN, "-"), unreadable)


def _characters(textpage: Any) -> tuple[str, int]:
    """The page's characters, one per PDFium index, the unreadable ones blanked (NUL), and
    how many those were."""
    count = textpage.count_chars()
    text = textpage.get_text_range(0, count)
    handle = textpage.raw
    if len(text) != count:  # a character outside UCS-2, or one PDFium left out: one by one
        text = "".join(_code(pdfium_c.FPDFText_GetUnicode(handle, i)) for i in range(count))
    chars = list(text.replace("\ufffe", _HYPHEN))
    unreadable = 0
    for suspect in _SUSPECT.finditer(text):
        i = suspect.start()
        char = chars[i]
        if char < " " or char == "\ufffd" or (char > "~" and _unmapped(handle, i, char)):
            chars[i] = "\0"
            unreadable += 1
    return "".join(chars), unreadable


def _unmapped(handle: Any, index: int, char: str) -> bool:
    """Whether PDFium made this character up from the font's own code (it flags it). Only
    characters outside printable ASCII are asked about (the flag costs a call a character),
    and a symbol it flags stays: PDFium had it from the glyph's name (a minus sign), where a
    made-up letter is a font's glyph number read as a letter."""
    return (unicodedata.category(char)[0] not in "SP"
            and bool(pdfium_c.FPDFText_HasUnicodeMapError(handle, index)))


def _code(point: int) -> str:
    return chr(point) if 0 < point <= 0x10FFFF else "\0"


def _words(chars: str, boxes: _Boxes) -> Iterator[_Word]:
    rtl = not chars.isascii() and _RTL.search(chars) is not None
    for match in _WORD.finditer(chars.replace("\0", " ")):
        start, end = match.span()
        first = boxes.box(start)
        last = boxes.box(end - 1) if end - start > 1 else first
        word = _Word(match.group(), min(first[0], last[0]), min(first[1], last[1]),
                     max(first[2], last[2]), max(first[3], last[3]))
        one_line = abs((first[1] + first[3]) / 2 - (last[1] + last[3]) / 2) < word.height / 2
        if one_line and word.right - word.left <= WIDE * word.height * (end - start):
            yield _reading_order(word, first[0] > last[0]) if rtl else word
        else:  # the word's ends are apart: the file drew it in pieces, so piece it again
            yield from _pieces(chars, start, end, boxes)


def _pieces(chars: str, start: int, end: int, boxes: _Boxes) -> Iterator[_Word]:
    piece: list[Any] = []  # text, left, bottom, right, top
    for i in range(start, end):
        left, bottom, right, top = boxes.box(i)
        if piece and _same_word(piece, left, bottom, right, top):
            piece[0] += chars[i]
            piece[1:] = min(piece[1], left), min(piece[2], bottom), max(piece[3], right), \
                max(piece[4], top)
            continue
        if piece:
            yield _reading_order(_Word(*piece), False)
        piece = [chars[i], left, bottom, right, top]
    if piece:
        yield _reading_order(_Word(*piece), False)


def _same_word(piece: list[Any], left: float, bottom: float, right: float,
               top: float) -> bool:
    middle = (bottom + top) / 2
    gap = max(left - piece[3], piece[1] - right)
    return bool(piece[2] <= middle <= piece[4] and gap < GLUE_GAP * max(piece[4] - piece[2], 1))


def _reading_order(word: _Word, drawn_right_to_left: bool) -> _Word:
    """A right-to-left word drawn left to right (its letters in visual order) reversed, so
    that it reads, and can be searched, as written."""
    if not drawn_right_to_left and _RTL.search(word.text):
        word.text = word.text[::-1]
    return word


def _rows(words: list[_Word]) -> list[list[_Word]]:
    """Words grouped into rows, top to bottom, each row left to right."""
    rows: list[list[_Word]] = []
    band = (0.0, 0.0)
    for word in sorted(words, key=lambda w: -w.middle):
        if rows and band[0] <= word.middle <= band[1]:
            rows[-1].append(word)
            continue
        rows.append([word])
        band = (word.bottom, word.top)
    for row in rows:
        row.sort(key=lambda w: w.left)
    return rows


def _cells(row: list[_Word]) -> list[str]:
    """A row's cells: its words split where the gap is wide, joined as they sit."""
    cells: list[list[tuple[str, _Word]]] = [[]]
    for before, word in zip([None, *row], row, strict=False):
        joint = ""
        if before is not None:
            gap = word.left - before.right
            height = min(word.height, before.height)
            if gap > CELL_GAP * height:
                cells.append([])
            elif abs(gap) >= GLUE_GAP * height:  # overlapping words too: drawn over each other
                joint = " "
        cells[-1].append((joint, word))
    return [_joined(cell) for cell in cells]


def _joined(cell: list[tuple[str, _Word]]) -> str:
    """Words of a cell joined; words of a right-to-left script side by side are in visual
    order, right to left, so each such run is turned round."""
    out: list[str] = []
    run: list[tuple[str, _Word]] = []
    for joint, word in [*cell, ("", None)]:
        if word is not None and _RTL.search(word.text):
            run.append((joint, word))
            continue
        if run:  # the run's first joint stays in front; the others move with their words
            out.append(run[0][0])
            turned = [run[-1][1].text]
            for (joint_after, _), (_, earlier) in zip(run[1:][::-1], run[:-1][::-1],
                                                       strict=True):
                turned += [joint_after, earlier.text]
            out += turned
            run = []
        if word is not None:
            out += [joint, word.text]
    return "".join(out)


def _prose_columns(rows: list[list[str]]) -> bool:
    """Whether the cells side by side on this page are mostly long: columns of prose, not a
    table (whose cells are short: dates, names, amounts)."""
    side_by_side = [cells for cells in rows if len(cells) > 1]
    if len(side_by_side) < PROSE_ROWS:
        return False
    return statistics.median(len(c) for cells in side_by_side for c in cells) >= PROSE_CELL


def _drawn_order(chars: str) -> str:
    """PDFium's own text: its lines joined where it marked a word broken by a hyphen."""
    chars = chars.replace("\0", "").replace(_HYPHEN + "\r\n", "").replace(_HYPHEN, "")
    lines = (" ".join(line.split()) for line in chars.splitlines())
    return "\n".join(line for line in lines if line)
