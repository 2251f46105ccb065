"""The text of WordprocessingML as a reader sees it, for `word.py`: paragraphs and tables in
order, each followed by what hangs off it.

python-docx reads runs and tables but not the rest a person sees on the page, so this walks the
elements it hands over (lxml, parsed by python-docx's hardened parser):
- footnotes and endnotes: "[footnote 1]" where the mark is, "[footnote 1: text]" after the
  paragraph, numbered in reading order as Word numbers them;
- comments: "[comment by NAME on "quoted words": text]" after the paragraph the comment ends in;
- tracked changes: "[inserted by NAME: ...]" and "[deleted by NAME: ...]" where they stand, so
  neither a pending insertion is lost nor a deletion read as if accepted (moves as both);
- text boxes and shapes (w:txbxContent): their paragraphs right after the paragraph they are
  anchored in; the VML copy Word keeps for old readers (mc:Fallback) is skipped;
- page-number fields: "#", since the number a header or footer last printed means nothing here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from docx.table import Table

from daemon.parsing.tables import markdown_table

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
R_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
PAGE_FIELDS = {"PAGE", "NUMPAGES", "SECTIONPAGES"}
QUOTED_CHARS = 80  # of the words a comment is on
NOTE = "\0note"  # the label of a piece that is roost's mark, not the document's words

_TEXT = {f"{W}t", f"{W}delText"}
_BREAKS = {f"{W}br": "\n", f"{W}cr": "\n", f"{W}tab": "\t", f"{W}noBreakHyphen": "-"}
_INSERTED = {f"{W}ins", f"{W}moveTo"}
_DELETED = {f"{W}del", f"{W}moveFrom"}
_NOTE_REFS = {f"{W}footnoteReference": "footnote", f"{W}endnoteReference": "endnote"}
# No text of their own, or text Word does not show (field codes, properties, the old copy).
_SKIPPED = {f"{W}pPr", f"{W}rPr", f"{W}instrText", f"{W}delInstrText", FALLBACK}

Element = Any  # an lxml element of python-docx's oxml


@dataclass
class Story:
    """One part's words: its element and the links its relationships name (hyperlinks point
    into the rels of the part they are in)."""
    element: Element
    links: dict[str, str] = field(default_factory=dict)


@dataclass
class Notes:
    """What the body refers to by id: footnotes and endnotes (elements of their parts) and
    comments (author, text)."""
    footnotes: dict[str, Story] = field(default_factory=dict)
    endnotes: dict[str, Story] = field(default_factory=dict)
    comments: dict[str, tuple[str, str]] = field(default_factory=dict)


class Reader:
    """Blocks of one story, counting what it met (words, tables, notes, changes)."""

    def __init__(self, notes: Notes, styles: dict[str, str], links: dict[str, str]) -> None:
        self.notes = notes
        self.styles = styles
        self.links = links
        self.counts: Counter[str] = Counter()
        self._pending: list[str] = []  # notes to show after the current block
        self._boxes: list[Element] = []  # text boxes anchored in the current block
        self._fields: list[list[Any]] = []  # open complex fields: [instruction, hidden]
        self._ranges: dict[str, list[str]] = {}  # open comment ranges: the words so far
        self._quoted: dict[str, str] = {}
        self._numbers: dict[tuple[str, str], int] = {}

    def blocks(self, container: Element) -> list[str]:
        """Paragraphs and tables (as Markdown) of a body, cell, note or text box, each with
        its notes after it and then the text boxes anchored in it."""
        out: list[str] = []
        for child in container.iterchildren():
            if child.tag == f"{W}p":
                text = self._paragraph(child)
            elif child.tag == f"{W}tbl":
                text = self._table(child)
            elif child.tag in (f"{W}sdt", f"{W}customXml"):  # content controls: their content
                inner = child.find(f"{W}sdtContent")
                out.extend(self.blocks(child if inner is None else inner))
                continue
            else:
                continue
            notes, boxes = self._pending, self._boxes
            self._pending, self._boxes = [], []
            if text or notes:
                out.append("\n".join([text, *notes]) if text else "\n".join(notes))
            for box in boxes:
                out.extend(self.blocks(box))
        return out

    def _paragraph(self, p: Element) -> str:
        pieces: list[tuple[str, str]] = []
        self._inline(p, "", pieces)
        for words in self._ranges.values():  # a comment's range goes on past this paragraph
            words.append(" ")
        text = joined(pieces).strip()
        if not text:
            return ""
        self.counts["words"] += len("".join(t for label, t in pieces if label == ""
                                            or label.startswith("inserted")).split())
        style_id = p.find(f"{W}pPr/{W}pStyle")
        style = self.styles.get(style_id.get(f"{W}val") if style_id is not None else "", "")
        if style.startswith("Heading") and style[7:].strip().isdigit():
            return "#" * min(int(style[7:]), 6) + " " + text
        if style == "Title":
            return "# " + text
        if style.startswith("List"):
            return "- " + text
        return text

    def _table(self, tbl: Element) -> str:
        # python-docx's rows repeat a merged cell in each grid column it spans, as it reads.
        # Listing cells needs no story part, so the table gets no parent.
        table = Table(tbl, None)  # type: ignore[arg-type]
        rows = [[self._cell(cell._tc) for cell in row.cells] for row in table.rows]
        if not any(any(row) for row in rows):
            return ""
        self.counts["tables"] += 1
        return markdown_table(rows)

    def _cell(self, tc: Element) -> str:
        return " ".join(part for part in self._cell_parts(tc) if part)

    def _cell_parts(self, container: Element) -> Iterable[str]:
        for child in container.iterchildren():
            if child.tag == f"{W}p":
                yield self._paragraph(child)
            elif child.tag == f"{W}tbl":  # a table in a cell: its cells in order
                for tc in child.iter(f"{W}tc"):
                    yield from self._cell_parts(tc)
            elif child.tag in (f"{W}sdt", f"{W}customXml"):
                inner = child.find(f"{W}sdtContent")
                yield from self._cell_parts(child if inner is None else inner)

    def _inline(self, element: Element, label: str, pieces: list[tuple[str, str]]) -> None:
        for child in element.iterchildren():
            tag = child.tag
            if tag in _TEXT:
                self._text(child.text or "", label, pieces)
            elif tag in _BREAKS:
                self._text(_BREAKS[tag], label, pieces)
            elif tag in _INSERTED or tag in _DELETED:
                kind = "inserted" if tag in _INSERTED else "deleted"
                author = (child.get(f"{W}author") or "").strip()
                if next(child.iter(*_TEXT), None) is not None:
                    self.counts[kind] += 1
                self._inline(child, f"{kind} by {author}" if author else kind, pieces)
            elif tag in _NOTE_REFS:
                self._note(_NOTE_REFS[tag], child.get(f"{W}id") or "", pieces)
            elif tag == f"{W}commentRangeStart":
                self._ranges[child.get(f"{W}id") or ""] = []
            elif tag == f"{W}commentRangeEnd":
                key = child.get(f"{W}id") or ""
                self._quoted[key] = "".join(self._ranges.pop(key, []))
            elif tag == f"{W}commentReference":
                self._comment(child.get(f"{W}id") or "")
            elif tag == f"{W}txbxContent":
                self._boxes.append(child)
            elif tag == f"{W}fldChar":
                self._field_char(child.get(f"{W}fldCharType"), pieces)
            elif tag == f"{W}instrText" and self._fields:
                self._fields[-1][0] += child.text or ""
            elif tag == f"{W}fldSimple" and _is_page(child.get(f"{W}instr")):
                pieces.append((label, "#"))
            elif tag == f"{W}hyperlink":
                self._hyperlink(child, label, pieces)
            elif tag not in _SKIPPED:
                self._inline(child, label, pieces)

    def _text(self, text: str, label: str, pieces: list[tuple[str, str]]) -> None:
        if any(hidden for _, hidden in self._fields):
            return
        pieces.append((label, text))
        if not label.startswith("deleted"):
            for words in self._ranges.values():
                if sum(map(len, words)) <= QUOTED_CHARS:
                    words.append(text)

    def _field_char(self, kind: str | None, pieces: list[tuple[str, str]]) -> None:
        if kind == "begin":
            self._fields.append(["", False])
        elif kind == "separate" and self._fields:
            if _is_page(self._fields[-1][0]):
                pieces.append(("", "#"))
                self._fields[-1][1] = True
        elif kind == "end" and self._fields:
            self._fields.pop()

    def _hyperlink(self, link: Element, label: str, pieces: list[tuple[str, str]]) -> None:
        inner: list[tuple[str, str]] = []
        self._inline(link, label, inner)
        pieces.extend(inner)
        url = self.links.get(link.get(R_ID) or "")
        shown = "".join(text for _, text in inner).strip()
        if url and shown and url != shown:
            pieces.append((NOTE, f" ({url})"))

    def _note(self, kind: str, key: str, pieces: list[tuple[str, str]]) -> None:
        story = (self.notes.footnotes if kind == "footnote" else self.notes.endnotes).get(key)
        if story is None:
            return
        known = (kind, key) in self._numbers
        number = self._numbers.setdefault(
            (kind, key), 1 + sum(1 for k, _ in self._numbers if k == kind))
        pieces.append((NOTE, f"[{kind} {number}]"))
        if known:
            return
        self.counts[f"{kind}s"] += 1
        inside = Reader(self.notes, self.styles, story.links)
        text = " ".join(inside.blocks(story.element))
        self._pending.append(f"[{kind} {number}: {text}]")

    def _comment(self, key: str) -> None:
        found = self.notes.comments.get(key)
        if found is None:
            return
        author, text = found
        self.counts["comments"] += 1
        quoted = " ".join(self._quoted.pop(key, "").split())
        if len(quoted) > QUOTED_CHARS:
            quoted = quoted[:QUOTED_CHARS - 1] + "…"
        head = f"comment by {author}" if author else "comment"
        on = f' on "{quoted}"' if quoted else ""
        self._pending.append(f"[{head}{on}: {' '.join(text.split())}]")


def _is_page(instruction: str | None) -> bool:
    words = (instruction or "").split()
    return bool(words) and words[0].upper() in PAGE_FIELDS


def joined(pieces: list[tuple[str, str]]) -> str:
    """The pieces as text: a run of one insertion or deletion marked once, its spaces outside
    the brackets."""
    out: list[str] = []
    index = 0
    while index < len(pieces):
        label, text = pieces[index]
        index += 1
        if label in ("", NOTE):
            out.append(text)
            continue
        while index < len(pieces) and pieces[index][0] == label:
            text += pieces[index][1]
            index += 1
        core = text.strip()
        if core:
            lead = text[: len(text) - len(text.lstrip())]
            trail = text[len(text.rstrip()):]
            out.append(f"{lead}[{label}: {core}]{trail}")
    return "".join(out)
