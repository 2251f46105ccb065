"""Markdown from the model -> what each channel sends, split at the platform's limit.

Pure functions: no I/O, clock, config or network. The walk over markdown-it's syntax tree
lives in `channels.markdown_render`; this module is the API the channels call, and splitting.

Splitting happens after rendering, because the limits count what the user sees: Telegram's
4096 is the text after entity parsing (tags gone, entities one character). We count UTF-16 code
units, the unit of Telegram's entity offsets; it is never less than the count of code points,
so a part cannot run over whichever of the two the server checks. The Bot API also refuses a
`text` over 32,768 bytes before it parses anything, which a link-heavy answer reaches long
before 4096 visible characters (each `<a href="...">` costs its URL): a Telegram part stays
under both.

A part is cut at the last paragraph break that fits, else a line break, else a space, else
anywhere; tags open at the cut (a <pre> around a long code block, a <blockquote>) are closed
at the end of the part and reopened, attributes and all, at the start of the next, so every
part is valid HTML on its own. WhatsApp text gets the same treatment for ``` blocks.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from channels.markdown_render import (
    MatrixRenderer,
    PlainRenderer,
    TelegramRenderer,
    WhatsAppRenderer,
)

TELEGRAM_LIMIT = 4096  # characters of a message's text after entity parsing (what the user sees)
TELEGRAM_RAW_LIMIT = 32768  # bytes of the text as sent, markup included, checked before parsing
WHATSAPP_LIMIT = 4096
# Matrix has no length limit but the event's: 65,536 bytes of JSON, holding the body and the
# formatted body (and, in an encrypted room, both again as base64 of the ciphertext). 6,000
# characters of each stays under it even for text of three-byte characters.
MATRIX_LIMIT = 6000
MATRIX_RAW_LIMIT = 24000  # bytes of the formatted body of one part

# Below this a part could not hold a reopened ``` fence, a closing one and any text.
_MIN_LIMIT = 8
# Bytes kept free under a raw limit for the closing tags of what is open at the cut (tags
# opened inside the part; those reopened at its start are counted exactly).
_RAW_RESERVE = 256
# A paragraph (or line) break is worth a shorter part only while the part stays at least this
# full; otherwise a later line (or word) break wins and fewer messages are sent.
_MIN_FILL = 0.5

__all__ = [
    "MATRIX_LIMIT",
    "TELEGRAM_LIMIT",
    "TELEGRAM_RAW_LIMIT",
    "WHATSAPP_LIMIT",
    "html_visible_length",
    "matrix_plain",
    "split_matrix",
    "split_telegram",
    "split_text",
    "to_matrix_html",
    "to_plain",
    "to_telegram_html",
    "to_whatsapp",
]


def to_telegram_html(markdown: str) -> str:
    """Markdown -> Telegram's HTML parse mode: only its tags, all text escaped."""
    return TelegramRenderer().render(markdown)


def to_whatsapp(markdown: str) -> str:
    """Markdown -> WhatsApp's markers (*bold*, _italic_, ~strike~, ```code```)."""
    return WhatsAppRenderer().render(markdown)


def to_plain(markdown: str) -> str:
    """Markdown -> readable plain text for a terminal, with no emphasis markers left over."""
    return PlainRenderer().render(markdown)


def split_telegram(markdown: str, limit: int = TELEGRAM_LIMIT,
                   raw_limit: int = TELEGRAM_RAW_LIMIT) -> list[str]:
    """Render for Telegram and split into parts of at most `limit` visible UTF-16 units and
    `raw_limit` UTF-8 bytes of HTML.

    Every part is balanced HTML; their visible texts add up to the whole, less the whitespace
    at the cuts. No parts for a reply that renders to nothing.
    """
    _check_limit(limit)
    return _split(_html_atoms(to_telegram_html(markdown)), limit, reserve=0, raw_limit=raw_limit)


def to_matrix_html(markdown: str) -> str:
    """Markdown -> Matrix's `org.matrix.custom.html` (a message's `formatted_body`)."""
    return MatrixRenderer().render(markdown)


def split_matrix(markdown: str, limit: int = MATRIX_LIMIT,
                 raw_limit: int = MATRIX_RAW_LIMIT) -> list[tuple[str, str]]:
    """Render for Matrix and split like Telegram's HTML; each part as (body, formatted_body):
    the plain `body` every Matrix message must carry is read off the part's own HTML, so the
    two always say the same."""
    _check_limit(limit)
    parts = _split(_html_atoms(to_matrix_html(markdown)), limit, reserve=0, raw_limit=raw_limit)
    if len(parts) == 1:  # the usual case: the body as a terminal shows it, numbers and all
        return [(to_plain(markdown), parts[0])]
    return [(matrix_plain(part), part) for part in parts]


_BLOCK_BREAK = re.compile(r"\s*<(?:br/?|hr/?|/?(?:p|h[1-6]|ul|ol|li|blockquote|pre|table|thead|"
                          r"tbody|tr))(?:\s[^>]*)?>\s*")
_LIST_ITEM = re.compile(r"<li>(?:\s*<p>)?")
_CELL_END = re.compile(r"</t[hd]>\s*(?=<t[hd]>)")


def matrix_plain(html_part: str) -> str:
    """The plain-text `body` of a Matrix HTML part: block ends become line breaks, list
    items bullets, table cells ' | '; tags dropped, entities undone."""
    text = _LIST_ITEM.sub("<li>\u2022 ", html_part)
    text = _CELL_END.sub(" | ", text)
    text = _BLOCK_BREAK.sub("\n", text)
    text = re.sub(r"<[^>]*>", "", text)
    text = re.sub(r"\n{2,}", "\n", text)
    return html.unescape(text).strip()


def split_text(text: str, limit: int) -> list[str]:
    """Split rendered plain or WhatsApp text into parts of at most `limit` UTF-16 units.

    A ``` block cut in two is closed at the end of one part and reopened in the next, so the
    code stays monospaced. An odd number of ``` means they are not fences: left alone.
    """
    _check_limit(limit)
    atoms = _text_atoms(text)
    has_fence = any(atom.kind != "text" for atom in atoms)
    return _split(atoms, limit, reserve=_units(_FENCE) if has_fence else 0)


def html_visible_length(html_text: str) -> int:
    """UTF-16 length of the text Telegram shows for `html_text`: tags removed, entities
    counted as the character they stand for."""
    return sum(_units(atom.visible) for atom in _html_atoms(html_text))


# ---- atoms: the indivisible pieces of rendered text -----------------------------------------


@dataclass(frozen=True, slots=True)
class _Atom:
    raw: str  # as written in the message
    visible: str  # as the user sees it: "" for a tag, "&" for "&amp;"
    kind: Literal["text", "open", "close"] = "text"
    name: str = ""  # tag name, or the fence
    closer: _Atom | None = None  # for "open": what closes it at a cut


def _units(text: str) -> int:
    """UTF-16 code units: characters outside the BMP (most emoji) count twice."""
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


# Tags, and the entities Telegram knows (numeric ones, and only these four named ones).
_HTML_TOKEN = re.compile(
    r"<(?P<close>/?)(?P<name>[A-Za-z][A-Za-z0-9-]*)[^>]*>"
    r"|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|lt|gt|amp|quot);"
)


def _html_atoms(text: str) -> list[_Atom]:
    atoms: list[_Atom] = []
    pos = 0
    for match in _HTML_TOKEN.finditer(text):
        atoms.extend(_Atom(char, char) for char in text[pos : match.start()])
        raw = match.group()
        name = (match.group("name") or "").lower()
        if not name:
            atoms.append(_Atom(raw, html.unescape(raw)))
        elif match.group("close"):
            atoms.append(_Atom(raw, "", "close", name))
        elif raw.endswith("/>"):  # self-closing: nothing to balance
            atoms.append(_Atom(raw, ""))
        else:
            atoms.append(_Atom(raw, "", "open", name, _Atom(f"</{name}>", "", "close", name)))
        pos = match.end()
    atoms.extend(_Atom(char, char) for char in text[pos:])
    return atoms


_FENCE = "```"
_FENCE_CLOSE = _Atom(_FENCE, _FENCE, "close", _FENCE)
_FENCE_OPEN = _Atom(_FENCE, _FENCE, "open", _FENCE, _FENCE_CLOSE)


def _text_atoms(text: str) -> list[_Atom]:
    fenced = text.count(_FENCE) % 2 == 0
    atoms: list[_Atom] = []
    inside = False
    pos = 0
    while pos < len(text):
        if fenced and text.startswith(_FENCE, pos):
            atoms.append(_FENCE_CLOSE if inside else _FENCE_OPEN)
            inside = not inside
            pos += len(_FENCE)
        else:
            atoms.append(_Atom(text[pos], text[pos]))
            pos += 1
    return atoms


# ---- splitting ---------------------------------------------------------------------------


def _check_limit(limit: int) -> None:
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit must be at least {_MIN_LIMIT}, got {limit}")


def _split(atoms: Sequence[_Atom], limit: int, reserve: int,
           raw_limit: int | None = None) -> list[str]:
    """Cut `atoms` into parts of at most `limit` visible units (and `raw_limit` bytes as
    written, when given); `reserve` is kept free for closing what is open at a cut when
    closing costs visible text (a ``` fence)."""
    widths = [_units(atom.visible) for atom in atoms]
    sizes = [len(atom.raw.encode()) for atom in atoms]
    total = len(atoms)
    parts: list[str] = []
    stack: list[_Atom] = []  # tags (or fence) open where the current part starts
    start = 0
    while start < total:
        reopened = list(stack)
        budget = limit - sum(_units(atom.visible) for atom in reopened)
        # Room for the tags reopened here and for closing, at the cut, whatever is open then.
        room = (raw_limit - sum(len(a.raw.encode()) * 2 + 3 for a in reopened) - _RAW_RESERVE
                if raw_limit is not None else None)
        end, used, size = start, 0, 0
        while (end < total and used + widths[end] <= budget
               and (room is None or size + sizes[end] <= room)):
            used += widths[end]
            size += sizes[end]
            end += 1
        if end < total:  # does not all fit: leave room to close what is open at the cut
            budget -= reserve
            while end > start and used > budget:
                end -= 1
                used -= widths[end]
            cut, resume = _choose_cut(atoms, widths, start, max(end, start + 1), budget)
        else:
            cut = resume = total
        body = list(atoms[start:cut])
        for atom in body:
            _track(stack, atom)
        while body and _is_space(body[-1]):  # platforms trim it anyway; it only costs room
            body.pop()
        closers = [atom.closer for atom in reversed(stack) if atom.closer is not None]
        if any(atom.visible.strip() for atom in body):
            parts.append(_join([*reopened, *body, *closers]))
        start = resume
    return parts


def _is_space(atom: _Atom) -> bool:
    return atom.kind == "text" and atom.visible in (" ", "\n", "\t", "\r")


def _choose_cut(
    atoms: Sequence[_Atom], widths: Sequence[int], start: int, end: int, budget: int
) -> tuple[int, int]:
    """Where to cut the part starting at `start`, whose atoms up to `end` fit.

    Returns (cut, resume): the part is atoms[start:cut], the next starts at `resume`; the
    whitespace in between is dropped. A run beginning at `end` itself counts, since the
    whitespace is not kept.
    """
    best: dict[int, tuple[int, int]] = {}  # strength of break -> last (cut, resume) found
    best_full: dict[int, tuple[int, int]] = {}  # the same, among cuts keeping the part full
    filled = 0
    for k in range(start, min(end + 1, len(atoms))):
        if k > start and _is_space(atoms[k]) and not _is_space(atoms[k - 1]):
            run_end = k
            while run_end < len(atoms) and _is_space(atoms[run_end]):
                run_end += 1
            newlines = [i for i in range(k, run_end) if atoms[i].visible == "\n"]
            strength = min(len(newlines), 2)  # 2: paragraph, 1: line, 0: word
            # After a line break the next part keeps the next line's indentation (code,
            # nested list items); only the break itself is dropped.
            resume = newlines[-1] + 1 if newlines else run_end
            best[strength] = (k, resume)
            if filled >= budget * _MIN_FILL:
                best_full[strength] = (k, resume)
        if k < end:
            filled += widths[k]
    for found in (best_full, best):
        if found:
            return found[max(found)]
    cut = end
    # No whitespace at all: cut anywhere, but not between a character and what clings to it.
    while cut - 1 > start and (_clings(atoms[cut].visible) or atoms[cut - 1].visible == "\u200d"):
        cut -= 1
    return cut, cut


def _clings(char: str) -> bool:
    """Combining marks, joiners, variation selectors and skin tones belong to the character
    before them; a hard cut there would show a broken glyph."""
    if len(char) != 1:
        return False
    return (
        unicodedata.category(char) in ("Mn", "Me")
        or char in ("\u200d", "\ufe0e", "\ufe0f")
        or 0x1F3FB <= ord(char) <= 0x1F3FF
    )


def _track(stack: list[_Atom], atom: _Atom) -> None:
    if atom.kind == "open":
        stack.append(atom)
    elif atom.kind == "close":
        for index in range(len(stack) - 1, -1, -1):
            if stack[index].name == atom.name:
                del stack[index]
                break


def _join(atoms: Sequence[_Atom]) -> str:
    """The part's text, without tags opened and closed around nothing (a cut next to them)."""
    kept: list[_Atom] = []
    for atom in atoms:
        if atom.kind == "close" and kept and kept[-1].kind == "open" and kept[-1].name == atom.name:
            kept.pop()
        else:
            kept.append(atom)
    return "".join(atom.raw for atom in kept)
